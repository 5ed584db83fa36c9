package storage

import (
	"bytes"
	"fmt"
	"hash/maphash"
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
	if got := chargedBytes(s); got != st.CacheBytes {
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

// chargedBytes sums the sizes of the entries every stripe holds.
func chargedBytes(s *Store) int64 {
	n := int64(0)
	for i := range s.stripe {
		st := &s.stripe[i]
		st.mu.Lock()
		for _, e := range st.mu.ring {
			n += e.size()
		}
		st.mu.Unlock()
	}
	return n
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
	if st := s.Stats(); st.CacheEntries != 0 || st.CacheBytes != 0 {
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
	if st := s.Stats(); st.CacheEntries != 1 || st.CacheBytes > st.CacheMemory/numStripes {
		t.Fatalf("a small record's miss was not cached within the stripe's share: %d entries, %d bytes", st.CacheEntries, st.CacheBytes)
	}
}

// The free list of removed entries is outside the byte bound, so it must
// keep little: with the cache off, 16384 records with 1000-byte keys
// written at once left 16 MiB of entries on the free lists, and up to
// 64 entries of 2 KiB per stripe (128 MiB) could stay there.
func TestFreeListKeepsNoBigBuffers(t *testing.T) {
	s, err := Open("db", Options{fs: vfs.NewMem(), CacheEntries: -1, MaxQueued: 1 << 20, MaxQueuedBytes: 1 << 30})
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
	free := 0
	for i := range s.stripe {
		st := &s.stripe[i]
		st.mu.Lock()
		for e := st.mu.free; e != nil; e = e.next {
			free += int(e.size())
		}
		st.mu.Unlock()
	}
	if limit := numStripes << 12; free > limit {
		t.Fatalf("free lists keep %d KiB, want at most 4 KiB per stripe, %d KiB", free>>10, limit>>10)
	}
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

// entryOverhead must cover what an entry costs besides its buffers. Fill
// every stripe with short keys and values, the layout the cache has when
// full, and compare the heap's growth with the charge. Small fills use
// several tables, so that about 256K entries drown the heap's noise.
func TestEntryOverhead(t *testing.T) {
	if raceEnabled {
		// Measured with 16-byte keys and values: 207 to 233 B of heap per
		// entry under -race, 185 to 197 B without, against 224 charged.
		t.Skip("the race detector changes what an entry costs on the heap; run without -race")
	}
	key := make([]byte, 16)
	val := make([]byte, 16)
	// Just past the map's growth steps is the dearest fill.
	for _, perStripe := range []int{9, 15, 57, 225, DefaultCacheEntries / numStripes} {
		stores := make([]*Store, (DefaultCacheEntries+perStripe*numStripes-1)/(perStripe*numStripes))
		for k := range stores {
			stores[k] = &Store{seed: maphash.MakeSeed()}
			for i := range stores[k].stripe {
				stores[k].stripe[i].mu.m = make(map[uint64]*entry)
			}
		}
		base := heapInUse()
		n, charged := 0, int64(0)
		for _, s := range stores {
			for i := range s.stripe {
				st := &s.stripe[i]
				for j := range perStripe {
					copy(key, fmt.Sprintf("%06d:%06d", i, j))
					e := st.insertLocked(maphash.Bytes(s.seed, key), key, len(val))
					st.setValLocked(e, val)
					n++
				}
				charged += st.mu.bytes
			}
		}
		grown := int64(heapInUse()) - int64(base)
		t.Logf("%d per stripe: heap %d B per entry, charged %d B", perStripe, grown/int64(n), charged/int64(n))
		if grown > charged {
			t.Errorf("%d entries (%d per stripe) took %d bytes of heap but were charged %d: raise entryOverhead (%d) by %d", n, perStripe, grown, charged, entryOverhead, (grown-charged)/int64(n)+1)
		}
		runtime.KeepAlive(stores)
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
		{"count", 16, Options{CacheEntries: 4 * numStripes}},
		{"bytes", 600, Options{CacheMemory: 4 * numStripes * (entryOverhead + 640 + 16)}},
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
			r := &counter{}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if err := bt.Modify(keys[i%len(keys)], r); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if st := s.Stats(); st.CacheEntries > int64(4*numStripes) || st.CacheBytes > st.CacheMemory {
				b.Fatalf("cache over its bounds: %d entries, %d of %d bytes", st.CacheEntries, st.CacheBytes, st.CacheMemory)
			}
		})
	}
}

// A new record costs the hot-state table two allocations, its entry and
// one buffer for its key and value (three when they had a buffer each).
// Nothing else allocates in the store meanwhile: the committer waits for
// a Commit that never comes. The stripes' maps and rings grow by doubling,
// which the bound of 2.2 leaves room for.
func TestNewRecordAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	s := openMem(t, vfs.NewMem(), SyncEverySec)
	defer s.Close()
	b := s.NewBatch()
	c := &counter{delta: 1}
	key := []byte("new:0000000000")
	n := 0
	next := func() {
		n++
		for i, j := len(key)-1, n; j > 0; i, j = i-1, j/10 {
			key[i] = byte('0' + j%10)
		}
		if err := b.Modify(key, c); err != nil {
			t.Fatal(err)
		}
		b.reset() // the keys stay dirty in the table; no Commit needed
	}
	// First fill every stripe, so that the growth of its map and ring,
	// which doubles, is rare in the measured run.
	for range 100 * numStripes {
		next()
	}
	allocs := testing.AllocsPerRun(1000, next)
	if allocs > 2.2 {
		t.Fatalf("%.2f allocations per new record, want 2 (its entry, one buffer for key and value; at most 2.2 with the growth of maps and rings)", allocs)
	}
}
