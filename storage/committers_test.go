package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/sluicehq/sluice/keyspace"
)

// TestKeysGoToTheirCommitter: with the server's partition, committer i of
// K writes the hash slots from i×16384/K on, read from a record key's first
// two bytes, and any Partition divides its partitions the same way.
func TestKeysGoToTheirCommitter(t *testing.T) {
	s, err := Open("db", Options{fs: vfs.NewMem(), Committers: 4, Partition: keyspace.Partition, Partitions: keyspace.Partitions})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	slotKey := func(slot uint16) []byte { return binary.BigEndian.AppendUint16(nil, slot) }
	for _, c := range []struct {
		key  []byte
		want int
	}{
		{slotKey(0), 0}, {slotKey(4095), 0}, {slotKey(4096), 1}, {slotKey(8191), 1},
		{slotKey(8192), 2}, {slotKey(12288), 3}, {slotKey(16383), 3},
		{[]byte{}, 0}, {[]byte{0x3f}, 0}, // shorter than a slot: slot 0
	} {
		if got := s.committerOf(c.key); got != c.want {
			t.Errorf("key %x: committer %d, want %d", c.key, got, c.want)
		}
	}
	if st := s.Stats(); st.Committers != 4 {
		t.Errorf("Stats.Committers = %d, want 4", st.Committers)
	}

	s2, err := Open("db2", Options{fs: vfs.NewMem(), Committers: 3, Partitions: 6, Partition: digitPartition})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for key, want := range map[string]int{"0x": 0, "1x": 0, "2x": 1, "3x": 1, "5x": 2, "7x": 0 /* 7 mod 6 */} {
		if got := s2.committerOf([]byte(key)); got != want {
			t.Errorf("key %q: committer %d, want %d", key, got, want)
		}
	}
}

// TestDefaultPartitionKnowsNoLayout: without a Partition the store reads
// no key layout: the records of the first and the last hash slot, which
// the server's partition gives to the first and the last committer, go to
// one committer, the only one.
func TestDefaultPartitionKnowsNoLayout(t *testing.T) {
	s, err := Open("db", Options{fs: vfs.NewMem(), Committers: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, key := range []string{"\x00\x00key", "\x3f\xffkey", "key"} {
		if c := s.committerOf([]byte(key)); c != 0 {
			t.Errorf("key %q: committer %d, want 0", key, c)
		}
	}
	if st := s.Stats(); st.Committers != 1 {
		t.Errorf("Stats.Committers = %d, want 1", st.Committers)
	}
}

// digitPartition puts a key in the partition of its first byte's digit.
func digitPartition(key []byte) int {
	if len(key) == 0 {
		return 0
	}
	return int(key[0]) - '0'
}

// crossKeys is one key per committer of a store with Partition
// digitPartition and as many committers as partitions: a transaction
// changing them all spans every committer.
func crossKeys(prefix string, n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%d%s", i, prefix)
	}
	return keys
}

// touch is a Mutator that writes a counter back unchanged: the key is
// noted for its committer's next round like any change, which then
// writes whatever value the key holds.
var touch = mutatorFunc(func(old []byte, found bool) ([]byte, Op, error) {
	if !found {
		return nil, Keep, nil
	}
	return old, Put, nil
})

// TestCrossTransactionsStayWhole runs transactions that add 1 to one key
// of each of four committers, while other goroutines keep those keys
// queued for their own committers (touch) and change keys of every
// committer, and an observer reads the four keys from Pebble again and
// again, each time at one sequence number: what Pebble holds at a sequence
// number is what a restart after a crash replays when the log ends there.
// Every reading must find the four equal (a transaction reached the log
// whole, in one round of one committer, never partly in the rounds of the
// keys' own committers) and none below the last (no committer wrote an
// older value after a newer one). A few crash copies of the disk are
// opened too, in always after an fsync covers them.
func TestCrossTransactionsStayWhole(t *testing.T) {
	const committers = 4
	for _, mode := range []SyncMode{SyncEverySec, SyncAlways} {
		t.Run(mode.String(), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			o := Options{Sync: mode, SyncInterval: time.Millisecond, fs: fs, Committers: committers, Partitions: committers, Partition: digitPartition}
			// The keys' own committers take their rounds at their own
			// pace: make them differ.
			o.afterKey = func(key []byte) {
				for range int(key[0]-'0') % committers {
					runtime.Gosched()
				}
			}
			s, err := Open("db", o)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			tx := crossKeys("tx", committers)
			var (
				wg   sync.WaitGroup
				stop atomic.Bool
				txs  atomic.Int64
			)
			fail := func(err error) {
				t.Error(err)
				stop.Store(true)
			}
			for range 2 {
				wg.Go(func() {
					b := s.NewBatch()
					for !stop.Load() {
						b.Hold(false)
						var err error
						for _, k := range tx {
							if err == nil {
								err = b.Modify(k, &counter{delta: 1})
							}
						}
						b.Release()
						if err == nil {
							err = b.Commit()
						}
						if err != nil {
							fail(err)
							return
						}
						txs.Add(1)
					}
				})
			}
			for w := range 2 {
				wg.Go(func() {
					b := s.NewBatch()
					own := crossKeys(fmt.Sprintf("w%d", w), committers)
					for !stop.Load() {
						var err error
						for i, k := range tx {
							if err == nil {
								err = b.Modify(k, touch)
							}
							if err == nil {
								err = b.Modify(own[i], &counter{delta: 1})
							}
						}
						if err == nil {
							err = b.Commit()
						}
						if err != nil {
							fail(err)
							return
						}
					}
				})
			}
			var readings, last int
			for (txs.Load() < 400 || readings < 4000) && !stop.Load() {
				got, err := readTogether(s.db, tx)
				if err != nil {
					fail(err)
					break
				}
				readings++
				for i, v := range got {
					if v != got[0] {
						fail(fmt.Errorf("reading %d: Pebble holds %v for %q: a transaction reached the log split", readings, got, tx))
						break
					}
					if v < last {
						fail(fmt.Errorf("reading %d: %q = %d in Pebble after %d: an older value was written after a newer one", readings, tx[i], v, last))
						break
					}
				}
				last = got[0]
				if readings%200 == 0 {
					checkCrashCopy(t, fs, tx)
				}
			}
			stop.Store(true)
			wg.Wait()
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			got, err := readTogether(s.db, tx)
			if err != nil {
				t.Fatal(err)
			}
			if n := int(txs.Load()); got[0] < n {
				t.Fatalf("after Flush Pebble holds %v for %d transactions acknowledged", got, n)
			}
			t.Logf("%d transactions, %d readings", txs.Load(), readings)
		})
	}
}

// readTogether reads the counters of keys from db at one sequence number.
func readTogether(db *pebble.DB, keys [][]byte) ([]int, error) {
	snap := db.NewSnapshot()
	defer snap.Close()
	got := make([]int, len(keys))
	for i, k := range keys {
		v, closer, err := snap.Get(k)
		if errors.Is(err, pebble.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		got[i] = int(binary.BigEndian.Uint64(v))
		closer.Close()
	}
	return got, nil
}

// checkCrashCopy opens what a crash would leave of fs now, only synced
// data kept, and checks that the counters of keys are equal there.
func checkCrashCopy(t *testing.T, fs *vfs.MemFS, keys [][]byte) {
	t.Helper()
	c := openMem(t, fs.CrashClone(vfs.CrashCloneCfg{}), SyncAlways)
	defer c.Close()
	got, err := readTogether(c.db, keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range got {
		if v != got[0] {
			t.Errorf("after a crash: %v for %q: a transaction split", got, keys)
		}
	}
}

// TestAlwaysAcknowledgesOnlySyncedWrites: in always, Commits of batches
// whose keys belong to every committer, from several goroutines at once,
// return only once every committer that took one of their keys has
// fsynced it. After each Commit returns, its goroutine takes a crash copy
// of the disk (only what an fsync covered) and finds its values there.
// The committers go at different paces (afterKey), so that one of them
// syncing does not cover the others by chance, and each fsync of the log
// is slow (it yields many times first), as a disk's is: a committer takes
// its next round while a round's fsync runs (finishRound), and a round
// acknowledged before its fsync returned would be found missing.
func TestAlwaysAcknowledgesOnlySyncedWrites(t *testing.T) {
	const committers = 4
	fs := vfs.NewCrashableMem()
	slow := errorfs.Wrap(fs, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData) && strings.HasSuffix(op.Path, ".log") {
			for range 200 {
				runtime.Gosched()
			}
		}
		return nil
	}))
	o := Options{Sync: SyncAlways, fs: slow, Committers: committers, Partitions: committers, Partition: digitPartition}
	o.afterKey = func(key []byte) {
		for range 4 * (int(key[0]-'0') % committers) {
			runtime.Gosched()
		}
	}
	s, err := Open("db", o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			b := s.NewBatch()
			keys := crossKeys(fmt.Sprintf("w%d", w), committers)
			for n := 1; n <= 25; n++ {
				for _, k := range keys {
					if err := b.Modify(k, &counter{delta: 1}); err != nil {
						t.Error(err)
						return
					}
				}
				if err := b.Commit(); err != nil {
					t.Error(err)
					return
				}
				c, err := Open("db", Options{fs: fs.CrashClone(vfs.CrashCloneCfg{}), Sync: SyncAlways, Committers: 1, NoKeyFilter: true})
				if err != nil {
					t.Error(err)
					return
				}
				got, err := readTogether(c.db, keys)
				c.Close()
				if err != nil {
					t.Error(err)
					return
				}
				for i, v := range got {
					if v < n {
						t.Errorf("commit %d of %q acknowledged, but after a crash %q = %d: not fsynced", n, keys, keys[i], v)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// TestCommitterChecksRecordHint: the committer finds a queued key's
// record where it was when the key was queued only if that record still
// holds the key; otherwise it looks the key up. Here the hint of a's
// change names b's record, in the same stripe, as if a's record had been
// evicted and b's made in its place since: Flush must still write a, and
// write nothing of b, whose change was never committed.
func TestCommitterChecksRecordHint(t *testing.T) {
	s := openMem(t, vfs.NewMem(), SyncEverySec)
	defer s.Close()
	keys := keysOfOneStripe(s, 2)
	a, b := s.NewBatch(), s.NewBatch()
	add(t, a, keys[0], 1)
	add(t, b, keys[1], 2)
	a.notes[0].hint = b.notes[0].hint
	if err := a.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		_, closer, err := s.db.Get([]byte(keys[i]))
		if err == nil {
			closer.Close()
		}
		if got := err == nil; got != want {
			t.Errorf("%q in Pebble: %v, want %v", keys[i], got, want)
		}
	}
}

// TestCommittersFlushSweepAndClose: with several committers, Flush writes
// what every one of them holds, the queue's bound is shared among them,
// Sweep's deletes reach each committer's range, and a Shutdown writes
// and syncs every queue, so that the store reopens with every change.
func TestCommittersFlushSweepAndClose(t *testing.T) {
	const committers = 4
	fs := vfs.NewMem()
	o := Options{Sync: SyncEverySec, SyncInterval: time.Hour, fs: fs, Committers: committers, Partitions: committers, Partition: digitPartition, MaxQueued: 64}
	s, err := Open("db", o)
	if err != nil {
		t.Fatal(err)
	}
	var bounds int
	for _, q := range s.queues[:committers] {
		bounds += q.maxKeys
	}
	if bounds != o.MaxQueued {
		t.Errorf("the committers' queues hold %d keys in all, want MaxQueued %d", bounds, o.MaxQueued)
	}
	b := s.NewBatch()
	var keys []string
	for i := range 4 * committers {
		keys = append(keys, fmt.Sprintf("%dk%d", i%committers, i))
		add(t, b, keys[i], uint64(i+1))
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Queued != len(keys) || st.Dirty != int64(len(keys)) {
		t.Fatalf("before Flush: %d queued, %d dirty; want %d each (write-behind)", st.Queued, st.Dirty, len(keys))
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Queued != 0 || st.Dirty != 0 || st.KeysWritten != int64(len(keys)) || st.Rounds != committers {
		t.Fatalf("after Flush: %d queued, %d dirty, %d keys written in %d rounds; want 0, 0, %d in %d", st.Queued, st.Dirty, st.KeysWritten, st.Rounds, len(keys), committers)
	}
	// The sweep deletes the odd counters, of every committer's range.
	var cursor []byte
	for {
		next, _, err := s.Sweep(cursor, 5, func(_, val []byte) bool { return binary.BigEndian.Uint64(val)%2 == 1 })
		if err != nil {
			t.Fatal(err)
		}
		if cursor = next; cursor == nil {
			break
		}
	}
	add(t, b, keys[1], 100) // a change after the sweep, left queued
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openMem(t, fs, SyncEverySec)
	defer s.Close()
	for i, k := range keys {
		v, found := read(t, s, k)
		want, wantFound := uint64(i+1), i%2 == 1
		if i == 1 {
			want = 102
		}
		if found != wantFound || (found && v != want) {
			t.Errorf("%s after reopening: %d (found %v), want %d (found %v)", k, v, found, want, wantFound)
		}
	}
}
