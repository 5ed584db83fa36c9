package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/storage"
)

// MaxOrdinals bounds the nodes of a replicated cluster: a node's
// identity in Raft tells its ordinal (NodeID).
const MaxOrdinals = 1024

// NodeID is the Raft identity of the replicas on the node of ordinal o
// in its incarnation k: 0 for the cluster's first replicas, bootstrapped
// together; a new one, never used before, each time the node comes back
// without its data (HostConfig.Incarnation), so that it never takes part
// under an identity whose votes and log it forgot.
func NodeID(ordinal int, incarnation uint64) uint64 {
	return uint64(ordinal) + 1 + incarnation*MaxOrdinals
}

// Ordinal is the ordinal of the node whose replicas have identity node.
func Ordinal(node uint64) int { return int((node - 1) % MaxOrdinals) }

// ShardGroup is the Raft group of shard i of a cluster's placement
// (cluster.Place). Group 1 is kept for the cluster's topology.
func ShardGroup(i int) uint64 { return uint64(i) + 2 }

// ShardBounds is the record keys of a shard with slots r: [lower, upper).
// Record keys start with their hash slot, two bytes big-endian.
func ShardBounds(r cluster.Range) (lower, upper []byte) {
	end := int(r.Last) + 1
	return []byte{byte(r.First >> 8), byte(r.First)}, []byte{byte(end >> 8), byte(end)}
}

// HostConfig configures the replicas that one node holds.
type HostConfig struct {
	// Store is the node's store, opened with Committers as its
	// Replicator, one committer per shard of Shards, and a partition
	// function that gives a record key its shard.
	Store      *storage.Store
	Committers *Committers
	// Transport carries the groups' messages; the Host adds its groups.
	Transport *Transport
	// Shards is the cluster's placement as it was first started (the
	// groups are bootstrapped with its replicas); Ordinal this node's
	// place in it.
	Shards  []cluster.Shard
	Ordinal int
	// Replicas, when set, gives each shard's replicas now, the first its
	// home, where they were moved since (SetReplicas); nil: those of
	// Shards. A placement the store holds (Move) comes before it.
	Replicas [][]int
	// Nodes is how many nodes the cluster has, ordinals 0 to Nodes−1;
	// 0: len(Addrs), or those of Shards. A placement that holds the nodes
	// (AddNode, RemoveNode) comes before it.
	Nodes int
	// Placement, when set, is the placement learned from another node
	// (Transport.AskPlacement) by a node added to the cluster (AddNode):
	// its replicas and nodes until the node's replica of the placement
	// group applies a later one. One the store holds comes before it.
	Placement *Placement
	// Addrs are the addresses of the nodes the cluster was first started
	// with, by ordinal; a node is added (AddNode) only where they are
	// given, or where the placement holds them already.
	Addrs []Node
	// Incarnation is this node's (see NodeID). 0 bootstraps the groups
	// the store holds nothing of, with the first replicas of every shard
	// as voters; above 0, the node lost its data and its replicas join
	// their groups: each asks the other replicas of its shard to be added
	// (the leader adds it as a learner, catches it up by snapshot, then
	// promotes it in place of the identity of the same ordinal).
	Incarnation uint64
	// Group is the template of each group's Config: its timing and log
	// bounds. Group, Node, Bootstrap, bounds, Store and Send are the
	// Host's.
	Group Config
	// BalanceTicks is how often, in ticks, a leader that is not its
	// shard's home hands leadership back to the home replica once that
	// one has caught up; default 2 × the election ticks.
	BalanceTicks int
	// Handoff, when set, is called before this node hands a shard's
	// leadership back to its home node, or on to a node that holds the
	// shard when this one no longer does, once the shard stopped serving
	// here (Status.Serving is false, its proposals still taken): it
	// returns once every decision this node made in the shard is
	// committed by the group, so that the handback loses nothing, or an
	// error, and the node keeps the leadership and serves again. Without
	// it, leadership is handed at once, and the decisions the group had
	// not committed are lost (answered TRYAGAIN where they wait for it).
	Handoff func(shard int) error
	Logger  *slog.Logger // default: discard
}

// Host runs the replicas one node holds of a replicated cluster's shards:
// one group per shard whose replicas include the node, each proposing its
// committer's rounds (Committers) and applying its group's, over one
// transport, ticked by one clock. A shard's leadership goes back to its
// home node (the first of its replicas) whenever that one is caught up,
// so that every node leads its own share of the slots.
type Host struct {
	cfg  HostConfig
	lg   *slog.Logger
	self uint64 // this node's replicas' identity
	// groups holds this node's replica of each shard; nil where it holds
	// none. A replica is added, and retired, while the Host runs
	// (SetReplicas).
	groups []atomic.Pointer[Group]
	// replicas holds the ordinals of each shard's replicas, the first its
	// home (HostConfig.Replicas, SetReplicas).
	replicas []atomic.Pointer[[]int]
	ticks    int
	// joining is set while join requests are being sent (askToJoin), and
	// leaving while replicas ask whether they were removed (askRemoved).
	joining, leaving atomic.Bool
	// membersMu makes SetReplicas and the retirement of a replica one at
	// a time.
	membersMu sync.Mutex
	// placement is this node's replica of the placement group; epoch the
	// placement's it follows, placeSeen the group's applied index it last
	// looked at (followPlacement, under followMu); placeMu makes Moves
	// one at a time.
	placement *Group
	epoch     atomic.Uint64
	placeSeen uint64
	// placeFailed is the applied index at which the placement last did
	// not read (under followMu).
	placeFailed uint64
	followMu    sync.Mutex
	placeMu     sync.Mutex
	// nodeSet is the cluster's nodes as this node follows them: read
	// by every tick, replaced when the placement adds or removes one.
	nodeSet atomic.Pointer[nodeSet]
	// handing is set, per shard, while this node hands its leadership
	// back home (balance, with HostConfig.Handoff).
	handing []atomic.Bool
	tick    time.Duration // Run's

	mu      sync.Mutex
	started bool
	stopped bool
	ctx     context.Context // Run's
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	errs    []error
}

// NewHost opens the node's replicas: each group's state in the store, or
// a group bootstrapped with the shard's replicas as voters.
func NewHost(cfg HostConfig) (*Host, error) {
	if cfg.Store == nil || cfg.Committers == nil || cfg.Transport == nil {
		return nil, errors.New("replication: HostConfig needs a Store, Committers and a Transport")
	}
	if cfg.Ordinal < 0 || cfg.Ordinal >= MaxOrdinals {
		return nil, fmt.Errorf("replication: ordinal %d; want 0 to %d", cfg.Ordinal, MaxOrdinals-1)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	n := len(cfg.Shards)
	h := &Host{cfg: cfg, lg: cfg.Logger, self: NodeID(cfg.Ordinal, cfg.Incarnation),
		groups: make([]atomic.Pointer[Group], n), replicas: make([]atomic.Pointer[[]int], n), handing: make([]atomic.Bool, n)}
	if cfg.Replicas != nil && len(cfg.Replicas) != n {
		return nil, fmt.Errorf("replication: HostConfig gives the replicas of %d shards; the placement has %d", len(cfg.Replicas), n)
	}
	stored, moved, err := StoredPlacement(cfg.Store)
	if err != nil {
		return nil, err
	}
	if !moved && cfg.Placement != nil {
		stored, moved = *cfg.Placement, true
	}
	if moved && len(stored.Replicas) != n {
		return nil, fmt.Errorf("%w: the store's placement has %d shards; the cluster has %d", ErrBadPlacement, len(stored.Replicas), n)
	}
	nodes := len(cfg.Addrs)
	for _, sh := range cfg.Shards {
		for _, o := range sh.Replicas {
			nodes = max(nodes, o+1)
		}
	}
	if cfg.Nodes > 0 {
		nodes = cfg.Nodes
	}
	if cfg.Addrs != nil && len(cfg.Addrs) != nodes {
		return nil, fmt.Errorf("replication: HostConfig gives the addresses of %d nodes; the cluster has %d", len(cfg.Addrs), nodes)
	}
	h.nodeSet.Store(&nodeSet{n: nodes, list: cfg.Addrs})
	if moved && stored.Nodes != nil {
		h.setNodes(stored.Nodes)
	}
	all := make([]uint64, n)
	for i, sh := range cfg.Shards {
		reps := sh.Replicas
		switch {
		case moved:
			reps = stored.Replicas[i]
		case cfg.Replicas != nil:
			reps = cfg.Replicas[i]
		}
		if err := h.setReplicas(i, reps); err != nil {
			return nil, err
		}
		all[i] = ShardGroup(i)
	}
	// The groups are bootstrapped on a node's first start only: a replica
	// that has no state once the node has lived (added since, or retired
	// and added again) joins its group, and takes its state by snapshot.
	lived, err := Holds(cfg.Store, all...)
	if err != nil {
		return nil, err
	}
	h.epoch.Store(stored.Epoch)
	if err := h.openPlacement(); err != nil {
		return nil, err
	}
	for i, sh := range cfg.Shards {
		mine := slices.Contains(h.replicasOf(i), cfg.Ordinal)
		if !mine {
			// A replica moved away before it was retired: it asks whether
			// it was removed (askRemoved).
			held, err := Holds(cfg.Store, ShardGroup(i))
			if err != nil {
				return nil, err
			}
			if !held {
				continue
			}
		}
		bootstrap := !lived && cfg.Incarnation == 0 && cfg.Placement == nil && slices.Contains(sh.Replicas, cfg.Ordinal)
		if err := h.addGroup(i, bootstrap); err != nil {
			return nil, err
		}
	}
	if h.cfg.BalanceTicks <= 0 {
		et := cfg.Group.ElectionTicks
		if et <= 0 {
			et = DefaultElectionTicks
		}
		h.cfg.BalanceTicks = 2 * et
	}
	return h, nil
}

// openPlacement opens this node's replica of the placement group: on the
// node's first start (incarnation 0, no state of it in the store)
// bootstrapped with the first nodes as voters and the others as
// learners; otherwise as it was, or joining.
func (h *Host) openPlacement() error {
	cfg := h.cfg
	gc := cfg.Group
	gc.Group, gc.Node, gc.Store, gc.Send, gc.Logger = PlacementGroup, h.self, cfg.Store, cfg.Transport.Send, cfg.Logger
	gc.Lower, gc.Upper = placementLower, placementUpper
	gc.Bootstrap, gc.BootstrapLearners = nil, nil
	held, err := Holds(cfg.Store, PlacementGroup)
	if err != nil {
		return err
	}
	if !held && cfg.Incarnation == 0 && cfg.Placement == nil {
		voters, learners := placementVoters(h.presentOrdinals())
		for _, o := range voters {
			gc.Bootstrap = append(gc.Bootstrap, NodeID(o, 0))
		}
		for _, o := range learners {
			gc.BootstrapLearners = append(gc.BootstrapLearners, NodeID(o, 0))
		}
	}
	g, err := NewGroup(gc)
	if err != nil {
		return fmt.Errorf("replication: the placement group: %w", err)
	}
	h.placement = g
	cfg.Transport.Add(g)
	return nil
}

// addGroup opens this node's replica of shard i: bootstrapped with the
// shard's first replicas, or joining its group. Once Run has started, it
// runs at once.
func (h *Host) addGroup(i int, bootstrap bool) error {
	cfg := h.cfg
	gc := cfg.Group
	gc.Group, gc.Node, gc.Store, gc.Send, gc.Logger = ShardGroup(i), h.self, cfg.Store, cfg.Transport.Send, cfg.Logger
	gc.Lower, gc.Upper = ShardBounds(cfg.Shards[i].Slots)
	gc.Bootstrap = nil
	if bootstrap {
		for _, o := range cfg.Shards[i].Replicas {
			gc.Bootstrap = append(gc.Bootstrap, NodeID(o, 0))
		}
	}
	g, err := NewGroup(gc)
	if err != nil {
		return fmt.Errorf("replication: shard %d: %w", i, err)
	}
	h.groups[i].Store(g)
	cfg.Transport.Add(g)
	cfg.Committers.Set(i, g)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.started && !h.stopped {
		h.runGroup(h.ctx, i, g)
	}
	return nil
}

// runGroup runs g, shard i's replica, until ctx is done or g stops; h.mu
// is held.
func (h *Host) runGroup(ctx context.Context, i int, g *Group) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		if err := g.Run(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, ErrStopped) {
			what := "shard " + strconv.Itoa(i)
			if i < 0 {
				what = "the placement group"
			}
			h.lg.Error("replica stopped", "group", what, "err", err)
			h.mu.Lock()
			h.errs = append(h.errs, fmt.Errorf("%s: %w", what, err))
			h.mu.Unlock()
		}
	}()
}

func (h *Host) isStopped() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stopped
}

// nodeSet is the cluster's nodes: how many, and their addresses where
// known; placed when the list is a stored placement's, the same on every
// node, rather than this node's HostConfig.Addrs.
type nodeSet struct {
	n      int
	list   []Node
	placed bool
}

// nodeCount is how many nodes the cluster has, as this node follows it.
func (h *Host) nodeCount() int { return h.nodeSet.Load().n }

// present reports whether the node of ordinal o, below nodeCount, is
// not removed.
func (h *Host) present(o int) bool {
	ns := h.nodeSet.Load()
	return ns.list == nil || !ns.list[o].Removed()
}

// presentOrdinals returns the ordinals of the cluster's nodes but those
// removed.
func (h *Host) presentOrdinals() []int {
	ns := h.nodeSet.Load()
	var out []int
	for o := range ns.n {
		if ns.list == nil || !ns.list[o].Removed() {
			out = append(out, o)
		}
	}
	return out
}

// setNodes follows the nodes of a placement.
func (h *Host) setNodes(list []Node) {
	h.nodeSet.Store(&nodeSet{n: len(list), list: slices.Clone(list), placed: true})
}

// Nodes returns the cluster's nodes by ordinal as this node follows them,
// or nil where their addresses were not given (HostConfig.Addrs) and the
// placement holds none; the caller must not change them.
func (h *Host) Nodes() []Node { return h.nodeSet.Load().list }

// replicasOf returns the ordinals of shard i's replicas, its home first.
func (h *Host) replicasOf(i int) []int { return *h.replicas[i].Load() }

// setReplicas records shard i's replicas, checked.
func (h *Host) setReplicas(i int, ordinals []int) error {
	if err := h.checkReplicas(i, ordinals); err != nil {
		return err
	}
	reps := slices.Clone(ordinals)
	h.replicas[i].Store(&reps)
	return nil
}

// checkReplicas refuses replicas of shard i that are none, too many, on a
// node the cluster does not have, or twice on one.
func (h *Host) checkReplicas(i int, ordinals []int) error {
	if len(ordinals) == 0 || len(ordinals) > MaxReplicas {
		return fmt.Errorf("%w: shard %d: %d replicas; want 1 to %d", ErrReplicas, i, len(ordinals), MaxReplicas)
	}
	nodes := h.nodeCount()
	for j, o := range ordinals {
		if o < 0 || o >= nodes {
			return fmt.Errorf("%w: shard %d: ordinal %d; the cluster's nodes are 0 to %d", ErrReplicas, i, o, nodes-1)
		}
		if !h.present(o) {
			return fmt.Errorf("%w: shard %d: node %d was removed from the cluster", ErrReplicas, i, o)
		}
		if slices.Contains(ordinals[:j], o) {
			return fmt.Errorf("%w: shard %d: node %d given twice", ErrReplicas, i, o)
		}
	}
	return nil
}

// MaxReplicas bounds the replicas of one shard.
const MaxReplicas = 7

// ErrReplicas is wrapped by the error of replicas SetReplicas refuses.
var ErrReplicas = errors.New("replication: bad replicas")

// SetReplicas moves shard i to the nodes of ordinals, the first its home,
// by changes of its group's members (every node of the cluster is told
// the same): a node that now holds it opens a replica that joins the
// group (the leader adds it as a learner, catches it up by snapshot, and
// promotes it in place of a replica whose node no longer holds the
// shard); a leader whose node no longer holds it hands its leadership to
// a replica that does; and a replica that was removed is retired: it
// stops, and its records and Raft state are deleted from the store. The
// shard never has fewer voters than ordinals while it moves.
func (h *Host) SetReplicas(i int, ordinals []int) error {
	if i < 0 || i >= len(h.groups) {
		return fmt.Errorf("%w: shard %d; the placement has %d", ErrReplicas, i, len(h.groups))
	}
	h.membersMu.Lock()
	defer h.membersMu.Unlock()
	if err := h.setReplicas(i, ordinals); err != nil {
		return err
	}
	if h.isStopped() || h.groups[i].Load() != nil || !slices.Contains(ordinals, h.cfg.Ordinal) {
		return nil
	}
	h.lg.Info("this node now holds a replica of a shard: it joins the shard's group", "shard", i)
	return h.addGroup(i, false)
}

// Incarnation is the node's incarnation (HostConfig.Incarnation).
func (h *Host) Incarnation() uint64 { return h.cfg.Incarnation }

// Group returns the replica of shard i on this node, or nil (always nil
// on a nil Host).
func (h *Host) Group(i int) *Group {
	if h == nil || i < 0 || i >= len(h.groups) {
		return nil
	}
	return h.groups[i].Load()
}

// Run drives every replica (its Ready loop) and ticks them every tick,
// until Stop. A replica that fails stops alone: its shard answers from
// the other replicas.
func (h *Host) Run(tick time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	h.mu.Lock()
	if h.started {
		h.mu.Unlock()
		cancel()
		return
	}
	h.started, h.ctx, h.cancel, h.tick = true, ctx, cancel, tick
	h.runGroup(ctx, -1, h.placement)
	for i := range h.groups {
		if g := h.groups[i].Load(); g != nil {
			h.runGroup(ctx, i, g)
		}
	}
	h.mu.Unlock()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			h.Tick()
		}
	}()
}

// Tick advances every replica's clock by one tick, takes the next step
// of a replica that joins or leaves (changeMembers, askToJoin), and
// every BalanceTicks hands leadership back home where it can and asks
// whether replicas were removed (askRemoved).
func (h *Host) Tick() {
	h.placement.Tick()
	for i := range h.groups {
		if g := h.groups[i].Load(); g != nil {
			g.Tick()
		}
	}
	h.ticks++
	h.followPlacement()
	// A joining replica's steps each wait for a tick, not for a balance:
	// its shard is a replica short until it is promoted.
	h.changeMembers()
	h.askToJoin()
	if h.ticks%h.cfg.BalanceTicks == 0 {
		h.balance()
		h.askRemoved()
	}
}

// changeMembers has each shard this node leads take the next step of a
// replica that joins or leaves (Group.planMembers); a leader whose node
// no longer holds its shard hands the leadership to one that does.
func (h *Host) changeMembers() {
	voters, learners := placementVoters(h.presentOrdinals())
	if cc, note, node := h.placement.planMembers(voters, learners, Ordinal); note != "" || cc != nil {
		if note != "" {
			h.lg.Info(note, "group", "placement", "node", node, "ordinal", Ordinal(node))
		}
		if cc != nil {
			if err := h.placement.ChangeMembers(cc); err != nil {
				h.lg.Warn("membership change not proposed", "group", "placement", "err", err)
			}
		}
	}
	for i := range h.groups {
		g := h.groups[i].Load()
		if g == nil {
			continue
		}
		reps := h.replicasOf(i)
		cc, note, node := g.planMembers(reps, nil, Ordinal)
		if note != "" {
			h.lg.Info(note, "shard", i, "node", node, "ordinal", Ordinal(node))
		}
		if cc != nil {
			if err := g.ChangeMembers(cc); err != nil {
				h.lg.Warn("membership change not proposed", "shard", i, "err", err)
			}
			continue
		}
		if slices.Contains(reps, h.cfg.Ordinal) {
			continue
		}
		for _, o := range reps {
			if to := g.replicaOf(Ordinal, o); to != 0 && g.caughtUp(to) { // caughtUp: this replica leads
				h.handOver(i, g, to, "this node no longer holds the shard: handing its leadership on")
				break
			}
		}
	}
}

// askToJoin asks, for each replica of this node that has no members yet
// (a node that lost its data, or a replica added by SetReplicas, waiting
// for its snapshot), every other node it knows of to add it; the
// shard's leader does (changeMembers). The requests are repeated until
// each replica is a member: one may reach no leader, during an election.
func (h *Host) askToJoin() {
	var groups []uint64 // made only when a replica waits
	if !h.placement.member() {
		groups = append(groups, PlacementGroup)
	}
	for i := range h.groups {
		if g := h.groups[i].Load(); g != nil && !g.member() && slices.Contains(h.replicasOf(i), h.cfg.Ordinal) {
			groups = append(groups, ShardGroup(i))
		}
	}
	if len(groups) == 0 || !h.joining.CompareAndSwap(false, true) {
		return
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer h.joining.Store(false)
		for _, o := range h.presentOrdinals() {
			if o == h.cfg.Ordinal {
				continue
			}
			if err := h.cfg.Transport.RequestJoin(NodeID(o, 0), groups); err != nil {
				h.lg.Debug("join request not sent", "ordinal", o, "err", err)
			}
		}
	}()
}

// askRemoved retires each replica that applied its own removal, and
// asks, for each replica this node holds of a shard its node no longer
// holds, and for each replica that knows no leader (one removed from its
// group, and not told so, campaigns in vain), the shard's other replicas
// for the group's members. An answer of members
// the group committed without this replica, at an index this replica
// has not passed, means it was removed: it is retired, and joins again
// if its node holds the shard (removeReplica). An answer from a replica
// behind this one is not taken: it may predate the change that added
// this replica.
func (h *Host) askRemoved() {
	var asked []int
	removed := map[int]bool{} // a replica whose own members leave it out
	for i := range h.groups {
		g := h.groups[i].Load()
		if g == nil {
			continue
		}
		st := g.Status()
		switch {
		case st.Role == "leader":
		case g.member() && !inConf(g.log.confState(), g.cfg.Node):
			// It applied its removal: a removed replica is not promotable,
			// never campaigns, and goes on naming the leader it knew.
			asked, removed[i] = append(asked, i), true
		case !slices.Contains(h.replicasOf(i), h.cfg.Ordinal) || (st.Leader == 0 && g.member()):
			asked = append(asked, i)
		}
	}
	if len(asked) == 0 || !h.leaving.CompareAndSwap(false, true) {
		return
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer h.leaving.Store(false)
		for _, i := range asked {
			g := h.groups[i].Load()
			if g == nil {
				continue
			}
			if removed[i] {
				if err := h.removeReplica(i, g); err != nil {
					h.lg.Error("a replica removed from its shard could not be retired", "shard", i, "err", err)
				}
				continue
			}
			for _, o := range h.replicasOf(i) {
				if o == h.cfg.Ordinal {
					continue
				}
				applied, cs, err := h.cfg.Transport.AskMembers(NodeID(o, 0), ShardGroup(i))
				if err != nil || cs == nil || len(cs.GetVotersOutgoing()) > 0 || inConf(cs, g.cfg.Node) || applied < g.log.Applied() {
					continue
				}
				if err := h.removeReplica(i, g); err != nil {
					h.lg.Error("a replica removed from its shard could not be retired", "shard", i, "err", err)
				}
				break
			}
		}
	}()
}

// inConf reports whether node is a voter or learner of cs.
func inConf(cs *pb.ConfState, node uint64) bool {
	return slices.Contains(cs.GetVoters(), node) || slices.Contains(cs.GetLearners(), node) ||
		slices.Contains(cs.GetVotersOutgoing(), node) || slices.Contains(cs.GetLearnersNext(), node)
}

// removeReplica stops g, this node's replica of shard i, removed from its
// group, and deletes its records and Raft state from the store; if the
// shard is placed on this node again (moved back before the replica knew
// it was removed), a new replica joins the group, by snapshot.
func (h *Host) removeReplica(i int, g *Group) error {
	h.membersMu.Lock()
	defer h.membersMu.Unlock()
	if h.isStopped() || h.groups[i].Load() != g {
		return nil
	}
	h.cfg.Committers.Set(i, nil)
	h.cfg.Transport.Remove(g.cfg.Group)
	g.Stop()
	n, err := g.deleteState()
	h.groups[i].Store(nil) // once its state is gone: Group(i) nil says so
	if err != nil {
		return err
	}
	h.lg.Info("retired a replica removed from its shard: its records and Raft state are deleted", "shard", i, "records", n)
	if !slices.Contains(h.replicasOf(i), h.cfg.Ordinal) {
		return nil
	}
	h.lg.Info("this node holds the shard again: a new replica joins the shard's group", "shard", i)
	return h.addGroup(i, false)
}

// balance asks each shard this node leads, that is not its home, to hand
// leadership to its home replica if that one has every committed entry
// and was heard from lately.
func (h *Host) balance() {
	for i := range h.groups {
		g := h.groups[i].Load()
		reps := h.replicasOf(i)
		if g == nil || reps[0] == h.cfg.Ordinal || !slices.Contains(reps, h.cfg.Ordinal) {
			continue
		}
		home := g.replicaOf(Ordinal, reps[0])
		if home == 0 || !g.caughtUp(home) {
			continue
		}
		h.handOver(i, g, home, "handing a shard's leadership back to its home node")
	}
}

// handOver hands shard i's leadership from g, its leader, to node: at
// once without HostConfig.Handoff, else once every decision made here is
// committed (handBack). why is logged.
func (h *Host) handOver(i int, g *Group, node uint64, why string) {
	if h.cfg.Handoff == nil {
		h.lg.Info(why, "shard", i, "to", node)
		g.TransferLeadership(node)
		return
	}
	if h.handing[i].CompareAndSwap(false, true) {
		h.wg.Add(1)
		go h.handBack(i, g, node, why)
	}
}

// handBack hands shard i's leadership from g to node once every decision
// made here is committed (HostConfig.Handoff), and waits for the handover,
// up to two election timeouts: if it does not come, g serves again.
func (h *Host) handBack(i int, g *Group, node uint64, why string) {
	defer h.wg.Done()
	defer h.handing[i].Store(false)
	g.setHandoff(true)
	defer g.setHandoff(false)
	if err := h.cfg.Handoff(i); err != nil {
		h.lg.Warn("a shard's leadership stays here: what was decided in it could not be committed first", "shard", i, "err", err)
		return
	}
	if !g.caughtUp(node) {
		return // another election, or node fell behind: a later tick tries again
	}
	h.lg.Info(why, "shard", i, "to", node)
	g.TransferLeadership(node)
	h.mu.Lock()
	tick := h.tick
	h.mu.Unlock()
	for range 2 * g.cfg.ElectionTicks {
		if g.Status().Role != "leader" {
			return
		}
		time.Sleep(tick)
	}
}

// Stop stops every replica and waits for them. The store and the
// transport stay open: their owner closes them.
func (h *Host) Stop() error {
	h.membersMu.Lock() // no replica added or retired meanwhile
	h.mu.Lock()
	cancel := h.cancel
	h.stopped = true
	h.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	for i := range h.groups {
		if g := h.groups[i].Load(); g != nil {
			h.cfg.Committers.Set(i, nil)
			h.cfg.Transport.Remove(g.cfg.Group)
			g.Stop()
		}
	}
	h.cfg.Transport.Remove(PlacementGroup)
	h.placement.Stop()
	h.membersMu.Unlock()
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	return errors.Join(h.errs...)
}

// caughtUp reports whether this replica leads its group and node's
// replica is a voter being replicated to with every committed entry. Not
// RecentActive: each CheckQuorum clears it until the next answers, and a
// balance that fell on those ticks never handed leadership home. A
// replica the transport cannot reach leaves the replicating state
// (ReportUnreachable), so a node that is down is not taken for caught up.
func (g *Group) caughtUp(node uint64) bool {
	ok := false
	g.raft(func(rn *raft.RawNode) error {
		st := rn.Status()
		if st.RaftState != raft.StateLeader {
			return nil
		}
		pr, found := st.Progress[node]
		ok = found && !pr.IsLearner && pr.State == tracker.StateReplicate && pr.Match >= st.GetCommit()
		return nil
	})
	return ok
}
