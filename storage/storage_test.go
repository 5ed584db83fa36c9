package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/sluicehq/sluice/keyspace"
)

// counter is a Mutator that adds delta to a big-endian uint64, or deletes
// the record when del is set.
type counter struct {
	delta uint64
	del   bool
	seen  uint64
	buf   [8]byte
}

func (c *counter) Mutate(old []byte, found bool) ([]byte, Op, error) {
	c.seen = 0
	if found {
		if len(old) != 8 {
			return nil, Keep, fmt.Errorf("bad value %x", old)
		}
		c.seen = binary.BigEndian.Uint64(old)
	}
	if c.del {
		return nil, Delete, nil
	}
	if c.delta == 0 {
		return nil, Keep, nil
	}
	binary.BigEndian.PutUint64(c.buf[:], c.seen+c.delta)
	return c.buf[:], Put, nil
}

// openMem opens a store in fs partitioned as the server's, by
// keyspace.Partition.
func openMem(t *testing.T, fs vfs.FS, mode SyncMode) *Store {
	t.Helper()
	s, err := Open("db", Options{Sync: mode, fs: fs, MaxQueued: 64, Partition: keyspace.Partition, Partitions: keyspace.Partitions})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func read(t *testing.T, s *Store, key string) (uint64, bool) {
	t.Helper()
	c := &counter{}
	if err := s.NewBatch().Modify([]byte(key), c); err != nil {
		t.Fatal(err)
	}
	var found bool
	_ = s.NewBatch().Modify([]byte(key), mutatorFunc(func(old []byte, f bool) ([]byte, Op, error) {
		found = f
		return nil, Keep, nil
	}))
	return c.seen, found
}

type mutatorFunc func(old []byte, found bool) ([]byte, Op, error)

func (f mutatorFunc) Mutate(old []byte, found bool) ([]byte, Op, error) { return f(old, found) }

func add(t *testing.T, b *Batch, key string, delta uint64) {
	t.Helper()
	if err := b.Modify([]byte(key), &counter{delta: delta}); err != nil {
		t.Fatal(err)
	}
}

func TestReadYourWritesAndReopen(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncEverySec, SyncNo} {
		t.Run(mode.String(), func(t *testing.T) {
			fs := vfs.NewMem()
			s := openMem(t, fs, mode)
			b := s.NewBatch()
			add(t, b, "a", 1)
			add(t, b, "a", 2) // same key twice in one batch
			add(t, b, "b", 5)
			if got, _ := read(t, s, "a"); got != 3 {
				t.Fatalf("before commit: a = %d, want 3 (overlay)", got)
			}
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := b.Modify([]byte("b"), &counter{del: true}); err != nil {
				t.Fatal(err)
			}
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			if _, found := read(t, s, "b"); found {
				t.Fatal("b still found after delete")
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openMem(t, fs, mode)
			defer s.Close()
			if got, _ := read(t, s, "a"); got != 3 {
				t.Fatalf("after reopen: a = %d, want 3", got)
			}
			if _, found := read(t, s, "b"); found {
				t.Fatal("b came back after reopen")
			}
		})
	}
}

// Many goroutines add to few keys; the final value, in memory and after a
// reopen, is the exact sum. Run with -race this also checks the locking of
// the overlay against the committer.
func TestConcurrentModifyIsExact(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncEverySec} {
		t.Run(mode.String(), func(t *testing.T) {
			fs := vfs.NewMem()
			s := openMem(t, fs, mode)
			const workers, rounds, keys = 8, 300, 5
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					b := s.NewBatch()
					c := &counter{delta: 1}
					r := rand.New(rand.NewPCG(uint64(w), 1))
					for i := range rounds {
						k := fmt.Sprintf("k%d", r.IntN(keys))
						if err := b.Modify([]byte(k), c); err != nil {
							t.Error(err)
							return
						}
						if i%7 == 6 {
							if err := b.Commit(); err != nil {
								t.Error(err)
								return
							}
						}
					}
					if err := b.Commit(); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			sum := func() (n uint64) {
				for k := range keys {
					v, _ := read(t, s, fmt.Sprintf("k%d", k))
					n += v
				}
				return n
			}
			if got := sum(); got != workers*rounds {
				t.Fatalf("sum %d, want %d", got, workers*rounds)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openMem(t, fs, mode)
			defer s.Close()
			if got := sum(); got != workers*rounds {
				t.Fatalf("after reopen: sum %d, want %d", got, workers*rounds)
			}
		})
	}
}

// With SyncAlways, every write whose Commit returned survives a crash that
// drops everything not fsynced. The crash is simulated with Pebble's
// crashable in-memory filesystem, cloned at an instant with only synced
// data.
func TestAlwaysSurvivesCrash(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := openMem(t, fs, SyncAlways)
	const n = 200
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			b := s.NewBatch()
			for i := range n {
				add(t, b, fmt.Sprintf("w%d-%d", w, i), uint64(i+1))
				if err := b.Commit(); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	s.Close()
	s2 := openMem(t, crashed, SyncAlways)
	defer s2.Close()
	for w := range 4 {
		for i := range n {
			if got, _ := read(t, s2, fmt.Sprintf("w%d-%d", w, i)); got != uint64(i+1) {
				t.Fatalf("w%d-%d = %d after crash, want %d", w, i, got, i+1)
			}
		}
	}
}

// With SyncEverySec, writes applied before a completed periodic sync survive
// a crash. The test drives the sync itself rather than waiting a second.
func TestEverySecSyncPointSurvivesCrash(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := openMem(t, fs, SyncEverySec)
	b := s.NewBatch()
	for i := range 100 {
		add(t, b, fmt.Sprintf("k%d", i), 7)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, s)
	if err := s.syncApplied(); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.SyncedRound < st.AppliedRound || st.Fsyncs == 0 {
		t.Fatalf("after sync: %+v", st)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	s.Close()
	s2 := openMem(t, crashed, SyncEverySec)
	defer s2.Close()
	for i := range 100 {
		if got, _ := read(t, s2, fmt.Sprintf("k%d", i)); got != 7 {
			t.Fatalf("k%d = %d after crash, want 7", i, got)
		}
	}
}

// waitApplied blocks until the committer has applied every queued key.
func waitApplied(t *testing.T, s *Store) {
	t.Helper()
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestRefusesForeignPebbleStore(t *testing.T) {
	fs := vfs.NewMem()
	db, err := pebble.Open("db", &pebble.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("someone else's"), []byte("data"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err = Open("db", Options{fs: fs})
	if !errors.Is(err, ErrNotStore) {
		t.Fatalf("got %v, want ErrNotStore", err)
	}
}

func TestMutatorErrorChangesNothing(t *testing.T) {
	s := openMem(t, vfs.NewMem(), SyncEverySec)
	defer s.Close()
	b := s.NewBatch()
	add(t, b, "a", 1)
	boom := errors.New("boom")
	err := b.Modify([]byte("a"), mutatorFunc(func([]byte, bool) ([]byte, Op, error) { return []byte("junk"), Put, boom }))
	if !errors.Is(err, boom) {
		t.Fatalf("got %v", err)
	}
	if got, _ := read(t, s, "a"); got != 1 {
		t.Fatalf("a = %d, want 1", got)
	}
}

func TestClosedStoreRefuses(t *testing.T) {
	s := openMem(t, vfs.NewMem(), SyncAlways)
	s.Close()
	if err := s.NewBatch().Modify([]byte("a"), &counter{delta: 1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v, want ErrClosed", err)
	}
}

func TestParseSyncMode(t *testing.T) {
	for _, m := range []SyncMode{SyncAlways, SyncEverySec, SyncNo} {
		if got, err := ParseSyncMode(m.String()); err != nil || got != m {
			t.Fatalf("%v: %v %v", m, got, err)
		}
	}
	if _, err := ParseSyncMode("sometimes"); err == nil {
		t.Fatal("accepted a bad mode")
	}
}

// BenchmarkModify is the store side of one RL.REDUCE on a key already in
// Pebble: lock, read, mutate, overlay, commit (everysec).
func BenchmarkModify(b *testing.B) {
	s, err := Open(b.TempDir(), Options{Sync: SyncEverySec})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	keys := make([][]byte, 1<<14)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "bench-key-%08d", i)
	}
	bt := s.NewBatch()
	c := &counter{delta: 1}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := bt.Modify(keys[i%len(keys)], c); err != nil {
			b.Fatal(err)
		}
		if i%16 == 15 {
			if err := bt.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// The cache holds at most CacheMemory bytes once writes are applied,
// answers repeated use from memory, and caches "not found" without hiding a
// later write.
func TestCacheBoundAndHits(t *testing.T) {
	s, err := Open("db", Options{fs: vfs.NewMem(), CacheMemory: 2048 * CacheBucketCharge})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := s.NewBatch()
	for i := range 20_000 {
		add(t, b, fmt.Sprintf("k%d", i), 1)
		if i%100 == 99 {
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitApplied(t, s)
	st := s.Stats()
	if st.CacheBytes > st.CacheMemory || st.CacheEntries < 2048 || st.CacheEntries >= 20_000 {
		t.Fatalf("cache holds %d entries in %d bytes, want at most %d bytes, and at least 2048 short records", st.CacheEntries, st.CacheBytes, st.CacheMemory)
	}
	if st.Dirty != 0 {
		t.Fatalf("%d dirty entries after every write was applied", st.Dirty)
	}
	// Every record is still readable, from the cache or from Pebble.
	for i := range 20_000 {
		if got, _ := read(t, s, fmt.Sprintf("k%d", i)); got != 1 {
			t.Fatalf("k%d = %d, want 1", i, got)
		}
	}
	before := s.Stats()
	read(t, s, "k19999")
	read(t, s, "k19999")
	after := s.Stats()
	if after.CacheHits-before.CacheHits < 3 { // read() does two Modifies each
		t.Fatalf("repeated reads were not answered from the cache: %+v -> %+v", before, after)
	}
	// A cached "not found" is replaced by a write, not kept.
	if _, found := read(t, s, "fresh"); found {
		t.Fatal("fresh key found")
	}
	add(t, b, "fresh", 5)
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if got, found := read(t, s, "fresh"); !found || got != 5 {
		t.Fatalf("fresh = %d, %v after a write over a cached miss", got, found)
	}
}

func TestCacheOff(t *testing.T) {
	fs := vfs.NewMem()
	s, err := Open("db", Options{fs: fs, CacheEntries: -1})
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	for i := range 500 {
		add(t, b, fmt.Sprintf("k%d", i%50), 1)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, s)
	if st := s.Stats(); st.CacheEntries != 0 || st.Dirty != 0 {
		t.Fatalf("cache off still holds entries: %+v", st)
	}
	if got, _ := read(t, s, "k7"); got != 10 {
		t.Fatalf("k7 = %d, want 10", got)
	}
	s.Close()
}

// syncGate blocks WAL syncs while on, announcing each on entered, so a test
// can act while the committer is inside Apply.
type syncGate struct {
	on      atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (g *syncGate) String() string { return "syncGate" }
func (g *syncGate) MaybeError(op errorfs.Op) error {
	if g.on.Load() && strings.HasSuffix(op.Path, ".log") &&
		(op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData) {
		g.entered <- struct{}{}
		<-g.release
	}
	return nil
}

// Regression: a committer round must not rewrite a clean entry, or another
// connection can evict that entry and reuse it for a different key while
// Apply runs, and the other key's acknowledged write is lost. Found in
// review; this is its reproduction with the sleep replaced by a wait on the
// queue.
func TestEvictionDuringApplyLosesNothing(t *testing.T) {
	g := &syncGate{entered: make(chan struct{}), release: make(chan struct{})}
	// Room for one short record per stripe: its record, a first index of
	// minIndex slots and its key and value.
	oneRecord := recordSize + minIndex*indexSlot + 16
	s, err := Open("db", Options{Sync: SyncAlways, fs: errorfs.Wrap(vfs.NewMem(), g), CacheMemory: numStripes * (oneRecord + recordSize/2)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var keys []string // three keys of one stripe (one entry per stripe allowed)
	stripeOf := func(k string) uint64 { return maphash.Bytes(s.seed, []byte(k)) % numStripes }
	for i := 0; len(keys) < 3; i++ {
		k := fmt.Sprintf("key%d", i)
		if len(keys) == 0 || stripeOf(k) == stripeOf(keys[0]) {
			keys = append(keys, k)
		}
	}
	k, k2, k3 := keys[0], keys[1], keys[2]

	g.on.Store(true)
	a, b := s.NewBatch(), s.NewBatch()
	add(t, a, k, 1)
	add(t, b, k, 1)
	aDone := make(chan error)
	go func() { aDone <- a.Commit() }()
	<-g.entered // round R is in Apply
	q := s.queues[s.committerOf([]byte(k))]
	q.Lock()
	next := q.round // R+1
	q.Unlock()
	bDone := make(chan error)
	go func() { bDone <- b.Commit() }()
	// Wait until b's key is queued for round R+1, or taken by it: in
	// always the committer takes its next round while R's fsync runs.
	for taken := false; !taken; runtime.Gosched() {
		q.Lock()
		taken = len(q.ends) > 0 || q.round > next
		q.Unlock()
	}
	g.release <- struct{}{}
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	// Round R+1 has nothing left to write for k; with the bug it rewrote
	// k's clean entry and sat in Apply here.
	var bErr error
	select {
	case <-g.entered:
		c := s.NewBatch()
		add(t, c, k2, 5) // evicts k's entry and reuses it
		add(t, c, k2, 5)
		g.release <- struct{}{}
		bErr = <-bDone
		g.on.Store(false)
		if err := c.Commit(); err != nil {
			t.Fatal(err)
		}
	case bErr = <-bDone:
	}
	if bErr != nil {
		t.Fatal(bErr)
	}
	g.on.Store(false)
	c := s.NewBatch()
	add(t, c, k2, 10)
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
	read(t, s, k3) // needs room in the stripe: evicts whatever is clean
	if got, _ := read(t, s, k2); got != 10 {
		t.Fatalf("%s = %d after an acknowledged write of 10", k2, got)
	}
	if got, _ := read(t, s, k); got != 2 {
		t.Fatalf("%s = %d, want 2", k, got)
	}
	if st := s.Stats(); st.Dirty < 0 {
		t.Fatalf("dirty count went negative: %d", st.Dirty)
	}
}

func TestRefusesDirectoryOfOtherFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(dir, Options{})
	if !errors.Is(err, ErrNotStore) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("got %v, want ErrNotStore naming %s and notes.txt", err, dir)
	}
	// A fresh volume's lost+found is no reason to refuse.
	dir = t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "lost+found"), 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("directory with lost+found: %v", err)
	}
	s.Close()
}

func TestCorruptStoreNamesPath(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	add(t, s.NewBatch(), "a", 1)
	s.Close()
	manifests, _ := filepath.Glob(filepath.Join(dir, "MANIFEST-*"))
	if len(manifests) == 0 {
		t.Fatal("no MANIFEST in the store")
	}
	for _, m := range manifests {
		if err := os.WriteFile(m, bytes.Repeat([]byte{0xff}, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, err = Open(dir, Options{})
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("corrupt store: got %v, want an error naming %s", err, dir)
	}
}

func TestSecondOpenIsRefusedAsLocked(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = Open(dir, Options{})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("second open: got %v, want ErrLocked naming %s", err, dir)
	}
}
