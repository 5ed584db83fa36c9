package replication

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/storage"
)

// TestPlanMembersReplacesALostReplica: a replica that lost its store
// comes back under a new identity of its ordinal and asks to join. The
// leader refuses while the replica it would replace still answers; once
// that one is gone it adds the new one as a learner, catches it up by
// snapshot, and promotes it in place of the old identity, which leaves
// the group.
func TestPlanMembersReplacesALostReplica(t *testing.T) {
	c := newTestCluster(t, 3, 5)
	lead := c.electLeader()
	want := map[string]string{}
	for i := range 20 {
		c.propose(lead, put(testKey(i), "v"))
		want[string(testKey(i))] = "v"
	}
	replicas := []int{0, 1, 2}
	g := c.nodes[lead].g
	lost := others(c.ids, lead)[0]
	fresh := NodeID(Ordinal(lost), 1)
	if Ordinal(fresh) != Ordinal(lost) || fresh == lost {
		t.Fatalf("node %d's next incarnation is %d", lost, fresh)
	}

	g.requestJoin(fresh)
	if cc, note, _ := g.planMembers(replicas, nil, Ordinal); cc != nil || !strings.Contains(note, "still answers") {
		t.Fatalf("a join while node %d answers: %v, %q; want it refused", lost, cc, note)
	}
	g.requestJoin(NodeID(7, 1))
	if cc, note, _ := g.planMembers(replicas, nil, Ordinal); cc != nil || !strings.Contains(note, "holds no replica") {
		t.Fatalf("a join of ordinal 7: %v, %q; want it refused", cc, note)
	}

	c.stop(lost)
	c.wipe(lost)
	g.ReportUnreachable(lost) // as the transport does when it cannot send
	c.ids = append(c.ids, fresh)
	c.start(fresh, c.nodes[lost].dir, nil)
	propose := func(cc *pb.ConfChangeV2) {
		t.Helper()
		if err := g.ChangeMembers(cc); err != nil {
			t.Fatal(err)
		}
		c.settle()
	}
	g.requestJoin(fresh)
	cc, note, node := g.planMembers(replicas, nil, Ordinal)
	if cc == nil || node != fresh {
		t.Fatalf("no join planned for node %d: %q, node %d", fresh, note, node)
	}
	propose(cc)
	if ls := g.log.confState().GetLearners(); !slices.Equal(ls, []uint64{fresh}) {
		t.Fatalf("learners %v, want [%d]", ls, fresh)
	}
	c.tickUntil(100, "the learner was never promoted", func() bool {
		cc, _, _ = g.planMembers(replicas, nil, Ordinal)
		return cc != nil
	})
	if c.snaps == 0 {
		t.Fatal("caught up without a snapshot")
	}
	propose(cc)
	c.tickUntil(100, "the new identity did not replace the old one", func() bool {
		cs := g.log.confState()
		return slices.Contains(cs.GetVoters(), fresh) && !slices.Contains(cs.GetVoters(), lost) &&
			len(cs.GetVotersOutgoing()) == 0 && len(cs.GetLearners()) == 0
	})
	c.sameRecords(want)
	if cc, note, _ := g.planMembers(replicas, nil, Ordinal); cc != nil {
		t.Fatalf("after the replacement, another change: %v (%s)", cc, note)
	}
}

// TestTransportAnswersStanding: a node asked whether its groups have
// lived answers empty with no group, fresh with groups as bootstrapped,
// lived with one that joins an existing group; and a connection meant
// for another identity than the node's (its identity before it lost its
// data) is refused.
func TestTransportAnswersStanding(t *testing.T) {
	var addr string
	tr, l := serveTransport(t, TransportConfig{Node: NodeID(0, 3), Addr: func(n uint64) (string, bool) { return addr, Ordinal(n) < 3 }})
	addr = l.Addr().String()
	asker, err := NewTransport(TransportConfig{Node: NodeID(1, 0), Addr: func(n uint64) (string, bool) { return addr, Ordinal(n) < 3 }})
	if err != nil {
		t.Fatal(err)
	}
	defer asker.Close()
	ask := func(want Standing) {
		t.Helper()
		got, err := asker.Ask(NodeID(0, 0)) // its address, whatever its identity now
		if err != nil || got != want {
			t.Fatalf("standing %v, %v; want %v", got, err, want)
		}
	}
	ask(StandingEmpty)
	store, err := storage.Open(t.TempDir(), storage.Options{Sync: storage.SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	group := func(id uint64, bootstrap []uint64) *Group {
		g, err := NewGroup(Config{Group: id, Node: NodeID(0, 3), Bootstrap: bootstrap, Lower: testLower, Upper: testUpper, Store: store, Send: tr.Send})
		if err != nil {
			t.Fatal(err)
		}
		tr.Add(g)
		return g
	}
	group(2, []uint64{NodeID(0, 3), 2, 3})
	ask(StandingFresh)
	group(3, nil)
	ask(StandingLived)

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(testHello(helloMessages, 1, NodeID(0, 0), 0))
	refused(t, "a connection for the node's old identity", c)
}

// TestTransportForgetsIdlePeers: a node nothing is sent to and that
// cannot be reached (the identity a node had before it lost its data) is
// dialed no longer than IdlePeer; a message for it starts it again.
func TestTransportForgetsIdlePeers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there
	// Node 1 dials node 2; node 3 asks node 2 to dial.
	for _, self := range []uint64{1, 3} {
		tr, err := NewTransport(TransportConfig{Node: self, IdlePeer: time.Millisecond, Addr: func(uint64) (string, bool) { return addr, true }})
		if err != nil {
			t.Fatal(err)
		}
		hb := []*pb.Message{{Type: pb.MsgHeartbeat.Enum(), To: proto.Uint64(2), From: proto.Uint64(self)}}
		for range 2 {
			tr.Send(testGroup, hb)
			waitUntil(t, "the idle peer to be forgotten", func() bool {
				tr.mu.Lock()
				defer tr.mu.Unlock()
				return tr.mu.peers[2] == nil
			})
		}
		tr.Close()
	}
}

// TestTransportRefusesAnotherConfiguration: a node started with another
// cluster configuration (another list of nodes, another number of
// replicas: Cluster) is refused, whatever it opens: its question whether
// the cluster has lived is answered ErrOtherCluster, and its connection
// for messages is closed, once with a warning.
func TestTransportRefusesAnotherConfiguration(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	lg := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var addr string
	_, l := serveTransport(t, TransportConfig{Node: NodeID(0, 0), Cluster: 7, Logger: lg, Addr: func(n uint64) (string, bool) { return addr, Ordinal(n) < 3 }})
	addr = l.Addr().String()
	for _, c := range []struct {
		cluster uint64
		want    error
	}{{7, nil}, {8, ErrOtherCluster}} {
		asker, err := NewTransport(TransportConfig{Node: NodeID(1, 0), Cluster: c.cluster, Addr: func(n uint64) (string, bool) { return addr, Ordinal(n) < 3 }})
		if err != nil {
			t.Fatal(err)
		}
		st, err := asker.Ask(NodeID(0, 0))
		asker.Close()
		if !errors.Is(err, c.want) || (c.want == nil && st != StandingEmpty) {
			t.Fatalf("asked from configuration %d: %v, %v; want %v", c.cluster, st, err, c.want)
		}
	}
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(testHello(helloMessages, NodeID(1, 0), NodeID(0, 0), 8))
		refused(t, "a connection of another configuration", c)
		c.Close()
	}
	// The question's refusal is answered before it is logged: its
	// warning may come last.
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return strings.Count(logs.String(), "another cluster configuration")
	}
	for deadline := time.Now().Add(10 * time.Second); count() == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "another cluster configuration"); n != 1 {
		t.Errorf("%d warnings of a node of another configuration, for 3 tries from one node; want 1:\n%s", n, logs.String())
	}
}
