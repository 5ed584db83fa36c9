// Package clustercmd holds the replies of CLUSTER's read subcommands
// (INFO, SLOTS, SHARDS, NODES) as Redis Cluster words them for its clients,
// computed from a topology (package cluster). It is pure: no I/O, no
// state; package server chooses the topology and sends the reply.
package clustercmd

import (
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/resp"
)

// Info is CLUSTER INFO of top.
func Info(top cluster.Topology) string {
	assigned := top.Assigned()
	state := "ok"
	if assigned < cluster.Slots {
		state = "fail"
	}
	size := 0
	for _, n := range top.Nodes {
		if len(n.Slots) > 0 {
			size++
		}
	}
	epoch := strconv.FormatUint(top.Epoch, 10)
	var b strings.Builder
	kv := func(k, val string) { b.WriteString(k + ":" + val + "\r\n") }
	kv("cluster_state", state)
	kv("cluster_slots_assigned", strconv.Itoa(assigned))
	kv("cluster_slots_ok", strconv.Itoa(assigned))
	kv("cluster_slots_pfail", "0")
	kv("cluster_slots_fail", "0")
	kv("cluster_known_nodes", strconv.Itoa(len(top.Nodes)))
	kv("cluster_size", strconv.Itoa(size))
	kv("cluster_current_epoch", epoch)
	kv("cluster_my_epoch", epoch)
	kv("cluster_stats_messages_sent", "0")
	kv("cluster_stats_messages_received", "0")
	kv("total_cluster_links_buffer_limit_exceeded", "0")
	return b.String()
}

// hostPort splits an announced address; CheckAddr has vetted it.
func hostPort(addr string) (string, int64) {
	h, p, _ := cluster.SplitAddr(addr)
	n, _ := strconv.ParseInt(p, 10, 64)
	return h, n
}

// Shard is a set of slots and the nodes that hold them: one master,
// which serves them, and its replicas, as Redis Cluster has them.
type Shard struct {
	Slots []cluster.Range
	// Replicas are the shard's nodes, the master first.
	Replicas []Replica
}

// Replica is a node's place in a shard.
type Replica struct {
	Node   int // its index in the topology's Nodes
	Master bool
	// Health is CLUSTER SHARDS' word for it: HealthOnline, HealthLoading
	// or HealthFailed.
	Health string
	// Offset is its replication-offset: the last log index it is known
	// to hold, 0 when unknown or not replicated.
	Offset uint64
}

// The health of a shard's node, as CLUSTER SHARDS words it.
const (
	HealthOnline  = "online"
	HealthLoading = "loading"
	HealthFailed  = "failed"
)

// Shards are the shards of a topology with one copy per slot: one per
// node, its only replica the node itself, online; slotless nodes
// included, as Redis lists them.
func Shards(top cluster.Topology) []Shard {
	shards := make([]Shard, len(top.Nodes))
	for i, n := range top.Nodes {
		shards[i] = Shard{Slots: n.Slots, Replicas: []Replica{{Node: i, Master: true, Health: HealthOnline}}}
	}
	return shards
}

// AppendSlots appends CLUSTER SLOTS of shards: one entry per range, in
// slot order, each with its master then its replicas, each as [host,
// port, id] (three elements: go-redis refuses more than four). A replica
// is listed when it has not failed (as Redis leaves failed replicas out)
// and is the master of no shard: a Redis node has one role, and clients
// take it from here (redis-py from a node's first appearance, which would
// make a master of other slots a replica in its list of primaries).
func AppendSlots(b []byte, top cluster.Topology, shards []Shard) []byte {
	type owned struct {
		r  cluster.Range
		sh *Shard
	}
	master := masters(top, shards)
	listed := func(j int, rep Replica) bool { return j == 0 || rep.Health != HealthFailed && !master[rep.Node] }
	var all []owned
	for i := range shards {
		if len(shards[i].Replicas) == 0 || !shards[i].Replicas[0].Master {
			continue
		}
		for _, r := range shards[i].Slots {
			all = append(all, owned{r, &shards[i]})
		}
	}
	slices.SortFunc(all, func(a, b owned) int { return int(a.r.First) - int(b.r.First) })
	b = resp.AppendArray(b, len(all))
	for _, o := range all {
		served := 0
		for j, rep := range o.sh.Replicas {
			if listed(j, rep) {
				served++
			}
		}
		b = resp.AppendArray(b, 2+served)
		b = resp.AppendInt(b, int64(o.r.First))
		b = resp.AppendInt(b, int64(o.r.Last))
		for j, rep := range o.sh.Replicas {
			if !listed(j, rep) {
				continue
			}
			n := &top.Nodes[rep.Node]
			host, port := hostPort(n.Addr)
			b = resp.AppendArray(b, 3)
			b = resp.AppendBulkString(b, host)
			b = resp.AppendInt(b, port)
			b = resp.AppendBulkString(b, n.ID)
		}
	}
	return b
}

// AppendShards appends CLUSTER SHARDS of shards, maps in RESP3 when r3.
func AppendShards(b []byte, top cluster.Topology, shards []Shard, r3 bool) []byte {
	b = resp.AppendArray(b, len(shards))
	for _, sh := range shards {
		b = resp.AppendMap(b, 2, r3)
		b = resp.AppendBulkString(b, "slots")
		b = resp.AppendArray(b, 2*len(sh.Slots))
		for _, r := range sh.Slots {
			b = resp.AppendInt(b, int64(r.First))
			b = resp.AppendInt(b, int64(r.Last))
		}
		b = resp.AppendBulkString(b, "nodes")
		b = resp.AppendArray(b, len(sh.Replicas))
		for _, rep := range sh.Replicas {
			n := &top.Nodes[rep.Node]
			host, port := hostPort(n.Addr)
			// Redis leaves hostname out when none is set: a host that is an
			// IP address is no hostname.
			named := net.ParseIP(host) == nil
			b = resp.AppendMap(b, 7+named01(named), r3)
			b = resp.AppendBulkString(b, "id")
			b = resp.AppendBulkString(b, n.ID)
			b = resp.AppendBulkString(b, "port")
			b = resp.AppendInt(b, port)
			b = resp.AppendBulkString(b, "ip")
			b = resp.AppendBulkString(b, host)
			b = resp.AppendBulkString(b, "endpoint")
			b = resp.AppendBulkString(b, host)
			if named {
				b = resp.AppendBulkString(b, "hostname")
				b = resp.AppendBulkString(b, host)
			}
			role := "replica"
			if rep.Master {
				role = "master"
			}
			b = resp.AppendBulkString(b, "role")
			b = resp.AppendBulkString(b, role)
			b = resp.AppendBulkString(b, "replication-offset")
			b = resp.AppendInt(b, int64(min(rep.Offset, 1<<63-1)))
			b = resp.AppendBulkString(b, "health")
			b = resp.AppendBulkString(b, rep.Health)
		}
	}
	return b
}

// Nodes is CLUSTER NODES of top, seen from node index self (-1: not a
// member), in Redis' line format, which Lettuce and redis-py parse: id,
// host:port@cport, flags, master, ping-sent, pong-recv, config-epoch,
// link-state, then the slots (top's). A Redis node has one role: a node
// that is the master of a shard is a master, one that is only a replica
// is a slave of the master of the first shard it is a replica of. fail,
// when not nil, gives a node's failure flag: "", "fail?" or "fail"; a
// node with one is shown disconnected.
func Nodes(top cluster.Topology, self int, shards []Shard, fail []string) string {
	masterOf := make([]int, len(top.Nodes)) // index+1 of the node's master; 0: a master
	isMaster := masters(top, shards)
	for _, sh := range shards {
		if len(sh.Replicas) == 0 || !sh.Replicas[0].Master {
			continue
		}
		for _, rep := range sh.Replicas[1:] {
			if !isMaster[rep.Node] && masterOf[rep.Node] == 0 {
				masterOf[rep.Node] = sh.Replicas[0].Node + 1
			}
		}
	}
	var b strings.Builder
	for i, n := range top.Nodes {
		flags, master := "master", "-"
		if m := masterOf[i]; m != 0 {
			flags, master = "slave", top.Nodes[m-1].ID
		}
		if i == self {
			flags = "myself," + flags
		}
		link := "connected"
		if i < len(fail) && fail[i] != "" {
			flags += "," + fail[i]
			link = "disconnected"
		}
		b.WriteString(n.ID + " " + n.Addr + "@0 " + flags + " " + master + " 0 0 " + strconv.FormatUint(top.Epoch, 10) + " " + link)
		for _, r := range n.Slots {
			b.WriteByte(' ')
			b.WriteString(strconv.Itoa(int(r.First)))
			if r.Last != r.First {
				b.WriteString("-" + strconv.Itoa(int(r.Last)))
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// masters reports, by node, whether it is the master of a shard.
func masters(top cluster.Topology, shards []Shard) []bool {
	m := make([]bool, len(top.Nodes))
	for _, sh := range shards {
		for _, rep := range sh.Replicas {
			if rep.Master {
				m[rep.Node] = true
			}
		}
	}
	return m
}

func named01(named bool) int {
	if named {
		return 1
	}
	return 0
}
