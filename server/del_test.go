package server

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// DEL removes every record of a key, of every kind and parameter set, and
// nothing else: not another key of the same hash slot, not a divvy counter.
func TestDelRemovesEveryKind(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock(t0)
	path := filepath.Join(t.TempDir(), "policy.ini")
	if err := os.WriteFile(path, []byte("[default]\nactorField = user\ncreditLimit = 5\nresetSeconds = 60\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, Config{Clock: clock.now, Policy: policycmd.Config{File: path}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	c := newClient(t, srv)
	for _, k := range []string{"{u}a", "{u}b", "bin\xff\x00"} {
		for _, cmd := range [][]any{
			{"RL.REDUCE", k, 10, 60},
			{"RL.REDUCE", k, 20, 60, "TAKE", 3}, // another parameter set: another bucket
			{"CL.THROTTLE", k, 15, 30, 60},
			{"FW.INCR", k, 5, 300},
			{"FW.INCR", k, 5, 60}, // another window length: another counter
			{"FW.PINCR", k, 5, 300000, "STAGGER"},
			{"ROLL.LIMIT", k, 60000, 5},
		} {
			if err := c.Do(ctx, cmd...).Err(); err != nil {
				t.Fatalf("%v: %v", cmd, err)
			}
		}
	}
	if err := c.Do(ctx, "HIT", "user={u}a").Err(); err != nil {
		t.Fatal(err)
	}
	if keyspace.Slot([]byte("{u}a")) != keyspace.Slot([]byte("{u}b")) {
		t.Fatal("the test needs two keys of one slot")
	}
	if got := dbSize(t, c); got != 3*7+1 {
		t.Fatalf("DBSIZE = %d, want 22", got)
	}

	// Two of the keys had records, "missing" none; a key named twice counts once.
	n, err := c.Do(ctx, "DEL", "{u}a", "missing", "bin\xff\x00", "{u}a").Int64()
	if err != nil || n != 2 {
		t.Fatalf("DEL = %d, %v; want 2", n, err)
	}
	if got := dbSize(t, c); got != 7+1 {
		t.Fatalf("DBSIZE after DEL = %d, want 8: {u}b's seven records and the divvy counter", got)
	}
	if n, err := c.Do(ctx, "del", "{u}a").Int64(); err != nil || n != 0 {
		t.Fatalf("DEL of a deleted key = %d, %v; want 0", n, err)
	}
	// The deleted key starts afresh in every kind; its slot neighbour and
	// the counter are as they were.
	if v, _ := c.Do(ctx, "RL.GET", "{u}a", 20, 60).Int64(); v != 20 {
		t.Errorf("bucket of {u}a after DEL: %d tokens, want 20", v)
	}
	if v, _ := c.Do(ctx, "RL.GET", "{u}b", 20, 60).Int64(); v != 17 {
		t.Errorf("bucket of {u}b: %d tokens, want 17", v)
	}
	wantInts(t, c, []int64{0, 16, 15, -1, 2}, "CL.THROTTLE", "{u}a", 15, 30, 60)
	wantInts(t, c, []int64{0, 16, 14, -1, 4}, "CL.THROTTLE", "{u}b", 15, 30, 60)
	wantInts(t, c, []int64{0, 5, 5, -1, 100, 0, 1700000100}, "FW.GET", "bin\xff\x00", 5, 300)
	wantInts(t, c, []int64{0, 5, 4, -1, 100, 1, 1700000100}, "FW.GET", "{u}b", 5, 300)
	wantInts(t, c, []int64{0, 0, 0, 0, 4}, "ROLL.WOULDLIMIT", "{u}a", 60000, 5)
	wantInts(t, c, []int64{0, 0, 0, 0, 3}, "ROLL.WOULDLIMIT", "{u}b", 60000, 5)
	hit, err := c.Do(ctx, "HIT", "user={u}a").Slice()
	if err != nil || hit[1] != int64(3) {
		t.Errorf("HIT after DEL = %v, %v; want 3 credits left: DEL leaves divvy counters alone", hit, err)
	}

	for _, bad := range [][]any{{"DEL"}, {"DEL", strings.Repeat("k", 16<<10+1)}} {
		if err := c.Do(ctx, bad...).Err(); err == nil {
			t.Errorf("%v: no error", bad)
		} else {
			t.Logf("%v: %v", bad[0], err)
		}
	}
}

// A DEL in --fsync always is durable when answered, and the pipeline's own
// writes before it are deleted too.
func TestDelDurable(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	store, err := storage.Open(dir, StoreOptions(storage.Options{Sync: storage.SyncAlways}))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Store: store, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, store)
	c := newClient(t, srv)
	p := c.Pipeline()
	p.Do(ctx, "CL.THROTTLE", "k", 1, 1, 60)
	p.Do(ctx, "FW.INCR", "k", 5, 300)
	p.Do(ctx, "ROLL.LIMIT", "k", 60000, 5)
	p.Do(ctx, "CL.THROTTLE", "kept", 1, 1, 60)
	del := p.Do(ctx, "DEL", "k")
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := del.Int64(); n != 1 {
		t.Fatalf("DEL after writes in the same pipeline = %d, want 1", n)
	}
	if got := dbSize(t, c); got != 1 {
		t.Fatalf("DBSIZE = %d, want 1", got)
	}
	// What the store holds once the server is gone: the DEL is in it.
	srv.Close()
	store.Close()
	var keys []string
	if err := storage.Inspect(dir, func(k, _ []byte) bool {
		r, err := keyspace.Parse(k)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, r.Kind.Name+":"+string(r.Key))
		return true
	}, nil); err != nil {
		t.Fatal(err)
	}
	if strings.Join(keys, ",") != "gcra:kept" {
		t.Fatalf("store holds %v after DEL, want only gcra:kept", keys)
	}
}

// The sweep deletes GCRA and window records that mean the same as none, on
// the server clock, and keeps live ones; INFO and /metrics count the
// records of each kind.
func TestSweepIdleGCRAAndWindows(t *testing.T) {
	ctx := context.Background()
	// A whole multiple of 2520 s, and so of every window of 1 to 10 s.
	const t0 = int64(1699999560) * 1000
	clock := newTestClock(t0)
	srv := startServer(t, Config{Clock: clock.now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	c := newClient(t, srv)
	for i := range 10 {
		k := "k" + strconv.Itoa(i)
		for _, cmd := range [][]any{
			{"CL.PTHROTTLE", k, 0, 1, 1000 * (i + 1)}, // full again after (i+1) s
			{"FW.PINCR", k, 5, 1000 * (i + 1)},        // windows of (i+1) s, aligned
			{"RL.PREDUCE", k, 1, 1000 * (i + 1)},      // full after (i+1) s
		} {
			if err := c.Do(ctx, cmd...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	counts := func() string {
		var b strings.Builder
		for _, kind := range []string{"bucket", "gcra", "window"} {
			b.WriteString(kind + "=" + infoField(t, c, "keyspace", "keys_"+kind) + " ")
		}
		return strings.TrimSpace(b.String())
	}
	if got := counts(); got != "bucket=10 gcra=10 window=10" {
		t.Fatalf("before the sweep: %s", got)
	}
	if got := infoField(t, c, "storage", "records_gcra"); got != "10" {
		t.Fatalf("INFO storage records_gcra:%s, want 10", got)
	}
	// Nothing is idle yet.
	if err := c.Do(ctx, "COMPACT").Err(); err != nil {
		t.Fatal(err)
	}
	if got := counts(); got != "bucket=10 gcra=10 window=10" {
		t.Fatalf("after a sweep with nothing idle: %s", got)
	}
	// 5.5 s later, the records of periods up to 5 s are idle: the buckets
	// and GCRA keys are full again, the windows of up to 5 s have ended.
	clock.ms.Store(t0 + 5500)
	if err := c.Do(ctx, "COMPACT").Err(); err != nil {
		t.Fatal(err)
	}
	if got := counts(); got != "bucket=5 gcra=5 window=5" {
		t.Fatalf("after the sweep at +5.5 s: %s", got)
	}
	// The live ones kept their state.
	wantInts(t, c, []int64{1, 1, 0, 500, 500}, "CL.PTHROTTLE", "k5", 0, 1, 6000)
	wantInts(t, c, []int64{0, 5, 4, -1, 500, 1, t0 + 6000}, "FW.PGET", "k5", 5, 6000)

	_, metrics := get(t, serveHTTPOn(t, srv)+"/metrics")
	for _, want := range []string{`sluice_records{kind="gcra"} 5`, `sluice_records{kind="window"} 5`, `sluice_records{kind="bucket"} 5`, `sluice_records{kind="divvy"} 0`, `sluice_buckets 15`} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
