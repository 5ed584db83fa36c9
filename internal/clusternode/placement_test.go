package clusternode

import (
	"errors"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/replication"
	"github.com/sluicehq/sluice/storage"
)

// TestPlacementIsFixed: a node of a replicated cluster records what
// placed its shards on its first start, and a later start whose flags
// place them otherwise (a fourth node listed, another replica count, one
// copy per slot) is refused before anything starts: its shards would
// change slot ranges under the same Raft groups while the other nodes
// keep theirs, and two leaders could answer for one slot, each counting
// its buckets. A shard count of one per node, given or left out, is the
// same placement.
func TestPlacementIsFixed(t *testing.T) {
	three := []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}
	four := append(three[:3:3], "127.0.0.1:7003")
	o, reps, err := ReplicatedStoreOptions(storage.Options{Disk: storage.NewMemDisk()}, 3, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	st, err := storage.Open("db", o)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	replicated := func(nodes []string, r int) *Config {
		bus := make([]string, len(nodes))
		for i := range bus {
			bus[i] = "127.0.0.1:0"
		}
		return &Config{Nodes: nodes, Self: nodes[0], Replicas: r, Replicator: reps, BusNodes: bus}
	}
	start := func(cfg *Config) error {
		t.Helper()
		n, err := Open(Options{Store: st, Mode: Mode{Node: cfg}})
		if n != nil {
			n.Close()
		}
		return err
	}
	if err := start(replicated(three, 3)); err != nil {
		t.Fatalf("first start: %v", err)
	}
	if err := start(replicated(three, 3)); err != nil {
		t.Fatalf("a start with the same flags: %v", err)
	}
	same := replicated(three, 3)
	same.Shards = 3
	if err := start(same); err != nil {
		t.Fatalf("a start with --cluster-shards 3, one per node as before: %v", err)
	}
	for _, c := range []struct {
		what string
		cfg  *Config
	}{
		{"a fourth node listed", replicated(four, 3)},
		{"five replicas", replicated(append(four, "127.0.0.1:7004"), 5)},
		{"six shards", func() *Config { c := replicated(three, 3); c.Shards = 6; return c }()},
		{"one copy per slot", &Config{Nodes: three, Self: three[0]}},
	} {
		if err := start(c.cfg); !errors.Is(err, ErrPlacement) {
			t.Errorf("%s: %v; want ErrPlacement", c.what, err)
		}
	}
}

// TestPlacementDigestDiffers: the digest the nodes' hellos carry tells
// placements apart.
func TestPlacementDigestDiffers(t *testing.T) {
	nodes := []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}
	a, b := placementDigest(placement(nodes, 3, 3)), placementDigest(placement(append(nodes, "127.0.0.1:7003"), 4, 3))
	c := placementDigest(placement(nodes[:3], 3, 5))
	if a == b || a == c || a != placementDigest(placement(nodes, 3, 3)) {
		t.Errorf("digests %x, %x, %x: want the first unlike the others, and stable", a, b, c)
	}
}

// TestReplicaNodesTakeTheFlagsBus: the nodes the cluster first started
// with are dialed and listened for at the replication addresses this
// node's flags give (a proxy's, in the fault test), not those of the
// placement, which holds its proposer's; a node added has the
// placement's, and a node removed stays removed.
func TestReplicaNodesTakeTheFlagsBus(t *testing.T) {
	r := &replicas{initial: []replication.Node{{Addr: "a:1", Bus: "own-a:2"}, {Addr: "b:1", Bus: "own-b:2"}, {Addr: "c:1", Bus: "own-c:2"}}}
	placed := []replication.Node{{Addr: "a:1", Bus: "prop-a:2"}, {}, {Addr: "c:1", Bus: "prop-c:2"}, {Addr: "d:1", Bus: "d:2"}}
	r.known.Store(&placed)
	want := []replication.Node{{Addr: "a:1", Bus: "own-a:2"}, {}, {Addr: "c:1", Bus: "own-c:2"}, {Addr: "d:1", Bus: "d:2"}}
	if got := r.nodes(); !slices.Equal(got, want) {
		t.Errorf("nodes: %v; want %v", got, want)
	}
	if got := r.addrs(); !slices.Equal(got, []string{"a:1", "", "c:1", "d:1"}) || r.present() != "a:1,c:1,d:1" {
		t.Errorf("addrs %q, present %q", got, r.present())
	}
}
