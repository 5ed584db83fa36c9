package replication

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/storage"
)

// Log answers as raft's own MemoryStorage does, the model, through random
// appends (overwriting conflicting tails), truncations and reopenings,
// with entries big enough that it keeps only some of them in memory.
func TestLogMatchesMemoryStorage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	s, err := storage.Open(dir, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	l, err := OpenLog(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	model := raft.NewMemoryStorage()
	rng := rand.New(rand.NewPCG(1, 2))
	b := s.NewReplicaBatch()
	term := uint64(1)
	for step := range 400 {
		first, _ := model.FirstIndex()
		last, _ := model.LastIndex()
		switch op := rng.IntN(10); {
		case op < 6: // append, maybe over a tail
			start := first + uint64(rng.IntN(int(last-first+2)))
			term += uint64(rng.IntN(2))
			var ents []*pb.Entry
			for i := range 1 + rng.IntN(5) {
				pad := rng.IntN(50)
				if rng.IntN(8) == 0 {
					pad = rng.IntN(DefaultLogMemory / 2) // past the entries kept in memory
				}
				ents = append(ents, &pb.Entry{Index: proto.Uint64(start + uint64(i)), Term: proto.Uint64(term),
					Data: fmt.Appendf(nil, "step %d entry %d %s", step, i, make([]byte, pad))})
			}
			var c logChange
			hs := &pb.HardState{Term: proto.Uint64(term), Commit: proto.Uint64(start - 1)}
			if err := l.stageAppend(b, &c, ents, hs); err != nil {
				t.Fatal(err)
			}
			if err := b.Commit(true); err != nil {
				t.Fatal(err)
			}
			l.settle(&c)
			if err := model.Append(ents); err != nil {
				t.Fatal(err)
			}
			model.SetHardState(hs)
		case op < 8 && last > first: // truncate
			i := first + uint64(rng.IntN(int(last-first)))
			var c logChange
			// The group truncates only what it has applied.
			if err := l.stageApplied(b, &c, i, &pb.ConfState{}); err != nil {
				t.Fatal(err)
			}
			if err := l.stageCompact(b, &c, i); err != nil {
				t.Fatal(err)
			}
			if err := b.Commit(false); err != nil {
				t.Fatal(err)
			}
			l.settle(&c)
			if err := model.Compact(i); err != nil {
				t.Fatal(err)
			}
		default: // reopen from the store
			if l, err = OpenLog(s, 1); err != nil {
				t.Fatal(err)
			}
			// Reopened, the log counts its bytes from the store.
			if got, want := l.logBytes(), storedLogBytes(t, s, l); got != want {
				t.Fatalf("step %d: reopened, the log counts %d bytes, holds %d", step, got, want)
			}
		}
		compareLog(t, step, l, model)
		// Truncating a mark in two or replacing a tail overcounts a little,
		// never under: the log keeps at least what it is to keep.
		if got, want := l.logBytes(), storedLogBytes(t, s, l); got < want {
			t.Fatalf("step %d: the log counts %d bytes, holds %d", step, got, want)
		}
	}
}

// storedLogBytes returns the bytes of l's entries in the store.
func storedLogBytes(t *testing.T, s *storage.Store, l *Log) uint64 {
	t.Helper()
	var n uint64
	err := s.ReplicaScan(groupKey(l.group, keyEntry), groupKey(l.group, keyEntry+1), func(_, v []byte) bool {
		n += uint64(len(v))
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func compareLog(t *testing.T, step int, l *Log, m *raft.MemoryStorage) {
	t.Helper()
	lf, _ := l.FirstIndex()
	mf, _ := m.FirstIndex()
	ll, _ := l.LastIndex()
	ml, _ := m.LastIndex()
	if lf != mf || ll != ml {
		t.Fatalf("step %d: log [%d, %d], model [%d, %d]", step, lf, ll, mf, ml)
	}
	hs, _, _ := l.InitialState()
	mhs, _, _ := m.InitialState()
	if !(raft.IsEmptyHardState(hs) && raft.IsEmptyHardState(mhs)) && !proto.Equal(hs, mhs) {
		t.Fatalf("step %d: hard state %v, model %v", step, hs, mhs)
	}
	for i := mf - 1; i <= ml+1; i++ {
		lt, lerr := l.Term(i)
		mt, merr := m.Term(i)
		if lt != mt || !errors.Is(lerr, merr) {
			t.Fatalf("step %d: Term(%d) = %d, %v; model %d, %v", step, i, lt, lerr, mt, merr)
		}
	}
	for lo := mf; lo <= ml; lo++ {
		for _, max := range []uint64{0, 60, 200, 1 << 20} {
			le, lerr := l.Entries(lo, ml+1, max)
			me, merr := m.Entries(lo, ml+1, max)
			if (lerr == nil) != (merr == nil) || len(le) != len(me) {
				t.Fatalf("step %d: Entries(%d, %d, %d): %d entries, %v; model %d, %v", step, lo, ml+1, max, len(le), lerr, len(me), merr)
			}
			for i := range le {
				if !proto.Equal(le[i], me[i]) {
					t.Fatalf("step %d: Entries(%d...)[%d] = %v, model %v", step, lo, i, le[i], me[i])
				}
			}
		}
	}
	if _, err := l.Entries(mf-1, ml+1, 0); mf > 1 && err != raft.ErrCompacted {
		t.Fatalf("step %d: Entries below the first index: %v, want ErrCompacted", step, err)
	}
}

// Raft reads the log (Entries, on the leader, for a follower that lags)
// while the Ready loop truncates it: a read that finds the start of its
// range gone is a compaction, ErrCompacted, which makes raft send a
// snapshot; any other error makes raft panic, failing the group.
func TestLogEntriesDuringCompaction(t *testing.T) {
	s, err := storage.Open(filepath.Join(t.TempDir(), "db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := OpenLog(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewReplicaBatch()
	var ents []*pb.Entry
	for i := uint64(1); i <= 20; i++ {
		ents = append(ents, &pb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(1), Data: []byte("round")})
	}
	var c logChange
	if err := l.stageAppend(b, &c, ents, &pb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(20)}); err != nil {
		t.Fatal(err)
	}
	if err := l.stageApplied(b, &c, 20, &pb.ConfState{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
	l.settle(&c)
	// The truncation's write has landed; the Log's bounds are not yet
	// updated, as a reader racing the Ready loop sees them.
	c = logChange{}
	if err := l.stageCompact(b, &c, 10); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(false); err != nil {
		t.Fatal(err)
	}
	// Entries kept in memory are still the log's, whatever the store
	// holds now.
	if got, err := l.Entries(5, 21, 1<<20); err != nil || len(got) != 16 {
		t.Fatalf("Entries(5, 21) racing a truncation to 10, from memory: %d entries, %v", len(got), err)
	}
	l.mu.Lock()
	l.keepRecentLocked(nil, 0) // read from the store from now on
	l.mu.Unlock()
	for _, lo := range []uint64{5, 10} {
		if _, err := l.Entries(lo, 21, 1<<20); err != raft.ErrCompacted {
			t.Fatalf("Entries(%d, 21) racing a truncation to 10: %v, want ErrCompacted", lo, err)
		}
	}
	l.settle(&c)
	if got, err := l.Entries(11, 21, 1<<20); err != nil || len(got) != 10 {
		t.Fatalf("Entries(11, 21) after the truncation: %d entries, %v", len(got), err)
	}
}
