package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestClusterReshardUnderLoad is issue 17's second must-show: three nodes
// grow to four and shrink back to three with sluice cluster rebalance
// while 8 goroutines reduce a known set of buckets through go-redis'
// ClusterClient. Every reduce is at the same instant (AT) of buckets that
// do not refill meanwhile, so each bucket must end holding its size minus
// the reduces its clients were told succeeded: nothing lost, nothing
// counted twice. The clients may see MOVED and TRYAGAIN, which go-redis
// follows and retries; any other error fails the test.
func TestClusterReshardUnderLoad(t *testing.T) {
	addrs := freePorts(t, 4)
	procs := make([]*proc, 4)
	for i := range procs {
		procs[i] = startProc(t, t.TempDir(), "--addr", addrs[i], "--cluster-nodes", strings.Join(addrs, ","), "--cluster-size", "3", "--cluster-ordinal", strconv.Itoa(i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const (
		buckets = 2000
		size    = 1_000_000
		workers = 8
	)
	var counts [buckets]atomic.Int64
	var ops atomic.Int64
	var stop atomic.Bool
	errc := make(chan error, workers)
	progress := make(chan struct{}, 1)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRedirects: 16, MaxRetries: 100,
				MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
			defer cc.Close()
			for n := 0; !stop.Load(); n++ {
				b := (w*7919 + n*31) % buckets
				err := cc.Do(ctx, "RL.REDUCE", "bucket:"+strconv.Itoa(b), size, size, "TAKE", 1, "AT", clusterAt).Err()
				if err != nil {
					errc <- err
					return
				}
				counts[b].Add(1)
				if ops.Add(1)%500 == 0 {
					select {
					case progress <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	// waitOps waits until the clients have done n more reduces.
	waitOps := func(n int64) {
		t.Helper()
		target := ops.Load() + n
		for ops.Load() < target {
			select {
			case <-progress:
			case err := <-errc:
				t.Fatalf("a client got an error: %v", err)
			}
		}
	}
	rebalance := func(nodes ...string) string {
		t.Helper()
		var out bytes.Buffer
		err := runReloading(ctx, nil, []string{"cluster", "rebalance", "--nodes", strings.Join(nodes, ",")}, noEnvLookup, nil, &out, &out)
		if err != nil {
			t.Fatalf("rebalance to %d nodes: %v\n%s", len(nodes), err, out.String())
		}
		t.Logf("rebalance to %d nodes:\n%s", len(nodes), out.String())
		return out.String()
	}
	plain := make([]*redis.Client, 4)
	for i, p := range procs {
		plain[i] = p.client(t)
	}
	dbsize := func(i int) int64 {
		n, err := plain[i].DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	waitOps(3000)
	rebalance(addrs...)
	waitOps(3000)
	if n := dbsize(3); n == 0 {
		t.Fatal("after 3 → 4 nodes, the fourth holds no bucket")
	}
	rebalance(addrs[:3]...)
	waitOps(3000)
	stop.Store(true)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatalf("a client got an error: %v", err)
	default:
	}
	if n := dbsize(3); n != 0 {
		t.Fatalf("after 4 → 3 nodes, the fourth still holds %d records", n)
	}
	var total int64
	for i := range 3 {
		total += dbsize(i)
	}
	touched := int64(0)
	for b := range counts {
		if counts[b].Load() > 0 {
			touched++
		}
	}
	if total != touched {
		t.Fatalf("the nodes hold %d records, the clients touched %d buckets", total, touched)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs[:3]})
	defer cc.Close()
	cmds, err := cc.Pipelined(ctx, func(p redis.Pipeliner) error {
		for b := range buckets {
			p.Do(ctx, "RL.GET", "bucket:"+strconv.Itoa(b), size, size, "AT", clusterAt)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for b, c := range cmds {
		got, err := c.(*redis.Cmd).Int64()
		if want := size - counts[b].Load(); err != nil || got != want {
			t.Errorf("bucket %d: %d tokens (%v), want %d: %d reduces acknowledged", b, got, err, want, counts[b].Load())
		}
	}
	t.Logf("%d reduces, %d buckets", ops.Load(), touched)
}

func noEnvLookup(string) (string, bool) { return "", false }
