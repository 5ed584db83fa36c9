package replication

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/storage"
)

// The store's own writes through its group (storage.Options.Replicator):
// a Batch committed on the leader is proposed as a round by the store's
// committer, and its Commit returns once the group has committed it.

// setTo is a mutator that sets a record's value.
type setTo string

func (v setTo) Mutate([]byte, bool) ([]byte, storage.Op, error) {
	return []byte(v), storage.Put, nil
}

// reader is a mutator that only reads.
type reader struct {
	val   string
	found bool
}

func (r *reader) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	r.val, r.found = string(old), found
	return nil, storage.Keep, nil
}

// get reads key on node id as a command would: the store's table first.
func (c *testCluster) get(id uint64, key []byte) (string, bool) {
	c.t.Helper()
	var r reader
	if err := c.nodes[id].store.NewBatch().Modify(key, &r); err != nil {
		c.t.Fatalf("node %d: read %q: %v", id, key, err)
	}
	return r.val, r.found
}

// commitAsync sets key to val on node id in a Batch and commits it, on a
// goroutine of its own: the Commit waits for the group, which the test
// drives.
func (c *testCluster) commitAsync(id uint64, key []byte, val string) <-chan error {
	done := make(chan error, 1)
	s := c.nodes[id].store
	go func() {
		b := s.NewBatch()
		if err := b.Modify(key, setTo(val)); err != nil {
			done <- err
			return
		}
		done <- b.Commit()
	}()
	return done
}

// driveUntil settles the cluster, ticking it when tick is set, until done
// answers, and returns the answer. The deadline only bounds a hang.
func (c *testCluster) driveUntil(done <-chan error, tick bool) error {
	c.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		select {
		case err := <-done:
			return err
		default:
		}
		if tick {
			for _, id := range c.ids {
				if !c.down[id] {
					c.nodes[id].g.Tick()
				}
			}
		}
		c.settle()
		runtime.Gosched()
	}
	c.t.Fatal("the commit never returned")
	return nil
}

var keyA, keyB = []byte("\x00\x01a"), []byte("\x00\x02b")

// TestReplicatedCommitReachesEveryReplica: a Batch committed on the
// leader returns once its round is committed by the group, and every
// replica then holds the record, counted once.
func TestReplicatedCommitReachesEveryReplica(t *testing.T) {
	c := newTestClusterOf(t, 3, 100, true, false)
	lead := c.electLeader()
	if err := c.driveUntil(c.commitAsync(lead, keyA, "v1"), false); err != nil {
		t.Fatalf("commit on the leader: %v", err)
	}
	c.settle()
	for _, id := range c.ids {
		if v, ok := c.get(id, keyA); !ok || v != "v1" {
			t.Errorf("node %d: %q %v; want v1", id, v, ok)
		}
		if n := c.nodes[id].store.Records(); n != 1 {
			t.Errorf("node %d counts %d records; want 1", id, n)
		}
	}
	// A follower's store refuses its own writes: it is not the leader.
	var follower uint64
	for _, id := range c.ids {
		if id != lead {
			follower = id
		}
	}
	err := c.driveUntil(c.commitAsync(follower, keyB, "no"), false)
	if !errors.Is(err, storage.ErrNotReplicated) || !errors.Is(err, ErrNotLeader) {
		t.Fatalf("commit on a follower: %v; want ErrNotReplicated for ErrNotLeader", err)
	}
	c.dropped(follower, keyB, 1)
	// Its lost round leaves nothing to write: Flush (COMPACT's, a
	// checkpoint's) does not fail for it.
	if err := c.nodes[follower].store.Flush(); err != nil {
		t.Errorf("Flush on the follower after its refused change: %v", err)
	}
}

// dropped fails unless node id no longer shows a change of key it made
// and its group did not commit, and counts records records.
func (c *testCluster) dropped(id uint64, key []byte, records int64) {
	c.t.Helper()
	if v, ok := c.get(id, key); ok {
		c.t.Errorf("node %d still reads %q under %q, a change its group did not commit", id, v, key)
	}
	if n := c.nodes[id].store.Records(); n != records {
		c.t.Errorf("node %d counts %d records; want %d", id, n, records)
	}
}

// TestDeposedLeaderDropsWhatItsGroupDidNotCommit: a leader cut off from
// its group takes a change it cannot replicate; its Commit fails with
// ErrNotReplicated once it is no longer the leader, and the change is no
// longer readable there, while what the new leader commits reaches it.
func TestDeposedLeaderDropsWhatItsGroupDidNotCommit(t *testing.T) {
	c := newTestClusterOf(t, 3, 100, true, false)
	old := c.electLeader()
	if err := c.driveUntil(c.commitAsync(old, keyA, "v1"), false); err != nil {
		t.Fatalf("commit on the leader: %v", err)
	}
	var others []uint64
	for _, id := range c.ids {
		if id != old {
			others = append(others, id)
			c.cut[[2]uint64{old, id}] = true
		}
	}
	lost := c.commitAsync(old, keyA, "v2")
	// Until the commit fails, the cut-off leader shows its change: that
	// is what a lost write in everysec looks like to its own clients.
	err := c.driveUntil(lost, true)
	if !errors.Is(err, storage.ErrNotReplicated) {
		t.Fatalf("commit on a leader cut off from its group: %v; want ErrNotReplicated", err)
	}
	if v, _ := c.get(old, keyA); v != "v1" {
		t.Errorf("the deposed leader reads %q; want the committed v1", v)
	}
	lead := c.electLeader(others...)
	if err := c.driveUntil(c.commitAsync(lead, keyB, "w"), false); err != nil {
		t.Fatalf("commit on the new leader: %v", err)
	}
	clear(c.cut)
	c.tickUntil(500, "the old leader to follow", func() bool {
		v, _ := c.get(old, keyB)
		return v == "w"
	})
	for _, id := range c.ids {
		if v, _ := c.get(id, keyA); v != "v1" {
			t.Errorf("node %d reads %q under key A; want v1", id, v)
		}
		if n := c.nodes[id].store.Records(); n != 2 {
			t.Errorf("node %d counts %d records; want 2", id, n)
		}
	}
}

// TestDeposedLeaderDropsChangesNotYetProposed: in everysec a change waits
// in the leader's table before its round is proposed, and its Commit has
// returned; once that leader is deposed (cut off, CheckQuorum), the
// change, which the group never saw, is dropped there.
func TestDeposedLeaderDropsChangesNotYetProposed(t *testing.T) {
	c := newTestClusterOf(t, 3, 100, true, true)
	old := c.electLeader()
	if err := c.driveUntil(c.commitAsync(old, keyA, "v1"), false); err != nil {
		t.Fatalf("commit on the leader: %v", err)
	}
	if v, _ := c.get(old, keyA); v != "v1" {
		t.Fatalf("the leader reads %q after its commit; want v1", v)
	}
	for _, id := range c.ids {
		if id != old {
			c.cut[[2]uint64{old, id}] = true
		}
	}
	c.tickUntil(500, "the cut-off leader to step down", func() bool { return c.nodes[old].g.Status().Role != "leader" })
	c.dropped(old, keyA, 0)
}

// TestLeaderKeepsItsLaterChangeWhenItsRoundApplies: a record changed on
// the leader again while its previous round waits for the group keeps the
// later value when that round is applied there, and the later round
// brings it to every replica.
func TestLeaderKeepsItsLaterChangeWhenItsRoundApplies(t *testing.T) {
	c := newTestClusterOf(t, 3, 100, true, false)
	lead := c.electLeader()
	g := c.nodes[lead].g
	first := c.commitAsync(lead, keyA, "v1")
	for deadline := time.Now().Add(30 * time.Second); ; runtime.Gosched() {
		g.mu.Lock()
		n := len(g.mu.waiters)
		g.mu.Unlock()
		if n > 0 {
			break // the round of v1 is proposed, not yet committed
		}
		if time.Now().After(deadline) {
			t.Fatal("the round of v1 was never proposed")
		}
	}
	b := c.nodes[lead].store.NewBatch()
	if err := b.Modify(keyA, setTo("v2")); err != nil {
		t.Fatal(err)
	}
	if err := c.driveUntil(first, false); err != nil {
		t.Fatalf("commit of v1: %v", err)
	}
	if v, _ := c.get(lead, keyA); v != "v2" {
		t.Fatalf("the leader reads %q once its round of v1 is applied; want its later v2", v)
	}
	second := make(chan error, 1)
	go func() { second <- b.Commit() }()
	if err := c.driveUntil(second, false); err != nil {
		t.Fatalf("commit of v2: %v", err)
	}
	c.settle()
	for _, id := range c.ids {
		if v, _ := c.get(id, keyA); v != "v2" {
			t.Errorf("node %d reads %q; want v2", id, v)
		}
		if n := c.nodes[id].store.Records(); n != 1 {
			t.Errorf("node %d counts %d records; want 1", id, n)
		}
	}
}

// removeIt is a mutator that deletes a record.
type removeIt struct{}

func (removeIt) Mutate([]byte, bool) ([]byte, storage.Op, error) { return nil, storage.Delete, nil }

// change is one Modify of a Batch.
type change struct {
	key []byte
	m   storage.Mutator
}

// commitChanges makes changes on node id in one Batch, commits it and
// drives the cluster until the commit returns.
func (c *testCluster) commitChanges(id uint64, changes ...change) {
	c.t.Helper()
	done := make(chan error, 1)
	s := c.nodes[id].store
	go func() {
		b := s.NewBatch()
		for _, ch := range changes {
			if err := b.Modify(ch.key, ch.m); err != nil {
				done <- err
				return
			}
		}
		done <- b.Commit()
	}()
	if err := c.driveUntil(done, false); err != nil {
		c.t.Fatalf("commit on node %d: %v", id, err)
	}
}

// TestFollowerCountsFollowTheLeader: a follower's record counts equal the
// leader's after rounds that create, update and delete records, a key
// created and deleted within one round and one created and deleted by two
// rounds, with several rounds applied at once, and again after a restart
// that applies the last rounds a second time.
func TestFollowerCountsFollowTheLeader(t *testing.T) {
	c := newTestClusterOf(t, 3, 100, true, false)
	lead := c.electLeader()
	f := others(c.ids, lead)[0]
	k := func(i int) []byte { return testKey(i) }
	// f hears nothing until the end: it then applies every round at once.
	c.cut[[2]uint64{lead, f}] = true
	c.commitChanges(lead, change{k(1), setTo("v1")}, change{k(2), setTo("v2")}, change{k(3), setTo("v3")})
	afterCreate := c.nodes[lead].g.Status().Applied
	c.commitChanges(lead, change{k(1), setTo("v1b")}, change{k(2), removeIt{}})
	c.commitChanges(lead, change{k(4), setTo("v4")}, change{k(4), removeIt{}}) // one round
	c.commitChanges(lead, change{k(5), setTo("v5")})
	c.commitChanges(lead, change{k(5), removeIt{}})
	end := c.nodes[lead].g.Status().Applied
	clear(c.cut)
	c.tickUntil(100, "the cut-off follower to catch up", func() bool { return c.nodes[f].g.Status().Applied == end })
	want := c.records(lead)
	if len(want) != 2 {
		t.Fatalf("the leader holds %d records, want 2: %q", len(want), want)
	}
	c.sameRecords(want) // and their counts

	// What a crash of f can leave: the applied index, and the records, of
	// the first round; the restart applies the others again.
	c.reapply(f, lead, afterCreate, func(b *storage.ReplicaBatch) error {
		if err := b.PutRecord(k(1), []byte("v1")); err != nil {
			return err
		}
		return b.PutRecord(k(2), []byte("v2"))
	})
	c.sameRecords(want) // and their counts
}
