package storage

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
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

// TestPartitionWritesCountOnlyWhileWatched: writes bump their partition's
// count (here the slot's) while someone watches, and only then.
func TestPartitionWritesCountOnlyWhileWatched(t *testing.T) {
	s := openMem(t, vfs.NewMem(), SyncEverySec)
	defer s.Close()
	b := s.NewBatch()
	key := "\x01\x02rest" // slot 0x0102
	add(t, b, key, 1)
	if n := s.PartitionWrites(0x0102); n != 0 {
		t.Fatalf("unwatched write counted: %d", n)
	}
	s.Watch()
	add(t, b, key, 1)
	add(t, b, "\x01\x03other", 1)
	if err := b.Modify([]byte(key), &counter{}); err != nil { // a read
		t.Fatal(err)
	}
	if n := s.PartitionWrites(0x0102); n != 1 {
		t.Fatalf("watched: slot count %d after one write; want 1", n)
	}
	s.Unwatch()
	add(t, b, key, 1)
	if n := s.PartitionWrites(0x0102); n != 1 {
		t.Fatalf("after Unwatch the count moved to %d", n)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestCommitRefusesHeldBatch: Commit on a Batch between Hold and Release
// returns an error instead of handing over part of the transaction (or
// waiting for a committer that waits for the transaction).
func TestCommitRefusesHeldBatch(t *testing.T) {
	s := openMem(t, vfs.NewMem(), SyncEverySec)
	defer s.Close()
	b := s.NewBatch()
	b.Hold(false)
	add(t, b, "a", 1)
	if err := b.Commit(); err == nil || !strings.Contains(err.Error(), "held") {
		b.Release()
		t.Fatalf("Commit of a held batch: %v; want the held batch refused", err)
	}
	b.Release()
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if n, _ := read(t, s, "a"); n != 1 {
		t.Fatalf("a = %d after Release and Commit; want 1", n)
	}
}

// TestShutdownWaitsForTransaction: Shutdown begun while a transaction
// runs lets it finish (its later changes are not refused) and writes all
// of it, so the log never holds part of a transaction.
func TestShutdownWaitsForTransaction(t *testing.T) {
	fs := vfs.NewMem()
	s := openMem(t, fs, SyncEverySec)
	b := s.NewBatch()
	b.Hold(false)
	add(t, b, "a", 1)
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	for !s.guard.closing.Load() { // Shutdown has begun
		runtime.Gosched()
	}
	err := b.Modify([]byte("b"), &counter{delta: 1})
	b.Release()
	if err != nil {
		t.Fatalf("a change of a transaction under way when Shutdown began: %v; want it made", err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c := openMem(t, fs, SyncAlways)
	defer c.Close()
	a, _ := read(t, c, "a")
	bv, _ := read(t, c, "b")
	if a != 1 || bv != 1 {
		t.Fatalf("after Shutdown the log holds a = %d, b = %d; want both 1", a, bv)
	}
}

// TestTransactionRefusedMidwayReachesNoLog: if the store closes while a
// transaction runs (Shutdown past its deadline), the change refused
// midway takes the earlier ones with it: Release hands none of them to
// the committer and Commit reports ErrClosed.
func TestTransactionRefusedMidwayReachesNoLog(t *testing.T) {
	fs := vfs.NewMem()
	s := openMem(t, fs, SyncEverySec)
	b := s.NewBatch()
	b.Hold(false)
	add(t, b, "a", 1)
	s.closed.Store(true) // as Shutdown does once its deadline passed
	if err := b.Modify([]byte("b"), &counter{delta: 1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("a change after the store closed: %v; want ErrClosed", err)
	}
	b.Release()
	if err := b.Commit(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Commit of a transaction refused midway: %v; want ErrClosed", err)
	}
	s.closed.Store(false) // let Close drain the queue, to see what Release handed over
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	c := openMem(t, fs, SyncAlways)
	defer c.Close()
	if _, found := read(t, c, "a"); found {
		t.Fatal("the log holds the change made before the refused one: part of a transaction")
	}
}

// TestCommitterRoundNeverSplitsTransaction: a transaction cannot run
// while the committer reads a round's values, so a round never holds
// one key's value from before a transaction and another's from after it.
// The committer's hook, after it read a (whose change, like b's, is in
// the round), runs a transaction on a and b if it can take it at once;
// the round must then not write the transaction's b beside the old a.
func TestCommitterRoundNeverSplitsTransaction(t *testing.T) {
	var (
		s      *Store
		state  int
		logged [2][]byte // a and b in Pebble once the first round is applied
	)
	hook := func(key []byte) {
		switch {
		case state == 0 && string(key) == "a":
			state = 1
			if !s.txMu.TryLock() {
				return // the transaction would wait for the round: as it must
			}
			s.txMu.Unlock()
			b := s.NewBatch()
			b.Hold(false)
			_ = b.Modify([]byte("a"), &counter{delta: 1})
			_ = b.Modify([]byte("b"), &counter{delta: 1})
			b.Release()
		case state == 1 && string(key) == "b":
			state = 2
		case state == 2: // the next round: the first one is in Pebble
			state = 3
			for i, k := range []string{"a", "b"} {
				v, closer, err := s.db.Get([]byte(k))
				if err == nil {
					logged[i] = bytes.Clone(v)
					closer.Close()
				}
			}
		}
	}
	fs := vfs.NewMem()
	var err error
	s, err = Open("db", Options{Sync: SyncAlways, fs: fs, afterKey: hook})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := s.NewBatch()
	add(t, b, "a", 1)
	add(t, b, "b", 1)
	if err := b.Commit(); err != nil { // the first round, synced
		t.Fatal(err)
	}
	// A transaction after it, for a second round (the hook's, if it ran,
	// came first).
	b.Hold(false)
	add(t, b, "c", 1)
	b.Release()
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if state != 3 {
		t.Fatalf("the committer's hook reached state %d; want 3", state)
	}
	if !bytes.Equal(logged[0], logged[1]) {
		t.Fatalf("after the first round the log holds a = %x, b = %x: a transaction's change of b went into a round that had read a before it", logged[0], logged[1])
	}
}

// TestHeldBatchNotRefusedByFailingDisk: a transaction is not stopped
// midway (or at all) by writes to the disk failing: its changes are made
// and queued together, Commit reports the failure, and once the disk
// takes writes again the log gets all of them.
func TestHeldBatchNotRefusedByFailingDisk(t *testing.T) {
	disk := NewMemDisk()
	s := openDisk(t, disk, SyncEverySec)
	failing := make(chan struct{}, 1)
	s.guard.sleep = func(time.Duration) { // between retries: the store refuses changes
		select {
		case failing <- struct{}{}:
		default:
		}
		time.Sleep(100 * time.Microsecond)
	}
	b := s.NewBatch()
	disk.FailWrites(errDiskFull)
	add(t, b, "before", 1)
	if err := b.Commit(); err != nil { // everysec: acknowledged once queued
		t.Fatal(err)
	}
	<-failing
	b.Hold(false)
	errA := b.Modify([]byte("a"), &counter{delta: 1})
	errB := b.Modify([]byte("b"), &counter{delta: 1})
	b.Release()
	if errA != nil || errB != nil {
		t.Fatalf("a transaction's changes while the disk fails: %v, %v; want them made and queued", errA, errB)
	}
	if err := b.Commit(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Commit of the transaction while the disk fails: %v; want ErrUnavailable", err)
	}
	disk.FailWrites(nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openDisk(t, disk, SyncEverySec)
	defer s.Close()
	for _, k := range []string{"before", "a", "b"} {
		if got, _ := read(t, s, k); got != 1 {
			t.Fatalf("after recovery %s = %d; want 1", k, got)
		}
	}
}
