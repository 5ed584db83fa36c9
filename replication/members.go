package replication

import (
	"bytes"
	"fmt"
	"maps"
	"slices"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/storage"
)

// maxJoinRequests bounds the join requests a replica keeps between two
// looks at them (Host): they are repeated until granted.
const maxJoinRequests = 16

// pristine reports whether the replica's stored state is as bootstrap
// left it: no vote, no term past the first, no entry. A replica that
// joined by snapshot, or waits for one, is not.
func (g *Group) pristine() bool {
	hs, _, _ := g.log.InitialState()
	last, _ := g.log.LastIndex()
	return hs.GetTerm() <= bootstrapTerm && hs.GetVote() == 0 && last == bootstrapIndex
}

// member reports whether the replica has the group's members: it was
// bootstrapped or has taken a snapshot. A replica that joins an existing
// group has none until the leader's snapshot arrives.
func (g *Group) member() bool { return g.log.hasMembers() }

// requestJoin notes that node asks to be added to the group; the Host
// looks at the requests on the leader (planMembers).
func (g *Group) requestJoin(node uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.mu.joins == nil {
		g.mu.joins = map[uint64]struct{}{}
	}
	if len(g.mu.joins) < maxJoinRequests {
		g.mu.joins[node] = struct{}{}
	}
}

// replicaOf returns the voter of the group on the node of ordinal o, as
// the replica knows the members; 0 if none.
func (g *Group) replicaOf(ordinal func(uint64) int, o int) uint64 {
	for _, id := range g.log.confState().GetVoters() {
		if ordinal(id) == o {
			return id
		}
	}
	return 0
}

// planMembers returns the next change of the group's members, nil for
// none, when this replica leads. A replica that joins asks to
// (requestJoin): a node that lost its volume, back under a new
// identity, or a node the shard was moved to (Host.SetReplicas). It is
// added as a learner, which the leader catches up by snapshot, and once
// caught up it is promoted, in one joint change with the removal of the
// identity it replaces (the voter of the same ordinal) or else of a
// voter whose node no longer holds the shard, so that the voters never
// number fewer than before. A voter whose node no longer holds the shard
// is removed alone once every node that holds it has a voter; never this
// leader (the Host hands its leadership on first). A join is refused
// while the voter it would replace is still replicated to, so that a
// second process started with a node's ordinal never takes the first
// one's place. replicas are the ordinals that hold the shard; learners
// those whose replicas only learn the group's entries (the placement
// group's nodes past its voters): they are added as learners, in place of
// an old identity of theirs, and never promoted. ordinal maps a node
// identity to its ordinal.
// note says what the plan is, or why a join was refused, about node.
func (g *Group) planMembers(replicas, learners []int, ordinal func(uint64) int) (cc *pb.ConfChangeV2, note string, node uint64) {
	g.mu.Lock()
	joins := slices.Sorted(maps.Keys(g.mu.joins))
	clear(g.mu.joins)
	if g.mu.rn.BasicStatus().RaftState != raft.StateLeader {
		g.mu.Unlock()
		return nil, "", 0 // Status, with its progress map, is a leader's
	}
	st := g.mu.rn.Status()
	g.mu.Unlock()
	if len(st.Config.Voters[1]) > 0 || len(st.Config.LearnersNext) > 0 {
		return nil, "", 0 // a change under way
	}
	voters := st.Config.Voters[0]
	same := func(ids map[uint64]struct{}, o int, not uint64) []uint64 {
		var out []uint64
		for _, id := range slices.Sorted(maps.Keys(ids)) {
			if id != not && ordinal(id) == o {
				out = append(out, id)
			}
		}
		return out
	}
	change := func(t pb.ConfChangeType, id uint64) *pb.ConfChangeSingle {
		return &pb.ConfChangeSingle{Type: t.Enum(), NodeId: proto.Uint64(id)}
	}
	for _, l := range slices.Sorted(maps.Keys(st.Config.Learners)) {
		pr, ok := st.Progress[l]
		if !ok || pr.State != tracker.StateReplicate || pr.Match < st.GetCommit() || !slices.Contains(replicas, ordinal(l)) {
			continue
		}
		cc = &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{change(pb.ConfChangeAddNode, l)}}
		replaced := false
		for _, old := range same(voters, ordinal(l), l) {
			if old == st.ID {
				continue // never this leader: it hands leadership on first
			}
			cc.Changes = append(cc.Changes, change(pb.ConfChangeRemoveNode, old))
			replaced = true
		}
		if old := departing(voters, replicas, ordinal, st.ID); !replaced && old != 0 {
			cc.Changes = append(cc.Changes, change(pb.ConfChangeRemoveNode, old))
			return cc, "promoting a replica that has caught up, in place of one whose node no longer holds the shard", l
		}
		return cc, "promoting a rejoined replica that has caught up", l
	}
	for _, id := range joins {
		o := ordinal(id)
		switch {
		case !slices.Contains(replicas, o) && !slices.Contains(learners, o):
			note, node = "refusing a join: its ordinal holds no replica of the shard", id
			continue
		case contains(voters, id) || contains(st.Config.Learners, id):
			continue
		}
		alive := false
		olds := same(voters, o, id)
		if slices.Contains(learners, o) {
			olds = same(st.Config.Learners, o, id)
		}
		for _, v := range olds {
			if pr, ok := st.Progress[v]; v == st.ID || (ok && pr.State == tracker.StateReplicate) {
				alive = true
			}
		}
		if alive {
			note, node = "refusing a join: the replica of the same ordinal still answers (a second process started with its ordinal?)", id
			continue
		}
		cc = &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{change(pb.ConfChangeAddLearnerNode, id)}}
		// A learner of the ordinal from an earlier attempt never catches
		// up now: its node is the one asking.
		for _, stale := range same(st.Config.Learners, o, id) {
			cc.Changes = append(cc.Changes, change(pb.ConfChangeRemoveNode, stale))
		}
		return cc, "adding a rejoining replica as a learner", id
	}
	if note != "" {
		return nil, note, node
	}
	for _, l := range slices.Sorted(maps.Keys(st.Config.Learners)) {
		if o := ordinal(l); !slices.Contains(replicas, o) && !slices.Contains(learners, o) {
			cc = &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{change(pb.ConfChangeRemoveNode, l)}}
			return cc, "removing a learner whose node no longer holds the shard", l
		}
	}
	for _, o := range replicas {
		if len(same(voters, o, 0)) == 0 {
			return nil, "", 0 // a node that holds the shard has no voter yet
		}
	}
	if old := departing(voters, replicas, ordinal, st.ID); old != 0 {
		cc = &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{change(pb.ConfChangeRemoveNode, old)}}
		return cc, "removing a replica whose node no longer holds the shard", old
	}
	return nil, "", 0
}

// departing returns a voter, not leader, whose node is not among
// replicas; 0 if none.
func departing(voters map[uint64]struct{}, replicas []int, ordinal func(uint64) int, leader uint64) uint64 {
	for _, id := range slices.Sorted(maps.Keys(voters)) {
		if id != leader && !slices.Contains(replicas, ordinal(id)) {
			return id
		}
	}
	return 0
}

// deleteState deletes the stopped replica's records and Raft state from
// the store, in pages, and returns how many records it deleted. The
// replica was removed from its group (Host.retire).
func (g *Group) deleteState() (int, error) {
	g.procMu.Lock() // no Ready or snapshot under way
	defer g.procMu.Unlock()
	b := g.batch
	defer b.Reset()
	n := 0
	from := g.cfg.Lower
	if g.own {
		from = g.cfg.Upper // no records; its keys go with its Raft state
		if err := b.DeleteRange(g.cfg.Lower, g.cfg.Upper); err != nil {
			return 0, err
		}
	}
	for bytes.Compare(from, g.cfg.Upper) < 0 {
		page, next, err := deleteKeys(b, g.cfg.Store.Scan, b.DeleteRecord, from, g.cfg.Upper, deletePage, nil)
		if err != nil {
			return n, fmt.Errorf("replication: group %d: delete the records of a retired replica: %w", g.cfg.Group, err)
		}
		n += page
		if next == nil {
			break
		}
		from = next
	}
	lo := groupKey(g.cfg.Group, 0)
	hi := groupKey(g.cfg.Group+1, 0)
	if err := b.DeleteRange(lo[:len(lo)-1], hi[:len(hi)-1]); err != nil {
		return n, err
	}
	if err := b.Commit(true); err != nil {
		return n, fmt.Errorf("replication: group %d: delete the Raft state of a retired replica: %w", g.cfg.Group, err)
	}
	return n, nil
}

// deleteKeys stages in b the deletion, by del, of the keys scan finds in
// [from, to) that gone says are gone (nil: all), at most limit of them
// (0: no bound), then commits b, not synced. It returns how many it
// deleted and, when it stopped at limit, the key to go on from.
func deleteKeys(b *storage.ReplicaBatch, scan func(lower, upper []byte, fn func(k, v []byte) bool) error, del func([]byte) error,
	from, to []byte, limit int, gone func(k []byte) bool) (int, []byte, error) {
	var next []byte
	var derr error
	n := 0
	err := scan(from, to, func(k, _ []byte) bool {
		if gone != nil && !gone(k) {
			return true
		}
		if n == limit && limit > 0 {
			next = bytes.Clone(k)
			return false
		}
		n++
		derr = del(k)
		return derr == nil
	})
	if err == nil {
		err = derr
	}
	if err == nil {
		err = b.Commit(false)
	}
	return n, next, err
}

// deletePage is how many records one write of deleteState deletes.
const deletePage = 4096

func contains(ids map[uint64]struct{}, id uint64) bool {
	_, ok := ids[id]
	return ok
}

// Holds reports whether store holds state of any of groups: a log, a
// hard state or members. A node whose store holds none of its groups is
// new, or lost its data (see Transport.Ask).
func Holds(store *storage.Store, groups ...uint64) (bool, error) {
	for _, id := range groups {
		l, err := OpenLog(store, id)
		if err != nil {
			return false, err
		}
		hs, cs, _ := l.InitialState()
		last, _ := l.LastIndex()
		if last > 0 || !raft.IsEmptyHardState(hs) || len(cs.GetVoters()) > 0 || len(cs.GetLearners()) > 0 {
			return true, nil
		}
	}
	return false, nil
}
