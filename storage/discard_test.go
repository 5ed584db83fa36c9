package storage

import (
	"errors"
	"testing"
	"time"
)

// heldReplicator hands each round to the test, which answers it.
type heldReplicator struct{ rounds chan heldRound }

type heldRound struct {
	keys   []string
	answer chan error
}

func (h *heldReplicator) Replicate(c int, ops []ReplicaOp) (<-chan error, error) {
	r := heldRound{answer: make(chan error, 1)}
	for _, op := range ops {
		r.keys = append(r.keys, string(op.Key))
	}
	h.rounds <- r
	return r.answer, nil
}

// TestDiscardDirtyLosesChangesNotYetProposed: a leader that loses its
// group's leadership drops its dirty records (DiscardDirty). A change
// queued for a round its committer has not proposed yet must then fail
// with ErrNotReplicated: its round finds the record gone and writes
// nothing, and an empty round is acknowledged at once. Found by the fault
// test of replicated shards: a leader stopped past an election timeout
// acknowledged, right after it was deposed, admissions the shard never
// took.
func TestDiscardDirtyLosesChangesNotYetProposed(t *testing.T) {
	h := &heldReplicator{rounds: make(chan heldRound, 4)}
	s, err := Open(t.TempDir(), Options{Sync: SyncAlways, Committers: 1, Replicator: h})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commit := func(key string) <-chan error {
		done := make(chan error, 1)
		go func() {
			b := s.NewBatch()
			if err := b.Modify([]byte(key), &putValue{v: []byte("v")}); err != nil {
				done <- err
				return
			}
			done <- b.Commit()
		}()
		return done
	}
	next := func() heldRound {
		t.Helper()
		select {
		case r := <-h.rounds:
			return r
		case <-time.After(30 * time.Second): // bounds a hang only
			t.Fatal("no round proposed")
			return heldRound{}
		}
	}
	a := commit("\x00\x01a")
	r1 := next()
	b := commit("\x00\x01b")
	r2 := next() // proposed; the committer now waits for r1's answer
	c := commit("\x00\x01c")
	q := s.queues[0]
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		q.Lock()
		queued := len(q.ends)
		q.Unlock()
		if queued > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("c never queued")
		}
	}
	if n, err := s.DiscardDirty([]byte{0}, []byte{0xfe}); err != nil || n != 3 {
		t.Fatalf("DiscardDirty: %d records, %v; want 3", n, err)
	}
	r1.answer <- nil // both proposed rounds were committed after all
	r2.answer <- nil
	for name, done := range map[string]<-chan error{"a": a, "b": b} {
		if err := <-done; err != nil {
			t.Errorf("the change of %s, proposed and committed: %v", name, err)
		}
	}
	if err := <-c; !errors.Is(err, ErrNotReplicated) {
		t.Errorf("the change of c, never proposed, its record dropped: %v; want ErrNotReplicated", err)
	}
	select {
	case r := <-h.rounds:
		t.Errorf("a round proposed after the discard: %q", r.keys)
		r.answer <- nil
	default:
	}
}

// TestDiscardDirtyFailsAChangeMadeBefore: a change made (Modify) before
// its node loses the group's leadership and drops its dirty records, and
// committed after, must fail with ErrNotReplicated: it was never queued
// when the drop marked the queued rounds lost, and its round finds the
// record gone and writes nothing. Acknowledged before, it was lost: a
// replication test found 1,442 records of 4,196 missing from the leader
// right after their Commit returned nil.
func TestDiscardDirtyFailsAChangeMadeBefore(t *testing.T) {
	h := &heldReplicator{rounds: make(chan heldRound, 4)}
	s, err := Open(t.TempDir(), Options{Sync: SyncAlways, Committers: 1, Replicator: h})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := s.NewBatch()
	if err := b.Modify([]byte("\x00\x01a"), &putValue{v: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.DiscardDirty([]byte{0}, []byte{0xfe}); err != nil || n != 1 {
		t.Fatalf("DiscardDirty: %d records, %v; want 1", n, err)
	}
	if err := b.Commit(); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("a change made before its record was dropped, committed after: %v; want ErrNotReplicated", err)
	}
	select {
	case r := <-h.rounds:
		t.Errorf("a round proposed for a dropped change: %q", r.keys)
		r.answer <- nil
	default:
	}
	// A change made after the drop is not refused.
	b = s.NewBatch()
	if err := b.Modify([]byte("\x00\x01b"), &putValue{v: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Commit() }()
	select {
	case r := <-h.rounds:
		r.answer <- nil
	case <-time.After(30 * time.Second): // bounds a hang only
		t.Fatal("no round proposed")
	}
	if err := <-done; err != nil {
		t.Errorf("a change made after the drop: %v", err)
	}
}
