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

// AppendSlots appends CLUSTER SLOTS of top: one entry per range, in slot
// order, each with its owner as [host, port, id] (three elements: go-redis
// refuses more than four).
func AppendSlots(b []byte, top cluster.Topology) []byte {
	type owned struct {
		r cluster.Range
		n *cluster.Node
	}
	var all []owned
	for i := range top.Nodes {
		for _, r := range top.Nodes[i].Slots {
			all = append(all, owned{r, &top.Nodes[i]})
		}
	}
	slices.SortFunc(all, func(a, b owned) int { return int(a.r.First) - int(b.r.First) })
	b = resp.AppendArray(b, len(all))
	for _, o := range all {
		host, port := hostPort(o.n.Addr)
		b = resp.AppendArray(b, 3)
		b = resp.AppendInt(b, int64(o.r.First))
		b = resp.AppendInt(b, int64(o.r.Last))
		b = resp.AppendArray(b, 3)
		b = resp.AppendBulkString(b, host)
		b = resp.AppendInt(b, port)
		b = resp.AppendBulkString(b, o.n.ID)
	}
	return b
}

// AppendShards appends CLUSTER SHARDS of top, maps in RESP3 when r3: one shard per node (there
// are no replicas), slotless nodes included, as Redis lists them.
func AppendShards(b []byte, top cluster.Topology, r3 bool) []byte {
	b = resp.AppendArray(b, len(top.Nodes))
	for _, n := range top.Nodes {
		host, port := hostPort(n.Addr)
		b = resp.AppendMap(b, 2, r3)
		b = resp.AppendBulkString(b, "slots")
		b = resp.AppendArray(b, 2*len(n.Slots))
		for _, r := range n.Slots {
			b = resp.AppendInt(b, int64(r.First))
			b = resp.AppendInt(b, int64(r.Last))
		}
		b = resp.AppendBulkString(b, "nodes")
		// Redis leaves hostname out when none is set: a host that is an
		// IP address is no hostname.
		named := net.ParseIP(host) == nil
		b = resp.AppendArray(b, 1)
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
		b = resp.AppendBulkString(b, "role")
		b = resp.AppendBulkString(b, "master")
		b = resp.AppendBulkString(b, "replication-offset")
		b = resp.AppendInt(b, 0)
		b = resp.AppendBulkString(b, "health")
		b = resp.AppendBulkString(b, "online")
	}
	return b
}

// Nodes is CLUSTER NODES of top, seen from node index self (-1: not a
// member), in Redis' line format, which Lettuce and
// redis-py parse: id, host:port@cport, flags, master, ping-sent,
// pong-recv, config-epoch, link-state, then the slots.
func Nodes(top cluster.Topology, self int) string {
	var b strings.Builder
	for i, n := range top.Nodes {
		flags := "master"
		if i == self {
			flags = "myself,master"
		}
		b.WriteString(n.ID + " " + n.Addr + "@0 " + flags + " - 0 0 " + strconv.FormatUint(top.Epoch, 10) + " connected")
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

func named01(named bool) int {
	if named {
		return 1
	}
	return 0
}
