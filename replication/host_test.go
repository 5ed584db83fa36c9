package replication

import (
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/storage"
)

// hostNode is one node of the Host tests: a store, a transport on a
// listener of its own, and the Host over them, ticking on a timer.
type hostNode struct {
	ordinal    int
	store      *storage.Store
	committers *Committers
	addr       string
	tr         *Transport
	h          *Host
	// incarnation is the node's, as Host's: above 0 once it lost its
	// store (wipe).
	incarnation uint64
	opts        storage.Options
	// learned is the placement a node added to the cluster learned from
	// another (HostConfig.Placement), for its first start.
	learned *Placement
}

type hostCluster struct {
	t      *testing.T
	shards []cluster.Shard
	// nodes grows under mu (addNode), which the transports' Addr takes.
	mu     sync.Mutex
	nodes  []*hostNode
	addrs  []Node             // HostConfig.Addrs
	slotOf [cluster.Slots]int // shard of each slot
	// handoff, when set, is each node's HostConfig.Handoff, given the
	// node's ordinal.
	handoff atomic.Pointer[func(o, shard int) error]
	// replicas, when set, is each node's HostConfig.Replicas at its next
	// start.
	replicas [][]int
}

func newHostCluster(t *testing.T, n, r int) *hostCluster {
	shards, err := cluster.Place(n, r)
	if err != nil {
		t.Fatal(err)
	}
	c := &hostCluster{t: t, shards: shards}
	for i, sh := range shards {
		for s := int(sh.Slots.First); s <= int(sh.Slots.Last); s++ {
			c.slotOf[s] = i
		}
	}
	for range n {
		n := c.addNode()
		c.addrs = append(c.addrs, Node{Addr: "127.0.0.1:" + strconv.Itoa(1000+n.ordinal), Bus: n.addr})
	}
	for o := range c.nodes {
		c.start(o)
	}
	return c
}

// addNode makes the next node's store and picks its port, not started.
func (c *hostCluster) addNode() *hostNode {
	t := c.t
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close() // its port, for start to listen on again
	committers := &Committers{}
	opts := storage.Options{
		Sync:       storage.SyncAlways,
		Replicator: committers,
		Committers: len(c.shards), Partitions: len(c.shards),
		Partition: func(key []byte) int { return c.slotOf[(int(key[0])<<8|int(key[1]))%cluster.Slots] },
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	o := len(c.nodes)
	s, err := storage.Open(filepath.Join(t.TempDir(), "n"+strconv.Itoa(o)), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	n := &hostNode{ordinal: o, store: s, committers: committers, addr: ln.Addr().String(), opts: opts}
	c.nodes = append(c.nodes, n)
	return n
}

// addrOf is the transport address of node id.
func (c *hostCluster) addrOf(id uint64) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id == 0 || Ordinal(id) >= len(c.nodes) {
		return "", false
	}
	return c.nodes[Ordinal(id)].addr, true
}

// start starts node o's transport and Host on its store.
func (c *hostCluster) start(o int) {
	t := c.t
	n := c.nodes[o]
	tr, err := NewTransport(TransportConfig{Node: NodeID(o, n.incarnation), Addr: c.addrOf})
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	for range 100 { // the port was let go by the node before: take it again
		if ln, err = net.Listen("tcp", n.addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	go tr.Serve(ln)
	h, err := NewHost(HostConfig{Store: n.store, Committers: n.committers, Transport: tr,
		Shards: c.shards, Replicas: c.replicas, Ordinal: o, Incarnation: n.incarnation,
		Addrs: c.addrs, Placement: n.learned,
		Handoff: func(shard int) error {
			if f := c.handoff.Load(); f != nil {
				return (*f)(o, shard)
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	n.tr, n.h = tr, h
	h.Run(5 * time.Millisecond)
	t.Cleanup(func() { c.stop(o) })
}

// stop stops node o's Host and transport, as a crash would as far as its
// peers can tell; its store stays open for a restart.
func (c *hostCluster) stop(o int) {
	n := c.nodes[o]
	if n.h == nil {
		return
	}
	if err := n.h.Stop(); err != nil {
		c.t.Errorf("node %d: %v", o, err)
	}
	n.tr.Close()
	n.h, n.tr = nil, nil
}

// waitFor waits until cond holds; the deadline only bounds a hang.
func (c *hostCluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.t.Fatalf("waiting for %s", what)
		}
	}
}

// serving returns the ordinal of the node serving shard i, or -1.
func (c *hostCluster) serving(i int) int {
	for o, n := range c.nodes {
		if n.h != nil && n.h.Group(i) != nil && n.h.Group(i).Status().Serving {
			return o
		}
	}
	return -1
}

// keyIn is a record key in shard i.
func (c *hostCluster) keyIn(i int, name string) []byte {
	s := c.shards[i].Slots.First
	return append([]byte{byte(s >> 8), byte(s)}, name...)
}

// commit sets key to val on node o.
func (c *hostCluster) commit(o int, key []byte, val string) error {
	b := c.nodes[o].store.NewBatch()
	if err := b.Modify(key, setTo(val)); err != nil {
		return err
	}
	return b.Commit()
}

func (c *hostCluster) read(o int, key []byte) string {
	var r reader
	if err := c.nodes[o].store.NewBatch().Modify(key, &r); err != nil {
		c.t.Fatal(err)
	}
	return r.val
}

// TestHostLeadsEachShardFromItsHome: three nodes, three shards of three
// replicas: each shard comes to be led by its home node, a change
// committed there reaches every replica, a change on a replica that does
// not lead is refused; when the home node stops another replica takes
// the shard over, and when it returns the shard goes back to it.
func TestHostLeadsEachShardFromItsHome(t *testing.T) {
	c := newHostCluster(t, 3, 3)
	for i := range c.shards {
		c.waitFor("shard "+strconv.Itoa(i)+" led from its home", func() bool { return c.serving(i) == i })
	}
	for i := range c.shards {
		key := c.keyIn(i, "k")
		// Retried while an election (a loaded machine misses heartbeats)
		// moves the shard away from its home and back: a commit refused
		// then changed nothing.
		c.waitFor("a commit on shard "+strconv.Itoa(i)+"'s home leader", func() bool {
			return c.serving(i) == i && c.commit(i, key, "v"+strconv.Itoa(i)) == nil
		})
		other := (i + 1) % len(c.nodes)
		if err := c.commit(other, key, "no"); !errors.Is(err, storage.ErrNotReplicated) {
			t.Errorf("commit of shard %d on node %d, not its leader: %v; want ErrNotReplicated", i, other, err)
		}
		for o := range c.nodes {
			o := o
			c.waitFor("shard "+strconv.Itoa(i)+"'s change on node "+strconv.Itoa(o), func() bool { return c.read(o, key) == "v"+strconv.Itoa(i) })
		}
	}
	c.stop(0)
	c.waitFor("shard 0 led by another node", func() bool { return c.serving(0) > 0 })
	c.waitFor("a commit on shard 0's new leader", func() bool {
		lead := c.serving(0)
		return lead > 0 && c.commit(lead, c.keyIn(0, "k"), "after") == nil
	})
	c.start(0)
	c.waitFor("shard 0 back on its home", func() bool { return c.serving(0) == 0 })
	c.waitFor("node 0 to have the change made while it was down", func() bool { return c.read(0, c.keyIn(0, "k")) == "after" })
}

// TestCaughtUpRightAfterCheckQuorum: a leader's CheckQuorum marks every
// follower not recently active until it answers again; a follower that
// is being replicated to and has every committed entry still counts as
// caught up then, or a home node whose leader checks its quorum on the
// ticks the Host balances would never get its shard back.
func TestCaughtUpRightAfterCheckQuorum(t *testing.T) {
	c := newTestCluster(t, 3, 100)
	lead := c.electLeader()
	c.propose(lead, Op{Key: []byte("\x00\x01k"), Value: []byte("v")})
	var f uint64
	for _, id := range c.ids {
		if id != lead {
			f = id
		}
	}
	if !c.nodes[lead].g.caughtUp(f) {
		t.Fatalf("node %d, a follower with every entry, is not caught up", f)
	}
	for range DefaultElectionTicks { // its CheckQuorum, answers not delivered
		c.nodes[lead].g.Tick()
	}
	if st := c.nodes[lead].g.Status(); st.Role != "leader" {
		t.Fatalf("the leader stepped down: %+v", st)
	}
	if !c.nodes[lead].g.caughtUp(f) {
		t.Fatalf("right after the leader's CheckQuorum, node %d, a follower with every entry, is not caught up", f)
	}
}

// wipe stops node o, gives it an empty store, as a lost volume would,
// and starts it again under its next incarnation.
func (c *hostCluster) wipe(o int) {
	t := c.t
	c.stop(o)
	n := c.nodes[o]
	if err := n.store.Close(); err != nil {
		t.Fatal(err)
	}
	n.committers = &Committers{}
	n.opts.Replicator = n.committers
	s, err := storage.Open(filepath.Join(t.TempDir(), "wiped"), n.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	n.store = s
	n.incarnation++
	c.start(o)
}

// TestHostRejoinsAfterLosingItsStore: a node that lost its store comes
// back under a new identity; every shard it holds takes it in by
// snapshot, in place of its old identity, and the shard it is home to
// goes back to it, with every change made before and while it was away.
func TestHostRejoinsAfterLosingItsStore(t *testing.T) {
	c := newHostCluster(t, 3, 3)
	for i := range c.shards {
		c.waitFor("shard "+strconv.Itoa(i)+" led from its home", func() bool { return c.serving(i) == i })
	}
	for i := range c.shards {
		c.commitOn(i, i, c.keyIn(i, "before"), "b")
	}
	c.stop(0)
	c.waitFor("a commit on shard 0's new leader", func() bool {
		lead := c.serving(0)
		return lead > 0 && c.commit(lead, c.keyIn(0, "while"), "w") == nil
	})
	c.wipe(0)
	self := NodeID(0, 1)
	c.waitFor("shard 0 back on its home, under its new identity", func() bool { return c.serving(0) == 0 })
	for i := range c.shards {
		for o := range c.nodes {
			c.waitFor("node "+strconv.Itoa(o)+"'s members of shard "+strconv.Itoa(i), func() bool {
				cs := c.nodes[o].h.Group(i).log.confState()
				return slices.Equal(cs.GetVoters(), []uint64{2, 3, self}) && len(cs.GetLearners()) == 0 && len(cs.GetVotersOutgoing()) == 0
			})
		}
		if got := c.read(0, c.keyIn(i, "before")); got != "b" {
			t.Errorf("shard %d on the rejoined node: %q, want b", i, got)
		}
	}
	if got := c.read(0, c.keyIn(0, "while")); got != "w" {
		t.Errorf("the change made while node 0 was away: %q, want w", got)
	}
	for o := range c.nodes {
		c.waitFor("node "+strconv.Itoa(o)+"'s members of the placement group", func() bool {
			cs := c.nodes[o].h.placement.log.confState()
			return slices.Equal(cs.GetVoters(), []uint64{2, 3, self}) && len(cs.GetLearners()) == 0 && len(cs.GetVotersOutgoing()) == 0
		})
	}
	c.commitOn(0, 0, c.keyIn(0, "after"), "a") // on the rejoined home node
}

// TestHostHandsBackAfterCommitting: a node that stood in for a shard's
// home hands the leadership back only through Handoff, during which it
// serves no more (Status.Serving is false) while its proposals are still
// taken: what it commits then is on the home node once that leads again.
func TestHostHandsBackAfterCommitting(t *testing.T) {
	c := newHostCluster(t, 3, 3)
	for i := range c.shards {
		c.waitFor("shard "+strconv.Itoa(i)+" led from its home", func() bool { return c.serving(i) == i })
	}
	c.stop(0)
	c.waitFor("shard 0 led by another node", func() bool { return c.serving(0) > 0 })
	key := c.keyIn(0, "handoff")
	var calls atomic.Int32
	f := func(o, shard int) error {
		if shard != 0 {
			return nil
		}
		calls.Add(1)
		if c.nodes[o].h.Group(0).Status().Serving {
			t.Errorf("node %d serves shard 0 during its handoff", o)
		}
		if err := c.commit(o, key, "decided in the handoff"); err != nil {
			t.Errorf("commit on node %d during its handoff: %v", o, err)
			return err
		}
		return nil
	}
	c.handoff.Store(&f)
	c.start(0)
	c.waitFor("shard 0 back on its home", func() bool { return c.serving(0) == 0 })
	if calls.Load() == 0 {
		t.Fatal("shard 0 went home without a handoff")
	}
	if got := c.read(0, key); got != "decided in the handoff" {
		t.Errorf("node 0, leading shard 0 again: %q; want what the node standing in committed in its handoff", got)
	}
}

// move moves shard i to the nodes of ordinals on every running node, as
// the cluster's placement would tell them.
func (c *hostCluster) move(i int, ordinals ...int) {
	c.t.Helper()
	for o, n := range c.nodes {
		if n.h == nil {
			continue
		}
		if err := n.h.SetReplicas(i, ordinals); err != nil {
			c.t.Fatalf("node %d: SetReplicas(%d, %v): %v", o, i, ordinals, err)
		}
	}
	if c.replicas == nil {
		for _, sh := range c.shards {
			c.replicas = append(c.replicas, sh.Replicas)
		}
	}
	c.replicas[i] = ordinals
}

// voters waits until every replica of shard i on the nodes of ordinals
// has applied members that are those nodes' voters (incarnation 0), with
// no learner and no joint change.
func (c *hostCluster) voters(i int, ordinals ...int) {
	c.t.Helper()
	var want []uint64
	for _, o := range ordinals {
		want = append(want, NodeID(o, c.nodes[o].incarnation))
	}
	slices.Sort(want)
	for _, o := range ordinals {
		c.waitFor("node "+strconv.Itoa(o)+"'s members of shard "+strconv.Itoa(i), func() bool {
			g := c.nodes[o].h.Group(i)
			if g == nil {
				return false
			}
			cs := g.log.confState()
			return slices.Equal(cs.GetVoters(), want) && len(cs.GetLearners()) == 0 && len(cs.GetVotersOutgoing()) == 0
		})
	}
}

// retired waits until node o holds nothing of shard i: no replica, no
// record in its slots, no Raft state.
func (c *hostCluster) retired(o, i int) {
	c.t.Helper()
	n := c.nodes[o]
	c.waitFor("node "+strconv.Itoa(o)+" to retire its replica of shard "+strconv.Itoa(i), func() bool { return n.h.Group(i) == nil })
	lower, upper := ShardBounds(c.shards[i].Slots)
	records := 0
	if err := n.store.Scan(lower, upper, func(k, _ []byte) bool { records++; return true }); err != nil {
		c.t.Fatal(err)
	}
	held, err := Holds(n.store, ShardGroup(i))
	if err != nil {
		c.t.Fatal(err)
	}
	if records != 0 || held {
		c.t.Errorf("node %d, retired from shard %d, still holds %d of its records (Raft state: %v)", o, i, records, held)
	}
}

// commitOn sets key to val in shard i on node o once o serves the shard,
// again while an election (a loaded machine misses heartbeats) refuses
// it: a commit refused then changed nothing.
func (c *hostCluster) commitOn(o, i int, key []byte, val string) {
	c.t.Helper()
	c.waitFor("a commit on shard "+strconv.Itoa(i)+" on node "+strconv.Itoa(o), func() bool {
		return c.serving(i) == o && c.commit(o, key, val) == nil
	})
}

// TestHostMovesAReplica: four nodes, shards of three replicas; shard 0
// (nodes 0, 1, 2) is moved to nodes 0, 1, 3: node 3 joins by snapshot
// with every record, node 2 is removed and deletes what it held of the
// shard (more records than one of its deleting writes takes), and the shard kept three voters and its leader throughout. A
// restart of both with the new placement keeps it so.
func TestHostMovesAReplica(t *testing.T) {
	c := newHostCluster(t, 4, 3)
	// More records than node 2 deletes in one write, in one round.
	const records = deletePage + 100
	c.waitFor("a round of "+strconv.Itoa(records)+" records on shard 0's home", func() bool {
		b := c.nodes[0].store.NewBatch()
		for k := range records {
			if err := b.Modify(c.keyIn(0, "before"+strconv.Itoa(k)), setTo("b")); err != nil {
				t.Fatal(err)
			}
		}
		return c.serving(0) == 0 && b.Commit() == nil
	})
	c.move(0, 0, 1, 3)
	c.voters(0, 0, 1, 3)
	c.retired(2, 0)
	for k := range records {
		if got := c.read(3, c.keyIn(0, "before"+strconv.Itoa(k))); got != "b" {
			t.Fatalf("node 3, moved into shard 0: record %d is %q, want b", k, got)
		}
	}
	c.commitOn(0, 0, c.keyIn(0, "after"), "a")
	c.waitFor("the commit on node 3", func() bool { return c.read(3, c.keyIn(0, "after")) == "a" })
	if err := c.commit(2, c.keyIn(0, "no"), "x"); err == nil {
		t.Error("node 2, retired from shard 0, committed a change of it")
	}
	for _, o := range []int{2, 3} {
		c.stop(o)
		c.start(o)
	}
	if g := c.nodes[2].h.Group(0); g != nil {
		t.Error("node 2, retired from shard 0, opened a replica of it again at its restart")
	}
	c.voters(0, 0, 1, 3)
	if got := c.read(3, c.keyIn(0, "after")); got != "a" {
		t.Errorf("node 3 after its restart: %q, want a", got)
	}
}

// TestHostMovesTheLeadersReplica: shard 0 moved off its leader's node
// (nodes 0, 1, 2 to 1, 2, 3): the leader hands its leadership to the new
// home, node 1, and is removed and retired; node 3 joins.
func TestHostMovesTheLeadersReplica(t *testing.T) {
	c := newHostCluster(t, 4, 3)
	c.commitOn(0, 0, c.keyIn(0, "k"), "v")
	c.move(0, 1, 2, 3)
	c.voters(0, 1, 2, 3)
	c.retired(0, 0)
	c.waitFor("shard 0 led from its new home", func() bool { return c.serving(0) == 1 })
	c.waitFor("the record on node 3", func() bool { return c.read(3, c.keyIn(0, "k")) == "v" })
}

// TestSetReplicasRefusesBadOrdinals: SetReplicas refuses no replica, an
// ordinal given twice or out of range, and an unknown shard, and changes
// nothing then.
func TestSetReplicasRefusesBadOrdinals(t *testing.T) {
	c := newHostCluster(t, 3, 3)
	h := c.nodes[0].h
	for _, tc := range []struct {
		shard    int
		ordinals []int
	}{{0, nil}, {0, []int{1, 1, 2}}, {0, []int{0, 1, MaxOrdinals}}, {0, []int{-1}}, {3, []int{0, 1, 2}}, {-1, []int{0}}} {
		if err := h.SetReplicas(tc.shard, tc.ordinals); !errors.Is(err, ErrReplicas) {
			t.Errorf("SetReplicas(%d, %v): %v; want ErrReplicas", tc.shard, tc.ordinals, err)
		}
	}
	if got := h.replicasOf(0); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("shard 0's replicas after refused changes: %v", got)
	}
}

// placementLeader waits for the placement group's leader to serve and
// returns its ordinal.
func (c *hostCluster) placementLeader() int {
	c.t.Helper()
	lead := -1
	c.waitFor("the placement group's leader", func() bool {
		for o, n := range c.nodes {
			if n.h != nil && n.h.placement.Status().Serving {
				lead = o
				return true
			}
		}
		return false
	})
	return lead
}

// placeOn moves shard i to ordinals through the placement group's
// leader, again while an election (a loaded machine misses heartbeats)
// loses the proposal: a move made already is answered as it is.
func (c *hostCluster) placeOn(i int, ordinals ...int) Placement {
	c.t.Helper()
	var p Placement
	c.waitFor("a move of shard "+strconv.Itoa(i), func() bool {
		var err error
		p, err = c.nodes[c.placementLeader()].h.Move(i, ordinals)
		if err != nil && !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrProposalLost) {
			c.t.Fatalf("Move(%d, %v): %v", i, ordinals, err)
		}
		return err == nil
	})
	return p
}

// TestHostMoveThroughThePlacementGroup: a move proposed to the placement
// group's leader (Host.Move) is followed by every node: shard 1 (nodes
// 1, 2, 3) goes to nodes 1, 0, 3; a node that does not lead the group
// refuses a move, naming the leader; a bad move is refused and changes
// nothing; a node restarted keeps the placement it applied.
func TestHostMoveThroughThePlacementGroup(t *testing.T) {
	c := newHostCluster(t, 4, 3)
	c.commitOn(1, 1, c.keyIn(1, "k"), "v")
	if p := c.nodes[0].h.Placement(); p.Epoch != 0 || p.Nodes != nil {
		t.Errorf("placement before any move: %+v; want epoch 0 without nodes (each node knows them from its own flags)", p)
	}
	lead := c.placementLeader()
	other := (lead + 1) % 4
	var nl *NotLeaderError
	// Unless an election made it the leader meanwhile: then it moves.
	if _, err := c.nodes[other].h.Move(1, []int{1, 0, 3}); err != nil && (!errors.As(err, &nl) || nl.Group != PlacementGroup) {
		t.Errorf("Move on node %d, not the placement group's leader: %v; want a NotLeaderError", other, err)
	}
	for _, bad := range [][]int{{1, 0}, {1, 0, 0}, {1, 0, 4}} {
		if _, err := c.nodes[other].h.Move(1, bad); !errors.Is(err, ErrReplicas) {
			t.Errorf("Move(1, %v): %v; want ErrReplicas", bad, err)
		}
	}
	if _, err := c.nodes[other].h.Move(4, []int{0, 1, 2}); !errors.Is(err, ErrReplicas) {
		t.Errorf("Move of shard 4 of 4: %v; want ErrReplicas", err)
	}
	if p := c.placeOn(1, 1, 0, 3); p.Epoch != 1 || !slices.Equal(p.Replicas[1], []int{1, 0, 3}) || !slices.Equal(p.Replicas[0], []int{0, 1, 2}) {
		t.Fatalf("placement after the move: %+v", c.nodes[lead].h.Placement())
	}
	c.voters(1, 0, 1, 3)
	c.retired(2, 1)
	c.waitFor("the record on node 0", func() bool { return c.read(0, c.keyIn(1, "k")) == "v" })
	for o := range c.nodes {
		c.waitFor("node "+strconv.Itoa(o)+" following epoch 1", func() bool { return c.nodes[o].h.Placement().Epoch == 1 })
		if got := c.nodes[o].h.Placement().Nodes; !slices.Equal(got, c.addrs) {
			t.Errorf("node %d at epoch 1: nodes %v; want the placement's, %v", o, got, c.addrs)
		}
	}
	c.stop(2)
	c.start(2)
	if got := c.nodes[2].h.Placement(); got.Epoch != 1 || !slices.Equal(got.Replicas[1], []int{1, 0, 3}) {
		t.Errorf("node 2 after its restart: placement %+v; want epoch 1 with shard 1 on 1, 0, 3", got)
	}
	if c.nodes[2].h.Group(1) != nil {
		t.Error("node 2 opened a replica of shard 1 again at its restart")
	}
}

// TestPlacementEncoding: a placement reads back as written; what is not
// one is refused.
func TestPlacementEncoding(t *testing.T) {
	p := Placement{Epoch: 7, Replicas: [][]int{{0, 1, 2}, {3, 0, 1}}}
	got, err := DecodePlacement(p.Encode())
	if err != nil || got.Epoch != 7 || len(got.Replicas) != 2 || !slices.Equal(got.Replicas[1], []int{3, 0, 1}) {
		t.Fatalf("DecodePlacement(%q) = %+v, %v", p.Encode(), got, err)
	}
	for _, bad := range []string{"", "v1 1", "v2 1 0,1,2", "v1 x 0,1,2", "v1 1 0,a,2"} {
		if _, err := DecodePlacement([]byte(bad)); !errors.Is(err, ErrBadPlacement) {
			t.Errorf("DecodePlacement(%q): %v; want ErrBadPlacement", bad, err)
		}
	}
}

// TestHostPlacementLearners: with six nodes the first five vote in the
// placement group and the sixth learns it: it follows a move, and once it
// lost its store it comes back as a learner under its new identity, in
// place of its old one, and still follows the next move.
func TestHostPlacementLearners(t *testing.T) {
	c := newHostCluster(t, 6, 3)
	c.placementLeader()
	cs := c.nodes[5].h.placement.log.confState()
	if !slices.Equal(cs.GetVoters(), []uint64{1, 2, 3, 4, 5}) || !slices.Equal(cs.GetLearners(), []uint64{6}) {
		t.Fatalf("the placement group's members: %v", cs)
	}
	c.placeOn(0, 0, 1, 5)
	c.waitFor("node 5 following epoch 1", func() bool { return c.nodes[5].h.Placement().Epoch == 1 })
	c.voters(0, 0, 1, 5)
	c.wipe(5)
	self := NodeID(5, 1)
	for o := range c.nodes {
		c.waitFor("node "+strconv.Itoa(o)+"'s learners of the placement group", func() bool {
			cs := c.nodes[o].h.placement.log.confState()
			return slices.Equal(cs.GetVoters(), []uint64{1, 2, 3, 4, 5}) && slices.Equal(cs.GetLearners(), []uint64{self})
		})
	}
	c.placeOn(1, 1, 2, 5)
	c.waitFor("node 5, rejoined, following epoch 2", func() bool { return c.nodes[5].h.Placement().Epoch == 2 })
}

// TestHostReplicaMovedBackWhileDown: shard 0 is moved off node 2 while
// node 2 is down, then back onto it before it returns. Its replica still
// holds the shard's old members, itself among them, and hears from no
// leader: it asks the other replicas, finds it was removed, deletes its
// state and joins again by snapshot, with what was committed meanwhile.
func TestHostReplicaMovedBackWhileDown(t *testing.T) {
	c := newHostCluster(t, 4, 3)
	c.commitOn(0, 0, c.keyIn(0, "before"), "b")
	c.stop(2)
	c.placeOn(0, 0, 1, 3)
	c.voters(0, 0, 1, 3)
	c.commitOn(0, 0, c.keyIn(0, "while"), "w")
	c.placeOn(0, 0, 1, 2)
	c.start(2)
	c.voters(0, 0, 1, 2)
	c.retired(3, 0)
	c.waitFor("node 2 with the change made while it was away", func() bool { return c.read(2, c.keyIn(0, "while")) == "w" })
}

// TestHostMovedOffAndBackAtOnce: shard 0 moved off node 2 and back as
// soon as node 3 has replaced it, before node 2 retires its replica,
// which may have applied its own removal already (a removed replica
// does not campaign, and goes on naming the leader it knew): node 2
// joins again and node 3 leaves.
func TestHostMovedOffAndBackAtOnce(t *testing.T) {
	c := newHostCluster(t, 4, 3)
	for round := range 3 {
		c.commitOn(0, 0, c.keyIn(0, "k"+strconv.Itoa(round)), "v")
		c.placeOn(0, 0, 1, 3)
		c.voters(0, 0, 1, 3)
		c.placeOn(0, 0, 1, 2)
		c.voters(0, 0, 1, 2)
		c.retired(3, 0)
		c.waitFor("node 2 with the change of round "+strconv.Itoa(round), func() bool { return c.read(2, c.keyIn(0, "k"+strconv.Itoa(round))) == "v" })
	}
}

// TestHostAddsANode: a node added through the placement group (AddNode)
// learns the placement from another node (AskPlacement) before it knows
// its ordinal, starts with it, and joins the placement group as a voter;
// a shard moved onto it then comes to be led from it with its records,
// and a restart keeps it all. A node already the cluster's is refused,
// and so is an AddNode on a node that does not lead the placement group.
func TestHostAddsANode(t *testing.T) {
	c := newHostCluster(t, 3, 3)
	c.commitOn(0, 0, c.keyIn(0, "before"), "b")
	n := c.addNode()
	add := Node{Addr: "127.0.0.1:1003", Bus: n.addr}
	lead := c.placementLeader()
	var nl *NotLeaderError
	if _, err := c.nodes[(lead+1)%3].h.AddNode(add); err != nil && (!errors.As(err, &nl) || nl.Group != PlacementGroup) {
		t.Errorf("AddNode on node %d, not the placement group's leader: %v; want a NotLeaderError", (lead+1)%3, err)
	}
	for _, bad := range []Node{{Addr: c.addrs[1].Addr, Bus: n.addr}, {Addr: add.Addr, Bus: c.addrs[2].Bus}, {Addr: "no port", Bus: n.addr}, {Addr: add.Addr, Bus: "a|b:1"}} {
		var err error
		c.waitFor("AddNode answered by the placement group's leader", func() bool {
			_, err = c.nodes[c.placementLeader()].h.AddNode(bad)
			return !errors.Is(err, ErrNotLeader) // an election meanwhile: again
		})
		if !errors.Is(err, ErrNodes) {
			t.Errorf("AddNode(%+v): %v; want ErrNodes", bad, err)
		}
	}
	p := c.join(n, add, 5)
	if p.Epoch != 1 || !slices.Equal(p.Nodes, append(slices.Clone(c.addrs), add)) {
		t.Fatalf("placement after AddNode: %+v", p)
	}
	c.placeOn(0, 3, 0, 1)
	c.voters(0, 0, 1, 3)
	c.retired(2, 0)
	c.waitFor("shard 0 led from node 3", func() bool { return c.serving(0) == 3 })
	if got := c.read(3, c.keyIn(0, "before")); got != "b" {
		t.Errorf("node 3, moved into shard 0: %q, want b", got)
	}
	c.commitOn(3, 0, c.keyIn(0, "after"), "a")
	n.learned = nil // from now on, what its store holds
	c.stop(3)
	c.start(3)
	if got := c.nodes[3].h.Placement(); got.Epoch != 2 || len(got.Nodes) != 4 || !slices.Equal(got.Replicas[0], []int{3, 0, 1}) {
		t.Errorf("node 3 after its restart: %+v", got)
	}
	c.waitFor("shard 0 led from node 3 again", func() bool { return c.serving(0) == 3 })
	if got := c.read(3, c.keyIn(0, "after")); got != "a" {
		t.Errorf("node 3 after its restart: %q, want a", got)
	}
}

// join adds node n, not started, to the cluster as add (AddNode), has it
// learn the placement as a node that does not know its ordinal
// (AskPlacement), starts it under incarnation inc, and waits until every
// node has it among the placement group's voters. It returns the
// placement it learned.
func (c *hostCluster) join(n *hostNode, add Node, inc uint64) Placement {
	t := c.t
	t.Helper()
	var p Placement
	c.waitFor("node "+strconv.Itoa(n.ordinal)+" added", func() bool {
		var err error
		p, err = c.nodes[c.placementLeader()].h.AddNode(add)
		if err != nil && !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrProposalLost) {
			t.Fatalf("AddNode: %v", err)
		}
		return err == nil
	})
	ask, err := NewTransport(TransportConfig{Addr: c.addrOf})
	if err != nil {
		t.Fatal(err)
	}
	defer ask.Close()
	var learned Placement
	c.waitFor("the placement from node 1", func() bool {
		var ok bool
		learned, ok, err = ask.AskPlacement(NodeID(1, 0))
		return err == nil && ok && learned.Epoch == p.Epoch
	})
	if !slices.Equal(learned.Nodes, p.Nodes) {
		t.Fatalf("learned %+v; want %+v", learned, p)
	}
	n.learned, n.incarnation = &learned, inc
	c.start(n.ordinal)
	want := []uint64{NodeID(n.ordinal, inc)}
	for o, m := range c.nodes {
		if m.h != nil && o != n.ordinal && o < MaxPlacementVoters {
			want = append(want, NodeID(o, m.incarnation))
		}
	}
	slices.Sort(want)
	for o, m := range c.nodes {
		if m.h == nil {
			continue
		}
		c.waitFor("node "+strconv.Itoa(o)+"'s members of the placement group", func() bool {
			cs := m.h.placement.log.confState()
			return slices.Equal(cs.GetVoters(), want) && len(cs.GetLearners()) == 0
		})
	}
	return learned
}

// TestHostRemovesANode: a node added and holding no shard is removed
// (RemoveNode): it leaves the placement group, the placement marks its
// ordinal removed, a move onto it is refused, and its address added
// again takes the next ordinal. A node that holds a replica is refused.
// A placement leader asked to remove its own node hands the group's
// leadership on first.
func TestHostRemovesANode(t *testing.T) {
	c := newHostCluster(t, 3, 3)
	n := c.addNode()
	add := Node{Addr: "127.0.0.1:1003", Bus: n.addr}
	c.join(n, add, 5)
	var err error
	c.waitFor("RemoveNode(1) answered by the placement group's leader", func() bool {
		_, err = c.nodes[c.placementLeader()].h.RemoveNode(1)
		return !errors.Is(err, ErrNotLeader) // an election meanwhile: again
	})
	if !errors.Is(err, ErrNodes) || !strings.Contains(err.Error(), "still holds a replica of shards 0,1,2") {
		t.Errorf("RemoveNode(1), a node that holds shards: %v; want ErrNodes naming them", err)
	}
	// Node 3 leads the placement group, and is asked to remove itself.
	c.waitFor("node 3 leading the placement group", func() bool {
		if lead := c.placementLeader(); lead != 3 {
			c.nodes[lead].h.placement.TransferLeadership(NodeID(3, 5))
			return false
		}
		return true
	})
	var nl *NotLeaderError
	if _, err := c.nodes[3].h.RemoveNode(3); !errors.As(err, &nl) {
		t.Fatalf("RemoveNode of the placement leader's own node: %v; want a NotLeaderError", err)
	}
	var p Placement
	c.waitFor("node 3 removed", func() bool {
		lead := c.placementLeader()
		var err error
		p, err = c.nodes[lead].h.RemoveNode(3)
		if err != nil && !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrProposalLost) {
			t.Fatalf("RemoveNode(3) on node %d: %v", lead, err)
		}
		return err == nil
	})
	if len(p.Nodes) != 4 || !p.Nodes[3].Removed() || p.Nodes[2] != c.addrs[2] {
		t.Fatalf("placement after RemoveNode: %+v", p)
	}
	got, err := DecodePlacement(p.Encode())
	if err != nil || !slices.Equal(got.Nodes, p.Nodes) {
		t.Errorf("the placement with a node removed reads back as %+v, %v", got, err)
	}
	for o := range 3 {
		c.waitFor("node "+strconv.Itoa(o)+"'s members of the placement group without node 3", func() bool {
			cs := c.nodes[o].h.placement.log.confState()
			return slices.Equal(cs.GetVoters(), []uint64{1, 2, 3}) && len(cs.GetLearners()) == 0
		})
	}
	if _, err := c.nodes[c.placementLeader()].h.Move(0, []int{3, 0, 1}); !errors.Is(err, ErrReplicas) {
		t.Errorf("a move onto the node removed: %v; want ErrReplicas", err)
	}
	c.stop(3)
	m := c.addNode()
	p = c.join(m, Node{Addr: add.Addr, Bus: m.addr}, 6)
	if len(p.Nodes) != 5 || p.Nodes[4].Addr != add.Addr || !p.Nodes[3].Removed() {
		t.Errorf("the address added again: %+v; want ordinal 4", p)
	}
}
