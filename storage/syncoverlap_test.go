package storage

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// heldLogSync wraps fs so that, once armed, the next fsync of the log
// waits: it says so on began and returns what release gives it (nil: the
// sync goes on). Only that one fsync is held.
type heldLogSync struct {
	armed   atomic.Bool
	began   chan struct{}
	release chan error
}

func newHeldLogSync() *heldLogSync {
	return &heldLogSync{began: make(chan struct{}, 1), release: make(chan error, 1)}
}

func (h *heldLogSync) wrap(fs vfs.FS) vfs.FS {
	return errorfs.Wrap(fs, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if (op.Kind != errorfs.OpFileSync && op.Kind != errorfs.OpFileSyncData) || !strings.HasSuffix(op.Path, ".log") || !h.armed.CompareAndSwap(true, false) {
			return nil
		}
		h.began <- struct{}{}
		return <-h.release
	}))
}

// commitAsync commits a change of key from a goroutine of its own and
// gives Commit's result on the channel.
func commitAsync(s *Store, key string) <-chan error {
	res := make(chan error, 1)
	go func() {
		b := s.NewBatch()
		if err := b.Modify([]byte(key), &counter{delta: 1}); err != nil {
			res <- err
			return
		}
		res <- b.Commit()
	}()
	return res
}

// waitQueue waits until cond, called with q locked, holds, and fails the
// test if it does not within a minute (a bound, not an ordering).
func waitQueue(t *testing.T, q *commitQueue, what string, cond func() bool) {
	t.Helper()
	ok := make(chan struct{})
	go func() {
		q.Lock()
		for !cond() {
			q.done.Wait()
		}
		q.Unlock()
		close(ok)
	}()
	select {
	case <-ok:
	case <-time.After(time.Minute):
		t.Fatalf("not within a minute: %s", what)
	}
}

// TestAlwaysAppliesNextRoundDuringFsync: in SyncAlways a committer
// applies its next round while the fsync of the previous one runs, yet
// acknowledges neither before an fsync covers it; after a failed fsync it
// acknowledges neither, though the later round's own fsync would succeed.
// The log's fsync of round a is held until round b is applied: with a
// committer that waits for each round's fsync b is never applied
// meanwhile, and with one that acknowledges a round when it is applied,
// a is acknowledged while its fsync is held.
func TestAlwaysAppliesNextRoundDuringFsync(t *testing.T) {
	for _, fsyncErr := range []error{nil, fmt.Errorf("injected: %w", syscall.EIO)} {
		t.Run(fmt.Sprintf("fsync %v", fsyncErr), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			h := newHeldLogSync()
			s, err := Open("db", Options{Sync: SyncAlways, fs: h.wrap(fs), Committers: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			defer func() {
				select {
				case h.release <- nil: // let a held sync go if the test failed first
				default:
				}
			}()
			q := s.queues[0]
			h.armed.Store(true)
			a := commitAsync(s, "a")
			select {
			case <-h.began:
			case <-time.After(time.Minute):
				t.Fatal("no fsync of the log within a minute of a Commit in always")
			}
			q.Lock()
			roundA := q.round - 1 // taken: its fsync runs
			q.Unlock()
			b := commitAsync(s, "b")
			waitQueue(t, q, "the round after a's applied while a's fsync is held", func() bool { return q.applied > roundA })
			q.Lock()
			synced := q.synced
			q.Unlock()
			if synced >= roundA {
				t.Fatalf("round %d acknowledged as synced (synced round %d) while its fsync is held", roundA, synced)
			}
			select {
			case err := <-a:
				t.Fatalf("a's Commit returned (%v) while its fsync is held", err)
			case err := <-b:
				t.Fatalf("b's Commit returned (%v) while a's fsync, before b's, is held", err)
			default:
			}
			h.release <- fsyncErr
			for name, res := range map[string]<-chan error{"a": a, "b": b} {
				err := <-res
				switch {
				case fsyncErr == nil && err != nil:
					t.Errorf("Commit of %s: %v", name, err)
				case fsyncErr != nil && !errors.Is(err, ErrFailed):
					t.Errorf("Commit of %s after a's fsync failed: %v, want ErrFailed", name, err)
				}
			}
			if fsyncErr != nil {
				if s.Failed() == nil {
					t.Fatal("a's fsync failed and the store goes on")
				}
				return
			}
			c, err := Open("db", Options{fs: fs.CrashClone(vfs.CrashCloneCfg{}), Sync: SyncAlways, Committers: 1, KeyFilterSize: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			got, err := readTogether(c.db, [][]byte{[]byte("a"), []byte("b")})
			if err != nil {
				t.Fatal(err)
			}
			if got[0] != 1 || got[1] != 1 {
				t.Fatalf("after a crash a, b = %v, want both 1: acknowledged, not fsynced", got)
			}
		})
	}
}
