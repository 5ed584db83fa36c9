package clusternode

import (
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/clustercmd"
	"github.com/sluicehq/sluice/replication"
	"slices"
)

// failTicks is how long, in ticks, a node goes without a message from a
// peer it should hear from before it counts that peer as failed: the
// groups' election timeout, after which a follower would elect another
// leader.
const failTicks = replication.DefaultElectionTicks

// shards returns CLUSTER SLOTS, SHARDS and NODES' view of v: its shards
// with their nodes and health, and each node's failure flag for NODES
// (nil: none).
func (s *Node) shards(v *view) ([]clustercmd.Shard, []string) {
	if s.rep == nil {
		return clustercmd.Shards(v.top), nil
	}
	return s.rep.describe(v)
}

// describe gives, for each shard whose leader v knows (the others'
// slots answer CLUSTERDOWN and are left out, as in the slot table), its
// leader as master and its other replicas, in placement order, as this
// node sees them:
//
//   - on the shard's leader, a follower is failed when it has sent
//     nothing for failTicks ticks, loading while it is being sent the
//     shard by snapshot, online otherwise, at its match index;
//   - elsewhere, a node is failed when it has sent nothing for failTicks
//     ticks although it should have (it leads a shard this node holds,
//     or follows one this node leads), online otherwise: followers do not
//     talk to each other, so a node judges only those it exchanges
//     messages with.
//
// The flag of a node failed so in NODES is fail? while this node still
// knows it as the leader of a shard it holds (no election has replaced
// it yet), fail otherwise.
func (r *replicas) describe(v *view) ([]clustercmd.Shard, []string) {
	progress := make([]replication.Progress, len(r.shards))
	held := make([]bool, len(r.shards))
	for i := range r.shards {
		if g := r.group(i); g != nil {
			progress[i], held[i] = g.Progress(), true
		}
	}
	return describeShards(r.placed(), r.ordinal(), v, progress, held)
}

// describeShards is describe of the shards of a placement seen from
// ordinal self, from the progress of the replicas it holds (held).
func describeShards(placed []cluster.Shard, self int, v *view, progress []replication.Progress, held []bool) ([]clustercmd.Shard, []string) {
	n := v.ordinals()           // by ordinal; the replies by index in v.top
	silent := make([]uint64, n) // fewest ticks since a message, over the groups
	for i := range silent {
		silent[i] = ^uint64(0)
	}
	talks := make([]bool, n) // a node this one should hear from
	leads := make([]bool, n) // a known leader of a shard this node holds
	for i := range placed {
		if !held[i] {
			continue
		}
		p := progress[i]
		for _, peer := range p.Peers {
			o := replication.Ordinal(peer.Node)
			if o >= n {
				continue
			}
			silent[o] = min(silent[o], peer.Silent)
			if p.Serving {
				talks[o] = true
			}
		}
		if p.Leader != 0 && !p.Serving {
			if o := replication.Ordinal(p.Leader); o < n && o != self {
				talks[o], leads[o] = true, true
			}
		}
	}
	failed := func(o int) bool { return o != self && talks[o] && silent[o] >= failTicks }

	var shards []clustercmd.Shard
	for i, sh := range placed {
		owner := int(v.owner[sh.Slots.First]) - 1
		if owner < 0 {
			continue
		}
		owner = v.ordinal(owner)
		p := progress[i]
		mine := held[i] && p.Serving && owner == self
		out := clustercmd.Shard{Slots: []cluster.Range{sh.Slots}}
		master := clustercmd.Replica{Node: owner, Master: true, Health: clustercmd.HealthOnline}
		switch {
		case mine:
			master.Offset = p.Last
		case held[i]:
			master.Offset = p.Commit
			if failed(owner) {
				master.Health = clustercmd.HealthFailed
			}
		}
		out.Replicas = append(out.Replicas, master)
		for _, o := range sh.Replicas {
			if o == owner {
				continue
			}
			rep := clustercmd.Replica{Node: o, Health: clustercmd.HealthOnline}
			switch {
			case mine:
				for _, peer := range p.Peers {
					if replication.Ordinal(peer.Node) != o {
						continue
					}
					rep.Offset = peer.Match
					switch {
					case peer.Silent >= failTicks:
						rep.Health = clustercmd.HealthFailed
					case peer.State == "snapshot":
						rep.Health = clustercmd.HealthLoading
					}
				}
			case o == self && held[i]:
				rep.Offset = p.Applied
			case failed(o):
				rep.Health = clustercmd.HealthFailed
			}
			out.Replicas = append(out.Replicas, rep)
		}
		shards = append(shards, out)
	}
	for k := range shards {
		reps := shards[k].Replicas
		for j := range reps {
			reps[j].Node = v.index(reps[j].Node)
		}
		shards[k].Replicas = slices.DeleteFunc(reps, func(r clustercmd.Replica) bool { return r.Node < 0 })
	}
	flags := make([]string, len(v.top.Nodes))
	for i := range flags {
		switch o := v.ordinal(i); {
		case !failed(o):
		case leads[o]:
			flags[i] = "fail?"
		default:
			flags[i] = "fail"
		}
	}
	return shards, flags
}

// ShardMetrics is what the metrics tell of a shard this node holds a
// replica of.
type ShardMetrics struct {
	Shard   int
	Serving bool // it leads the shard and serves its slots
	// ApplyLag is the entries committed and not yet applied here.
	ApplyLag uint64
	// FollowerLag is, on the leader, the most entries a follower lacks;
	// 0 elsewhere.
	FollowerLag uint64
	replication.Stats
}

// ReplicationMetrics returns the metrics of the shards this node holds a
// replica of, by shard; none when the shards are not replicated.
func (s *Node) ReplicationMetrics() []ShardMetrics {
	if s == nil || s.rep == nil {
		return nil
	}
	var out []ShardMetrics
	for i := range s.rep.shards {
		g := s.rep.group(i)
		if g == nil {
			continue
		}
		p := g.Progress()
		out = append(out, ShardMetrics{Shard: i, Serving: p.Serving, ApplyLag: p.ApplyLag(), FollowerLag: p.MaxLag(), Stats: g.Stats()})
	}
	return out
}
