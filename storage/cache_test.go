package storage

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// heapInUse returns the Go heap in use after full collections: the second
// frees what sync.Pools and finalizers still held at the first.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// bigKey is a key of n bytes that starts with i, so that keys spread over
// the stripes.
func bigKey(i, n int) []byte {
	k := bytes.Repeat([]byte{'x'}, n)
	copy(k, fmt.Sprintf("k%08d:", i))
	return k
}

// With the default options, records with long keys fill the cache to its
// byte bound and no further: with a bound in entries only, 4000 records with
// 64 KiB keys held 250 MiB (the issue saw 4.5 GiB RSS with 512 KiB keys).
func TestCacheBoundInBytesWithLongKeys(t *testing.T) {
	// A real directory keeps the store's files out of the Go heap.
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := heapInUse()
	const n, keyLen = 4000, 64 << 10
	b := s.NewBatch()
	for i := range n {
		if err := b.Modify(bigKey(i, keyLen), &counter{delta: 1}); err != nil {
			t.Fatal(err)
		}
		if i%16 == 15 {
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			// Keep the commit queue short: this test is about the cache.
			waitApplied(t, s)
		}
	}
	// Read them all back, which fills the cache from Pebble too.
	for i := range n {
		c := &counter{}
		if err := b.Modify(bigKey(i, keyLen), c); err != nil {
			t.Fatal(err)
		}
		if c.seen != 1 {
			t.Fatalf("record %d = %d, want 1", i, c.seen)
		}
	}
	st := s.Stats()
	if st.CacheMemory != DefaultCacheMemory {
		t.Fatalf("CacheMemory = %d, want the default %d", st.CacheMemory, DefaultCacheMemory)
	}
	if st.CacheBytes > st.CacheMemory || st.CacheBytes < st.CacheMemory/2 {
		t.Fatalf("cache holds %d bytes (%d entries), want at most its bound %d and at least half of it", st.CacheBytes, st.CacheEntries, st.CacheMemory)
	}
	if got := chargedBytes(t, s); got != st.CacheBytes {
		t.Fatalf("Stats.CacheBytes = %d, but the entries' sizes sum to %d", st.CacheBytes, got)
	}
	// Pebble's memtables and block cache live in the Go heap in builds
	// without cgo or with -race: the sizing rule's 2 × memtable-size and
	// the block cache's use. The slack covers the runtime's own growth.
	grown := int64(heapInUse()) - int64(base)
	st = s.Stats()
	pebbleMem := 2*DefaultMemTableSize + st.BlockCacheBytes
	if limit := st.CacheMemory + pebbleMem + 32<<20; grown > limit {
		t.Fatalf("heap grew by %d MiB, want at most the cache bound %d MiB + Pebble's %d MiB + 32 MiB", grown>>20, st.CacheMemory>>20, pebbleMem>>20)
	}
	t.Logf("cache %d entries, %d MiB of %d MiB; heap grew %d MiB; Pebble memtables %d MiB and block cache %d MiB", st.CacheEntries, st.CacheBytes>>20, st.CacheMemory>>20, grown>>20, st.MemTableBytes>>20, st.BlockCacheBytes>>20)
}

// chargedBytes sums what every stripe's table holds, counted apart from
// table.bytes: the capacity of its records, index and arena. It checks each table's invariants on the way.
func chargedBytes(t testing.TB, s *Store) int64 {
	t.Helper()
	n := int64(0)
	for i := range s.stripe {
		st := &s.stripe[i]
		st.mu.Lock()
		n += checkTable(t, s, &st.mu.t)
		st.mu.Unlock()
	}
	return n
}

// checkTable checks tb's invariants and returns its size: every record in
// use is found by its key, the index holds nothing else, the free list
// holds every other record, and the arena is the records' regions plus the
// garbage.
func checkTable(t testing.TB, s *Store, tb *table) int64 {
	t.Helper()
	regions, live := int64(0), 0
	for i := range tb.recs {
		r := &tb.recs[i]
		if r.flags&fLive == 0 {
			continue
		}
		live++
		regions += int64(r.klen + r.room)
		if r.vlen > r.room || int(r.off+r.klen+r.room) > len(tb.arena) {
			t.Fatalf("record %d: value %d of room %d at %d, arena %d", i, r.vlen, r.room, r.off, len(tb.arena))
		}
		key := tb.key(r)
		if got := tb.find(maphash.Bytes(s.seed, key), key); got != i {
			t.Fatalf("record %d (%q) found at %d", i, key, got)
		}
	}
	used := 0
	for _, v := range tb.index {
		if v != 0 {
			used++
		}
	}
	free := 0
	for f := tb.free; f != 0; f = tb.recs[f-1].hash {
		if tb.recs[f-1].flags&fLive != 0 {
			t.Fatalf("record %d on the free list is in use", f-1)
		}
		free++
	}
	if live != tb.live || used != live || free != tb.nfree || live+free != len(tb.recs) {
		t.Fatalf("table: %d records in use (counted %d), %d in the index, %d free (counted %d) of %d", live, tb.live, used, free, tb.nfree, len(tb.recs))
	}
	if regions+tb.garbage != int64(len(tb.arena)) {
		t.Fatalf("arena of %d bytes holds regions of %d and garbage of %d", len(tb.arena), regions, tb.garbage)
	}
	if len(tb.index) != cap(tb.index) {
		t.Fatalf("index of %d slots, capacity %d", len(tb.index), cap(tb.index))
	}
	// What it holds of memory: everything its slices hold.
	return int64(cap(tb.recs))*recordSize + int64(len(tb.index))*indexSlot + int64(cap(tb.arena))
}

// A record too big for its stripe's share of the byte bound is kept only
// while its write is on its way, and still read from Pebble; small records
// of the same stripe are cached as before.
func TestRecordTooBigForCacheIsNotCached(t *testing.T) {
	s, err := Open("db", Options{fs: vfs.NewMem(), CacheMemory: numStripes << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	big := bigKey(1, 4<<10)
	b := s.NewBatch()
	if err := b.Modify(big, &counter{delta: 7}); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, s)
	// An empty table keeps at most its first slices.
	if st := s.Stats(); st.CacheEntries != 0 || st.CacheBytes > minIndex*indexSlot+minRecs*recordSize+minArena {
		t.Fatalf("after its write, the big record is still held: %d entries, %d bytes", st.CacheEntries, st.CacheBytes)
	}
	before := s.Stats()
	for range 2 {
		c := &counter{}
		if err := b.Modify(big, c); err != nil {
			t.Fatal(err)
		}
		if c.seen != 7 {
			t.Fatalf("big record = %d, want 7", c.seen)
		}
	}
	if st := s.Stats(); st.CacheEntries != 0 || st.CacheMisses-before.CacheMisses != 2 {
		t.Fatalf("reads of the big record were cached: %d entries, %d misses of 2 reads", st.CacheEntries, st.CacheMisses-before.CacheMisses)
	}
	if _, found := read(t, s, "small"); found {
		t.Fatal("small found")
	}
	// The stripe of the big record keeps its first slices.
	if st := s.Stats(); st.CacheEntries != 1 || st.CacheBytes-before.CacheBytes > st.CacheMemory/numStripes {
		t.Fatalf("a small record's miss was not cached within the stripe's share: %d entries, %d bytes", st.CacheEntries, st.CacheBytes)
	}
}

// checkShares fails t if a stripe holds more than its share, as none may
// once its records are written.
func checkShares(t *testing.T, s *Store, when string) {
	t.Helper()
	for i := range s.stripe {
		st := &s.stripe[i]
		st.mu.Lock()
		held := st.mu.t.bytes()
		st.mu.Unlock()
		if held > s.byteLimit {
			t.Errorf("%s: stripe %d holds %d bytes, over its share of %d", when, i, held, s.byteLimit)
			return
		}
	}
}

// keysOfOneStripe returns n keys, the first hot, that share one stripe.
func keysOfOneStripe(s *Store, n int) []string {
	keys := []string{"hot"}
	stripe := maphash.String(s.seed, "hot") % numStripes
	for i := 0; len(keys) < n; i++ {
		if k := fmt.Sprintf("k%d", i); maphash.String(s.seed, k)%numStripes == stripe {
			keys = append(keys, k)
		}
	}
	return keys
}

// A round that ends with its stripe over its share leaves the CLOCK hand
// to choose what goes, so that a record in use stays cached: every record
// the round turned clean used to go, since removing one gives back no
// capacity before the trim, and the hot record, written and read again, was
// evicted before records written once, or never used since they were.
func TestRoundOverShareKeepsRecordsInUse(t *testing.T) {
	big := make([]byte, 400) // grows the arena past the share
	for _, tc := range []struct {
		name  string
		cold  int                                         // records written with hot before
		write func(t *testing.T, b *Batch, keys []string) // the round over the share
		want  int                                         // hot's value length after it
	}{
		{"burst of new records", 0, func(t *testing.T, b *Batch, keys []string) {
			add(t, b, keys[0], 1)
			for _, k := range keys[1:] {
				add(t, b, k, 1)
			}
		}, 8},
		{"value outgrowing the arena", 8, func(t *testing.T, b *Batch, keys []string) {
			if err := b.Modify([]byte(keys[0]), mutatorFunc(func([]byte, bool) ([]byte, Op, error) { return big, Put, nil })); err != nil {
				t.Fatal(err)
			}
		}, len(big)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open("db", Options{fs: vfs.NewMem(), CacheMemory: MinCacheMemory})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			keys := keysOfOneStripe(s, 40) // 40 of these records pass 1 KiB
			b := s.NewBatch()
			for _, k := range keys[:1+tc.cold] {
				add(t, b, k, 1)
			}
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			waitApplied(t, s)
			lookups := func() (hits int64, vlen int) {
				t.Helper()
				before := s.Stats().CacheHits
				for range 2 {
					if err := s.NewBatch().Modify([]byte("hot"), mutatorFunc(func(old []byte, found bool) ([]byte, Op, error) {
						vlen = len(old)
						return nil, Keep, nil
					})); err != nil {
						t.Fatal(err)
					}
				}
				return s.Stats().CacheHits - before, vlen
			}
			if hits, _ := lookups(); hits != 2 {
				t.Fatalf("%d of 2 lookups of hot hit the cache before the round", hits)
			}
			tc.write(t, b, keys)
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			waitApplied(t, s)
			if hits, vlen := lookups(); hits != 2 || vlen != tc.want {
				t.Errorf("after the round: %d of 2 lookups of hot hit the cache, value of %d bytes (want %d)", hits, vlen, tc.want)
			}
			checkShares(t, s, "after the round")
			chargedBytes(t, s)
		})
	}
}

// With the cache off, a table keeps little once its records are written:
// 16384 records with 1000-byte keys written at once once left 16 MiB of
// entries on free lists; the arena, records and index give back what they
// grew to.
func TestTableGivesBackMemory(t *testing.T) {
	s, err := Open("db", Options{fs: vfs.NewMem(), NoCache: true, MaxQueued: 1 << 20, MaxQueuedBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := s.NewBatch()
	for i := range 1 << 14 {
		if err := b.Modify(bigKey(i, 1000), &counter{delta: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, s)
	held := 0
	for i := range s.stripe {
		st := &s.stripe[i]
		st.mu.Lock()
		tb := &st.mu.t
		held += cap(tb.arena) + cap(tb.recs)*int(recordSize) + cap(tb.index)*indexSlot
		st.mu.Unlock()
	}
	if limit := numStripes << 12; held > limit {
		t.Fatalf("tables keep %d KiB, want at most 4 KiB per stripe, %d KiB", held>>10, limit>>10)
	}
	chargedBytes(t, s)
}

// The commit queue, which bounds the dirty entries, is charged their whole
// size, value included, so that long values cannot grow them unbounded.
func TestQueueChargesWholeEntries(t *testing.T) {
	s, err := Open("db", Options{fs: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	val := bytes.Repeat([]byte{'v'}, 1<<20)
	b := s.NewBatch()
	if err := b.Modify([]byte("k"), mutatorFunc(func([]byte, bool) ([]byte, Op, error) { return val, Put, nil })); err != nil {
		t.Fatal(err)
	}
	if b.bytes < len(val) {
		t.Fatalf("a change with a %d-byte value charges the queue %d bytes", len(val), b.bytes)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkModifyEvicting is BenchmarkModify with more keys than the cache
// holds, by count or by bytes: each Modify reads Pebble, evicts and reuses
// the evicted entry.
func BenchmarkModifyEvicting(b *testing.B) {
	for _, tc := range []struct {
		name   string
		keyLen int
		opts   Options
	}{
		{"short", 16, Options{CacheMemory: 4 * numStripes * CacheBucketCharge}},
		{"long", 600, Options{CacheMemory: 4 * numStripes * (recordOverhead + 600 + 16)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := Open(b.TempDir(), tc.opts)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			keys := make([][]byte, 1<<14)
			bt := s.NewBatch()
			c := &counter{delta: 1}
			for i := range keys {
				keys[i] = bigKey(i, tc.keyLen)
				if err := bt.Modify(keys[i], c); err != nil {
					b.Fatal(err)
				}
				if i%16 == 15 {
					if err := bt.Commit(); err != nil {
						b.Fatal(err)
					}
				}
			}
			// The bound is the clean records': the fill's are dirty
			// until written.
			if err := s.Flush(); err != nil {
				b.Fatal(err)
			}
			r := &counter{}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if err := bt.Modify(keys[i%len(keys)], r); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if st := s.Stats(); st.CacheBytes > st.CacheMemory {
				b.Fatalf("cache over its bound: %d entries, %d of %d bytes", st.CacheEntries, st.CacheBytes, st.CacheMemory)
			}
		})
	}
}

// TestSmallCacheMemory: a positive CacheMemory below MinCacheMemory, under
// which no stripe's share holds a record, is raised to it (and Stats
// reports the bound in force), and so is the deprecated CacheEntries with
// a few buckets: each caches records.
func TestSmallCacheMemory(t *testing.T) {
	for _, o := range []Options{{CacheMemory: 1000}, {CacheMemory: 64 << 10}, {CacheMemory: MinCacheMemory - 1}, {CacheEntries: 1000}, {CacheMemory: MinCacheMemory}} {
		o.fs = vfs.NewMem()
		given := o.CacheMemory + int64(o.CacheEntries)*CacheBucketCharge
		s, err := Open("db", o)
		if err != nil {
			t.Fatal(err)
		}
		b := s.NewBatch()
		for i := range 2000 {
			add(t, b, fmt.Sprintf("k%d", i), 1)
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		waitApplied(t, s)
		for i := range 2000 {
			read(t, s, fmt.Sprintf("k%d", i))
		}
		st := s.Stats()
		if st.CacheEntries == 0 {
			t.Errorf("CacheMemory %d caches nothing (Stats.CacheMemory %d)", given, st.CacheMemory)
		}
		if st.CacheMemory != MinCacheMemory {
			t.Errorf("CacheMemory %d: Stats.CacheMemory %d, want the least, %d", given, st.CacheMemory, MinCacheMemory)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// heldBytes is what the tables really hold, the capacity of their slices,
// and how many of their records are free.
func heldBytes(s *Store) (held int64, free int) {
	for i := range s.stripe {
		st := &s.stripe[i]
		st.mu.Lock()
		tb := &st.mu.t
		held += int64(cap(tb.arena)) + int64(cap(tb.recs))*recordSize + int64(cap(tb.index))*indexSlot
		free += tb.nfree
		st.mu.Unlock()
	}
	return held, free
}

// TestCacheBoundIsRealMemory: under churn of RL-sized records (a working
// set three times what the cache holds, cached misses, new and old keys
// written), what the tables really hold, free records and the unused
// capacity of their slices included, stays within CacheMemory once
// everything is written, and within it but for the dirty records' growth
// meanwhile. Charged by the records in use and the slices' lengths, the
// tables held 1.45 times CacheMemory at 16 MiB and 1.15 at 160 MiB.
func TestCacheBoundIsRealMemory(t *testing.T) {
	const mem = 2 << 20
	s, err := Open("db", Options{fs: vfs.NewMem(), CacheMemory: mem, NoKeyFilter: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	b := s.NewBatch()
	var key, val []byte
	space := 3 * mem / 66
	for i := range 3 * space {
		key, val = rlRecord(key, val, rng.IntN(space))
		v := val
		op := Keep
		if rng.IntN(3) == 0 {
			op = Put
		}
		if err := b.Modify(key, mutatorFunc(func([]byte, bool) ([]byte, Op, error) { return v, op, nil })); err != nil {
			t.Fatal(err)
		}
		if b.Full() || i%64 == 63 {
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		if i%(space/4) == 0 {
			// Dirty records cannot be evicted: allow each stripe one
			// growth of its arena for them.
			if held, free := heldBytes(s); held > mem+mem/4 {
				t.Fatalf("after %d changes: the tables hold %d bytes (%d free records), over CacheMemory %d by more than a quarter", i, held, free, mem)
			}
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, s)
	held, free := heldBytes(s)
	st := s.Stats()
	t.Logf("%d records in use, %d free: %d bytes held (%.2f of CacheMemory), %.1f per record", st.CacheEntries, free, held, float64(held)/mem, float64(held)/float64(st.CacheEntries))
	if held > mem {
		t.Errorf("the tables hold %d bytes, %.2f times CacheMemory %d", held, float64(held)/mem, mem)
	}
	if held != st.CacheBytes {
		t.Errorf("Stats.CacheBytes = %d, the tables hold %d", st.CacheBytes, held)
	}
	if got := chargedBytes(t, s); got != held {
		t.Errorf("the tables are charged %d, they hold %d", got, held)
	}
}
