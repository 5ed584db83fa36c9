package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/keyspace"
)

// rlRecord returns the record key and value of RL.* bucket i with a 16-byte
// client key, as keyspace and bucket encode them: the slot (two bytes), the
// kind byte, three parameter varints, the key, and a state of a dozen
// bytes.
func rlRecord(key, val []byte, i int) ([]byte, []byte) {
	var client [16]byte
	copy(client[:], "user:")
	for j, n := len(client)-1, i; j >= 5; j, n = j-1, n/10 {
		client[j] = byte('0' + n%10)
	}
	key = keyspace.AppendBucketKey(key[:0], bucket.Params{Max: 100, RefillAmount: 10, RefillMs: 1000}, client[:])
	now := int64(1_763_950_000_000) + int64(i%1000)
	val = bucket.AppendState(val[:0], bucket.State{Amount: int64(i % 100), Anchor: now, LastReduce: now + 250})
	return key, val
}

// fillTables puts n clean RL records into s's tables as a cache miss does,
// evicting within s.byteLimit, and returns how many are held.
func fillTables(s *Store, n int) int {
	var key, val []byte
	for i := range n {
		key, val = rlRecord(key, val, i)
		h := maphash.Bytes(s.seed, key)
		t := &s.stripeOf(h).mu.t
		if !t.makeRoom(s.byteLimit, len(key), len(val)) {
			continue
		}
		ri := t.insert(h, key, len(val))
		t.setVal(ri, val)
		t.recs[ri].flags |= fClean
	}
	held := 0
	for i := range s.stripe {
		held += s.stripe[i].mu.t.live
	}
	return held
}

// TestTableBytesPerBucket measures what a cached RL bucket costs on the
// heap, the table's growth slack included, and checks it against
// CacheBucketCharge (the figure the docs give and the deprecated
// --cache-buckets converts with), and that the default budget holds at
// least 2M such buckets. The old table took about 350 bytes per bucket.
func TestTableBytesPerBucket(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes the heap; run without -race")
	}
	key, val := rlRecord(nil, nil, 123)
	t.Logf("RL record: %d-byte key, %d-byte value; record %d bytes", len(key), len(val), recordSize)
	for _, tc := range []struct {
		name  string
		limit int64 // per stripe
		n     int
		least int // buckets held at least
	}{
		{"1M buckets, no eviction", 1 << 40, 1 << 20, 1 << 20},
		{"default budget, full", DefaultCacheMemory / numStripes, 3 << 20, 2 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Store{seed: maphash.MakeSeed(), byteLimit: tc.limit}
			base := heapInUse()
			held := fillTables(s, tc.n)
			grown := int64(heapInUse()) - int64(base)
			charged := int64(0)
			for i := range s.stripe {
				charged += s.stripe[i].mu.t.bytes()
			}
			chargedBytes(t, s)
			t.Logf("%d buckets held: heap %.1f B per bucket, charged %.1f B", held, float64(grown)/float64(held), float64(charged)/float64(held))
			if held < tc.least {
				t.Errorf("%d buckets held, want at least %d", held, tc.least)
			}
			if grown > int64(held)*CacheBucketCharge {
				t.Errorf("%d buckets took %d bytes of heap, %.1f each: more than CacheBucketCharge, %d", held, grown, float64(grown)/float64(held), CacheBucketCharge)
			}
			if charged > tc.limit*numStripes {
				t.Errorf("tables charged %d bytes, over the budget %d", charged, tc.limit*numStripes)
			}
			runtime.KeepAlive(s)
		})
	}
}

// Filling the cache allocates nothing per record once the table's slices
// have grown a few times: new records (dirty, as writes make them) and
// cached misses (clean, from the key filter's answer) of 1<<19 new keys.
func TestTableFillAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	for _, op := range []Op{Put, Keep} {
		t.Run(fmt.Sprint(op), func(t *testing.T) {
			// The committer waits for a Commit that never comes.
			s, err := Open("db", Options{fs: vfs.NewMem(), SyncInterval: 1 << 40})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			b := s.NewBatch()
			v := []byte("12345678901")
			m := mutatorFunc(func([]byte, bool) ([]byte, Op, error) { return v, op, nil })
			var key, val []byte
			n := 0
			next := func() {
				key, val = rlRecord(key, val, n)
				n++
				if err := b.Modify(key, m); err != nil {
					t.Fatal(err)
				}
				b.reset() // the records stay dirty; no Commit needed
			}
			// testing.AllocsPerRun rounds down to whole allocations.
			const runs = 1 << 19
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			for range runs {
				next()
			}
			runtime.ReadMemStats(&m1)
			allocs := float64(m1.Mallocs-m0.Mallocs) / runs
			st := s.Stats()
			t.Logf("%.4f allocations per new record; %d records, %d bytes", allocs, st.CacheEntries, st.CacheBytes)
			if allocs >= 0.1 {
				t.Fatalf("%.4f allocations per new record while the cache fills, want < 0.1", allocs)
			}
			if st.CacheEntries < runs {
				t.Fatalf("%d records held of %d new ones", st.CacheEntries, runs)
			}
		})
	}
}

// growing is a ROLL-like record: each change appends grow bytes to the
// value, and a value over max starts again; the value's bytes say what it
// must be (its length, repeated).
type growing struct {
	grow, max int
	buf       []byte
	bad       error
}

func (g *growing) Mutate(old []byte, found bool) ([]byte, Op, error) {
	n := len(old) + g.grow
	if !found || n > g.max {
		n = g.grow
	}
	if found && len(old) > 0 && !bytes.Equal(old, bytes.Repeat([]byte{byte(len(old))}, len(old))) {
		g.bad = fmt.Errorf("value of %d bytes reads %v", len(old), old[:min(len(old), 16)])
	}
	g.buf = append(g.buf[:0], bytes.Repeat([]byte{byte(n)}, n)...)
	return g.buf, Put, nil
}

// Under churn with mixed value sizes (values that grow in place, move to
// the end of the arena, start again small; records evicted and reused),
// every value reads back as written, the tables stay consistent, and once
// the writes are applied the cache is within its byte bound: the garbage of
// moved values is compacted, not left to grow.
func TestTableBoundUnderChurn(t *testing.T) {
	const perStripe = 2 << 10
	s, err := Open("db", Options{fs: vfs.NewMem(), CacheMemory: numStripes * perStripe})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	b := s.NewBatch()
	want := map[string]int{}
	compactions := 0
	for i := range 60_000 {
		k := rng.IntN(20_000)
		key := fmt.Sprintf("log:%d", k)
		// Most keys stay short (buckets); one in ten grows to KBs (logs).
		g := &growing{grow: 1 + rng.IntN(12), max: 24}
		if k%10 == 0 {
			g.grow, g.max = 8+rng.IntN(200), 1500
		}
		h := maphash.Bytes(s.seed, []byte(key))
		st := s.stripeOf(h)
		st.mu.Lock()
		before := st.mu.t.garbage
		st.mu.Unlock()
		if err := b.Modify([]byte(key), g); err != nil {
			t.Fatal(err)
		}
		if g.bad != nil {
			t.Fatalf("change %d of %s: %v", i, key, g.bad)
		}
		st.mu.Lock()
		if st.mu.t.garbage < before {
			compactions++
		}
		st.mu.Unlock()
		want[key] = len(g.buf)
		if i%64 == 63 {
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		if i%10_000 == 9_999 {
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			waitApplied(t, s)
			st := s.Stats()
			// The working set is bigger than the bound: a cache that
			// compacts its garbage stays over 80% full (measured); one that cannot
			// evicts far more than it must.
			if st.Dirty != 0 || st.CacheBytes > st.CacheMemory || (i >= 50_000 && st.CacheBytes < st.CacheMemory*7/10) {
				t.Fatalf("after %d changes, applied: %d dirty, cache %d bytes (%d records), want at most the bound %d and, once full, at least 70%% of it", i+1, st.Dirty, st.CacheBytes, st.CacheEntries, st.CacheMemory)
			}
			t.Logf("after %d changes: %d records, %d of %d bytes", i+1, st.CacheEntries, st.CacheBytes, st.CacheMemory)
			if got := chargedBytes(t, s); got != st.CacheBytes {
				t.Fatalf("Stats.CacheBytes = %d, the tables hold %d", st.CacheBytes, got)
			}
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, s)
	if compactions == 0 {
		t.Fatal("no compaction: the churn did not exercise garbage")
	}
	// Every value, from the cache or Pebble, is the last one written.
	for key, n := range want {
		v, closer, err := s.db.Get([]byte(key))
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if !bytes.Equal(v, bytes.Repeat([]byte{byte(n)}, n)) {
			t.Fatalf("%s in Pebble: %d bytes, want %d", key, len(v), n)
		}
		closer.Close()
		c := &growing{grow: 1, max: 1 << 20}
		if err := b.Modify([]byte(key), mutatorFunc(func(old []byte, found bool) ([]byte, Op, error) {
			c.Mutate(old, found)
			if len(old) != n {
				c.bad = fmt.Errorf("cache reads %d bytes, want %d", len(old), n)
			}
			return nil, Keep, nil
		})); err != nil {
			t.Fatal(err)
		}
		if c.bad != nil {
			t.Fatalf("%s: %v", key, c.bad)
		}
	}
	t.Logf("%d compactions seen", compactions)
}

// The committer names the records of a round by stripe and position, not by
// pointer. While a round is inside Apply, its record of k changes again, and
// other records of k's stripe are evicted, reused for new keys, and their
// values moved and compacted: after the round k stays dirty (its newer
// value goes in the next round; marking it clean would lose it), no other
// record is marked clean by the round, and Pebble ends with every newest
// value.
func TestCommitterRoundByPosition(t *testing.T) {
	g := &syncGate{entered: make(chan struct{}), release: make(chan struct{})}
	// Room for a few short records per stripe.
	s, err := Open("db", Options{Sync: SyncAlways, fs: errorfs.Wrap(vfs.NewMem(), g), CacheMemory: numStripes * 512})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stripeOf := func(k string) uint64 { return maphash.Bytes(s.seed, []byte(k)) % numStripes }
	var keys []string // keys[0] is k; the others share its stripe
	for i := 0; len(keys) < 40; i++ {
		k := fmt.Sprintf("key%d", i)
		if len(keys) == 0 || stripeOf(k) == stripeOf(keys[0]) {
			keys = append(keys, k)
		}
	}
	k := keys[0]
	// Clean records to evict: written and applied.
	c := s.NewBatch()
	for _, o := range keys[1:6] {
		add(t, c, o, 3)
	}
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
	g.on.Store(true)
	a := s.NewBatch()
	add(t, a, k, 1)
	aDone := make(chan error)
	go func() { aDone <- a.Commit() }()
	<-g.entered // k's round is in Apply
	// k changes after the round read it.
	add(t, c, k, 1)
	// The stripe churns: new records evict the clean ones and take their
	// positions; values grow, move and are compacted.
	for i, o := range keys[6:] {
		g := &growing{grow: 40 + i, max: 400}
		for range 4 {
			if err := c.Modify([]byte(o), g); err != nil {
				t.Fatal(err)
			}
		}
	}
	g.release <- struct{}{}
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	g.on.Store(false)
	st := &s.stripe[stripeOf(k)]
	st.mu.Lock()
	tb := &st.mu.t
	dirty := 0
	for i := range tb.recs {
		r := &tb.recs[i]
		if r.flags&fLive == 0 {
			continue
		}
		if r.flags&fRound != 0 {
			t.Errorf("record %d (%q) still marked as in a round", i, tb.key(r))
		}
		if r.flags&fClean == 0 {
			dirty++
		}
		if string(tb.key(r)) == k && r.flags&fClean != 0 {
			t.Errorf("%s marked clean by a round that read it before its last change", k)
		}
	}
	checkTable(t, s, tb)
	st.mu.Unlock()
	if dirty != len(keys)-6+1 {
		t.Errorf("%d dirty records in k's stripe, want %d (k and the new ones)", dirty, len(keys)-6+1)
	}
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
	check := func(key string, want []byte) {
		t.Helper()
		v, closer, err := s.db.Get([]byte(key))
		if errors.Is(err, pebble.ErrNotFound) {
			t.Fatalf("%s not in Pebble", key)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer closer.Close()
		if !bytes.Equal(v, want) {
			t.Fatalf("%s in Pebble = %v, want %v", key, v[:min(len(v), 16)], want[:min(len(want), 16)])
		}
	}
	check(k, binary.BigEndian.AppendUint64(nil, 2))
	for _, o := range keys[1:6] {
		check(o, binary.BigEndian.AppendUint64(nil, 3))
	}
	for i, o := range keys[6:] {
		n := 4 * (40 + i) // four changes of 40+i bytes each, under max
		check(o, bytes.Repeat([]byte{byte(n)}, n))
	}
	if st := s.Stats(); st.Dirty != 0 {
		t.Fatalf("%d dirty after every change was committed (SyncAlways)", st.Dirty)
	}
}
