package cluster

import (
	"errors"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestPure keeps the package pure: the standard library only, and no
// locks, I/O or clock.
func TestPure(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	banned := map[string]bool{"sync": true, "sync/atomic": true, "os": true, "io": true, "net": true, "time": true, "math/rand": true, "math/rand/v2": true}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") || banned[path] {
				t.Errorf("%s imports %s: cluster is pure and uses only the standard library", f, path)
			}
		}
	}
}

// TestRebalanceKeepsInitialSplit: a rebalance gives each node as many slots
// as Initial does, so rebalancing a fresh cluster over the same nodes moves
// nothing, and 3 → 4 → 3 nodes ends with the 3-node counts.
func TestRebalanceKeepsInitialSplit(t *testing.T) {
	three := []string{"a:1", "b:1", "c:1"}
	if mv := Rebalance(Initial(three), three); len(mv) != 0 {
		t.Errorf("rebalance of a fresh 3-node cluster over the same nodes moves %v", mv)
	}
	top := Initial(three)
	apply := func(want []string) {
		for _, mv := range Rebalance(top, want) {
			top = top.Moved(mv.Slots, mv.To)
		}
		top = top.Without(want)
	}
	apply(append(slices.Clone(three), "d:1"))
	apply(three)
	for i, n := range Initial(three).Nodes {
		got := Topology{Nodes: top.Nodes[i : i+1]}.Assigned()
		if want := (Topology{Nodes: []Node{n}}).Assigned(); got != want {
			t.Errorf("after 3 → 4 → 3 nodes, %s owns %d slots; the initial split gives it %d", n.Addr, got, want)
		}
	}
}

// TestOrdinalFromHostnameCanonical: only a StatefulSet's canonical ordinal
// is taken.
func TestOrdinalFromHostnameCanonical(t *testing.T) {
	for h, want := range map[string]int{"sluice-2": 2, "sluice-0": 0, "sluice-12.sluice.ns.svc": 12} {
		if n, err := OrdinalFromHostname(h); err != nil || n != want {
			t.Errorf("%q: %d %v; want %d", h, n, err, want)
		}
	}
	for _, h := range []string{"sluice-+3", "sluice-07", "sluice-", "sluice", "web-7d9f-abcde"} {
		if n, err := OrdinalFromHostname(h); err == nil {
			t.Errorf("%q: %d; want it refused", h, n)
		}
	}
}

// TestOverlapsAddNodeByList: a fourth node started with a list of four
// addresses takes the initial topology of four, and so serves slots
// 12288-16383 that the third node still serves by the topology of three:
// Overlaps names that range and those two nodes, and nothing in a
// cluster whose nodes agree.
func TestOverlapsAddNodeByList(t *testing.T) {
	three := []string{"a:1", "b:1", "c:1"}
	var claims []Claim
	for _, a := range three {
		claims = append(claims, ClaimOf(Initial(three), a))
	}
	if ov := Overlaps(claims); len(ov) != 0 {
		t.Fatalf("nodes with one topology: overlaps %v", ov)
	}
	claims = append(claims, ClaimOf(Initial(append(slices.Clone(three), "d:1")), "d:1"))
	ov := Overlaps(claims)
	if len(ov) != 1 || ov[0].A.Addr != "c:1" || ov[0].B.Addr != "d:1" || FormatRanges(ov[0].Slots) != "12288-16383" {
		t.Fatalf("overlaps %+v; want c:1 and d:1 on 12288-16383", ov)
	}
	// A node no topology gives slots to (an address given as an alias)
	// claims nothing.
	if c := ClaimOf(Initial(three), "alias:1"); len(c.Slots) != 0 {
		t.Errorf("claim of an address the topology lacks: %v", c.Slots)
	}
}

// TestPlace: each shard has the slots Initial gives its home, the shards
// cover every slot once, and each node holds r replicas, of r different
// shards, no shard twice on one node.
func TestPlace(t *testing.T) {
	for _, c := range []struct{ n, r int }{{1, 1}, {3, 3}, {5, 3}, {5, 5}, {7, 5}, {4, 1}} {
		shards, err := Place(c.n, c.r)
		if err != nil {
			t.Fatalf("Place(%d, %d): %v", c.n, c.r, err)
		}
		addrs := make([]string, c.n)
		for i := range addrs {
			addrs[i] = "n" + strconv.Itoa(i) + ":1"
		}
		init := Initial(addrs)
		held := make([]int, c.n)
		covered := 0
		for i, s := range shards {
			if s.Replicas[0] != i || !slices.Equal([]Range{s.Slots}, init.Nodes[i].Slots) {
				t.Errorf("n=%d r=%d shard %d: home %d slots %v; want home %d, slots %v", c.n, c.r, i, s.Replicas[0], s.Slots, i, init.Nodes[i].Slots)
			}
			covered += int(s.Slots.Last) - int(s.Slots.First) + 1
			seen := map[int]bool{}
			for _, o := range s.Replicas {
				if seen[o] {
					t.Errorf("n=%d r=%d shard %d: two replicas on node %d", c.n, c.r, i, o)
				}
				seen[o] = true
				held[o]++
			}
		}
		if covered != Slots {
			t.Errorf("n=%d r=%d: shards cover %d slots", c.n, c.r, covered)
		}
		for o, h := range held {
			if h != c.r {
				t.Errorf("n=%d r=%d: node %d holds %d replicas", c.n, c.r, o, h)
			}
		}
	}
	for _, c := range []struct{ n, r int }{{2, 3}, {3, 2}, {3, 0}, {9, 7}} {
		if _, err := Place(c.n, c.r); !errors.Is(err, ErrReplicas) {
			t.Errorf("Place(%d, %d): %v; want ErrReplicas", c.n, c.r, err)
		}
	}
}

// TestPlaceShards: with more shards than nodes, the shards cover every
// slot once, in order, no shard has two replicas on one node, and every
// node is the home of as many shards as another, give or take one; a
// shard count below the node count is refused.
func TestPlaceShards(t *testing.T) {
	for _, c := range []struct{ n, s, r int }{{3, 6, 3}, {3, 8, 3}, {5, 64, 3}, {5, 7, 5}} {
		shards, err := PlaceShards(c.n, c.s, c.r)
		if err != nil || len(shards) != c.s {
			t.Fatalf("PlaceShards(%d, %d, %d): %d shards, %v", c.n, c.s, c.r, len(shards), err)
		}
		homes := make([]int, c.n)
		next := 0
		for i, sh := range shards {
			if int(sh.Slots.First) != next || sh.Slots.Last < sh.Slots.First {
				t.Fatalf("%+v: shard %d has %v after slot %d", c, i, sh.Slots, next-1)
			}
			next = int(sh.Slots.Last) + 1
			homes[sh.Replicas[0]]++
			seen := map[int]bool{}
			for _, o := range sh.Replicas {
				if seen[o] || o < 0 || o >= c.n {
					t.Errorf("%+v: shard %d has replicas %v", c, i, sh.Replicas)
				}
				seen[o] = true
			}
			if len(sh.Replicas) != c.r {
				t.Errorf("%+v: shard %d has %d replicas", c, i, len(sh.Replicas))
			}
		}
		if next != Slots {
			t.Errorf("%+v: the shards end at slot %d", c, next-1)
		}
		if lo, hi := slices.Min(homes), slices.Max(homes); hi-lo > 1 {
			t.Errorf("%+v: nodes are home to %v shards", c, homes)
		}
	}
	if _, err := PlaceShards(3, 2, 3); !errors.Is(err, ErrShards) {
		t.Errorf("PlaceShards(3, 2, 3): %v; want ErrShards", err)
	}
}
