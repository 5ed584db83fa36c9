package main

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// takers take a token from each of their buckets again and again, from a
// cluster client, counting each bucket's takes acknowledged and those
// that failed (made or not: the reply was lost), so that a test can then
// check that no acknowledged take was lost and none counted twice.
type takers struct {
	cc    *redis.ClusterClient
	keys  []string
	limit int64

	mu            sync.Mutex
	acked, failed []int64

	stopped atomic.Bool
	wg      sync.WaitGroup
}

func newTakers(cc *redis.ClusterClient, keys []string, limit int64) *takers {
	return &takers{cc: cc, keys: keys, limit: limit, acked: make([]int64, len(keys)), failed: make([]int64, len(keys))}
}

// take takes one token from bucket b, and counts it.
func (tk *takers) take(ctx context.Context, b int) error {
	n, err := tk.cc.Do(ctx, "RL.REDUCE", tk.keys[b], tk.limit, 3600, "AT", clusterAt).Int64()
	tk.mu.Lock()
	defer tk.mu.Unlock()
	switch {
	case err != nil:
		tk.failed[b]++
	case n >= 1:
		tk.acked[b]++
	}
	return err
}

// run starts workers goroutines, each taking from its share of the
// buckets until stop or deadline, pausing after a failure.
func (tk *takers) run(ctx context.Context, workers int, deadline time.Time) {
	for w := range workers {
		tk.wg.Add(1)
		go func() {
			defer tk.wg.Done()
			for !tk.stopped.Load() && time.Now().Before(deadline) {
				for b := w; b < len(tk.keys); b += workers {
					if tk.take(ctx, b) != nil {
						time.Sleep(10 * time.Millisecond)
					}
				}
			}
		}()
	}
}

// stop stops the workers and waits for them.
func (tk *takers) stop() {
	tk.stopped.Store(true)
	tk.wg.Wait()
}

// check reads every bucket (retrying until deadline) once the workers
// stopped, and fails each that does not hold its limit less the takes
// acknowledged, less at most those that failed; it returns the takes
// acknowledged and failed in all.
func (tk *takers) check(t *testing.T, ctx context.Context, deadline time.Time, when string) (acked, failed int64) {
	t.Helper()
	for b, key := range tk.keys {
		acked, failed = acked+tk.acked[b], failed+tk.failed[b]
		for {
			n, err := tk.cc.Do(ctx, "RL.GET", key, tk.limit, 3600, "AT", clusterAt).Int64()
			if err == nil {
				if want := tk.limit - tk.acked[b]; n > want || n < want-tk.failed[b] {
					t.Errorf("%s %s: %d tokens left after %d takes acknowledged and %d failed; want %d less at most %d", key, when, n, tk.acked[b], tk.failed[b], want, tk.failed[b])
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s %s: %v", key, when, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return acked, failed
}
