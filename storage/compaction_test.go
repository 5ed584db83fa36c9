package storage

import (
	"runtime"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestCompactionsRunAtOnce checks that a store's compactions out of level
// 0 do not run one at a time: with uniform writes over a store of 300000
// buckets, and the table sizes of a store that runs 4 compactions at once,
// Pebble's picker finds disjoint pieces of level 0 (3 here) and starts
// more than one of them together. The gate holds the compactions back
// while level 0 is flushed into two sublevels (what makes Pebble compact
// it), then counts those it starts at once. Every record is still there
// afterwards.
func TestCompactionsRunAtOnce(t *testing.T) {
	const k, buckets, changed = 4, 300_000, 60_000
	recs := newStageRecordsOf(buckets)
	g := &compactionGate{}
	o := Options{fs: vfs.NewMem(), MemTableSize: 64 << 20, CompactionConcurrency: k}
	g.options(&o)
	s, err := Open("db", o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g.setOpen(true)
	applyRounds(t, s, recs, recs.keys)
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	compactAll(t, s)
	g.setOpen(false)
	for i := range 2 {
		applyRounds(t, s, recs, recs.round(i+1, changed))
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	g.take()
	if n := g.setOpen(true); n < 2 || n > k {
		t.Errorf("Pebble started %d compactions at once out of a level 0 of two sublevels, want 2 to %d (the store's CompactionConcurrency)", n, k)
	}
	compactAll(t, s)
	if st := g.take(); st.maxInFlight < 2 {
		t.Errorf("at most %d compactions ran at once, want 2 or more", st.maxInFlight)
	}
	it, err := s.db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		if string(it.Key()) < string(recordsEnd) {
			n++
		}
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	if n != buckets {
		t.Errorf("%d records after the compactions, want %d", n, buckets)
	}
}

// TestCompactionConcurrencyDefault checks that a zero
// CompactionConcurrency is GOMAXPROCS, and that a big one is capped.
func TestCompactionConcurrencyDefault(t *testing.T) {
	for _, tc := range []struct{ give, want int }{
		{0, min(runtime.GOMAXPROCS(0), MaxCompactionConcurrency)},
		{3, 3},
		{MaxCompactionConcurrency + 1, MaxCompactionConcurrency},
	} {
		s, err := Open("db", Options{fs: vfs.NewMem(), CompactionConcurrency: tc.give})
		if err != nil {
			t.Fatal(err)
		}
		got := s.opts.CompactionConcurrency
		s.Close()
		if got != tc.want {
			t.Errorf("CompactionConcurrency %d: the store runs %d compactions at once, want %d", tc.give, got, tc.want)
		}
	}
}
