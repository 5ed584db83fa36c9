package storage

import (
	"fmt"
	"testing"
	"time"
)

// TestWriteBehindRoundAppliedInSlices: a write-behind round is applied to
// Pebble commitSlice keys at a time, so on one core the connections run
// between slices instead of waiting for the whole round (see commitSlice).
// A round holding a transaction is applied whole, so that the log never
// holds part of one. The committer's hook looks into Pebble while the
// round is being read: slices are applied by then, a whole round is not.
func TestWriteBehindRoundAppliedInSlices(t *testing.T) {
	const n = 3 * commitSlice
	for _, tx := range []bool{false, true} {
		t.Run(fmt.Sprintf("transaction=%v", tx), func(t *testing.T) {
			var (
				s       *Store
				seen    int
				inLog   = -1 // keys already in Pebble when the last key is read
				lastKey = fmt.Sprintf("k%04d", n-1)
			)
			o := Options{Sync: SyncEverySec, SyncInterval: time.Hour}
			o.afterKey = func(key []byte) {
				seen++
				if string(key) != lastKey {
					return
				}
				inLog = 0
				for i := range n {
					if _, closer, err := s.db.Get(fmt.Appendf(nil, "k%04d", i)); err == nil {
						closer.Close()
						inLog++
					}
				}
			}
			var err error
			if s, err = Open(t.TempDir(), o); err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			b := s.NewBatch()
			if tx {
				b.Hold(false)
			}
			for i := range n {
				add(t, b, fmt.Sprintf("k%04d", i), 1)
			}
			if tx {
				b.Release()
			}
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			if seen != n {
				t.Fatalf("the committer read %d keys; want %d in one round", seen, n)
			}
			want := n - commitSlice // every slice before the last one
			if tx {
				want = 0
			}
			if inLog != want {
				t.Fatalf("while the round was read, %d of its %d keys were in Pebble; want %d (transaction %v)", inLog, n, want, tx)
			}
			for i := range n { // and the whole round is there at the end
				v, closer, err := s.db.Get(fmt.Appendf(nil, "k%04d", i))
				if err != nil {
					t.Fatalf("k%04d after Flush: %v", i, err)
				}
				closer.Close()
				if len(v) != 8 || v[7] != 1 {
					t.Fatalf("k%04d after Flush = %x; want 1", i, v)
				}
			}
		})
	}
}

// TestRoundWrittenInKeyOrder: the committer reads and writes a round's
// keys in key order whatever order they were queued in, so that Pebble's
// memtable inserts reuse their search (see commitLoop).
func TestRoundWrittenInKeyOrder(t *testing.T) {
	var got []string
	// One committer: a round holds every key.
	o := Options{Sync: SyncEverySec, SyncInterval: time.Hour, Committers: 1}
	o.afterKey = func(key []byte) { got = append(got, string(key)) }
	s, err := Open(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := s.NewBatch()
	// Queued backwards, with keys sharing their first eight bytes, keys
	// shorter than eight, and first bytes at both ends of the range.
	keys := []string{"\xfe", "zz", "prefix00-b", "prefix00-a", "prefix00", "m", "a\x00", "a", "\x00x"}
	for _, k := range keys {
		add(t, b, k, 1)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	want := []string{"\x00x", "a", "a\x00", "m", "prefix00", "prefix00-a", "prefix00-b", "zz", "\xfe"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the committer wrote %q; want %q", got, want)
	}
}
