package clusternode

import (
	"testing"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/clustercmd"
	"github.com/sluicehq/sluice/replication"
)

// TestDescribeHealth: the health CLUSTER SHARDS gives each replica, and
// the flag CLUSTER NODES gives each node, from the progress of the
// replicas node 0 holds of three shards replicated on three nodes: a
// follower being sent a snapshot is loading on the leader; a node silent
// for an election timeout is failed, flagged fail? while node 0 still
// knows it as a shard's leader and fail once another leads it; a
// follower node 0 does not exchange messages with is not judged.
func TestDescribeHealth(t *testing.T) {
	nodes := []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}
	placed, err := cluster.Place(3, 3)
	if err != nil {
		t.Fatal(err)
	}
	id := func(o int) uint64 { return replication.NodeID(o, 0) }
	// leaders[i] leads shard i; node 0 serves those it leads.
	describe := func(leaders [3]int, silent [3]uint64, state1 string) ([]clustercmd.Shard, []string) {
		top := cluster.Topology{}
		for _, a := range nodes {
			top.Nodes = append(top.Nodes, cluster.Node{ID: cluster.NodeID(a), Addr: a})
		}
		progress := make([]replication.Progress, 3)
		for i, sh := range placed {
			l := leaders[i]
			top.Nodes[l].Slots = append(top.Nodes[l].Slots, sh.Slots)
			p := replication.Progress{Status: replication.Status{Leader: id(l), Serving: l == 0}}
			for _, o := range sh.Replicas {
				if o == 0 {
					continue
				}
				peer := replication.Peer{Node: id(o), Silent: silent[o], State: "replicate"}
				if o == 1 {
					peer.State = state1
				}
				p.Peers = append(p.Peers, peer)
			}
			progress[i] = p
		}
		return describeShards(placed, 0, newView(top, top.Nodes[0].ID), progress, []bool{true, true, true})
	}
	// want checks the health shards give node in shard.
	want := func(shards []clustercmd.Shard, shard, node int, health, why string) {
		t.Helper()
		for _, sh := range shards {
			if sh.Slots[0] != placed[shard].Slots {
				continue
			}
			for _, r := range sh.Replicas {
				if r.Node == node {
					if r.Health != health {
						t.Errorf("%s: node %d in shard %d is %s; want %s", why, node, shard, r.Health, health)
					}
					return
				}
			}
		}
		t.Errorf("%s: node %d not in shard %d: %+v", why, node, shard, shards)
	}

	// Every node leads its home shard; node 1 is being sent shard 0.
	shards, flags := describe([3]int{0, 1, 2}, [3]uint64{}, "snapshot")
	want(shards, 0, 1, clustercmd.HealthLoading, "sent shard 0 by snapshot")
	want(shards, 0, 2, clustercmd.HealthOnline, "up to date in shard 0")
	if flags[1] != "" || flags[2] != "" {
		t.Errorf("flags %q; want none", flags)
	}

	// Node 2, which leads shard 2, goes silent: failed, and fail? while
	// node 0 still knows it as shard 2's leader.
	shards, flags = describe([3]int{0, 1, 2}, [3]uint64{1: 1, 2: failTicks}, "replicate")
	want(shards, 0, 2, clustercmd.HealthFailed, "silent for failTicks, a follower of node 0")
	want(shards, 2, 2, clustercmd.HealthFailed, "silent for failTicks, the leader node 0 follows")
	if flags[2] != "fail?" || flags[1] != "" {
		t.Errorf("flags %q; want node 2 fail? (still shard 2's leader here), node 1 none", flags)
	}

	// Node 1 has been elected for shard 2: node 2 leads nothing, fail.
	shards, flags = describe([3]int{0, 1, 1}, [3]uint64{1: 1, 2: failTicks}, "replicate")
	if flags[2] != "fail" {
		t.Errorf("flags %q; want node 2 fail once another leads its shard", flags)
	}
	want(shards, 1, 2, clustercmd.HealthFailed, "silent, in a shard node 0 follows (node 0 leads shard 0, which node 2 follows)")

	// Node 0 leads nothing and follows node 1 in every shard: node 2, a
	// follower like it, sends it nothing, and is not judged.
	_, flags = describe([3]int{1, 1, 1}, [3]uint64{1: 1, 2: 100 * failTicks}, "replicate")
	if flags[2] != "" {
		t.Errorf("flags %q; want node 2 unjudged: node 0 exchanges no messages with it", flags)
	}
}
