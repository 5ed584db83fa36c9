package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/storage"
)

// Three replicas elect a leader, and the rounds it proposes reach every
// replica's store, puts and deletes alike, with the record counts.
func TestGroupReplicatesRounds(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	lead := c.electLeader()
	want := map[string]string{}
	for i := range 50 {
		k := testKey(i)
		c.propose(lead, put(k, fmt.Sprint(i)), put(testKey(1000+i), "x"))
		want[string(k)] = fmt.Sprint(i)
		want[string(testKey(1000+i))] = "x"
		if i%5 == 0 {
			c.propose(lead, Op{Key: testKey(1000 + i), Delete: true})
			delete(want, string(testKey(1000+i)))
		}
	}
	c.tickUntil(50, "followers behind", func() bool {
		for _, id := range c.ids {
			if c.nodes[id].g.Status().Applied != c.nodes[lead].g.Status().Applied {
				return false
			}
		}
		return true
	})
	c.sameRecords(want)

	// A follower refuses proposals and names the leader.
	f := others(c.ids, lead)[0]
	_, err := c.nodes[f].g.Propose([]Op{put(testKey(1), "no")})
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.Leader != lead || !errors.Is(err, ErrNotLeader) {
		t.Fatalf("proposal on follower %d: %v, want NotLeaderError naming %d", f, err, lead)
	}
	// A key outside the group's range, or among the store's own, is
	// refused before it reaches the log.
	if _, err := c.nodes[lead].g.Propose([]Op{put([]byte{0x50}, "x")}); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("out of range: %v", err)
	}
	if _, err := c.nodes[lead].g.Propose([]Op{put([]byte{0xff, 'x'}, "x")}); !errors.Is(err, ErrBadRound) {
		t.Fatalf("reserved key: %v", err)
	}
}

// When the leader stops, the others elect a new one within the election
// timeout (in ticks) and go on; the old leader, back, follows and catches
// up.
func TestGroupFailsOver(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	old := c.electLeader()
	c.propose(old, put(testKey(1), "before"))
	c.stop(old)
	rest := others(c.ids, old)
	lead := c.electLeader(rest...)
	if lead == old {
		t.Fatalf("node %d, stopped, still leads", old)
	}
	c.propose(lead, put(testKey(2), "after"))
	c.start(old, c.nodes[old].dir, c.ids)
	c.tickUntil(100, "the old leader did not catch up", func() bool {
		return c.nodes[old].g.Status().Applied == c.nodes[lead].g.Status().Applied && c.leader() == lead
	})
	c.sameRecords(map[string]string{string(testKey(1)): "before", string(testKey(2)): "after"})
}

// A leader cut off from both followers steps down on its own (CheckQuorum)
// within an election timeout, its pending proposal fails as lost, the
// others elect a leader, and after the partition heals the old leader
// follows the new one and drops its uncommitted round.
func TestGroupPartitionedLeaderStepsDown(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	old := c.electLeader()
	c.propose(old, put(testKey(1), "committed"))
	rest := others(c.ids, old)
	for _, id := range rest {
		c.cut[[2]uint64{old, id}] = true
	}
	ch, err := c.nodes[old].g.Propose([]Op{put(testKey(2), "never committed")})
	if err != nil {
		t.Fatal(err)
	}
	c.tickUntil(3*DefaultElectionTicks, "the partitioned leader did not step down", func() bool {
		return c.nodes[old].g.Status().Role != "leader"
	})
	select {
	case err := <-ch:
		if !errors.Is(err, ErrProposalLost) {
			t.Fatalf("pending proposal: %v, want ErrProposalLost", err)
		}
	default:
		t.Fatal("the pending proposal was not answered when leadership was lost")
	}
	lead := c.electLeader(rest...)
	c.propose(lead, put(testKey(3), "new leader"))
	clear(c.cut)
	c.tickUntil(100, "the old leader did not rejoin", func() bool {
		return c.leader() == lead && c.nodes[old].g.Status().Applied == c.nodes[lead].g.Status().Applied
	})
	c.sameRecords(map[string]string{string(testKey(1)): "committed", string(testKey(3)): "new leader"})
}

// A follower whose data directory is wiped rejoins by snapshot, the
// leader's log having been truncated past everything it held, with every
// record intact, and then serves as leader. It comes back under a new
// identity, as a learner that is then promoted in place of the lost one:
// Raft assumes a replica never forgets what it acknowledged, and the
// same identity with an empty log fails its group (ErrReplicaLost) rather
// than take part.
func TestGroupWipedFollowerRejoinsBySnapshot(t *testing.T) {
	const keep = 5
	c := newTestCluster(t, 3, keep)
	lead := c.electLeader()
	want := map[string]string{}
	write := func(from, to int) {
		for i := from; i < to; i++ {
			var ops []Op
			for j := range 20 {
				k := testKey(i*20 + j)
				ops = append(ops, put(k, fmt.Sprint(i)))
				want[string(k)] = fmt.Sprint(i)
			}
			c.propose(lead, ops...)
		}
	}
	write(0, 20)
	lost := others(c.ids, lead)[0]
	c.stop(lost)
	write(20, 40)
	if first, _ := c.nodes[lead].g.log.FirstIndex(); first <= 2 {
		t.Fatalf("the leader's log starts at %d: not truncated", first)
	}
	c.wipe(lost)

	// Under its old identity the empty replica is refused, and its group
	// fails without taking the process down.
	c.start(lost, c.nodes[lost].dir, nil)
	c.lenient = true
	c.tickUntil(20, "the replica with a lost log kept running", func() bool {
		return errors.Is(c.nodes[lost].g.failedErr(), ErrReplicaLost)
	})
	c.lenient = false
	c.stop(lost)
	c.wipe(lost)

	const fresh = 4
	c.ids = append(c.ids, fresh)
	c.start(fresh, c.nodes[lost].dir, nil)
	change := func(ccs ...*pb.ConfChangeSingle) {
		t.Helper()
		if err := c.nodes[lead].g.ChangeMembers(&pb.ConfChangeV2{Changes: ccs}); err != nil {
			t.Fatal(err)
		}
	}
	change(&pb.ConfChangeSingle{Type: pb.ConfChangeAddLearnerNode.Enum(), NodeId: proto.Uint64(fresh)})
	c.tickUntil(100, "the new replica did not catch up", func() bool {
		return c.nodes[fresh].g.Status().Applied == c.nodes[lead].g.Status().Applied
	})
	if c.snaps == 0 {
		t.Fatal("caught up without a snapshot")
	}
	c.sameRecords(want)
	change(
		&pb.ConfChangeSingle{Type: pb.ConfChangeAddNode.Enum(), NodeId: proto.Uint64(fresh)},
		&pb.ConfChangeSingle{Type: pb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(lost)},
	)
	c.tickUntil(100, "the new replica is not a voter", func() bool {
		vs := c.nodes[lead].g.log.confState().GetVoters()
		return slices.Contains(vs, fresh) && !slices.Contains(vs, lost) && len(c.nodes[lead].g.log.confState().GetVotersOutgoing()) == 0
	})

	// It leads, and what it proposes is applied on the others.
	c.nodes[lead].g.TransferLeadership(fresh)
	c.tickUntil(100, "leadership did not move to the rejoined replica", func() bool { return c.leader() == fresh })
	c.propose(fresh, put(testKey(0), "from the rejoined leader"))
	want[string(testKey(0))] = "from the rejoined leader"
	c.tickUntil(10, "not applied everywhere", func() bool {
		for _, id := range c.ids {
			if !c.down[id] && c.nodes[id].g.Status().Applied != c.nodes[fresh].g.Status().Applied {
				return false
			}
		}
		return true
	})
	c.sameRecords(want)
}

// Applying is not synced: a crash may lose the last applied rounds and the
// applied index with them (one atomic write). The restart applies the log
// again from the applied index.
func TestGroupReappliesFromAppliedIndex(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	lead := c.electLeader()
	for i := range 10 {
		c.propose(lead, put(testKey(i), fmt.Sprint(i)))
	}
	want := c.records(lead)
	f := others(c.ids, lead)[0]
	c.tickUntil(10, "follower behind", func() bool {
		return c.nodes[f].g.Status().Applied == c.nodes[lead].g.Status().Applied
	})
	// What a crash can leave: the applied index of three rounds before,
	// and none of the records those rounds wrote.
	c.reapply(f, lead, c.nodes[f].g.Status().Applied-3, func(b *storage.ReplicaBatch) error {
		for i := 7; i < 10; i++ {
			if err := b.DeleteRecord(testKey(i)); err != nil {
				return err
			}
		}
		return nil
	})
	c.sameRecords(want)
}

// A snapshot stream that is cut, garbled, meant for another node or
// older than what the replica has is refused with an error, and the
// replica's records and its group go on as before.
func TestReadSnapshotRefusesBadStreams(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	lead := c.electLeader()
	c.propose(lead, put(testKey(1), "a"), put(testKey(2), "b"))
	f := others(c.ids, lead)[0]
	c.tickUntil(10, "follower behind", func() bool {
		return c.nodes[f].g.Status().Applied == c.nodes[lead].g.Status().Applied
	})
	want := c.records(f)
	snap, err := c.nodes[lead].g.log.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	msg := func(to, index uint64) *pb.Message {
		s := proto.Clone(snap).(*pb.Snapshot)
		s.Metadata.Index = proto.Uint64(index)
		return &pb.Message{Type: pb.MsgSnap.Enum(), To: proto.Uint64(to), From: proto.Uint64(lead),
			Term: proto.Uint64(c.nodes[lead].g.Status().Term), Snapshot: s}
	}
	stream := func(m *pb.Message) []byte {
		var buf bytes.Buffer
		if err := c.nodes[lead].g.WriteSnapshot(&buf, m); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	ahead := c.nodes[f].g.Status().Commit + 100
	good := stream(msg(f, ahead))
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"cut":            {good[:len(good)-3], ErrBadSnapshot},
		"garbage":        {[]byte("\x05hello world"), ErrBadSnapshot},
		"another node":   {stream(msg(lead, ahead)), ErrBadSnapshot},
		"already held":   {stream(msg(f, 1)), ErrStaleSnapshot},
		"page off range": {append(good[:msgLen(good)], 1, 0, 1, 0xff), ErrBadSnapshot},
	} {
		if err := c.nodes[f].g.ReadSnapshot(bytes.NewReader(tc.b)); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	c.sameRecords(want)
	c.propose(lead, put(testKey(3), "c"))
	c.tickUntil(10, "the follower stopped following", func() bool {
		return c.nodes[f].g.Status().Applied == c.nodes[lead].g.Status().Applied
	})
}

// msgLen returns the length of a snapshot stream's message part.
func msgLen(stream []byte) int {
	n, k := binary.Uvarint(stream)
	return k + int(n)
}

// A replica added to a young group, whose log still starts at its first
// entry, must learn the group's first members as well: they are in no
// entry, so it has to start from a snapshot, not from the log. Replaying
// the log on an empty membership would apply "add learner" with no voter
// (raft refuses it: the replica fails) or "add voter" as the only voter
// (the replica would elect itself alone).
func TestGroupNewReplicaOfYoungGroupLearnsMembers(t *testing.T) {
	c := newTestCluster(t, 3, 0) // default LogKeep: the log is never truncated here
	lead := c.electLeader()
	c.propose(lead, put(testKey(1), "a"))
	const fresh = 4
	c.ids = append(c.ids, fresh)
	c.start(fresh, filepath.Join(t.TempDir(), "fresh"), nil)
	cc := &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: pb.ConfChangeAddLearnerNode.Enum(), NodeId: proto.Uint64(fresh)}}}
	if err := c.nodes[lead].g.ChangeMembers(cc); err != nil {
		t.Fatal(err)
	}
	c.lenient = true
	c.tickUntil(100, "the new replica did not catch up", func() bool {
		return c.nodes[fresh].g.failedErr() != nil || c.nodes[fresh].g.Status().Applied == c.nodes[lead].g.Status().Applied
	})
	c.lenient = false
	if err := c.nodes[fresh].g.failedErr(); err != nil {
		t.Fatalf("the new replica failed: %v", err)
	}
	cs := c.nodes[fresh].g.log.confState()
	if !slices.Equal(cs.GetVoters(), []uint64{1, 2, 3}) || !slices.Equal(cs.GetLearners(), []uint64{fresh}) {
		t.Fatalf("the new replica's members: voters %v learners %v, want voters [1 2 3] learners [%d]", cs.GetVoters(), cs.GetLearners(), fresh)
	}
	c.sameRecords(map[string]string{string(testKey(1)): "a"})
}

// A round committed in the Ready in which its leader loses leadership is
// applied by that Ready, so its proposal is answered nil, not
// ErrProposalLost: the leader had the followers' acknowledgements before
// a new leader's heartbeat made it step down, and both reach its next
// Ready together.
func TestGroupCommittedAsLeadershipIsLost(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	old := c.electLeader()
	rest := others(c.ids, old)
	ch, err := c.nodes[old].g.Propose([]Op{put(testKey(1), "committed")})
	if err != nil {
		t.Fatal(err)
	}
	// The round reaches the followers, and their acknowledgements reach
	// the leader's Raft, but not its Ready loop.
	if _, err := c.nodes[old].g.Process(); err != nil {
		t.Fatal(err)
	}
	deliver := func(to uint64) {
		q := c.queue
		c.queue = nil
		for _, m := range q {
			if m.GetTo() != to {
				c.queue = append(c.queue, m)
				continue
			}
			if err := c.nodes[to].g.Step(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range rest {
		deliver(f)
		if _, err := c.nodes[f].g.Process(); err != nil {
			t.Fatal(err)
		}
	}
	deliver(old)
	// The leader is cut off and the others elect another, at a higher
	// term; then the new leader's heartbeat reaches the old one.
	c.down[old] = true
	lead := c.electLeader(rest...)
	c.down[old] = false
	c.queue = nil
	c.nodes[lead].g.Tick()
	if _, err := c.nodes[lead].g.Process(); err != nil {
		t.Fatal(err)
	}
	deliver(old)
	if _, err := c.nodes[old].g.Process(); err != nil {
		t.Fatal(err)
	}
	if st := c.nodes[old].g.Status(); st.Role == "leader" || st.Applied < 2 {
		t.Fatalf("the old leader: %+v, want a follower that applied the round", st)
	}
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("the round was applied, and its proposal answered %v", err)
		}
	default:
		t.Fatal("the round was applied, and its proposal not answered")
	}
	if got := c.records(old)[string(testKey(1))]; got != "committed" {
		t.Fatalf("record %q on the old leader", got)
	}
}

// Messages that no working replica sends are refused before Raft sees
// them: a proposal from a follower (Raft takes a message of term 0 for a
// local one, and the leader would append it), a heartbeat of term 0, one
// from the replica itself, and appended entries that skip an index (on
// which Raft panics, failing the group). The group goes on unharmed.
func TestGroupRefusesMessagesNoReplicaSends(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	lead := c.electLeader()
	c.propose(lead, put(testKey(1), "a"))
	f := others(c.ids, lead)[0]
	st := c.nodes[f].g.Status()
	forged := Round{Proposer: f, Seq: 1, Ops: []Op{put(testKey(2), "forged")}}
	bad := []*pb.Message{
		{Type: pb.MsgProp.Enum(), From: proto.Uint64(f), To: proto.Uint64(lead), Entries: []*pb.Entry{{Data: forged.Append(nil)}}},
		{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(lead), To: proto.Uint64(f)},
		{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(f), To: proto.Uint64(f), Term: proto.Uint64(st.Term)},
		{Type: pb.MsgApp.Enum(), From: proto.Uint64(lead), To: proto.Uint64(f), Term: proto.Uint64(st.Term),
			LogTerm: proto.Uint64(st.Term), Index: proto.Uint64(st.Commit), Commit: proto.Uint64(st.Commit),
			Entries: []*pb.Entry{{Term: proto.Uint64(st.Term), Index: proto.Uint64(st.Commit + 5), Data: forged.Append(nil)}}},
	}
	for _, m := range bad {
		if err := c.nodes[m.GetTo()].g.Step(m); !errors.Is(err, ErrBadMessage) {
			t.Errorf("a %v of term %d from %d to %d: %v, want ErrBadMessage", m.GetType(), m.GetTerm(), m.GetFrom(), m.GetTo(), err)
		}
	}
	c.tickUntil(10, "the group to settle", func() bool { return c.leader() == lead })
	for _, id := range c.ids {
		if err := c.nodes[id].g.failedErr(); err != nil {
			t.Fatalf("node %d failed: %v", id, err)
		}
	}
	c.propose(lead, put(testKey(3), "c"))
	c.tickUntil(10, "followers behind", func() bool {
		return c.nodes[f].g.Status().Applied == c.nodes[lead].g.Status().Applied
	})
	c.sameRecords(map[string]string{string(testKey(1)): "a", string(testKey(3)): "c"})
}

// TestNewLeaderServesOnceItsTermsFirstEntryIsApplied: a replica elected
// leader whose first entry of its term is not committed yet (its appends
// are lost) does not serve: its Status says so and it refuses proposals,
// since rounds committed before its term may still be missing from its
// store. Once the entry is committed and applied, it serves.
func TestNewLeaderServesOnceItsTermsFirstEntryIsApplied(t *testing.T) {
	c := newTestCluster(t, 3, 100)
	c.drop = func(m *pb.Message) bool { return m.GetType() == pb.MsgApp }
	var lead uint64
	c.tickUntil(500, "a leader", func() bool {
		for _, id := range c.ids {
			if c.nodes[id].g.Status().Role == "leader" {
				lead = id
				return true
			}
		}
		return false
	})
	if st := c.nodes[lead].g.Status(); st.Serving {
		t.Fatalf("a leader whose first entry is not committed serves: %+v", st)
	}
	if _, err := c.nodes[lead].g.Propose([]Op{{Key: []byte("\x00\x01k"), Value: []byte("v")}}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("proposal on a leader not serving: %v; want ErrNotLeader", err)
	}
	c.drop = nil
	c.tickUntil(500, "the leader to serve", func() bool { return c.nodes[lead].g.Status().Serving })
	c.propose(lead, Op{Key: []byte("\x00\x01k"), Value: []byte("v")})
}
