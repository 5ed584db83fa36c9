package storage

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestEverySyncKindFailsTheStore: a failed sync of each kind Pebble makes
// on a real filesystem (the log's fdatasync, a table's sync_file_range
// while it is written and its fdatasync at the end, the MANIFEST's fsync,
// the data directory's fsync) reaches the guard and fails the store, even
// though, as after a real writeback error, the same sync succeeds if it is
// tried again. None is retried into a false success or swallowed, and
// nothing is acknowledged after it.
func TestEverySyncKindFailsTheStore(t *testing.T) {
	for _, c := range []struct {
		name string
		kind errorfs.OpKind
		file func(dir, path string) bool
		// bigTables gives level 0 and the base level the table size of
		// the level below the base (8 MiB): Pebble syncs a table by range
		// only past 1.5 MiB, which a store this small, with its smaller
		// tables (compactionOptions), never writes.
		bigTables bool
	}{
		{"log fdatasync", errorfs.OpFileSyncData, hasSuffix(".log"), false},
		{"table sync_file_range", errorfs.OpFileSyncTo, hasSuffix(".sst"), true},
		{"table fdatasync", errorfs.OpFileSyncData, hasSuffix(".sst"), false},
		{"MANIFEST fsync", errorfs.OpFileSync, func(_, p string) bool { return strings.HasPrefix(filepath.Base(p), "MANIFEST-") }, false},
		{"directory fsync", errorfs.OpFileSync, func(dir, p string) bool { return p == dir }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			var armed, injected atomic.Bool
			var mu sync.Mutex
			var failedPath string
			fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
				if op.Kind != c.kind || !armed.Load() || !c.file(dir, op.Path) || injected.Swap(true) {
					return nil
				}
				mu.Lock()
				failedPath = op.Path
				mu.Unlock()
				return fmt.Errorf("injected: %w", syscall.EIO)
			}))
			o := Options{Sync: SyncAlways, fs: fs}
			if c.bigTables {
				o.pebble = func(po *pebble.Options) {
					po.TargetFileSizes[0], po.TargetFileSizes[1] = po.TargetFileSizes[2], po.TargetFileSizes[2]
				}
			}
			s, err := Open(dir, o)
			if err != nil {
				t.Fatal(err)
			}
			var faults atomic.Int32
			s.guard.fatal = func(err error) { // observe, then fail the store as usual
				faults.Add(1)
				s.fail(err)
			}
			armed.Store(true)
			// Enough incompressible data for tables past Pebble's
			// sync_file_range threshold (1 MiB and 512 KiB more), then a
			// compaction: every kind of sync happens. Its goroutine may
			// stay parked on the failed sync.
			done := make(chan struct{})
			go func() {
				defer close(done)
				b := s.NewBatch()
				for i := range 5000 {
					v := make([]byte, 1000)
					rand.Read(v)
					if b.Modify(fmt.Appendf(nil, "k%05d", i), mutatorFunc(func([]byte, bool) ([]byte, Op, error) { return v, Put, nil })) != nil {
						return
					}
					if i%100 == 99 && b.Commit() != nil {
						return
					}
				}
				_ = s.Compact(context.Background())
			}()
			select {
			case <-s.FailedC():
			case <-done:
				if s.Failed() == nil {
					t.Fatalf("the workload finished and the store goes on, though a sync failed (injected: %v)", injected.Load())
				}
			case <-time.After(time.Minute):
				t.Fatalf("the store has not failed a minute after the workload began (injected: %v)", injected.Load())
			}
			mu.Lock()
			path := failedPath
			mu.Unlock()
			if path == "" || faults.Load() == 0 {
				t.Fatalf("the store failed with %v, not through the guard on the injected sync (of %q)", s.Failed(), path)
			}
			if err := s.Failed(); err == nil || !strings.Contains(err.Error(), "injected") || !strings.Contains(err.Error(), path) {
				t.Fatalf("Failed() = %v, want the injected error naming %s", err, path)
			}
			if err := s.NewBatch().Modify([]byte("after"), &counter{delta: 1}); !errors.Is(err, ErrFailed) {
				t.Fatalf("a change after the failed %s: %v, want ErrFailed", c.name, err)
			}
		})
	}
}

func hasSuffix(suffix string) func(dir, path string) bool {
	return func(_, p string) bool { return strings.HasSuffix(p, suffix) }
}
