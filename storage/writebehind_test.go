package storage

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Write-behind (SyncEverySec and SyncNo): a key changed 1000 times, each
// change committed (acknowledged), waits in the queue and is written to
// Pebble once, with its last value, when the periodic tick (here Flush,
// with a tick that never comes) asks for it. Before, the committer wrote
// it about once a millisecond.
func TestWriteBehindWritesAKeyOncePerInterval(t *testing.T) {
	for _, mode := range []SyncMode{SyncEverySec, SyncNo} {
		t.Run(mode.String(), func(t *testing.T) {
			s, err := Open("db", Options{Sync: mode, fs: vfs.NewMem(), SyncInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			b := s.NewBatch()
			const n = 1000
			for range n {
				add(t, b, "hot", 1)
				if err := b.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			if st := s.Stats(); st.KeysWritten != 0 {
				t.Fatalf("after %d commits of one key: %d written to Pebble; want 0 until the interval ends", n, st.KeysWritten)
			}
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			if st := s.Stats(); st.KeysWritten != 1 || st.Queued != 0 || st.Dirty != 0 {
				t.Fatalf("after Flush: %d keys written, %d queued, %d dirty; want 1, 0, 0", st.KeysWritten, st.Queued, st.Dirty)
			}
			v, closer, err := s.db.Get([]byte("hot"))
			if err != nil {
				t.Fatal(err)
			}
			got := binary.BigEndian.Uint64(v)
			closer.Close()
			if got != n {
				t.Fatalf("Pebble holds %d, want the last value %d", got, n)
			}
			// A change after the round is queued again.
			add(t, b, "hot", 1)
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			if st := s.Stats(); st.Queued != 1 {
				t.Fatalf("a change after the round: %d keys queued, want 1", st.Queued)
			}
		})
	}
}

// A change whose key another Batch has noted already is still refused at
// Commit once the store has failed, as any change is: its reply must not
// say it was stored.
func TestWriteBehindCommitReportsFailure(t *testing.T) {
	s, err := Open("db", Options{Sync: SyncEverySec, fs: vfs.NewMem(), SyncInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, b := s.NewBatch(), s.NewBatch()
	add(t, a, "k", 1) // noted by a, not committed yet
	add(t, b, "k", 1)
	if !b.Pending() {
		t.Fatal("a Batch whose change another Batch queued reports nothing pending: its Commit would be skipped")
	}
	s.fail(errors.New("disk gone"))
	if err := b.Commit(); !errors.Is(err, ErrFailed) {
		t.Fatalf("Commit after the store failed: %v, want ErrFailed", err)
	}
}
