package storage

import (
	"encoding/binary"
	"path/filepath"
	"testing"
	"time"
)

// Write-behind: b's change to k is committed (acknowledged) while a, which
// noted k first, has not committed yet. Flush promises "every change
// committed before the call has been written to Pebble" and Checkpoint
// "every change committed before the call is in it": b's change must be in
// both, whatever a does. (A first write-behind skipped b's note because a
// had noted k, and lost it.)
func TestWriteBehindFlushHoldsAcknowledgedChange(t *testing.T) {
	for _, mode := range []SyncMode{SyncEverySec, SyncNo} {
		t.Run(mode.String(), func(t *testing.T) {
			s, err := Open(t.TempDir(), Options{Sync: mode, SyncInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			a, b := s.NewBatch(), s.NewBatch()
			add(t, a, "k", 1) // noted by a, not committed
			add(t, b, "k", 1)
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			// b's reply was sent: k=2 is acknowledged.
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			v, closer, err := s.db.Get([]byte("k"))
			if err != nil {
				t.Errorf("after b.Commit and Flush, Pebble has no k: %v (want 2)", err)
			} else {
				got := binary.BigEndian.Uint64(v)
				closer.Close()
				if got != 2 {
					t.Errorf("after Flush, Pebble holds k=%d, want 2", got)
				}
			}
			dir := filepath.Join(t.TempDir(), "cp")
			if err := s.Checkpoint(dir); err != nil {
				t.Fatal(err)
			}
			c, err := Open(dir, Options{Sync: mode})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, closer, err := c.db.Get([]byte("k")); err != nil {
				t.Errorf("checkpoint taken after b's acknowledged change has no k: %v", err)
			} else {
				closer.Close()
			}
			_ = a.Commit()
		})
	}
}

// A Batch that noted k and is then dropped without Commit (as a caller
// does on an error return) must not keep later changes to k, by other
// Batches, from being written: they survive Close and reopen.
func TestWriteBehindDroppedBatchLosesOnlyItsOwn(t *testing.T) {
	for _, mode := range []SyncMode{SyncEverySec, SyncNo} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			s, err := Open(dir, Options{Sync: mode, SyncInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			a := s.NewBatch()
			add(t, a, "k", 1) // a is dropped: never committed
			b := s.NewBatch()
			for range 5 {
				add(t, b, "k", 1)
				if err := b.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s, err = Open(dir, Options{Sync: mode})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			v, closer, err := s.db.Get([]byte("k"))
			if err != nil {
				t.Fatalf("5 acknowledged changes to k by b, Close, reopen: k not stored: %v", err)
			}
			got := binary.BigEndian.Uint64(v)
			closer.Close()
			if got < 5 {
				t.Fatalf("k=%d after reopen, want at least b's 5", got)
			}
		})
	}
}

type setMutator struct{ val []byte }

func (m *setMutator) Mutate([]byte, bool) ([]byte, Op, error) { return m.val, Put, nil }

// MaxQueuedBytes bounds the dirty bytes waiting for the committer even when
// a key's value grows after it was first noted: each change charges the
// entry's size, so the round falls due before the tick.
func TestWriteBehindQueueBytesCharged(t *testing.T) {
	const bound = 1 << 20
	s, err := Open(t.TempDir(), Options{Sync: SyncEverySec, SyncInterval: time.Hour, MaxQueuedBytes: bound})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, b := s.NewBatch(), s.NewBatch()
	small, big := &setMutator{val: []byte("x")}, &setMutator{val: make([]byte, 256<<10)}
	const n = 32
	for i := range n {
		if err := a.Modify([]byte{0, 1, byte(i)}, small); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Commit(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := b.Modify([]byte{0, 1, byte(i)}, big); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	t.Logf("queued %d keys, dirty %d, cache bytes %d, keys written %d, bound %d", st.Queued, st.Dirty, st.CacheBytes, st.KeysWritten, bound)
	if st.KeysWritten == 0 && st.CacheBytes > 2*bound {
		t.Fatalf("%d bytes of dirty entries wait for the committer (nothing written), against MaxQueuedBytes %d", st.CacheBytes, bound)
	}
}

// A change to k made while the committer writes k's round, after it read
// k's value, is noted again and the next round writes it.
func TestWriteBehindModifyDuringRound(t *testing.T) {
	for _, mode := range []SyncMode{SyncEverySec, SyncNo} {
		t.Run(mode.String(), func(t *testing.T) {
			var s *Store
			var b2 *Batch
			once := false
			o := Options{Sync: mode, fs: nil, SyncInterval: time.Hour}
			o.afterKey = func(key []byte) {
				if string(key) == "k" && !once {
					once = true
					add(t, b2, "k", 10)
					if err := b2.Commit(); err != nil {
						t.Error(err)
					}
				}
			}
			var err error
			s, err = Open(t.TempDir(), o)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			b2 = s.NewBatch()
			b := s.NewBatch()
			add(t, b, "k", 1)
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			v, closer, err := s.db.Get([]byte("k"))
			if err != nil {
				t.Fatal(err)
			}
			got := binary.BigEndian.Uint64(v)
			closer.Close()
			if !once || got != 11 {
				t.Fatalf("hook ran %v; Pebble holds k=%d, want 11", once, got)
			}
		})
	}
}

// A transaction changes k while an uncommitted Batch a has noted k; later
// changes are noted too, and the final value reaches Pebble.
func TestWriteBehindTxWhileQueued(t *testing.T) {
	s, err := Open(t.TempDir(), Options{Sync: SyncEverySec, SyncInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, tx, c := s.NewBatch(), s.NewBatch(), s.NewBatch()
	add(t, a, "k", 1)
	tx.Hold(false)
	add(t, tx, "k", 10)
	tx.Release()
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	add(t, c, "k", 100)
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	v, closer, err := s.db.Get([]byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	got := binary.BigEndian.Uint64(v)
	closer.Close()
	if err := a.Commit(); err != nil {
		t.Fatal(err)
	}
	if got != 111 {
		t.Fatalf("Pebble holds k=%d after tx and c committed and Flush, want 111", got)
	}
}
