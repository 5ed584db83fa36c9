package storage

import (
	"fmt"
	"hash/maphash"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func TestKeyFilterNoFalseNegativesFewPositives(t *testing.T) {
	seed := maphash.MakeSeed()
	const n = 100_000
	f := newKeyFilter(n * 10 / 8) // about 10 bits per key
	for i := range n {
		f.add(maphash.String(seed, fmt.Sprintf("in-%d", i)))
	}
	for i := range n {
		if !f.mayContain(maphash.String(seed, fmt.Sprintf("in-%d", i))) {
			t.Fatalf("false negative for in-%d", i)
		}
	}
	fp := 0
	for i := range n {
		if f.mayContain(maphash.String(seed, fmt.Sprintf("out-%d", i))) {
			fp++
		}
	}
	// About 1% is expected at 10 bits per key with 6 probes per block;
	// 3% leaves room for the blocking.
	if rate := float64(fp) / n; rate > 0.03 {
		t.Fatalf("false positive rate %.2f%%, want under 3%%", rate*100)
	}
	if newKeyFilter(63) != nil {
		t.Fatal("a filter smaller than one block should be off")
	}
}

// New buckets skip Pebble; stored ones are found again after a reopen,
// when the filter is rebuilt from a scan.
func TestKeyFilterInStore(t *testing.T) {
	fs := vfs.NewMem()
	s, err := Open("db", Options{fs: fs, KeyFilterSize: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	for i := range 1000 {
		add(t, b, fmt.Sprintf("k%d", i), 3)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.FilterSkips < 900 {
		t.Fatalf("only %d of 1000 new keys skipped the Pebble lookup", st.FilterSkips)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open("db", Options{fs: fs, KeyFilterSize: 1 << 16, CacheEntries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 1000 {
		if got, found := read(t, s, fmt.Sprintf("k%d", i)); !found || got != 3 {
			t.Fatalf("k%d = %d, %v after reopen", i, got, found)
		}
	}
}

// TestOffOptions: NoCache and NoKeyFilter turn the cache and the key
// filter off whatever size is given beside them, and a negative size
// still does, as it did before they existed.
func TestOffOptions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       Options
		wantCache  int64
		wantFilter bool
	}{
		{"defaults", Options{}, DefaultCacheMemory, true},
		{"bools", Options{CacheMemory: 1 << 20, NoCache: true, KeyFilterSize: 1 << 16, NoKeyFilter: true}, 0, false},
		{"negative", Options{CacheMemory: -1, KeyFilterSize: -1}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.fs = vfs.NewMem()
			s, err := Open("db", tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.Stats().CacheMemory; got != tc.wantCache {
				t.Errorf("CacheMemory in force = %d, want %d", got, tc.wantCache)
			}
			if got := s.filter != nil; got != tc.wantFilter {
				t.Errorf("key filter on = %v, want %v", got, tc.wantFilter)
			}
		})
	}
}

// BenchmarkKeyFilterAdd adds keys to a filter of the default size, which
// no cache holds: keys it holds already (a bucket changed again, as most
// writes are), and keys it does not.
func BenchmarkKeyFilterAdd(b *testing.B) {
	f := newKeyFilter(DefaultKeyFilter)
	seed := maphash.MakeSeed()
	const n = 1 << 20
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = maphash.String(seed, fmt.Sprintf("k%d", i))
	}
	for _, h := range hashes[:n/2] {
		f.add(h)
	}
	for name, hs := range map[string][]uint64{"held": hashes[:n/2], "new": hashes[n/2:]} {
		b.Run(name, func(b *testing.B) {
			for i := range b.N {
				f.add(hs[(i*7919)%len(hs)])
			}
		})
	}
}
