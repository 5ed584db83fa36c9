package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
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
	// Shards is the cluster's placement; Ordinal this node's place in it.
	Shards  []cluster.Shard
	Ordinal int
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
	// leadership back to its home node, once the shard stopped serving
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
	cfg    HostConfig
	lg     *slog.Logger
	groups []*Group // by shard; nil where this node holds no replica
	ticks  int
	// joining is set while join requests are being sent (askToJoin).
	joining atomic.Bool
	// handing is set, per shard, while this node hands its leadership
	// back home (balance, with HostConfig.Handoff).
	handing []atomic.Bool
	tick    time.Duration // Run's

	mu      sync.Mutex
	started bool
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
	h := &Host{cfg: cfg, lg: cfg.Logger, groups: make([]*Group, len(cfg.Shards)), handing: make([]atomic.Bool, len(cfg.Shards))}
	self := NodeID(cfg.Ordinal, cfg.Incarnation)
	for i, sh := range cfg.Shards {
		if !slices.Contains(sh.Replicas, cfg.Ordinal) {
			continue
		}
		gc := cfg.Group
		gc.Group, gc.Node, gc.Store, gc.Send, gc.Logger = ShardGroup(i), self, cfg.Store, cfg.Transport.Send, cfg.Logger
		gc.Lower, gc.Upper = ShardBounds(sh.Slots)
		gc.Bootstrap = nil
		for _, o := range sh.Replicas {
			if cfg.Incarnation == 0 {
				gc.Bootstrap = append(gc.Bootstrap, NodeID(o, 0))
			}
		}
		g, err := NewGroup(gc)
		if err != nil {
			return nil, fmt.Errorf("replication: shard %d: %w", i, err)
		}
		h.groups[i] = g
		cfg.Transport.Add(g)
		cfg.Committers.Set(i, g)
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

// Incarnation is the node's incarnation (HostConfig.Incarnation).
func (h *Host) Incarnation() uint64 { return h.cfg.Incarnation }

// Group returns the replica of shard i on this node, or nil (always nil
// on a nil Host).
func (h *Host) Group(i int) *Group {
	if h == nil || i < 0 || i >= len(h.groups) {
		return nil
	}
	return h.groups[i]
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
	h.started, h.cancel, h.tick = true, cancel, tick
	h.mu.Unlock()
	for i, g := range h.groups {
		if g == nil {
			continue
		}
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			if err := g.Run(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, ErrStopped) {
				h.lg.Error("replica stopped", "shard", i, "err", err)
				h.mu.Lock()
				h.errs = append(h.errs, fmt.Errorf("shard %d: %w", i, err))
				h.mu.Unlock()
			}
		}()
	}
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
// of a rejoining replica (changeMembers, askToJoin), and every
// BalanceTicks hands leadership back home where it can.
func (h *Host) Tick() {
	for _, g := range h.groups {
		if g != nil {
			g.Tick()
		}
	}
	h.ticks++
	// A rejoining replica's steps each wait for a tick, not for a balance:
	// its shard is a replica short until it is promoted.
	h.changeMembers()
	h.askToJoin()
	if h.ticks%h.cfg.BalanceTicks == 0 {
		h.balance()
	}
}

// changeMembers has each shard this node leads take the next step of a
// rejoining replica (Group.planMembers).
func (h *Host) changeMembers() {
	for i, g := range h.groups {
		if g == nil {
			continue
		}
		cc, note, node := g.planMembers(h.cfg.Shards[i].Replicas, Ordinal)
		if note != "" {
			h.lg.Info(note, "shard", i, "node", node, "ordinal", Ordinal(node))
		}
		if cc == nil {
			continue
		}
		if err := g.ChangeMembers(cc); err != nil {
			h.lg.Warn("membership change not proposed", "shard", i, "err", err)
		}
	}
}

// askToJoin asks, for each replica of this node that has no members yet
// (a node that lost its data, waiting for its snapshot), the other
// replicas of its shard to add it; the leader does (changeMembers). The
// requests are repeated until each replica is a member: one may reach no
// leader, during an election.
func (h *Host) askToJoin() {
	var byOrdinal map[int][]uint64 // made only when a replica waits
	for i, g := range h.groups {
		if g == nil || g.member() {
			continue
		}
		if byOrdinal == nil {
			byOrdinal = map[int][]uint64{}
		}
		for _, o := range h.cfg.Shards[i].Replicas {
			if o != h.cfg.Ordinal {
				byOrdinal[o] = append(byOrdinal[o], ShardGroup(i))
			}
		}
	}
	if len(byOrdinal) == 0 || !h.joining.CompareAndSwap(false, true) {
		return
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer h.joining.Store(false)
		for _, o := range slices.Sorted(maps.Keys(byOrdinal)) {
			if err := h.cfg.Transport.RequestJoin(NodeID(o, 0), byOrdinal[o]); err != nil {
				h.lg.Debug("join request not sent", "ordinal", o, "err", err)
			}
		}
	}()
}

// balance asks each shard this node leads, that is not its home, to hand
// leadership to its home replica if that one has every committed entry
// and was heard from lately.
func (h *Host) balance() {
	for i, g := range h.groups {
		if g == nil || h.cfg.Shards[i].Replicas[0] == h.cfg.Ordinal {
			continue
		}
		home := g.replicaOf(Ordinal, h.cfg.Shards[i].Replicas[0])
		if home == 0 || !g.caughtUp(home) {
			continue
		}
		if h.cfg.Handoff == nil {
			h.lg.Info("handing a shard's leadership back to its home node", "shard", i, "to", home)
			g.TransferLeadership(home)
			continue
		}
		if h.handing[i].CompareAndSwap(false, true) {
			h.wg.Add(1)
			go h.handBack(i, g, home)
		}
	}
}

// handBack hands shard i's leadership from g to home once every decision
// made here is committed (HostConfig.Handoff), and waits for the handover,
// up to two election timeouts: if it does not come, g serves again.
func (h *Host) handBack(i int, g *Group, home uint64) {
	defer h.wg.Done()
	defer h.handing[i].Store(false)
	g.setHandoff(true)
	defer g.setHandoff(false)
	if err := h.cfg.Handoff(i); err != nil {
		h.lg.Warn("a shard's leadership stays here: what was decided in it could not be committed first", "shard", i, "err", err)
		return
	}
	if !g.caughtUp(home) {
		return // another election, or home fell behind: a later balance tries again
	}
	h.lg.Info("handing a shard's leadership back to its home node", "shard", i, "to", home)
	g.TransferLeadership(home)
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
	h.mu.Lock()
	cancel := h.cancel
	h.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	for i, g := range h.groups {
		if g != nil {
			h.cfg.Committers.Set(i, nil)
			h.cfg.Transport.Remove(g.cfg.Group)
			g.Stop()
		}
	}
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
