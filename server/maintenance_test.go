package server

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/storage"
)

// testClock is a settable server clock.
type testClock struct{ ms atomic.Int64 }

func (c *testClock) now() time.Time { return time.UnixMilli(c.ms.Load()) }

func infoField(t *testing.T, c *redis.Client, section, field string) string {
	t.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	t.Fatalf("INFO %s has no %s:\n%s", section, field, info)
	return ""
}

// 100k buckets refill and become idle; COMPACT sweeps them away and
// compacts, so DBSIZE and the disk usage drop, while buckets reduced during
// the sweep keep their state.
func TestCompactSweepsIdleBuckets(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{}
	const t0 = 1_700_000_000_000
	clock.ms.Store(t0)
	srv := startServer(t, Config{Clock: clock.now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	c := newClient(t, srv)
	const n = 100_000
	for i := 0; i < n; i += 1000 {
		p := c.Pipeline()
		for j := i; j < i+1000; j++ {
			p.Do(ctx, "RL.PREDUCE", "b:"+strconv.Itoa(j), 5, 1000)
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.DBSize(ctx).Val(); got != n {
		t.Fatalf("DBSIZE = %d, want %d", got, n)
	}
	if got := infoField(t, c, "keyspace", "db0"); got != "keys=100000,expires=0,avg_ttl=0" {
		t.Fatalf("INFO keyspace db0:%s", got)
	}
	// Nothing is idle yet: COMPACT keeps every bucket and puts them all in
	// sorted tables, the baseline for the disk usage.
	if err := c.Do(ctx, "COMPACT").Err(); err != nil {
		t.Fatal(err)
	}
	if got := c.DBSize(ctx).Val(); got != n {
		t.Fatalf("DBSIZE after a sweep with nothing idle = %d, want %d", got, n)
	}
	before, _ := strconv.ParseInt(infoField(t, c, "storage", "table_bytes"), 10, 64)

	// Ten seconds later every bucket has refilled. Every 100th is reduced
	// again while COMPACT sweeps, from another connection.
	clock.ms.Store(t0 + 10_000)
	other := newClient(t, srv)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for j := n - 1; j >= 0; j -= 100 {
			if err := other.Do(ctx, "RL.PREDUCE", "b:"+strconv.Itoa(j), 5, 1000).Err(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	if err := c.Do(ctx, "COMPACT").Err(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if got := c.DBSize(ctx).Val(); got != n/100 {
		t.Errorf("DBSIZE after the sweep = %d, want %d (the buckets reduced during it)", got, n/100)
	}
	// A second COMPACT drops any that the first kept only because it ran
	// before their reduce; none is idle now, so the count stays.
	if err := c.Do(ctx, "COMPACT").Err(); err != nil {
		t.Fatal(err)
	}
	after, _ := strconv.ParseInt(infoField(t, c, "storage", "table_bytes"), 10, 64)
	// The sorted tables hold the buckets; the write-ahead log, recycled
	// by Pebble, does not shrink with them.
	if after*10 > before {
		t.Errorf("tables hold %d bytes after sweeping 99%% of the buckets, %d before; want less than a tenth", after, before)
	}
	t.Logf("table bytes: %d with %d buckets, %d with %d", before, n, after, n/100)
	for j := n - 1; j >= 0; j -= 100 {
		v, err := c.Do(ctx, "RL.PGET", "b:"+strconv.Itoa(j), 5, 1000).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if v != 4 {
			t.Fatalf("b:%d has %d tokens after the sweep, want 4: a reduce was lost", j, v)
		}
	}
	if got, _ := strconv.Atoi(infoField(t, c, "storage", "sweep_deleted_total")); got < n-n/100 {
		t.Errorf("INFO storage sweep_deleted_total:%d, want at least %d", got, n-n/100)
	}
}

// The background sweep runs by itself, paced, and resumes where it stopped.
func TestBackgroundSweep(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{}
	clock.ms.Store(1_700_000_000_000)
	srv := startServer(t, Config{Clock: clock.now, RESP: respserver.Tuning{SweepInterval: respserver.LimitOf(time.Millisecond), SweepRate: respserver.NoLimit[int]()}})
	c := newClient(t, srv)
	p := c.Pipeline()
	for j := range 3000 {
		p.Do(ctx, "RL.PREDUCE", "b:"+strconv.Itoa(j), 5, 1000)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	clock.ms.Add(10_000)
	// Wait for a pass that sees the idle buckets; no duration is asserted.
	for c.DBSize(ctx).Val() != 0 {
	}
	if got := infoField(t, c, "storage", "sweep_deleted_total"); got != "3000" {
		t.Errorf("sweep_deleted_total:%s, want 3000", got)
	}
}

// CHECKPOINT writes a copy that a second server serves with the same
// buckets; LASTSAVE moves.
func TestCheckpointServedBySecondServer(t *testing.T) {
	ctx := context.Background()
	backups := t.TempDir()
	clock := &testClock{}
	clock.ms.Store(1_700_000_000_000)
	srv := startServer(t, Config{Clock: clock.now, RESP: respserver.Tuning{BackupDir: backups}})
	c := newClient(t, srv)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // load on another connection while the checkpoint is made
		defer wg.Done()
		other := newClient(t, srv)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := other.Do(ctx, "RL.PREDUCE", "load:"+strconv.Itoa(i%500), 1000, 60).Err(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	p := c.Pipeline()
	for j := range 2000 {
		p.Do(ctx, "RL.PREDUCE", "b:"+strconv.Itoa(j), 100, 60000, "TAKE", j%50+1)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	dir, err := c.Do(ctx, "CHECKPOINT", "one").Text()
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(backups, "one"); dir != want {
		t.Fatalf("CHECKPOINT answered %q, want %q", dir, want)
	}
	if err := c.Do(ctx, "CHECKPOINT", "one").Err(); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("a second CHECKPOINT one: %v", err)
	}
	if err := c.Do(ctx, "CHECKPOINT", "../escape").Err(); err == nil || !strings.Contains(err.Error(), "name must be") {
		t.Fatalf("CHECKPOINT ../escape: %v", err)
	}
	if got := c.Do(ctx, "LASTSAVE").Val(); got.(int64) < time.Now().Add(-time.Hour).Unix() {
		t.Fatalf("LASTSAVE = %v", got)
	}

	store, err := storage.Open(dir, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	second, err := New(Config{Store: store, Clock: clock.now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, second, store)
	c2 := newClient(t, second)
	for j := range 2000 {
		got, err := c2.Do(ctx, "RL.PGET", "b:"+strconv.Itoa(j), 100, 60000).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(100 - (j%50 + 1)); got != want {
			t.Fatalf("b:%d in the checkpoint has %d tokens, want %d", j, got, want)
		}
	}
	if got := c2.DBSize(ctx).Val(); got < 2000 {
		t.Fatalf("DBSIZE of the checkpoint = %d, want at least 2000", got)
	}
}
