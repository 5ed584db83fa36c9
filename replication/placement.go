package replication

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/storage"
)

// The placement group: a Raft group of every node of a replicated
// cluster (the first MaxPlacementVoters vote, the others learn it) whose
// state is the placement, each shard's replicas under an epoch. A move of
// a shard's replicas (Host.Move) is a proposal to it, so that every node
// applies the same moves in the same order, and the shards' own groups
// follow (SetReplicas).

// PlacementGroup is the Raft group of the cluster's placement; ShardGroup
// numbers the shards' groups after it.
const PlacementGroup = 1

// MaxPlacementVoters is how many nodes vote in the placement group: the
// first ones by ordinal. The others hold a learner, which applies the
// placement without voting.
const MaxPlacementVoters = 5

var (
	placementLower = []byte(storage.ReplicaPrefix + "placement/")
	placementUpper = []byte(storage.ReplicaPrefix + "placement0") // '0' follows '/'
	placementKey   = []byte(storage.ReplicaPrefix + "placement/shards")
)

// Placement is where a replicated cluster's shards are: each shard's
// replicas as node ordinals, its home first, and the cluster's nodes,
// under an epoch that each change raises by one. Epoch 0 is the placement
// the cluster was first started with.
type Placement struct {
	Epoch    uint64
	Replicas [][]int
	// Nodes are the cluster's nodes by ordinal; nil in a placement whose
	// Host was not given their addresses (HostConfig.Addrs), and in one
	// stored by a version before nodes could be added: then they are the
	// nodes the cluster was first started with.
	Nodes []Node
}

// Node is a node of a replicated cluster: the address it announces to
// clients, and that of its replication listener; both empty for a node
// removed (RemoveNode), whose ordinal is never taken again.
type Node struct {
	Addr, Bus string
}

// Removed reports whether n is a node removed from the cluster.
func (n Node) Removed() bool { return n.Addr == "" }

// ErrBadPlacement is wrapped by the error of a stored placement that does
// not decode.
var ErrBadPlacement = errors.New("replication: bad placement")

// Encode is p as stored: "v1 <epoch> <ordinal>,<ordinal>,... ..." with
// one list of ordinals per shard; with nodes, "v2 <epoch> <addr>|<bus>,...
// <ordinal>,... ...", a node removed written "-".
func (p Placement) Encode() []byte {
	b := []byte("v1 ")
	if p.Nodes != nil {
		b = []byte("v2 ")
	}
	b = strconv.AppendUint(b, p.Epoch, 10)
	if p.Nodes != nil {
		b = append(b, ' ')
		for j, n := range p.Nodes {
			if j > 0 {
				b = append(b, ',')
			}
			if n.Removed() {
				b = append(b, '-')
				continue
			}
			b = append(append(append(b, n.Addr...), '|'), n.Bus...)
		}
	}
	for _, reps := range p.Replicas {
		b = append(b, ' ')
		for j, o := range reps {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(o), 10)
		}
	}
	return b
}

// DecodePlacement reads what Encode wrote.
func DecodePlacement(b []byte) (Placement, error) {
	f := strings.Fields(string(b))
	least := 3
	if len(f) > 0 && f[0] == "v2" {
		least = 4
	}
	if len(f) < least || (f[0] != "v1" && f[0] != "v2") {
		return Placement{}, fmt.Errorf("%w: %q does not start with v1 or v2, an epoch and a shard", ErrBadPlacement, b)
	}
	epoch, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return Placement{}, fmt.Errorf("%w: epoch %q", ErrBadPlacement, f[1])
	}
	p := Placement{Epoch: epoch}
	lists := f[2:]
	if f[0] == "v2" {
		p.Nodes = []Node{}
		for _, n := range strings.Split(f[2], ",") {
			if n == "-" {
				p.Nodes = append(p.Nodes, Node{})
				continue
			}
			addr, bus, ok := strings.Cut(n, "|")
			if !ok {
				return Placement{}, fmt.Errorf("%w: node %q is not <addr>|<bus>", ErrBadPlacement, n)
			}
			p.Nodes = append(p.Nodes, Node{Addr: addr, Bus: bus})
		}
		lists = f[3:]
	}
	for i, list := range lists {
		var reps []int
		for _, s := range strings.Split(list, ",") {
			o, err := strconv.Atoi(s)
			if err != nil || o < 0 || (p.Nodes != nil && (o >= len(p.Nodes) || p.Nodes[o].Removed())) {
				return Placement{}, fmt.Errorf("%w: shard %d: ordinal %q", ErrBadPlacement, i, s)
			}
			reps = append(reps, o)
		}
		p.Replicas = append(p.Replicas, reps)
	}
	return p, nil
}

// placementVoters returns the ordinals that vote in the placement group
// of a cluster of the nodes of ordinals, in order, and those that learn
// it.
func placementVoters(ordinals []int) (voters, learners []int) {
	for _, o := range ordinals {
		if len(voters) < MaxPlacementVoters {
			voters = append(voters, o)
		} else {
			learners = append(learners, o)
		}
	}
	return voters, learners
}

// StoredPlacement returns the placement the store holds, applied by its
// replica of the placement group, and false if it holds none (the
// placement was not changed yet).
func StoredPlacement(store *storage.Store) (Placement, bool, error) {
	v, ok, err := store.ReplicaGet(placementKey)
	if err != nil || !ok {
		return Placement{}, false, err
	}
	p, err := DecodePlacement(v)
	return p, err == nil, err
}

// Placement returns the placement as this node applied it. Its Nodes are
// nil until a stored placement gave them: before the first change each
// node knows the others from its own HostConfig.Addrs, whose replication
// addresses may differ from node to node.
func (h *Host) Placement() Placement {
	p := Placement{Epoch: h.epoch.Load()}
	if ns := h.nodeSet.Load(); ns.placed {
		p.Nodes = slices.Clone(ns.list)
	}
	for i := range h.replicas {
		p.Replicas = append(p.Replicas, slices.Clone(h.replicasOf(i)))
	}
	return p
}

// Replicas returns the ordinals of shard i's replicas as this node
// follows them, its home first; the caller must not change them.
func (h *Host) Replicas(i int) []int { return h.replicasOf(i) }

// PlacementLeader returns the ordinal of the node that leads the
// placement group as this node knows, or -1 when none is known.
func (h *Host) PlacementLeader() int {
	st := h.placement.Status()
	if st.Leader == 0 {
		return -1
	}
	return Ordinal(st.Leader)
}

// Move moves shard to the nodes of ordinals, its home first, by a
// proposal to the placement group, and returns the placement once the
// group applied it here; every node then follows it (SetReplicas). Only
// the placement group's leader takes it: elsewhere a *NotLeaderError
// names the leader. A shard keeps its number of replicas; a move that
// does not (or names a node twice, or one the cluster does not have) is
// refused on any node with ErrReplicas.
func (h *Host) Move(shard int, ordinals []int) (Placement, error) {
	if shard < 0 || shard >= len(h.cfg.Shards) {
		return Placement{}, fmt.Errorf("%w: shard %d; the cluster has shards 0 to %d", ErrReplicas, shard, len(h.cfg.Shards)-1)
	}
	if want := len(h.cfg.Shards[shard].Replicas); len(ordinals) != want {
		return Placement{}, fmt.Errorf("%w: %d nodes for shard %d; it has %d replicas (--cluster-replicas)", ErrReplicas, len(ordinals), shard, want)
	}
	if err := h.checkReplicas(shard, ordinals); err != nil {
		return Placement{}, err
	}
	return h.change(func(p *Placement) error {
		p.Replicas[shard] = slices.Clone(ordinals)
		return nil
	})
}

// AddNode adds a node to the cluster, as the next ordinal, by a proposal
// to the placement group, and returns the placement once the group
// applied it here. The node holds no replica until a Move places one
// there; once started (it asks the other nodes for the placement,
// AskPlacement), it joins the placement group. Only the placement group's
// leader takes it: elsewhere a *NotLeaderError names the leader. A node
// whose address or replication address is already the cluster's is
// refused with ErrNodes.
func (h *Host) AddNode(n Node) (Placement, error) {
	for _, a := range []string{n.Addr, n.Bus} {
		if _, _, err := net.SplitHostPort(a); err != nil || strings.ContainsAny(a, " ,|") {
			return Placement{}, fmt.Errorf("%w: %q is not a host:port address", ErrNodes, a)
		}
	}
	return h.change(func(p *Placement) error {
		if p.Nodes == nil {
			return fmt.Errorf("%w: this node was not given the addresses of the cluster's nodes", ErrNodes)
		}
		if len(p.Nodes) >= MaxOrdinals {
			return fmt.Errorf("%w: the cluster has %d nodes, the most it can", ErrNodes, len(p.Nodes))
		}
		for o, m := range p.Nodes {
			if m.Addr == n.Addr || m.Bus == n.Bus || m.Addr == n.Bus || m.Bus == n.Addr {
				return fmt.Errorf("%w: %s (replication %s) is already node %d of the cluster (%s, replication %s)", ErrNodes, n.Addr, n.Bus, o, m.Addr, m.Bus)
			}
		}
		p.Nodes = append(p.Nodes, n)
		return nil
	})
}

// RemoveNode removes the node of ordinal o from the cluster, by a
// proposal to the placement group, and returns the placement once the
// group applied it here: the node leaves the placement group, whose
// voters are again the first five nodes left, and no node dials it. A
// node that still holds a replica of a shard is refused with ErrNodes:
// move its shards away first (Move). Only the placement group's leader
// takes it; one that is the node removed hands the group's leadership
// on first and answers a *NotLeaderError naming no leader: ask again.
func (h *Host) RemoveNode(o int) (Placement, error) {
	if o == h.cfg.Ordinal {
		if g := h.placement; g.Status().Serving {
			voters, _ := placementVoters(h.presentOrdinals())
			for _, v := range voters {
				if to := g.replicaOf(Ordinal, v); v != o && to != 0 && g.caughtUp(to) {
					h.lg.Info("handing the placement's leadership on: this node is being removed", "to", to)
					g.TransferLeadership(to)
					break
				}
			}
			return Placement{}, &NotLeaderError{Group: PlacementGroup}
		}
	}
	return h.change(func(p *Placement) error {
		if p.Nodes == nil {
			return fmt.Errorf("%w: this node was not given the addresses of the cluster's nodes", ErrNodes)
		}
		if o < 0 || o >= len(p.Nodes) || p.Nodes[o].Removed() {
			return fmt.Errorf("%w: ordinal %d is not a node of the cluster", ErrNodes, o)
		}
		var held []string
		for i, reps := range p.Replicas {
			if slices.Contains(reps, o) {
				held = append(held, strconv.Itoa(i))
			}
		}
		if len(held) > 0 {
			return fmt.Errorf("%w: node %d (%s) still holds a replica of shards %s: move them to other nodes first (CLUSTER PLACE, or sluice cluster rebalance with the other nodes)", ErrNodes, o, p.Nodes[o].Addr, strings.Join(held, ","))
		}
		p.Nodes[o] = Node{}
		return nil
	})
}

// ErrNodes is wrapped by the error of a node AddNode or RemoveNode refuses.
var ErrNodes = errors.New("replication: bad node")

// change proposes the applied placement as f changes it, under the next
// epoch, to the placement group, and returns it once applied here; it
// returns the placement unchanged if f leaves it so.
func (h *Host) change(f func(p *Placement) error) (Placement, error) {
	h.placeMu.Lock()
	defer h.placeMu.Unlock()
	g := h.placement
	if st := g.Status(); !st.Serving {
		return Placement{}, &NotLeaderError{Group: PlacementGroup, Leader: st.Leader}
	}
	// Serving: every placement committed before this leader's term is
	// applied, and the changes of its term are made here, one at a time.
	cur, ok, err := StoredPlacement(h.cfg.Store)
	if err != nil {
		return Placement{}, err
	}
	if !ok {
		cur = Placement{Nodes: slices.Clone(h.cfg.Addrs)}
		for _, sh := range h.cfg.Shards {
			cur.Replicas = append(cur.Replicas, slices.Clone(sh.Replicas))
		}
	}
	next := Placement{Epoch: cur.Epoch + 1, Nodes: slices.Clone(cur.Nodes)}
	for _, reps := range cur.Replicas {
		next.Replicas = append(next.Replicas, slices.Clone(reps))
	}
	if err := f(&next); err != nil {
		return Placement{}, err
	}
	if slices.EqualFunc(cur.Replicas, next.Replicas, slices.Equal) && slices.Equal(cur.Nodes, next.Nodes) {
		return cur, nil
	}
	ch, err := g.Propose([]Op{{Key: placementKey, Value: next.Encode()}})
	if err != nil {
		return Placement{}, err
	}
	if err := <-ch; err != nil {
		return Placement{}, err
	}
	h.followPlacement()
	return next, nil
}

// followPlacement applies a placement the placement group applied since
// the last look: each shard whose replicas changed is moved
// (SetReplicas).
func (h *Host) followPlacement() {
	h.followMu.Lock()
	defer h.followMu.Unlock()
	applied := h.placement.log.Applied()
	if applied == h.placeSeen {
		return
	}
	p, ok, err := StoredPlacement(h.cfg.Store)
	if err != nil {
		// Read again at the next tick; logged once per change.
		if h.placeFailed != applied {
			h.placeFailed = applied
			h.lg.Error("the cluster's placement does not read", "err", err)
		}
		return
	}
	h.placeSeen = applied
	if !ok || p.Epoch <= h.epoch.Load() {
		return
	}
	if len(p.Replicas) != len(h.replicas) {
		h.lg.Error("the cluster's placement has another number of shards than this node's; not followed", "epoch", p.Epoch, "shards", len(p.Replicas), "want", len(h.replicas))
		return
	}
	if ns := h.nodeSet.Load(); p.Nodes != nil && (!ns.placed || !slices.Equal(p.Nodes, ns.list)) {
		old := ns.list
		for o, n := range p.Nodes {
			switch {
			case o >= len(old) && !n.Removed():
				h.lg.Info("the cluster's placement added a node", "epoch", p.Epoch, "ordinal", o, "addr", n.Addr, "replication_addr", n.Bus)
			case o < len(old) && n.Removed() && !old[o].Removed():
				h.lg.Info("the cluster's placement removed a node", "epoch", p.Epoch, "ordinal", o, "addr", old[o].Addr)
			}
		}
		h.setNodes(p.Nodes)
	}
	for i, reps := range p.Replicas {
		if slices.Equal(reps, h.replicasOf(i)) {
			continue
		}
		h.lg.Info("the cluster's placement moved a shard", "epoch", p.Epoch, "shard", i, "replicas", fmt.Sprint(reps))
		if err := h.SetReplicas(i, reps); err != nil {
			h.lg.Error("a shard's move in the cluster's placement is not followed", "epoch", p.Epoch, "shard", i, "err", err)
		}
	}
	h.epoch.Store(p.Epoch)
}
