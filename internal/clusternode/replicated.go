package clusternode

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
// -CLUSTERDOWN, which cluster clients retry. The slot ranges are fixed;
// a shard's replicas are moved by CLUSTER PLACE, a proposal to the
// placement group (replication.Host.Move), which every node follows.

// DefaultElectionTimeout is how long a shard's replicas wait without a
// word from its leader before electing another; Config.ElectionTimeout.
const DefaultElectionTimeout = time.Second

// DefaultLogMemory is the default of Config.LogMemory: the 1 MiB of
// entries each group kept before it was a bound, for the groups of a
// cluster of three nodes with one shard each (and the placement group).
const DefaultLogMemory = 4 << 20

// groupConfig returns the template of the node's groups' Config
// (replication.HostConfig.Group): the log's bounds, LogMemory shared by
// the groups of shards shards and the placement group, which is as many
// as a node can hold.
func groupConfig(cc *Config, shards int) replication.Config {
	mem := cc.LogMemory
	if mem <= 0 {
		mem = DefaultLogMemory
	}
	return replication.Config{LogKeepBytes: cc.LogKeepBytes, LogMemory: int(max(mem/int64(shards+1), 1))}
}

// busPortOffset is the default distance of a node's replication port from
// its announced port, as Redis Cluster's bus port.
const busPortOffset = 10000

var errReplicatedTopology = refuse("the shards of a cluster with --cluster-replicas above 1 are placed from --cluster-nodes; topology pushes and slot moves do not apply to it (move a shard's replicas with CLUSTER PLACE, or sluice cluster place)")

// ReplicatedStoreOptions returns o for the store of a node of a cluster of
// n nodes with r replicas per shard and s shards (Config.Shards; 0: one
// per node): one committer per shard, each the only writer of its
// shard's records, its rounds proposed to the shard's group through the
// returned Committers (Config.Replicator).
func ReplicatedStoreOptions(o storage.Options, n, s, r int) (storage.Options, *replication.Committers, error) {
	shards, err := cluster.PlaceShards(n, shardCount(n, s), r)
	if err != nil {
		return o, nil, err
	}
	if len(shards) > storage.MaxCommitters {
		return o, nil, fmt.Errorf("%w: %d shards; a node holds at most %d (one committer each)", cluster.ErrShards, len(shards), storage.MaxCommitters)
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
	// self is this node's ordinal: set before host, and -1 until then on
	// a node added to the cluster that has not learned it yet (join).
	self atomic.Int64
	// known are the cluster's nodes until host follows them: those of the
	// flags, or of the placement a node added to the cluster learned;
	// initial those the flags give (nodes).
	known   atomic.Pointer[[]replication.Node]
	initial []replication.Node
	// host is nil until the node knows its incarnation: on an empty data
	// directory, once the other nodes have answered (decideIncarnation).
	host atomic.Pointer[replication.Host]
	stop context.CancelFunc
	done chan struct{}
	// tr is the transport of the host, or of the node while it asks the
	// others; the goroutine that starts the host owns it until done.
	tr *replication.Transport
	// viewMu serializes rebuilds of the slot table (rebuild).
	viewMu sync.Mutex
	// quiesce is the server's (SetQuiesce).
	quiesce atomic.Pointer[func(deadline time.Time) bool]
}

// ordinal is this node's ordinal, or -1 while it waits to be added.
func (r *replicas) ordinal() int { return int(r.self.Load()) }

// nodes returns the cluster's nodes by ordinal, as this node follows
// them: those the cluster first started with as this node's flags give
// them (each node's --cluster-bus-nodes may name other replication
// addresses for them, a proxy's, while the placement holds its proposer's),
// the nodes added since as the placement gives them, and a node removed
// as removed.
func (r *replicas) nodes() []replication.Node {
	placed := *r.known.Load()
	if h := r.host.Load(); h != nil && h.Nodes() != nil {
		placed = h.Nodes()
	}
	out := slices.Clone(placed)
	for o := range min(len(out), len(r.initial)) {
		if !out[o].Removed() {
			out[o] = r.initial[o]
		}
	}
	return out
}

// addrs returns the announced addresses of the cluster's nodes by
// ordinal, "" for a node removed.
func (r *replicas) addrs() []string {
	nodes := r.nodes()
	out := make([]string, len(nodes))
	for o, n := range nodes {
		out[o] = n.Addr
	}
	return out
}

// present is the addresses of the cluster's nodes but those removed,
// comma-separated, for an error to list.
func (r *replicas) present() string {
	return strings.Join(slices.DeleteFunc(r.addrs(), func(a string) bool { return a == "" }), ",")
}

// group returns this node's replica of shard i, or nil.
func (r *replicas) group(i int) *replication.Group {
	return r.host.Load().Group(i)
}

// openReplicated starts the node's replicas of its shards and the loop
// that keeps the slot table on their leaders.
func (s *Node) openReplicated(cc *Config) error {
	n := len(cc.Nodes)
	if cc.Replicator == nil {
		return errors.New("server: --cluster-replicas: the store was not opened for replicated shards (ReplicatedStoreOptions)")
	}
	shards, err := cluster.PlaceShards(n, shardCount(n, cc.Shards), cc.Replicas)
	if err != nil {
		return fmt.Errorf("server: --cluster-replicas: %w", err)
	}
	bus := cc.BusNodes
	if len(bus) == 0 {
		for _, a := range cc.Nodes {
			b, err := busAddr(a)
			if err != nil {
				return fmt.Errorf("server: --cluster-replicas: %w", err)
			}
			bus = append(bus, b)
		}
	}
	if len(bus) != n {
		return fmt.Errorf("server: --cluster-bus-nodes lists %d addresses; want one per node of --cluster-nodes (%d)", len(bus), n)
	}
	initial := make([]replication.Node, n)
	for o := range n {
		initial[o] = replication.Node{Addr: cc.Nodes[o], Bus: bus[o]}
	}
	place := placement(cc.Nodes, len(shards), cc.Replicas)
	if err := s.checkPlacement(place); err != nil {
		return err
	}
	// A node added to the cluster (CLUSTER ADDNODE) is not in the flags'
	// list: its ordinal is in the placement its store holds, or, on its
	// first start, in the one it learns from the others (join).
	// A node removed since is not in it: it waits to be added again.
	known := initial
	self := slices.Index(cc.Nodes, cc.Self)
	p, ok, err := replication.StoredPlacement(s.store)
	if err != nil {
		return fmt.Errorf("server: read the cluster's placement: %w", err)
	}
	if ok && p.Nodes != nil {
		known = p.Nodes
		self = slices.IndexFunc(p.Nodes, func(n replication.Node) bool { return n.Addr == cc.Self })
	}
	var groups []uint64
	for i, sh := range shards {
		if slices.Contains(sh.Replicas, self) {
			groups = append(groups, replication.ShardGroup(i))
		}
	}
	inc, incKnown, err := s.storedIncarnation(groups)
	if err != nil {
		return err
	}
	timeout := cc.ElectionTimeout
	if timeout <= 0 {
		timeout = DefaultElectionTimeout
	}
	tick := timeout / replication.DefaultElectionTicks
	st := &replicaStart{s: s, cc: cc, shards: shards, initial: initial, tick: tick, cluster: placementDigest(place)}
	ctx, cancel := context.WithCancel(context.Background())
	s.rep = &replicas{shards: shards, initial: initial, stop: cancel, done: make(chan struct{})}
	s.rep.self.Store(int64(self))
	s.rep.known.Store(&known)
	s.view.Store(s.rep.view(0, s.myID))
	switch {
	case self < 0:
		// Every slot answers -CLUSTERDOWN until the node is added and
		// knows its ordinal.
		tr, err := st.transport(0)
		if err != nil {
			return err
		}
		s.rep.tr = tr
	case incKnown:
		// As before any wait: a node that cannot start its replicas fails
		// to start.
		if err := st.start(inc, nil, nil); err != nil {
			return err
		}
	default:
		// Listening already, to answer the other nodes, which may be
		// new too; every slot answers -CLUSTERDOWN until the node knows
		// its incarnation.
		tr, err := st.transport(0)
		if err == nil {
			err = st.listen(tr)
			if err != nil {
				tr.Close()
			}
		}
		if err != nil {
			return err
		}
		s.rep.tr = tr
	}
	go func() {
		defer close(s.rep.done)
		switch {
		case self < 0:
			if !st.joinAndStart(ctx) {
				return
			}
		case !incKnown:
			if !st.decideAndStart(ctx) {
				return
			}
		}
		s.followLeaders(ctx, tick)
	}()
	s.log.Info("cluster mode with replicated shards", "replicas", cc.Replicas, "shards", len(shards), "ordinal", self, "election_timeout", timeout)
	return nil
}

// busAddr is the default replication address of a node announced at
// addr: its port plus busPortOffset, as Redis Cluster's bus port.
func busAddr(addr string) (string, error) {
	h, p, _ := cluster.SplitAddr(addr)
	port, _ := strconv.Atoi(p)
	if port+busPortOffset > 65535 {
		return "", fmt.Errorf("node %s: its replication port would be %d, past 65535; give the ports with --cluster-bus-nodes", addr, port+busPortOffset)
	}
	return net.JoinHostPort(h, strconv.Itoa(port+busPortOffset)), nil
}

// replicaStart starts a node's replicas.
type replicaStart struct {
	s       *Node
	cc      *Config
	shards  []cluster.Shard
	initial []replication.Node // the flags' nodes
	tick    time.Duration
	// cluster is the digest of the placement (TransportConfig.Cluster).
	cluster uint64
}

// transport returns the node's transport under incarnation inc, not
// listening yet; of identity 0, to ask for the placement only, while the
// node does not know its ordinal.
func (st *replicaStart) transport(inc uint64) (*replication.Transport, error) {
	var id uint64
	if o := st.s.rep.ordinal(); o >= 0 {
		id = replication.NodeID(o, inc)
	}
	return st.transportAs(id)
}

// transportAs returns a transport of identity id, not listening yet.
func (st *replicaStart) transportAs(id uint64) (*replication.Transport, error) {
	r := st.s.rep
	return replication.NewTransport(replication.TransportConfig{
		Node: id, Cluster: st.cluster,
		Addr: func(node uint64) (string, bool) {
			nodes := r.nodes()
			if node == 0 || replication.Ordinal(node) >= len(nodes) || nodes[replication.Ordinal(node)].Removed() {
				return "", false
			}
			return nodes[replication.Ordinal(node)].Bus, true
		},
		ClientTLS: st.s.repClientTLS, ServerTLS: st.s.repServerTLS,
		Logger: st.s.log,
	})
}

func (st *replicaStart) listen(tr *replication.Transport) error {
	bus := st.s.rep.nodes()[st.s.rep.ordinal()].Bus
	_, port, _ := cluster.SplitAddr(bus)
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		return fmt.Errorf("server: listen for replication on %s: %w", bus, err)
	}
	go tr.Serve(ln)
	return nil
}

// start starts the node's replicas under incarnation inc, on tr when it
// is the transport already listening (of incarnation 0), or on a new one;
// learned is the placement a node added to the cluster learned (join).
func (st *replicaStart) start(inc uint64, tr *replication.Transport, learned *replication.Placement) error {
	listening := tr != nil
	if !listening {
		var err error
		if tr, err = st.transport(inc); err != nil {
			return err
		}
	}
	r := st.s.rep
	host, err := replication.NewHost(replication.HostConfig{
		Store: st.s.store, Committers: st.cc.Replicator, Transport: tr,
		Shards: st.shards, Addrs: st.initial, Placement: learned, Ordinal: r.ordinal(), Incarnation: inc, Logger: st.s.log,
		Handoff: st.s.handoff, Group: groupConfig(st.cc, len(st.shards)),
	})
	if err == nil && !listening {
		// Only now: before its groups are in, it would answer another
		// node's question (Transport.Ask) as one that holds nothing.
		if err = st.listen(tr); err != nil {
			host.Stop()
		}
	}
	if err != nil {
		tr.Close()
		return err
	}
	// Before it runs: the transport's addresses follow its placement.
	r.tr = tr
	r.host.Store(host)
	host.Run(st.tick)
	return nil
}

// decideAndStart decides the incarnation of a node that found its store
// empty (decideIncarnation), records it, and starts the replicas; false
// if it stopped first (ctx done) or failed, which it logs: every slot
// then answers -CLUSTERDOWN here, and the other replicas serve.
func (st *replicaStart) decideAndStart(ctx context.Context) bool {
	r := st.s.rep
	// The others refuse a node the cluster removed: it asks for the
	// placement as a node not added yet does.
	asker, err := st.transportAs(0)
	if err != nil {
		st.s.log.Error("cluster: this node's replicas did not start; its slots are served by the other replicas", "err", err)
		return false
	}
	inc, removed, err := st.s.decideIncarnation(ctx, r.tr, asker, len(st.initial), r.ordinal())
	if removed != nil {
		// Its ordinal is never given again: it waits to be added anew.
		st.s.log.Warn("cluster: this node's data directory is empty, and the cluster's placement shows its ordinal removed (sluice cluster remove-node): it is no node of the cluster, and waits to be added again as a new node (sluice cluster add-node), serving nothing",
			"ordinal", r.ordinal(), "placement_epoch", removed.Epoch)
		r.tr.Close()
		nodes := removed.Nodes
		r.known.Store(&nodes)
		r.self.Store(-1)
		st.s.view.Store(r.view(0, st.s.myID))
		r.tr = asker
		return st.joinAndStart(ctx)
	}
	asker.Close()
	if err != nil {
		return false // stopped
	}
	tr := r.tr
	if inc != 0 {
		tr.Close() // it has the first incarnation's identity
		tr = nil
	}
	r.tr = nil
	return st.record(inc, tr, nil)
}

// record records the node's incarnation inc and starts its replicas
// (start); false if either failed, which it logs.
func (st *replicaStart) record(inc uint64, tr *replication.Transport, learned *replication.Placement) bool {
	err := st.s.store.SetMeta(MetaIncarnation, strconv.AppendUint(nil, inc, 10))
	if err != nil {
		err = fmt.Errorf("record the node's incarnation: %w", err)
	} else {
		err = st.start(inc, tr, learned)
	}
	if err != nil {
		if tr != nil {
			tr.Close()
		}
		st.s.log.Error("cluster: this node's replicas did not start; its slots are served by the other replicas", "err", err)
		return false
	}
	return true
}

// joinAndStart waits until a node that is not one of the flags' nodes
// was added to the cluster (CLUSTER ADDNODE), asking the flags' nodes for
// the placement, then starts its replicas under a new incarnation: they
// join their groups, and take their state by snapshot. False if it
// stopped first (ctx done) or failed, which it logs.
func (st *replicaStart) joinAndStart(ctx context.Context) bool {
	r, s := st.s.rep, st.s
	var logged time.Time
	for {
		var best replication.Placement
		found := false
		for o := range st.initial {
			p, ok, err := r.tr.AskPlacement(replication.NodeID(o, 0))
			if err == nil && ok && p.Nodes != nil && (!found || p.Epoch > best.Epoch) {
				best, found = p, true
			}
		}
		if o := slices.IndexFunc(best.Nodes, func(n replication.Node) bool { return n.Addr == s.myAddr }); found && o >= 0 {
			r.tr.Close()
			r.tr = nil
			nodes := best.Nodes
			r.known.Store(&nodes)
			r.self.Store(int64(o))
			inc := rand.Uint64N(1<<50) + 1
			s.log.Info("cluster: this node was added to the cluster; its replicas join their shards by snapshot", "ordinal", o, "incarnation", inc, "placement_epoch", best.Epoch)
			return st.record(inc, nil, &best)
		}
		if now := time.Now(); now.Sub(logged) >= askLogEvery {
			logged = now
			s.log.Warn("cluster: this node is not one of the cluster's nodes (not one of --cluster-nodes, or removed), and the cluster has not added it: add it with CLUSTER ADDNODE "+s.myAddr+" on the placement's leader (sluice cluster add-node); it serves nothing until then",
				"announce", s.myAddr)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(askEvery):
		}
	}
}

// MetaPlacement is the store's record of what placed its node's shards
// (placement), written on its first start with replicated shards.
const MetaPlacement = "cluster.placement"

// placement is what places a replicated cluster's shards, as recorded:
// the replicas per shard, the shard count when it is not one per node,
// and the nodes in ordinal order. Another list (a node added by listing
// it) or another count gives other shards, other slot ranges under the
// same groups.
func placement(nodes []string, shards, replicas int) string {
	p := "v1 replicas=" + strconv.Itoa(replicas)
	if shards != len(nodes) {
		p += " shards=" + strconv.Itoa(shards)
	}
	return p + " nodes=" + strings.Join(nodes, ",")
}

// shardCount is the shards of a cluster of n nodes given s (Config.Shards).
func shardCount(n, s int) int {
	if s <= 0 {
		return n
	}
	return s
}

// placementDigest is place's identity in the nodes' hellos.
func placementDigest(place string) uint64 {
	h := sha256.Sum256([]byte(place))
	return binary.BigEndian.Uint64(h[:8])
}

// checkPlacement records place on a node's first start with replicated
// shards, and refuses a later start with another: the shards it holds
// would change slot ranges under the same Raft groups, while the other
// nodes keep theirs, and two leaders could answer for one slot.
func (s *Node) checkPlacement(place string) error {
	stored, err := s.store.Meta(MetaPlacement)
	if err != nil {
		return fmt.Errorf("server: read the cluster's placement: %w", err)
	}
	switch {
	case stored == nil:
		if err := s.store.SetMeta(MetaPlacement, []byte(place)); err != nil {
			return fmt.Errorf("server: record the cluster's placement: %w", err)
		}
		return nil
	case string(stored) == place:
		return nil
	}
	return fmt.Errorf("%w: %s was first started in a replicated cluster placed by --cluster-replicas, --cluster-shards and --cluster-nodes as %q; these flags give %q. "+
		"Start every node with the flags it was first started with, a node added since too (its own address past --cluster-size); add nodes with sluice cluster add-node (docs/cluster.md, \"Adding a node\")",
		ErrPlacement, s.store.Dir(), strings.TrimPrefix(string(stored), "v1 "), strings.TrimPrefix(place, "v1 "))
}

// ErrPlacement is wrapped by the error of a start whose flags place the
// shards of a replicated cluster otherwise than its first start did.
var ErrPlacement = errors.New("server: another placement of the cluster's shards")

// MetaIncarnation is the store's record of its node's incarnation
// (replication.NodeID), written before its replicas first start.
const MetaIncarnation = "cluster.incarnation"

// storedIncarnation returns the incarnation the store records, and true;
// 0 and true for a store that holds state of groups but no record (made
// before there was one); false for a store that holds neither: a new
// node's, or one that lost its data.
func (s *Node) storedIncarnation(groups []uint64) (uint64, bool, error) {
	v, err := s.store.Meta(MetaIncarnation)
	if err != nil {
		return 0, false, fmt.Errorf("server: read the node's incarnation: %w", err)
	}
	if v != nil {
		inc, err := strconv.ParseUint(string(v), 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("server: the node's incarnation recorded in %s: %q is not a number", s.store.Dir(), v)
		}
		return inc, true, nil
	}
	held, err := replication.Holds(s.store, groups...)
	if err != nil {
		return 0, false, fmt.Errorf("server: read the state of the node's replicas: %w", err)
	}
	return 0, held, nil
}

// askEvery is how often a node on an empty data directory asks the other
// nodes again, while one of them does not answer; it logs every
// askLogEvery.
const (
	askEvery    = 200 * time.Millisecond
	askLogEvery = 5 * time.Second
)

// decideIncarnation decides the incarnation of a node whose store holds
// nothing of its replicas, from what the other nodes answer
// (Transport.Ask). If one has a group that has lived, this node lost its
// data: it must never take part under its old identity, whose votes and
// acknowledged entries it forgot, so it takes a new random incarnation
// and its replicas rejoin by snapshot. If every other node holds nothing,
// or only groups as bootstrapped, the cluster is new: 0, and the node
// bootstraps its shards like the others. Until every node has answered
// it waits (a new cluster starts once all its nodes are up), or until
// ctx is done. The nodes refuse one the cluster removed: if one that does
// not answer gives asker (of identity 0) a placement in which this node's
// ordinal is removed, that placement is returned.
func (s *Node) decideIncarnation(ctx context.Context, tr, asker *replication.Transport, n, self int) (uint64, *replication.Placement, error) {
	var logged time.Time
	for {
		var missing, other []int
		for o := range n {
			if o == self {
				continue
			}
			st, err := tr.Ask(replication.NodeID(o, 0))
			switch {
			case errors.Is(err, replication.ErrOtherCluster):
				other = append(other, o)
			case err != nil:
				missing = append(missing, o)
			case st == replication.StandingLived:
				inc := rand.Uint64N(1<<50) + 1
				s.log.Warn("cluster: this node's data directory holds nothing of its shards, and ordinal "+strconv.Itoa(o)+"'s shows the cluster has run: this node lost its data; its replicas rejoin by snapshot under a new identity",
					"ordinal", self, "incarnation", inc)
				return inc, nil, nil
			}
		}
		if len(missing) == 0 && len(other) == 0 {
			s.log.Info("cluster: every node is new; bootstrapping the shards", "ordinal", self)
			return 0, nil, nil
		}
		// Those that do not answer may refuse a node removed.
		for _, o := range missing {
			p, ok, err := asker.AskPlacement(replication.NodeID(o, 0))
			if err == nil && ok && self < len(p.Nodes) && p.Nodes[self].Removed() {
				return 0, &p, nil
			}
		}
		if now := time.Now(); now.Sub(logged) >= askLogEvery && len(other) > 0 {
			logged = now
			s.log.Error("cluster: other nodes refuse this one: they were started with another --cluster-nodes, --cluster-replicas or --cluster-shards; every node of a replicated cluster must be started with the same (this node waits, serving nothing)",
				"ordinal", self, "refusing", fmt.Sprint(other), "placement", placement(s.cfg.Nodes, shardCount(len(s.cfg.Nodes), s.cfg.Shards), s.cfg.Replicas))
		} else if now.Sub(logged) >= askLogEvery {
			logged = now
			s.log.Warn("cluster: this node's data directory is empty; waiting for every other node to answer before it bootstraps its shards or rejoins them (a new cluster starts once all its nodes are up)",
				"ordinal", self, "not_answering", fmt.Sprint(missing))
		}
		select {
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		case <-time.After(askEvery):
		}
	}
}

// view is the slot table of the shards' leaders as this node knows them:
// a shard it serves is its own; one whose leader it knows is that node's;
// one it holds no replica of is its home node's, which redirects further
// if it does not lead it.
func (r *replicas) view(epoch uint64, myID string) *view {
	top := cluster.Topology{Epoch: epoch}
	self := r.ordinal()
	var ords []int // a node removed is left out
	index := map[int]int{}
	for o, a := range r.addrs() {
		if a == "" {
			continue
		}
		index[o] = len(top.Nodes)
		ords = append(ords, o)
		top.Nodes = append(top.Nodes, cluster.Node{ID: cluster.NodeID(a), Addr: a})
	}
	host := r.host.Load()
	for i, sh := range r.shards {
		if host == nil {
			continue // not started: CLUSTERDOWN
		}
		owner := host.Replicas(i)[0]
		if g := r.group(i); g != nil {
			st := g.Status()
			switch {
			case st.Serving:
				owner = self
			case st.Leader != 0 && replication.Ordinal(st.Leader) != self:
				owner = replication.Ordinal(st.Leader)
			default:
				continue // an election: CLUSTERDOWN, which clients retry
			}
		}
		ix, ok := index[owner]
		if !ok {
			continue // a node removed: CLUSTERDOWN until the shard moves
		}
		top.Nodes[ix].Slots = cluster.Merge(append(top.Nodes[ix].Slots, sh.Slots))
	}
	v := newView(top, myID)
	if len(ords) != len(r.addrs()) {
		v.ords = ords
	}
	return v
}

// followLeaders rebuilds the slot table every tick when a shard's leader
// changed, under a new epoch, until ctx is done.
func (s *Node) followLeaders(ctx context.Context, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.rep.rebuild(s)
	}
}

// rebuild replaces s's slot table when the shards' leaders, or the
// cluster's nodes, changed.
func (r *replicas) rebuild(s *Node) {
	r.viewMu.Lock()
	defer r.viewMu.Unlock()
	old := s.view.Load()
	v := r.view(old.top.Epoch+1, s.myID)
	if *v.owner != *old.owner || len(v.top.Nodes) != len(old.top.Nodes) || v.self != old.self {
		s.view.Store(v)
		s.log.Info("cluster: shard leaders changed", "epoch", v.top.Epoch, "slots_served", slotsOf(v.top, s.myID))
	}
}

// SetQuiesce gives the node the server's wait for the writes under way
// (every RESP pipeline and every write of the other front ends), which a
// shard's handback to its home node needs (handoff). Until it is set, a
// shard's leadership is not handed back.
func (s *Node) SetQuiesce(quiesce func(deadline time.Time) bool) {
	if s != nil && s.rep != nil {
		s.rep.quiesce.Store(&quiesce)
	}
}

// handoff is the Host's Handoff: once shard has stopped serving here, it
// takes its slots from the slot table, waits for the writes that began
// before (up to an election timeout), and for the group to commit every
// round they made, so that handing the leadership back home loses no
// decision.
func (s *Node) handoff(shard int) error {
	r := s.rep
	q := r.quiesce.Load()
	if q == nil {
		return errors.New("the server's writes cannot be waited for yet")
	}
	r.rebuild(s)
	timeout := s.cfg.ElectionTimeout
	if timeout <= 0 {
		timeout = DefaultElectionTimeout
	}
	if !(*q)(time.Now().Add(timeout)) {
		return fmt.Errorf("the writes under way did not end within %v", timeout)
	}
	return s.store.Flush()
}

// closeReplicated stops the replicas and their transport.
func (r *replicas) close() error {
	r.stop()
	<-r.done
	var err error
	if h := r.host.Load(); h != nil {
		err = h.Stop()
	}
	if r.tr != nil {
		r.tr.Close()
	}
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
	kv("cluster_ordinal", strconv.Itoa(s.rep.ordinal()))
	if s.rep.host.Load() == nil {
		kv("cluster_replicas_started", "0")
		return
	}
	kv("cluster_replicas_started", "1")
	kv("cluster_incarnation", strconv.FormatUint(s.rep.host.Load().Incarnation(), 10))
	kv("cluster_placement_epoch", strconv.FormatUint(s.rep.host.Load().Placement().Epoch, 10))
	tick := s.tick()
	u := func(n uint64) string { return strconv.FormatUint(n, 10) }
	for i, sh := range s.rep.shards {
		g := s.rep.group(i)
		if g == nil {
			continue
		}
		p := g.Progress()
		serving, leader := "0", -1
		if p.Serving {
			serving = "1"
		}
		if p.Leader != 0 {
			leader = replication.Ordinal(p.Leader)
		}
		line := "role=" + p.Role + ",serving=" + serving + ",leader=" + strconv.Itoa(leader) +
			",term=" + u(p.Term) + ",commit=" + u(p.Commit) + ",applied=" + u(p.Applied) + ",apply_lag=" + u(p.ApplyLag())
		if p.Role == "leader" {
			line += ",last=" + u(p.Last) + ",lag=" + u(p.MaxLag())
			for _, peer := range p.Peers {
				line += ",lag_" + strconv.Itoa(replication.Ordinal(peer.Node)) + "=" + u(p.Lag(peer))
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

// placed returns the shards with the replicas they have now, as this
// node follows the cluster's placement.
func (r *replicas) placed() []cluster.Shard {
	host := r.host.Load()
	if host == nil {
		return r.shards
	}
	out := slices.Clone(r.shards)
	for i := range out {
		out[i].Replicas = host.Replicas(i)
	}
	return out
}

// placementText is CLUSTER PLACEMENT's reply: the placement's epoch, its
// leader, then a line per shard with its slots and its replicas'
// addresses, its home first, then, once the placement holds the nodes
// (its first change), a line per node with its ordinal, address and
// replication address ("removed" for a node removed).
func (s *Node) placementText() (string, error) {
	host := s.rep.host.Load()
	if host == nil {
		return "", errClusterDown
	}
	p := host.Placement()
	nodes := s.rep.addrs()
	var b strings.Builder
	b.WriteString("epoch " + strconv.FormatUint(p.Epoch, 10) + "\n")
	lead := "-"
	if o := host.PlacementLeader(); o >= 0 && o < len(nodes) {
		lead = nodes[o]
	}
	b.WriteString("leader " + lead + "\n")
	for i, reps := range p.Replicas {
		addrs := make([]string, len(reps))
		for j, o := range reps {
			addrs[j] = nodes[o]
		}
		b.WriteString("shard " + strconv.Itoa(i) + " " + cluster.FormatRanges([]cluster.Range{s.rep.shards[i].Slots}) + " " + strings.Join(addrs, ",") + "\n")
	}
	if p.Nodes != nil {
		// The placement's, the same on every node.
		for o, n := range p.Nodes {
			if n.Removed() {
				b.WriteString("node " + strconv.Itoa(o) + " removed\n")
				continue
			}
			b.WriteString("node " + strconv.Itoa(o) + " " + n.Addr + " " + n.Bus + "\n")
		}
	}
	return b.String(), nil
}

// place is CLUSTER PLACE <shard> <host:port> ...: it moves the shard's
// replicas to the nodes named, the first its home, through the
// placement group's leader, and returns the placement's new epoch.
func (s *Node) place(args [][]byte) (uint64, error) {
	host := s.rep.host.Load()
	if host == nil {
		return 0, errClusterDown
	}
	shard, err := strconv.Atoi(string(args[0]))
	if err != nil || shard < 0 || shard >= len(s.rep.shards) {
		return 0, refuse("shard '" + resp.Preview(args[0]) + "': want a shard number from 0 to " + strconv.Itoa(len(s.rep.shards)-1) + " (CLUSTER PLACEMENT lists them)")
	}
	nodes := s.rep.addrs()
	var ordinals []int
	var addrs []string
	for _, a := range args[1:] {
		o := slices.Index(nodes, string(a))
		if o < 0 || len(a) == 0 {
			return 0, refuse("node '" + resp.Preview(a) + "' is not one of the cluster's nodes: " + s.rep.present() + " (--cluster-nodes, and those added by CLUSTER ADDNODE)")
		}
		ordinals, addrs = append(ordinals, o), append(addrs, string(a))
	}
	p, err := host.Move(shard, ordinals)
	if err != nil {
		return 0, s.placementErr(err, "PLACE", "the move")
	}
	s.log.Info("cluster: a shard's replicas are moved", "shard", shard, "replicas", strings.Join(addrs, ","), "epoch", p.Epoch)
	return p.Epoch, nil
}

// addNode is CLUSTER ADDNODE <host:port> [<replication host:port>]: it
// adds a node to the cluster, through the placement group's leader, and
// returns the placement's new epoch. The node holds no replica until
// CLUSTER PLACE moves one there.
func (s *Node) addNode(args [][]byte) (uint64, error) {
	host := s.rep.host.Load()
	if host == nil {
		return 0, errClusterDown
	}
	addr := string(args[0])
	if err := cluster.CheckAddr(addr); err != nil {
		return 0, refuseErr(err)
	}
	var bus string
	if len(args) > 1 {
		bus = string(args[1])
		if err := cluster.CheckAddr(bus); err != nil {
			return 0, refuseErr(err)
		}
	} else {
		var err error
		if bus, err = busAddr(addr); err != nil {
			return 0, refuseErr(err)
		}
	}
	p, err := host.AddNode(replication.Node{Addr: addr, Bus: bus})
	if err != nil {
		return 0, s.placementErr(err, "ADDNODE", "the node's addition")
	}
	s.log.Info("cluster: a node is added", "addr", addr, "replication_addr", bus, "ordinal", len(p.Nodes)-1, "epoch", p.Epoch)
	return p.Epoch, nil
}

// removeNode is CLUSTER REMOVENODE <host:port>: it removes a node that
// holds no replica from the cluster, through the placement group's
// leader, and returns the placement's new epoch.
func (s *Node) removeNode(addr []byte) (uint64, error) {
	host := s.rep.host.Load()
	if host == nil {
		return 0, errClusterDown
	}
	nodes := s.rep.addrs()
	o := slices.Index(nodes, string(addr))
	if o < 0 || len(addr) == 0 {
		return 0, refuse("node '" + resp.Preview(addr) + "' is not one of the cluster's nodes: " + s.rep.present())
	}
	p, err := host.RemoveNode(o)
	if err != nil {
		return 0, s.placementErr(err, "REMOVENODE", "the node's removal")
	}
	s.log.Info("cluster: a node is removed", "addr", string(addr), "ordinal", o, "epoch", p.Epoch)
	return p.Epoch, nil
}

// placementErr is the error to answer for err, returned by a change of
// the placement that CLUSTER sub made; what names the change.
func (s *Node) placementErr(err error, sub, what string) error {
	nodes := s.rep.addrs()
	var nl *replication.NotLeaderError
	switch {
	case errors.As(err, &nl) && nl.Leader != 0 && replication.Ordinal(nl.Leader) < len(nodes):
		return refuse("this node does not lead the cluster's placement; send CLUSTER " + sub + " to its leader, " + nodes[replication.Ordinal(nl.Leader)])
	case errors.As(err, &nl):
		return forwardErr("TRYAGAIN", "the cluster's placement has no leader now; retry shortly")
	case errors.Is(err, replication.ErrReplicas), errors.Is(err, replication.ErrNodes):
		return refuseErr(err)
	}
	return forwardErr("TRYAGAIN", what+" was not committed ("+err.Error()+"); CLUSTER PLACEMENT shows whether it was made")
}
