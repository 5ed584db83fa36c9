package storage

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestHeldBatchIsOneRound runs transactions (Hold, changes, Release,
// Commit) that add 1 to a, to other keys, then to b, while crash copies of
// the disk are taken: in every copy a equals b, so the log got
// each transaction's changes in one round or not at all, even while the
// committer was reading a round's values as another transaction ran.
func TestHeldBatchIsOneRound(t *testing.T) {
	fs := vfs.NewCrashableMem()
	// In everysec mode transactions do not wait for the committer, so
	// they run while it reads a round's values; a short interval syncs
	// often, for the crash copies.
	s, err := Open("db", Options{Sync: SyncEverySec, SyncInterval: time.Millisecond, fs: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const fillers = 30
	var (
		wg   sync.WaitGroup
		stop atomic.Bool
		txs  atomic.Int64
	)
	for w := range 3 {
		wg.Go(func() {
			b := s.NewBatch()
			for !stop.Load() {
				b.Hold(false)
				err := b.Modify([]byte("a"), &counter{delta: 1})
				for f := range fillers {
					if err == nil {
						err = b.Modify(fmt.Appendf(nil, "f%d-%d", w, f), &counter{delta: 1})
					}
				}
				if err == nil {
					err = b.Modify([]byte("b"), &counter{delta: 1})
				}
				b.Release()
				if err == nil {
					err = b.Commit()
				}
				if err != nil {
					t.Error(err)
					stop.Store(true)
					return
				}
				txs.Add(1)
			}
		})
	}
	for i := range 12 {
		for n := txs.Load(); txs.Load() < n+3 && !stop.Load(); { // a few transactions between copies
			runtime.Gosched()
		}
		crashed := fs.CrashClone(vfs.CrashCloneCfg{})
		c := openMem(t, crashed, SyncAlways)
		a, _ := read(t, c, "a")
		b, _ := read(t, c, "b")
		c.Close()
		if a != b {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("crash copy %d: a = %d, b = %d; a transaction's changes reached the log in two rounds", i, a, b)
		}
	}
	stop.Store(true)
	wg.Wait()
}

// TestSlotWritesCountOnlyWhileWatched: writes bump their slot's count
// while someone watches, and only then.
func TestSlotWritesCountOnlyWhileWatched(t *testing.T) {
	s := openMem(t, vfs.NewMem(), SyncEverySec)
	defer s.Close()
	b := s.NewBatch()
	key := "\x01\x02rest" // slot 0x0102
	add(t, b, key, 1)
	if n := s.SlotWrites(0x0102); n != 0 {
		t.Fatalf("unwatched write counted: %d", n)
	}
	s.Watch()
	add(t, b, key, 1)
	add(t, b, "\x01\x03other", 1)
	if err := b.Modify([]byte(key), &counter{}); err != nil { // a read
		t.Fatal(err)
	}
	if n := s.SlotWrites(0x0102); n != 1 {
		t.Fatalf("watched: slot count %d after one write; want 1", n)
	}
	s.Unwatch()
	add(t, b, key, 1)
	if n := s.SlotWrites(0x0102); n != 1 {
		t.Fatalf("after Unwatch the count moved to %d", n)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
}
