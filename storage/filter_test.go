package storage

import (
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

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
