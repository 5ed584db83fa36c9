package storage

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// idleIfOne treats a counter that was hit exactly once as idle.
func idleIfOne(key, val []byte) bool {
	return len(val) == 8 && binary.BigEndian.Uint64(val) == 1
}

// sweepAll runs Sweep from the first record to the last, step records at a
// time, and returns the totals.
func sweepAll(t *testing.T, s *Store, step int, idle func(key, val []byte) bool) SweepResult {
	t.Helper()
	var (
		cursor []byte
		total  SweepResult
	)
	for {
		next, res, err := s.Sweep(cursor, step, idle)
		if err != nil {
			t.Fatal(err)
		}
		total.Scanned += res.Scanned
		total.Deleted += res.Deleted
		if next == nil {
			return total
		}
		cursor = next
	}
}

// A record changed while the sweep runs is never lost: the sweep rechecks
// each candidate under its lock and deletes through the ordered path.
func TestSweepRacingWritesLosesNothing(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncEverySec} {
		t.Run(mode.String(), func(t *testing.T) {
			s := openMem(t, vfs.NewMem(), mode)
			defer s.Close()
			const n = 3000
			b := s.NewBatch()
			for i := range n {
				add(t, b, fmt.Sprintf("k%05d", i), 1)
			}
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			if got := s.Stats().Records; got != n {
				t.Fatalf("Records = %d, want %d", got, n)
			}
			if err := s.Flush(); err != nil { // the sweep reads what Pebble has
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				b := s.NewBatch()
				for i := n - 1; i >= 0; i -= 3 { // against the sweep's order
					if err := b.Modify(fmt.Appendf(nil, "k%05d", i), &counter{delta: 1}); err != nil {
						t.Error(err)
						return
					}
					if err := b.Commit(); err != nil {
						t.Error(err)
						return
					}
				}
			}()
			res := sweepAll(t, s, 97, idleIfOne)
			wg.Wait()
			if res.Scanned < n-n/3 || res.Scanned > n {
				t.Errorf("scanned %d records, want about %d", res.Scanned, n)
			}
			left := 0
			for i := range n {
				v, found := read(t, s, fmt.Sprintf("k%05d", i))
				touched := (n-1-i)%3 == 0
				if touched && !found {
					t.Fatalf("k%05d was written during the sweep and is gone", i)
				}
				if !touched && found {
					t.Fatalf("k%05d = %d survived the sweep, want it deleted", i, v)
				}
				if found {
					left++
				}
			}
			if got := s.Stats().Records; got != int64(left) {
				t.Errorf("Records = %d, want %d", got, left)
			}
			// A record deleted before its writer got to it comes back.
			if res.Deleted < n-left || res.Deleted > n {
				t.Errorf("Deleted = %d, want between %d and %d", res.Deleted, n-left, n)
			}
		})
	}
}

// The sweep leaves the cache to the records in use: its deletes evict no
// hot record, and once written leave no stripe over its share (the next
// write of a hot record in such a stripe evicted it).
func TestSweepKeepsHotRecordsCached(t *testing.T) {
	// 1 KiB a stripe holds about 16 of these records: the 20 cold ones of
	// a stripe, written at once, take most stripes over their share.
	s, err := Open("db", Options{fs: vfs.NewMem(), CacheMemory: MinCacheMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := s.NewBatch()
	for i := range 20000 {
		add(t, b, fmt.Sprintf("cold%05d", i), 1)
	}
	// The hot records are written in a round of their own and then read,
	// so that they are in use when the sweep runs: written in the cold
	// ones' round and never read, they were as cold as those, and whether
	// they stayed cached depended on which round they made.
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	hot := make([]string, 300)
	for i := range hot {
		hot[i] = fmt.Sprintf("hot%03d", i)
		add(t, b, hot[i], 5)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	// read makes two lookups per key; every one should be a hit.
	readHot := func(when string, want uint64) {
		t.Helper()
		before := s.Stats().CacheHits
		for _, k := range hot {
			if v, found := read(t, s, k); !found || v != want {
				t.Fatalf("%s: %s = %d, %v; want %d", when, k, v, found, want)
			}
		}
		if hits := s.Stats().CacheHits - before; hits != 2*int64(len(hot)) {
			t.Errorf("%s: %d of %d lookups of hot records hit the cache", when, hits, 2*len(hot))
		}
	}
	readHot("before the sweep", 5)
	res := sweepAll(t, s, 1000, idleIfOne)
	if res.Deleted != 20000 {
		t.Fatalf("deleted %d, want 20000", res.Deleted)
	}
	if err := s.Flush(); err != nil { // the deletes may take stripes over their share until written
		t.Fatal(err)
	}
	checkShares(t, s, "after the sweep")
	readHot("after the sweep", 5)
	for _, k := range hot {
		add(t, b, k, 1)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	readHot("after a write of each", 6)
	if st := s.Stats(); st.Records != 300 || st.SweepDeleted != 20000 {
		t.Errorf("Records = %d, SweepDeleted = %d, want 300 and 20000", st.Records, st.SweepDeleted)
	}
}

// The record count survives a reopen: it is recounted by the scan at Open.
func TestRecordsCountedAtOpen(t *testing.T) {
	fs := vfs.NewMem()
	s := openMem(t, fs, SyncEverySec)
	b := s.NewBatch()
	for i := range 500 {
		add(t, b, fmt.Sprintf("k%d", i), 1)
	}
	add(t, b, "k0", 1) // an update is not a new record
	b.Modify([]byte("k1"), &counter{del: true})
	b.Modify([]byte("never"), &counter{del: true}) // nothing to delete
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().Records; got != 499 {
		t.Fatalf("Records = %d, want 499", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openMem(t, fs, SyncEverySec)
	defer s.Close()
	if got := s.Stats().Records; got != 499 {
		t.Fatalf("Records after reopen = %d, want 499", got)
	}
}

// A checkpoint taken while writers run opens as a store of its own with
// every change committed before the call.
func TestCheckpointUnderLoad(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, "live"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := s.NewBatch()
	for i := range 1000 {
		add(t, b, fmt.Sprintf("k%d", i), uint64(i+1))
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		b := s.NewBatch()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := b.Modify(fmt.Appendf(nil, "other%d", i%5000), &counter{delta: 1}); err != nil {
				t.Error(err)
				return
			}
			if err := b.Commit(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	cp := filepath.Join(dir, "backups", "one")
	err = s.Checkpoint(cp)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(cp); err == nil {
		t.Fatal("a checkpoint into an existing directory succeeded")
	}
	c, err := Open(cp, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 1000 {
		if v, found := read(t, c, fmt.Sprintf("k%d", i)); !found || v != uint64(i+1) {
			t.Fatalf("checkpoint k%d = %d, %v; want %d", i, v, found, i+1)
		}
	}
	if err := c.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
}
