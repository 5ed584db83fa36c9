package storage

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// On one P (a server under taskset -c 0, a pod with cpu: 1) SyncAlways
// must still group the commits of every goroutine that is ready to commit
// into one fsync. Before the committer yielded before taking a round, the
// first Commit's Signal made the committer the next goroutine to run, so
// it took a round of that one Batch and synced it while the others had not
// run yet: one fsync per Batch.
func TestAlwaysGroupsCommitsOnOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	s := openMem(t, vfs.NewMem(), SyncAlways)
	defer s.Close()
	const workers, rounds = 50, 20
	before := s.Stats().Fsyncs
	for r := range rounds {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				b := s.NewBatch()
				<-start
				add(t, b, fmt.Sprintf("w%d", w), uint64(r+1))
				if err := b.Commit(); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
	}
	fsyncs := s.Stats().Fsyncs - before
	// Every worker is runnable when a round begins, so each round of
	// workers should need one or two fsyncs; allow a few more for the
	// scheduler's noise (the race detector shuffles it).
	if commits := int64(workers * rounds); fsyncs*5 > commits {
		t.Fatalf("%d fsyncs for %d commits by %d goroutines on one P: want at most one per 5 commits (group commit)", fsyncs, commits, workers)
	}
	t.Logf("%d fsyncs for %d commits", fsyncs, workers*rounds)
}
