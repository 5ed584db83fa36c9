package clusternode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/replication"
	"github.com/sluicehq/sluice/storage"
)

// Replicated shards (--cluster-replicas 3 or 5): the slots are placed from
// --cluster-nodes (cluster.Place: shard i has ordinal i's initial slots
// and replicas on the R nodes from ordinal i on), each shard a Raft group
// (package replication) whose leader alone decides. The slot table that
// Route, Owner and CLUSTER SLOTS/SHARDS/NODES read gives each shard's
// slots to the node serving it as leader, as this node knows it, and is
// rebuilt whenever that changes; a shard with no leader known answers
// -CLUSTERDOWN, which cluster clients retry. The topology cannot be
// pushed or resharded in this mode.

// DefaultElectionTimeout is how long a shard's replicas wait without a
// word from its leader before electing another; Config.ElectionTimeout.
const DefaultElectionTimeout = time.Second

// busPortOffset is the default distance of a node's replication port from
// its announced port, as Redis Cluster's bus port.
const busPortOffset = 10000

var errReplicatedTopology = resp.Error("ERR the shards of a cluster with --cluster-replicas above 1 are placed from --cluster-nodes; topology pushes and slot moves do not apply to it")

// ReplicatedStoreOptions returns o for the store of a node of a cluster of
// n nodes with r replicas per shard: one committer per shard, each the
// only writer of its shard's records, its rounds proposed to the shard's
// group through the returned Committers (Config.Replicator).
func ReplicatedStoreOptions(o storage.Options, n, r int) (storage.Options, *replication.Committers, error) {
	shards, err := cluster.Place(n, r)
	if err != nil {
		return o, nil, err
	}
	var shardOf [cluster.Slots]uint16
	for i, sh := range shards {
		for s := int(sh.Slots.First); s <= int(sh.Slots.Last); s++ {
			shardOf[s] = uint16(i)
		}
	}
	c := &replication.Committers{}
	o.Replicator = c
	o.Committers, o.Partitions = len(shards), len(shards)
	o.Partition = func(key []byte) int { return int(shardOf[keyspace.Partition(key)]) }
	return o, c, nil
}

// replicas is a node's replicated shards.
type replicas struct {
	shards []cluster.Shard
	self   int // this node's ordinal
	host   *replication.Host
	tr     *replication.Transport
	stop   context.CancelFunc
	done   chan struct{}
}

// openReplicated starts the node's replicas of its shards and the loop
// that keeps the slot table on their leaders.
func (s *Node) openReplicated(cc *Config) error {
	n := len(cc.Nodes)
	self := slices.Index(cc.Nodes, cc.Self)
	if self < 0 {
		return fmt.Errorf("server: --cluster-replicas %d: this node (%s) is not in --cluster-nodes; a replicated cluster's nodes are those listed", cc.Replicas, cc.Self)
	}
	if cc.Replicator == nil {
		return errors.New("server: --cluster-replicas: the store was not opened for replicated shards (ReplicatedStoreOptions)")
	}
	shards, err := cluster.Place(n, cc.Replicas)
	if err != nil {
		return fmt.Errorf("server: --cluster-replicas: %w", err)
	}
	bus := cc.BusNodes
	if len(bus) == 0 {
		for _, a := range cc.Nodes {
			h, p, _ := cluster.SplitAddr(a)
			port, _ := strconv.Atoi(p)
			if port+busPortOffset > 65535 {
				return fmt.Errorf("server: --cluster-replicas: node %s: its replication port would be %d, past 65535; give the ports with --cluster-bus-nodes", a, port+busPortOffset)
			}
			bus = append(bus, net.JoinHostPort(h, strconv.Itoa(port+busPortOffset)))
		}
	}
	if len(bus) != n {
		return fmt.Errorf("server: --cluster-bus-nodes lists %d addresses; want one per node of --cluster-nodes (%d)", len(bus), n)
	}
	id := func(o int) uint64 { return uint64(o) + 1 }
	tr, err := replication.NewTransport(replication.TransportConfig{
		Node: id(self),
		Addr: func(node uint64) (string, bool) {
			if node == 0 || node > uint64(n) {
				return "", false
			}
			return bus[node-1], true
		},
		Logger: s.log,
	})
	if err != nil {
		return err
	}
	_, port, _ := cluster.SplitAddr(bus[self])
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		tr.Close()
		return fmt.Errorf("server: listen for replication on %s: %w", bus[self], err)
	}
	go tr.Serve(ln)
	timeout := cc.ElectionTimeout
	if timeout <= 0 {
		timeout = DefaultElectionTimeout
	}
	host, err := replication.NewHost(replication.HostConfig{
		Store: s.store, Committers: cc.Replicator, Transport: tr,
		Shards: shards, Ordinal: self, NodeID: id, Logger: s.log,
	})
	if err != nil {
		tr.Close()
		return err
	}
	tick := timeout / replication.DefaultElectionTicks
	host.Run(tick)
	ctx, cancel := context.WithCancel(context.Background())
	s.rep = &replicas{shards: shards, self: self, host: host, tr: tr, stop: cancel, done: make(chan struct{})}
	s.view.Store(s.rep.view(cc.Nodes, 0, s.myID))
	go s.followLeaders(ctx, cc.Nodes, tick)
	s.log.Info("cluster mode with replicated shards", "replicas", cc.Replicas, "shards", len(shards), "ordinal", self, "replication_addr", bus[self], "election_timeout", timeout)
	return nil
}

// view is the slot table of the shards' leaders as this node knows them:
// a shard it serves is its own; one whose leader it knows is that node's;
// one it holds no replica of is its home node's, which redirects further
// if it does not lead it.
func (r *replicas) view(nodes []string, epoch uint64, myID string) *view {
	top := cluster.Topology{Epoch: epoch}
	for _, a := range nodes {
		top.Nodes = append(top.Nodes, cluster.Node{ID: cluster.NodeID(a), Addr: a})
	}
	for i, sh := range r.shards {
		owner := sh.Replicas[0]
		if g := r.host.Group(i); g != nil {
			st := g.Status()
			switch {
			case st.Serving:
				owner = r.self
			case st.Leader != 0 && ordinalOf(st.Leader) != r.self:
				owner = ordinalOf(st.Leader)
			default:
				continue // an election: CLUSTERDOWN, which clients retry
			}
		}
		top.Nodes[owner].Slots = cluster.Merge(append(top.Nodes[owner].Slots, sh.Slots))
	}
	return newView(top, myID)
}

// followLeaders rebuilds the slot table every tick when a shard's leader
// changed, under a new epoch, until ctx is done.
func (s *Node) followLeaders(ctx context.Context, nodes []string, tick time.Duration) {
	defer close(s.rep.done)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		old := s.view.Load()
		v := s.rep.view(nodes, old.top.Epoch+1, s.myID)
		if *v.owner != *old.owner {
			s.view.Store(v)
			s.log.Info("cluster: shard leaders changed", "epoch", v.top.Epoch, "slots_served", slotsOf(v.top, s.myID))
		}
	}
}

// closeReplicated stops the replicas and their transport.
func (r *replicas) close() error {
	r.stop()
	<-r.done
	err := r.host.Stop()
	r.tr.Close()
	return err
}

// ReplicationInfo gives INFO replication's lines of this node's replicas,
// one per shard it holds: shard_<i>:role=<leader|follower|candidate|
// pre-candidate>,serving=<0|1>,leader=<ordinal, or -1 when none is
// known>,term=,commit=,applied=,apply_lag=<commit−applied>, then on a
// leader last=<its last index>,lag=<most entries a follower lacks>,
// lag_<ordinal>=<entries it lacks> for each follower, elsewhere
// leader_silent_ms=<time since the leader's last message, in whole ticks;
// -1 when none is known>, and last slots=<first>-<last>. Nothing when the
// shards are not replicated.
func (s *Node) ReplicationInfo(kv func(k, v string)) {
	if s == nil || s.rep == nil {
		return
	}
	kv("cluster_replicas", strconv.Itoa(len(s.rep.shards[0].Replicas)))
	kv("cluster_ordinal", strconv.Itoa(s.rep.self))
	tick := s.tick()
	u := func(n uint64) string { return strconv.FormatUint(n, 10) }
	for i, sh := range s.rep.shards {
		g := s.rep.host.Group(i)
		if g == nil {
			continue
		}
		p := g.Progress()
		serving, leader := "0", -1
		if p.Serving {
			serving = "1"
		}
		if p.Leader != 0 {
			leader = ordinalOf(p.Leader)
		}
		line := "role=" + p.Role + ",serving=" + serving + ",leader=" + strconv.Itoa(leader) +
			",term=" + u(p.Term) + ",commit=" + u(p.Commit) + ",applied=" + u(p.Applied) + ",apply_lag=" + u(p.ApplyLag())
		if p.Role == "leader" {
			line += ",last=" + u(p.Last) + ",lag=" + u(p.MaxLag())
			for _, peer := range p.Peers {
				line += ",lag_" + strconv.Itoa(ordinalOf(peer.Node)) + "=" + u(p.Lag(peer))
			}
		} else {
			silent := int64(-1)
			for _, peer := range p.Peers {
				if p.Leader != 0 && peer.Node == p.Leader {
					silent = (time.Duration(peer.Silent) * tick).Milliseconds()
				}
			}
			line += ",leader_silent_ms=" + strconv.FormatInt(silent, 10)
		}
		kv("shard_"+strconv.Itoa(i), line+",slots="+cluster.FormatRanges([]cluster.Range{sh.Slots}))
	}
}

// tick is the replicas' tick: the election timeout over its ticks.
func (s *Node) tick() time.Duration {
	timeout := s.cfg.ElectionTimeout
	if timeout <= 0 {
		timeout = DefaultElectionTimeout
	}
	return timeout / replication.DefaultElectionTicks
}

// Sweeps reports whether this node's idle sweep may delete the record
// key: with replicated shards, only in a shard it serves as leader (a
// follower's deletes would be refused by the group, and the leader's
// reach it anyway); otherwise always, as a node with one copy per slot
// sweeps every record it holds.
func (s *Node) Sweeps(key []byte) bool {
	if s == nil || s.rep == nil {
		return true
	}
	slot, ok := keyspace.RecordSlot(key)
	if !ok {
		return false
	}
	_, mine := s.Owner(slot)
	return mine
}
