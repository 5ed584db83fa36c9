package storage

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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

// commitHeld arms h and commits a change of key as commitAsync does,
// once the fsync of the log that covers it is held.
func (h *heldLogSync) commitHeld(t *testing.T, s *Store, key string) <-chan error {
	t.Helper()
	h.armed.Store(true)
	res := commitAsync(s, key)
	select {
	case <-h.began:
	case <-time.After(time.Minute):
		t.Fatal("no fsync of the log within a minute of a Commit in always")
	}
	return res
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

// crashValues opens what a crash would leave of fs now, only synced data
// kept, and returns the counters of keys there.
func crashValues(t *testing.T, fs *vfs.MemFS, keys ...string) []int {
	t.Helper()
	c, err := Open("db", Options{fs: fs.CrashClone(vfs.CrashCloneCfg{}), Sync: SyncAlways, NoKeyFilter: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bs := make([][]byte, len(keys))
	for i, k := range keys {
		bs[i] = []byte(k)
	}
	got, err := readTogether(c.db, bs)
	if err != nil {
		t.Fatal(err)
	}
	return got
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
			s, err := Open("db", Options{Sync: SyncAlways, fs: h.wrap(fs), Committers: 1, overlapSyncs: true})
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
			a := h.commitHeld(t, s, "a")
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
			if got := crashValues(t, fs, "a", "b"); got[0] != 1 || got[1] != 1 {
				t.Fatalf("after a crash a, b = %v, want both 1: acknowledged, not fsynced", got)
			}
		})
	}
}

// TestAlwaysCrossReadWaitsForOtherCommittersFsync: a transaction over
// several committers' keys that only reads records whose rounds, of other
// committers than the one running the cross round, were applied and wait
// for their fsync, is acknowledged only once that fsync returned. The
// cross round then writes nothing of its own, so no fsync of its own
// covers those rounds: it must still not publish the transaction as
// synced before them. With the log's fsync held, the test waits until
// either the transaction's Commit returns (acknowledged too early) or the
// cross round hands Pebble a batch (WAL.BytesIn grows), which then waits
// for the held fsync.
func TestAlwaysCrossReadWaitsForOtherCommittersFsync(t *testing.T) {
	fs := vfs.NewCrashableMem()
	h := newHeldLogSync()
	s, err := Open("db", Options{Sync: SyncAlways, fs: h.wrap(fs), Committers: 3, Partitions: 3, Partition: digitPartition})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	released := false
	defer func() {
		if !released {
			h.release <- nil // let the held sync go if the test failed first
		}
	}()
	// "1a" and "2c" belong to committers 1 and 2; committer 0, which runs
	// the cross round, has no round of its own waiting for an fsync.
	a := h.commitHeld(t, s, "1a")
	q2 := s.queues[2]
	c := commitAsync(s, "2c")
	waitQueue(t, q2, "2c's round applied while 1a's fsync is held", func() bool { return q2.applied > 0 })
	bytesIn := s.db.Metrics().WAL.BytesIn
	tx := make(chan error, 1)
	seen := make([]uint64, 2)
	go func() {
		b := s.NewBatch()
		b.Hold(false)
		for i, key := range []string{"1a", "2c"} {
			m := &counter{} // reads, changes nothing
			if err := b.Modify([]byte(key), m); err != nil {
				b.Release()
				tx <- err
				return
			}
			seen[i] = m.seen
		}
		b.Release()
		tx <- b.Commit()
	}()
	deadline := time.Now().Add(time.Minute) // a bound, not an ordering
	for {
		select {
		case err := <-tx:
			t.Fatalf("the transaction that read 1a and 2c was acknowledged (%v) while the fsync of the rounds that wrote them is held", err)
		default:
		}
		if s.db.Metrics().WAL.BytesIn > bytesIn {
			break // the cross round went to the log, and waits for its fsync
		}
		if time.Now().After(deadline) {
			t.Fatal("neither an acknowledgement nor a cross round in the log within a minute")
		}
		runtime.Gosched()
	}
	select {
	case err := <-tx:
		t.Fatalf("the transaction was acknowledged (%v) while the fsync is held", err)
	default:
	}
	released = true
	h.release <- nil
	for name, res := range map[string]<-chan error{"1a": a, "2c": c, "the transaction": tx} {
		if err := <-res; err != nil {
			t.Fatalf("Commit of %s: %v", name, err)
		}
	}
	if seen[0] != 1 || seen[1] != 1 {
		t.Fatalf("the transaction read 1a, 2c = %v, want 1, 1", seen)
	}
	if got := crashValues(t, fs, "1a", "2c"); got[0] != 1 || got[1] != 1 {
		t.Fatalf("after a crash 1a, 2c = %v, want 1, 1", got)
	}
}

// TestAlwaysLastSyncCoversWhatWasWrittenBefore: the time of the last
// fsync (INFO's last_fsync_time, sluice_last_fsync_timestamp_seconds,
// the CloseError) promises that everything written before it survives a
// crash. In always a committer writes its next round while a round's
// fsync runs, so the time the round is acknowledged (or its fsync
// returned) is after a write that no fsync covers yet: the time must be
// the one before the round went to the log. The clock is the test's:
// round a is written at t1, round b at t2 while a's fsync is held, a is
// acknowledged at t3 while b's fsync is held in turn.
func TestAlwaysLastSyncCoversWhatWasWrittenBefore(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	t1, t2, t3 := base.Add(time.Minute), base.Add(2*time.Minute), base.Add(3*time.Minute)
	var clock atomic.Int64
	clock.Store(base.UnixNano())
	fs := vfs.NewCrashableMem()
	h := newHeldLogSync()
	s, err := Open("db", Options{Sync: SyncAlways, fs: h.wrap(fs), Committers: 1, overlapSyncs: true, now: func() time.Time { return time.Unix(0, clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	held := 0 // fsyncs held and not released yet
	defer func() {
		for ; held > 0; held-- {
			h.release <- nil // let a held sync go if the test failed first
		}
	}()
	q := s.queues[0]
	clock.Store(t1.UnixNano())
	a := h.commitHeld(t, s, "a")
	held++
	q.Lock()
	roundA := q.round - 1
	q.Unlock()
	clock.Store(t2.UnixNano())
	b := commitAsync(s, "b")
	waitQueue(t, q, "b's round applied while a's fsync is held", func() bool { return q.applied > roundA })
	h.armed.Store(true) // b's fsync, which comes next, is held too
	clock.Store(t3.UnixNano())
	h.release <- nil
	held--
	if err := <-a; err != nil {
		t.Fatalf("Commit of a: %v", err)
	}
	select {
	case <-h.began:
		held++
	case <-time.After(time.Minute):
		t.Fatal("b's fsync did not begin within a minute of a's")
	}
	if last := s.Stats().LastSync; !last.Before(t2) {
		t.Fatalf("last fsync %v, not before %v when b was written, whose fsync is held: b is not covered", last.UTC(), t2.UTC())
	}
	h.release <- nil
	held--
	if err := <-b; err != nil {
		t.Fatalf("Commit of b: %v", err)
	}
	if last := s.Stats().LastSync; last.Before(t2) {
		t.Fatalf("last fsync %v once b's fsync returned, before %v when b was written", last.UTC(), t2.UTC())
	}
}

// TestShutdownCountsASyncingKeyOnce: a Shutdown that gives up while a
// round's fsync is under way (its records stay dirty until it returns)
// reports the round's key as written to the log and not synced, not as
// unwritten too.
func TestShutdownCountsASyncingKeyOnce(t *testing.T) {
	h := newHeldLogSync()
	s, err := Open("db", Options{Sync: SyncAlways, fs: h.wrap(vfs.NewMem()), Committers: 3, Partitions: 3, Partition: digitPartition})
	if err != nil {
		t.Fatal(err)
	}
	res := h.commitHeld(t, s, "1a")
	q := s.queues[1]
	waitQueue(t, q, "1a's round applied while its fsync is held", func() bool { return q.applied > 0 })
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // gives up at once: the fsync is held
	err = s.Shutdown(ctx)
	h.release <- nil
	<-res
	var ce *CloseError
	if !errors.As(err, &ce) {
		t.Fatalf("Shutdown during a held fsync: %v; want a CloseError", err)
	}
	if ce.Unwritten != 0 || ce.Unsynced != 1 {
		t.Errorf("CloseError counts %d unwritten and %d unsynced; want 0 and 1, the key whose fsync was under way", ce.Unwritten, ce.Unsynced)
	}
}

// TestFsyncTimeIsTheFsyncs: a round whose fsync ran while its committer
// went on counts the fsync's own time in FsyncTime (INFO's
// fsync_avg_usec), from the apply to the fsync's return, not the time
// until the committer came back to it.
func TestFsyncTimeIsTheFsyncs(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	var clock atomic.Int64
	clock.Store(base.Add(10 * time.Second).UnixNano()) // the committer comes back late
	s, err := Open("db", Options{Sync: SyncAlways, fs: vfs.NewMem(), now: func() time.Time { return time.Unix(0, clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := s.Stats()
	p := &syncingRound{batch: s.db.NewBatch(), q: s.queues[0], t0: base, t1: base.Add(3 * time.Millisecond), returned: true}
	s.settle(&roundBufs{syncing: p})
	st := s.Stats()
	if n, d := st.Fsyncs-before.Fsyncs, st.FsyncTime-before.FsyncTime; n != 1 || d != 3*time.Millisecond {
		t.Errorf("%d fsyncs taking %v; want one of 3ms", n, d)
	}
}
