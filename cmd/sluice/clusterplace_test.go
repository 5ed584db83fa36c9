package main

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/cluster"
)

// placed gives the shards of cluster.Place(nodes, replicas), by address
// n<ordinal>, and the addresses.
func placed(t *testing.T, nodes, replicas int) ([][]string, []string) {
	t.Helper()
	shards, err := cluster.Place(nodes, replicas)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, sh := range shards {
		var reps []string
		for _, o := range sh.Replicas {
			reps = append(reps, "n"+strconv.Itoa(o))
		}
		out = append(out, reps)
	}
	var addrs []string
	for o := range nodes {
		addrs = append(addrs, "n"+strconv.Itoa(o))
	}
	return out, addrs
}

// spread returns the least and most replicas, and homes, any of nodes
// holds in plan, and fails if a shard is on a node twice or on a node
// not given.
func spread(t *testing.T, plan [][]string, nodes []string) (lo, hi, hlo, hhi int) {
	t.Helper()
	count, homes := map[string]int{}, map[string]int{}
	for i, reps := range plan {
		for j, n := range reps {
			if !slices.Contains(nodes, n) || slices.Index(reps, n) != j {
				t.Fatalf("shard %d on %v: want distinct nodes of %v", i, reps, nodes)
			}
			count[n]++
		}
		homes[reps[0]]++
	}
	lo, hlo = len(plan)*len(plan[0]), len(plan)
	for _, n := range nodes {
		lo, hi, hlo, hhi = min(lo, count[n]), max(hi, count[n]), min(hlo, homes[n]), max(hhi, homes[n])
	}
	return lo, hi, hlo, hhi
}

// changed counts the places (shard, position) where plan differs from cur.
func changed(cur, plan [][]string) int {
	n := 0
	for i := range cur {
		for j := range cur[i] {
			if cur[i][j] != plan[i][j] {
				n++
			}
		}
	}
	return n
}

// TestPlanReplicas: rebalance's plan leaves a balanced placement as it
// is; drains a node left out, its home too, spreading its replicas and
// homes over the others; gives a node added its share with as few moves
// as that takes, no home moved; and refuses fewer nodes than replicas.
func TestPlanReplicas(t *testing.T) {
	cur, nodes := placed(t, 3, 3)
	if plan, err := planReplicas(cur, nodes); err != nil || changed(cur, plan) != 0 {
		t.Errorf("balanced 3 nodes: plan %v, %v; want %v unchanged", plan, err, cur)
	}

	cur, nodes = placed(t, 4, 3)
	plan, err := planReplicas(cur, nodes[:3])
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi, hlo, hhi := spread(t, plan, nodes[:3]); lo != 4 || hi != 4 || hlo != 1 || hhi != 2 {
		t.Errorf("4 nodes drained to 3: %v: replicas %d-%d, homes %d-%d; want 4-4 and 1-2", plan, lo, hi, hlo, hhi)
	}
	if n := changed(cur, plan); n != 3 {
		t.Errorf("4 nodes drained to 3: %v -> %v changes %d places; want 3 (node 3's, each replaced where it stood)", cur, plan, n)
	}

	cur, nodes = placed(t, 3, 3)
	nodes = append(nodes, "n3")
	plan, err = planReplicas(cur, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi, _, _ := spread(t, plan, nodes); lo != 2 || hi != 3 {
		t.Errorf("3 nodes and one added: %v: replicas %d-%d; want 2-3", plan, lo, hi)
	}
	if n := changed(cur, plan); n != 2 {
		t.Errorf("3 nodes and one added: %v -> %v changes %d places; want 2 (the new node's share)", cur, plan, n)
	}
	for i := range cur {
		if plan[i][0] != cur[i][0] {
			t.Errorf("shard %d's home moved from %s to %s: want the homes kept (3 shards over 4 nodes)", i, cur[i][0], plan[i][0])
		}
	}

	if _, err := planReplicas(cur, nodes[:2]); err == nil {
		t.Error("2 nodes for shards of 3 replicas: planned; want an error")
	}
}

// TestPlanReplicasSpreads: from random placements onto random sets of
// nodes, every plan puts each shard on distinct nodes of the set, and
// spreads the replicas within one of each other.
func TestPlanReplicasSpreads(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		r := []int{3, 5}[rng.IntN(2)]
		all := r + rng.IntN(6)
		var pool []string
		for o := range all + 3 {
			pool = append(pool, "n"+strconv.Itoa(o))
		}
		cur := make([][]string, 1+rng.IntN(12))
		for i := range cur {
			perm := rng.Perm(all)
			for _, o := range perm[:r] {
				cur[i] = append(cur[i], pool[o])
			}
		}
		perm := rng.Perm(len(pool))
		var nodes []string
		for _, o := range perm[:r+rng.IntN(len(pool)-r+1)] {
			nodes = append(nodes, pool[o])
		}
		plan, err := planReplicas(slices.Clone(cur), nodes)
		if err != nil {
			t.Fatal(err)
		}
		if lo, hi, hlo, hhi := spread(t, plan, nodes); hi-lo > 1 || hhi-hlo > 1 {
			t.Fatalf("%v onto %v: %v spreads replicas %d-%d, homes %d-%d; want each within one", cur, nodes, plan, lo, hi, hlo, hhi)
		}
	}
}
