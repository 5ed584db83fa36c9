package cluster

import (
	"errors"
	"regexp"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/keyspace"
)

func TestSlotsMatchKeyspace(t *testing.T) {
	if Slots != keyspace.Slots {
		t.Fatalf("cluster.Slots %d, keyspace.Slots %d", Slots, keyspace.Slots)
	}
}

func TestInitialAssignment(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 5, 7, 16384} {
		addrs := make([]string, n)
		for i := range addrs {
			addrs[i] = Expand("sluice-{i}.sluice:9049", i)
		}
		top := Initial(addrs)
		if top.Assigned() != Slots {
			t.Fatalf("N=%d: %d slots assigned", n, top.Assigned())
		}
		for i, nd := range top.Nodes {
			want := Range{uint16(Slots * i / n), uint16(Slots*(i+1)/n - 1)}
			if len(nd.Slots) != 1 || nd.Slots[0] != want {
				t.Fatalf("N=%d node %d: %v, want %v", n, i, nd.Slots, want)
			}
		}
	}
	top := Initial([]string{"a:1", "b:2", "c:3"})
	want := [][]Range{{{0, 5460}}, {{5461, 10921}}, {{10922, 16383}}}
	for i, nd := range top.Nodes {
		if !slices.Equal(nd.Slots, want[i]) {
			t.Fatalf("node %d: %v, want %v", i, nd.Slots, want[i])
		}
	}
	o := top.Owners()
	if o[0] != 1 || o[5460] != 1 || o[5461] != 2 || o[16383] != 3 {
		t.Fatalf("owners: %d %d %d %d", o[0], o[5460], o[5461], o[16383])
	}
}

func TestNodeIDStable(t *testing.T) {
	id := NodeID("sluice-0.sluice:9049")
	if !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(id) {
		t.Fatalf("id %q", id)
	}
	if NodeID("sluice-0.sluice:9049") != id || NodeID("sluice-1.sluice:9049") == id {
		t.Fatal("NodeID not stable or not distinct")
	}
}

func TestEncodeDecode(t *testing.T) {
	top := Initial([]string{"a:1", "b:2", "c:3"})
	top.Epoch = 7
	top.Nodes[1].Slots = []Range{{5461, 6000}, {7000, 7000}}
	top.Nodes = append(top.Nodes, Node{ID: NodeID("d:4"), Addr: "d:4"})
	got, err := Decode(top.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(top) {
		t.Fatalf("got %+v, want %+v", got, top)
	}
	if string(top.Encode()) != "v1 7 a:1 0-5460 b:2 5461-6000,7000 c:3 10922-16383 d:4 -" {
		t.Fatalf("encoded %q", top.Encode())
	}
}

func TestParseRefuses(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"1"},
		{"1", "a:1"},
		{"x", "a:1", "0-10"},
		{"1", "a", "0-10"},
		{"1", "a:0", "0-10"},
		{"1", "a:1", "0-16384"},
		{"1", "a:1", "10-5"},
		{"1", "a:1", "0-10", "b:2", "10-20"},
		{"1", "a:1", "0-10", "a:1", "11-20"},
	} {
		if _, err := Parse(args); !errors.Is(err, ErrBadTopology) {
			t.Errorf("Parse(%q) = %v, want ErrBadTopology", args, err)
		}
	}
}

func TestMergeRanges(t *testing.T) {
	got, err := ParseRanges("10-20,0-5,6-9,30,21")
	if err != nil {
		t.Fatal(err)
	}
	if want := []Range{{0, 21}, {30, 30}}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestExpandNodes(t *testing.T) {
	got, err := ExpandNodes("sluice-{i}.sluice.default.svc:9049", 3)
	if err != nil || len(got) != 3 || got[2] != "sluice-2.sluice.default.svc:9049" {
		t.Fatalf("%v %v", got, err)
	}
	got, err = ExpandNodes("127.0.0.1:7000, 127.0.0.1:7001", 0)
	if err != nil || !slices.Equal(got, []string{"127.0.0.1:7000", "127.0.0.1:7001"}) {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []struct {
		list string
		size int
	}{{"x-{i}:1", 0}, {"a:1,b:2", 3}, {"a:1,a:1", 0}, {"a", 0}} {
		if _, err := ExpandNodes(bad.list, bad.size); err == nil {
			t.Errorf("ExpandNodes(%q, %d): no error", bad.list, bad.size)
		}
	}
}

func TestOrdinalFromHostname(t *testing.T) {
	for h, want := range map[string]int{"sluice-0": 0, "sluice-12": 12, "my-rate-limiter-3.svc.local": 3} {
		if got, err := OrdinalFromHostname(h); err != nil || got != want {
			t.Errorf("%s: %d %v", h, got, err)
		}
	}
	for _, h := range []string{"sluice", "sluice-", "sluice-x", "localhost"} {
		if _, err := OrdinalFromHostname(h); err == nil {
			t.Errorf("%s: no error", h)
		}
	}
}

func applyMoves(t Topology, moves []Move) Topology {
	for _, mv := range moves {
		t = t.Moved(mv.Slots, mv.To)
	}
	return t
}

func TestRebalance(t *testing.T) {
	three := []string{"a:1", "b:2", "c:3"}
	four := append(slices.Clone(three), "d:4")
	top := Initial(three)
	moves := Rebalance(top, four)
	moved := 0
	for _, mv := range moves {
		if mv.To != "d:4" {
			t.Fatalf("3→4 moves slots to %s: %+v", mv.To, mv)
		}
		moved += Topology{Nodes: []Node{{Slots: mv.Slots}}}.Assigned()
	}
	if moved != 4096 {
		t.Fatalf("3→4 moves %d slots, want 4096", moved)
	}
	t4 := applyMoves(top, moves)
	if t4.Assigned() != Slots || t4.Epoch != uint64(len(moves)) {
		t.Fatalf("after 3→4: %d assigned, epoch %d", t4.Assigned(), t4.Epoch)
	}
	for _, n := range t4.Nodes {
		if c := (Topology{Nodes: []Node{n}}).Assigned(); c != 4096 {
			t.Fatalf("node %s has %d slots", n.Addr, c)
		}
	}
	if len(Rebalance(t4, four)) != 0 {
		t.Fatal("a balanced topology plans moves")
	}
	back := Rebalance(t4, three)
	for _, mv := range back {
		if mv.From != "d:4" {
			t.Fatalf("4→3 moves slots off %s", mv.From)
		}
	}
	t3 := applyMoves(t4, back).Without(three)
	if t3.Assigned() != Slots || len(t3.Nodes) != 3 {
		t.Fatalf("after 4→3: %+v", t3)
	}
	// Unowned slots are given too.
	hole := Topology{Nodes: []Node{{ID: NodeID("a:1"), Addr: "a:1", Slots: []Range{{0, 99}}}}}
	if got := applyMoves(hole, Rebalance(hole, []string{"a:1", "b:2"})); got.Assigned() != Slots {
		t.Fatalf("unowned slots left: %d", got.Assigned())
	}
}
