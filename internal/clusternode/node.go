// Package clusternode is a node's side of cluster mode: the Redis Cluster
// protocol over a topology decided outside the nodes (package cluster).
// The RESP front end checks every keyed command once against the slot
// table of the topology in use (Node.Route): a key another node owns is
// answered -MOVED, a slot nobody owns -CLUSTERDOWN, a slot being handed
// over -TRYAGAIN. CLUSTER answers the replies cluster clients read
// (SLOTS, SHARDS, NODES, INFO, MYID, KEYSLOT), and CLUSTER SETTOPOLOGY
// takes a topology pushed with a higher epoch and stores it, so a
// restarted node keeps it (Node.Command). A rule counter another node
// owns is forwarded to it (forward.go), and slots move between nodes with
// their records (migrate.go). The engine asks it through engine.Cluster,
// which Node implements.
//
// Open returns a Node for cluster mode, nil for a standalone server. A
// Node is safe for concurrent use.
package clusternode

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/clustercmd"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/replication"
	"github.com/sluicehq/sluice/storage"
)

// Config turns cluster mode on.
type Config struct {
	// Nodes are the announced host:port of the initial nodes, in ordinal
	// order: ordinal i owns slots ⌊16384·i/N⌋ to ⌊16384·(i+1)/N⌋−1 until a
	// topology is pushed.
	Nodes []string
	// Self is this node's announced host:port. When it is not among Nodes
	// (a pod added by scaling the StatefulSet up), the node starts as a
	// member that owns no slot, until a rebalance gives it some.
	Self string
	// ForwardTimeout bounds one counter hit forwarded to the node owning
	// the counter (forward.go); default DefaultForwardTimeout.
	ForwardTimeout time.Duration
	// ForwardQueue bounds the counter hits waiting for replies on the
	// connection to one node (forward.go); a hit beyond it waits for room,
	// within ForwardTimeout. Default DefaultForwardQueue.
	ForwardQueue int
	// MaxClockSkew bounds how far the clock of a node forwarding a counter
	// hit (SLUICE.COUNTERHIT's now) may be from this node's: a now further
	// off is clamped to this node's clock ± MaxClockSkew; default
	// DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// ReassignFrom is the announced host:port of the node a data directory
	// was recorded as, to start it as Self anyway (a volume re-assigned on
	// purpose); it then records Self. Empty: a directory recorded as
	// another node than Self is refused (ErrClusterIdentity).
	ReassignFrom string
	// PauseWait bounds MIGRATE PAUSE's wait for the pipelines and writes
	// under way; default DefaultPauseWait. No flag sets it: tests shorten
	// it.
	PauseWait time.Duration

	// Replicas is how many replicas each shard has: 0 or 1, one copy of
	// each slot, on the topology pushed by sluice cluster; 3 or 5, shards
	// replicated with Raft, placed from Nodes (replicated.go).
	Replicas int
	// Shards is how many shards a replicated cluster has, each its own
	// Raft group of a slot range (cluster.PlaceShards); 0: one per node.
	// More shards than nodes make each node the home of several.
	Shards int
	// Replicator is the store's Options.Replicator when Replicas is above
	// 1: the store was opened with ReplicatedStoreOptions.
	Replicator *replication.Committers
	// BusNodes are the addresses of the nodes' replication listeners, in
	// the order of Nodes; empty: each node's host and port plus 10000.
	BusNodes []string
	// ElectionTimeout is how long a shard's replicas go without a word
	// from its leader before electing another; default
	// DefaultElectionTimeout.
	ElectionTimeout time.Duration
	// LogKeepBytes bounds each shard's Raft log by bytes
	// (replication.Config.LogKeepBytes); 0: its default.
	LogKeepBytes uint64
	// LogMemory bounds the bytes of Raft log entries the node keeps in
	// memory, all its groups together: each gets an equal share of it
	// (replication.Config.LogMemory); 0: DefaultLogMemory.
	LogMemory int64
}

// Mode is cluster mode as an operator sets it; its zero value is
// standalone.
type Mode struct {
	// Node, when set, serves the Redis Cluster protocol as a node of the
	// cluster it describes; nil: standalone (Open then only checks that
	// the store is not a cluster node's).
	Node *Config
	// AcceptRepairedState starts on a store whose cluster state sluice
	// repair brought back older than it may have been
	// (storage.StaleMetaName), which is otherwise refused
	// (ErrClusterStateRepaired): an operator has checked it is current.
	AcceptRepairedState bool
}

// Options is what Open needs besides the operator's Mode.
type Options struct {
	Store  *storage.Store   // required
	Logger *slog.Logger     // default: discard
	Clock  func() time.Time // default time.Now
	// Mode is cluster mode or standalone.
	Mode Mode
	// Password is the one the nodes share: forwarded hits authenticate
	// with it.
	Password string
	// TLS is the server's, nil without: the nodes then serve RESP over
	// TLS only, so a hit forwarded to another node goes over TLS
	// (admit.TLS.NodeClient), and the replication transport of
	// replicated shards is mutual TLS with its certificates
	// (admit.TLS.Replication); without it, plain TCP.
	TLS *admit.TLS
}

// Node is the engine's Cluster in cluster mode.
var _ engine.Cluster = (*Node)(nil)

// Node is this node's cluster mode.
type Node struct {
	store *storage.Store
	log   *slog.Logger
	clock func() time.Time
	cfg   Config
	pass  string
	// repClientTLS and repServerTLS secure the replication transport
	// (Options.TLS); nil: plain TCP.
	repClientTLS, repServerTLS *tls.Config

	myID   string
	myAddr string
	view   atomic.Pointer[view]
	mu     sync.Mutex // one SETTOPOLOGY at a time
	mig    migration  // slots being moved off this node (migrate.go)
	imp    imports    // slots being moved to this node (migrate.go)
	fwd    forwarder
	rep    *replicas // replicated shards; nil with one copy per slot
}

// MetaTopology is the store's metadata name of the topology in use.
const MetaTopology = "cluster.topology"

// metaSelf is the store's metadata name of the node its data directory
// belongs to: "v1 " and the announced host:port, recorded on the first
// start in cluster mode.
const metaSelf = "cluster.self"

// ErrClusterIdentity is wrapped by the error of a start that would serve
// a data directory as another node than the one it belongs to.
var ErrClusterIdentity = errors.New("server: the data directory belongs to another cluster node")

// ErrClusterStateRepaired is wrapped by the error of a start on a store
// whose cluster state sluice repair brought back older than it may have
// been, without Mode.AcceptRepairedState.
var ErrClusterStateRepaired = errors.New("server: sluice repair brought back this node's cluster state as it was before a table it could not read")

// view is a topology with its slot table. Node.view is replaced as a
// whole when a topology is pushed; a command loads it once.
type view struct {
	top   cluster.Topology
	owner *[cluster.Slots]uint16 // node index + 1; 0: no owner
	self  uint16                 // this node's index + 1; 0: not a member
	// ords gives the ordinal of each node of top, in a replicated
	// cluster that removed nodes (they are left out of top); nil: a
	// node's index is its ordinal.
	ords []int
}

// ordinal is the ordinal of the node of top at index i.
func (v *view) ordinal(i int) int {
	if v.ords == nil {
		return i
	}
	return v.ords[i]
}

// index is the index in top of the node of ordinal o, or -1 for a node
// removed.
func (v *view) index(o int) int {
	if v.ords == nil {
		return o
	}
	i, ok := slices.BinarySearch(v.ords, o)
	if !ok {
		return -1
	}
	return i
}

// ordinals is one past the highest ordinal of top's nodes.
func (v *view) ordinals() int {
	if len(v.ords) == 0 {
		return len(v.top.Nodes)
	}
	return v.ords[len(v.ords)-1] + 1
}

func newView(top cluster.Topology, myID string) *view {
	return &view{top: top, owner: top.Owners(), self: uint16(top.Index(myID) + 1)}
}

// Open starts cluster mode from o.Mode.Node and the topology the store
// kept, if any: a stored topology was pushed later than the flags'
// initial one, so it wins. Standalone (o.Mode.Node nil), it returns a nil
// Node once it has checked that the store may be served standalone.
func Open(o Options) (*Node, error) {
	s := &Node{store: o.Store, log: o.Logger, clock: o.Clock, pass: o.Password}
	if o.TLS != nil {
		s.fwd.tls = o.TLS.NodeClient
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.clock == nil {
		s.clock = time.Now
	}
	cc := o.Mode.Node
	if o.TLS != nil && cc != nil && cc.Replicas > 1 {
		var err error
		if s.repClientTLS, s.repServerTLS, err = o.TLS.Replication(); err != nil {
			return nil, err
		}
	}
	// First: a stale record of the node's identity would be refused below
	// as another node's.
	if err := s.checkRepairedState(o.Mode.AcceptRepairedState); err != nil {
		return nil, err
	}
	if cc == nil {
		return nil, s.checkStandalone()
	}
	if o.TLS != nil {
		// Said once here rather than only in each forwarded hit's error.
		if _, err := o.TLS.NodeClient(); err != nil {
			s.log.Warn("cluster: HIT, /check and Envoy's calls whose counter another node owns will answer an error: " + err.Error())
		}
	}
	s.cfg = *cc
	s.fwd.queue = cc.ForwardQueue
	if len(cc.Nodes) == 0 {
		return nil, errors.New("server: cluster mode needs the nodes' addresses (--cluster-nodes)")
	}
	for _, a := range append(slices.Clone(cc.Nodes), cc.Self) {
		if err := cluster.CheckAddr(a); err != nil {
			return nil, fmt.Errorf("server: cluster mode: %w", err)
		}
	}
	// Before anything is stored: a refused start changes nothing.
	if err := s.checkIdentity(cc.Self, cc.ReassignFrom); err != nil {
		return nil, err
	}
	s.myAddr = cc.Self
	s.myID = cluster.NodeID(cc.Self)
	if cc.Replicas > 1 {
		if stored, err := s.store.Meta(MetaTopology); err != nil || stored != nil {
			return nil, fmt.Errorf("server: --cluster-replicas %d on a data directory of a cluster with one copy per slot (it holds a pushed topology): start it on a new directory: %v", cc.Replicas, err)
		}
		if err := s.openReplicated(cc); err != nil {
			return nil, err
		}
		return s, nil
	}
	if place, err := s.store.Meta(MetaPlacement); err != nil {
		return nil, fmt.Errorf("server: read the cluster's placement: %w", err)
	} else if place != nil {
		return nil, fmt.Errorf("%w: %s was first started in a replicated cluster placed as %q; refusing to start it with one copy per slot (--cluster-replicas 1, the default): "+
			"it would answer alone for slots whose decisions its shards' other replicas hold too. Start it with the flags it was first started with",
			ErrPlacement, s.store.Dir(), strings.TrimPrefix(string(place), "v1 "))
	}
	top := cluster.Initial(cc.Nodes)
	if top.Index(s.myID) < 0 {
		top.Nodes = append(top.Nodes, cluster.Node{ID: s.myID, Addr: cc.Self})
	}
	stored, err := s.store.Meta(MetaTopology)
	if err != nil {
		return nil, fmt.Errorf("server: read the stored cluster topology: %w", err)
	}
	switch {
	case stored == nil:
		// Stored on the first start, so that a later start with other
		// flags (--cluster-size edited before any push) keeps the epoch-0
		// topology its peers use: two owners of a slot at one epoch would
		// both count its buckets.
		if err := s.store.SetMeta(MetaTopology, top.Encode()); err != nil {
			return nil, fmt.Errorf("server: store the initial cluster topology: %w", err)
		}
	default:
		t, err := cluster.Decode(stored)
		if err != nil {
			return nil, fmt.Errorf("server: the stored cluster topology in %s: %w", s.store.Dir(), err)
		}
		if t.Epoch == 0 && !t.Equal(top) {
			s.log.Error("cluster: --cluster-nodes/--cluster-size/--cluster-ordinal give another initial topology than the one this node stored on its first start; "+
				"IGNORING the flags and keeping the stored one, as the other nodes do: change the topology with sluice cluster rebalance, not the flags",
				"stored", strings.Join(t.Args(), " "), "flags", strings.Join(top.Args(), " "))
		} else {
			s.log.Info("cluster: using the stored topology", "epoch", t.Epoch, "nodes", len(t.Nodes))
		}
		top = t
	}
	v := newView(top, s.myID)
	s.view.Store(v)
	if err := s.loadImports(v); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.log.Info("cluster mode", "id", s.myID, "announce", s.myAddr, "epoch", top.Epoch, "slots_owned", slotsOf(top, s.myID))
	return s, nil
}

// checkRepairedState refuses a store whose cluster records (topology,
// moves, identity) sluice repair brought back in a version older than a
// table it lost: the node would act on an old topology, serving slots it
// gave away, or drop the copy of slots it owns as an interrupted move. An
// operator who has compared it with the cluster says so with
// Mode.AcceptRepairedState; the mark is then removed.
func (s *Node) checkRepairedState(accept bool) error {
	v, err := s.store.Meta(storage.StaleMetaName)
	if err != nil {
		return fmt.Errorf("server: read what sluice repair left: %w", err)
	}
	var names []string
	for _, n := range strings.Fields(string(v)) {
		if strings.HasPrefix(n, "cluster.") {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil
	}
	epoch := "none stored"
	if t, err := s.store.Meta(MetaTopology); err == nil && t != nil {
		if top, err := cluster.Decode(t); err == nil {
			epoch = fmt.Sprint(top.Epoch)
		}
	}
	if !accept {
		return fmt.Errorf("%w (%s; topology epoch %s): the cluster may have moved on since, and acting on an old topology would serve slots this node gave away or drop a move's copy of slots it owns. "+
			"Compare with the rest of the cluster (sluice cluster show --nodes <another node>): if it is at the same epoch and no move to or from this node ran since the repair's lost tables were written, start once with --accept-repaired-cluster-state; "+
			"otherwise restore a CHECKPOINT copy, or start this node on an empty data directory with --cluster-reassign-from (the limits of its slots then start afresh)",
			ErrClusterStateRepaired, strings.Join(names, ", "), epoch)
	}
	s.log.Warn("cluster: starting on cluster state that sluice repair brought back older than it may have been, as --accept-repaired-cluster-state says", "records", strings.Join(names, " "), "epoch", epoch)
	if err := s.store.SetMeta(storage.StaleMetaName, nil); err != nil {
		return fmt.Errorf("server: clear what sluice repair left: %w", err)
	}
	return nil
}

// recordedSelf is the announced address the data directory was recorded
// as, or "" when it has none (never started in cluster mode, or by a
// version before the record).
func (s *Node) recordedSelf() (string, error) {
	v, err := s.store.Meta(metaSelf)
	if err != nil {
		return "", fmt.Errorf("server: read the cluster node the data directory belongs to: %w", err)
	}
	if v == nil {
		return "", nil
	}
	addr, ok := strings.CutPrefix(string(v), "v1 ")
	if !ok || cluster.CheckAddr(addr) != nil {
		return "", fmt.Errorf("server: the cluster node recorded in %s: %q is not v1 and a host:port", s.store.Dir(), v)
	}
	return addr, nil
}

// checkIdentity refuses to start the data directory as node self when it
// belongs to another: that node's ID would then be answered for twice,
// its slots served from this directory's records, and this one's
// redirected to itself. A directory with no record (a fresh volume, a
// standalone store, a store of an earlier version) takes self's; so does
// one recorded as reassign.
func (s *Node) checkIdentity(self, reassign string) error {
	recorded, err := s.recordedSelf()
	if err != nil {
		return err
	}
	switch recorded {
	case self:
		if reassign != "" {
			s.log.Warn("cluster: --cluster-reassign-from is set, but the data directory is this node's already: remove the flag", "node", self, "reassign_from", reassign)
		}
		return nil
	case "":
		s.log.Info("cluster: recording this node in its data directory; it will start as no other node", "node", self, "id", cluster.NodeID(self), "data", s.store.Dir())
	case reassign:
		s.log.Warn("cluster: re-assigning the data directory to this node (--cluster-reassign-from); its records of slots this node does not own are not served", "from", recorded, "to", self, "data", s.store.Dir())
	default:
		return fmt.Errorf("%w: %s belongs to node %s (ID %s), recorded on its first start in cluster mode; refusing to start it as node %s (ID %s), which --cluster-nodes and --cluster-ordinal give: "+
			"it would answer as that node and serve its slots from this node's records. Start it with the --cluster-ordinal of %s (its position in --cluster-nodes, from 0), "+
			"or give node %s a data directory of its own; to re-assign this directory on purpose, start it once with --cluster-reassign-from %s",
			ErrClusterIdentity, s.store.Dir(), recorded, cluster.NodeID(recorded), self, cluster.NodeID(self), recorded, self, recorded)
	}
	if err := s.store.SetMeta(metaSelf, []byte("v1 "+self)); err != nil {
		return fmt.Errorf("server: record the cluster node in the data directory: %w", err)
	}
	return nil
}

// checkStandalone refuses to start standalone a data directory that
// belongs to a cluster node owning less than every slot: it would answer
// for every slot, those of the other nodes from records it does not have.
// A node that owns every slot (a cluster of one, or one every slot was
// moved to) may leave cluster mode.
func (s *Node) checkStandalone() error {
	recorded, err := s.recordedSelf()
	if err != nil || recorded == "" {
		return err
	}
	var top cluster.Topology
	if v, err := s.store.Meta(MetaTopology); err != nil {
		return fmt.Errorf("server: read the stored cluster topology: %w", err)
	} else if v != nil {
		if top, err = cluster.Decode(v); err != nil {
			return fmt.Errorf("server: the stored cluster topology in %s: %w", s.store.Dir(), err)
		}
	}
	id := cluster.NodeID(recorded)
	owned := slotsOf(top, id)
	if owned == cluster.Slots {
		s.log.Info("standalone on the data directory of a cluster node that owns every slot; it may start in cluster mode again as that node", "node", recorded, "epoch", top.Epoch)
		return nil
	}
	return fmt.Errorf("%w: %s belongs to cluster node %s (ID %s), which owns %d of %d slots at epoch %d; refusing to start it standalone: "+
		"it would answer for every slot, those of the other nodes from records it does not have. Start it in cluster mode as that node (--cluster-nodes and its --cluster-ordinal), "+
		"or first give that node every slot (sluice cluster rebalance --nodes %s; with the other nodes gone, CLUSTER SETTOPOLOGY %d %s 0-16383 on it), then start it standalone",
		ErrClusterIdentity, s.store.Dir(), recorded, id, owned, cluster.Slots, top.Epoch, recorded, top.Epoch+1, recorded)
}

func slotsOf(t cluster.Topology, id string) int {
	i := t.Index(id)
	if i < 0 {
		return 0
	}
	return cluster.Topology{Nodes: t.Nodes[i : i+1]}.Assigned()
}

// errClusterDown answers a key of a slot no node serves: the cluster's
// condition, not the request's (forwardErr).
var errClusterDown = forwardErr("CLUSTERDOWN", "Hash slot not served")

var errNotReplicated = refuse("CLUSTER PLACEMENT, PLACE, ADDNODE and REMOVENODE apply to a cluster with --cluster-replicas above 1, whose shards are Raft groups; this one moves slots with sluice cluster move and rebalance")

// refuse is a request the node refuses: a bad argument, a command out of
// turn, a state it cannot take. msg says what was wrong and what was
// expected; the front end words it (RESP: "ERR " msg).
func refuse(msg string) error { return &errs.Error{Kind: errs.Request, Msg: msg} }

// refuseErr is refuse with err's text, and err as its cause.
func refuseErr(err error) error { return &errs.Error{Kind: errs.Request, Msg: err.Error(), Err: err} }

// Route checks that this node serves slot: it returns ("", nil) when it
// does, the announced address of the node that owns it (the client is
// answered -MOVED slot addr), or the error the client is answered
// (-CLUSTERDOWN, -TRYAGAIN). It allocates nothing.
func (s *Node) Route(slot uint16) (moved string, err error) {
	v := s.view.Load()
	o := v.owner[slot]
	switch {
	case o == 0:
		return "", errClusterDown
	case o == v.self:
		if s.mig.active.Load() && s.mig.state[slot].Load() == slotPaused {
			return "", errTryAgain
		}
		return "", nil
	default:
		return v.top.Nodes[o-1].Addr, nil
	}
}

// ID is this node's ID (cluster.NodeID of its announced address).
func (s *Node) ID() string { return s.myID }

// Owner returns the index of the node owning slot in the topology in use
// (-1: none), and whether that is this node.
func (s *Node) Owner(slot uint16) (owner int, mine bool) {
	v := s.view.Load()
	o := v.owner[slot]
	return int(o) - 1, o != 0 && o == v.self
}

// Caller is what a CLUSTER subcommand needs of the RESP connection that
// sent it, besides its command context.
type Caller interface {
	// Commit commits the writes the connection's pipeline has made so
	// far, before a command that needs them in the store first.
	Commit() error
	// Quiesce returns once every pipeline and every write of the other
	// front ends under way when it was called, other than the caller's,
	// has ended, or false at deadline.
	Quiesce(deadline time.Time) bool
	// RESP3 reports whether the connection speaks RESP3 (HELLO 3).
	RESP3() bool
}

// Command runs CLUSTER's subcommands but HELP (args[0] is CLUSTER,
// args[1] the subcommand), appending its reply to x.Out, or returns the
// error to answer instead.
func (s *Node) Command(x *dispatch.Ctx, args [][]byte, c Caller) error {
	sub := strings.ToLower(string(args[1]))
	v := s.view.Load()
	switch {
	case sub == "myid" && len(args) == 2:
		x.Out = resp.AppendBulkString(x.Out, s.myID)
	case sub == "keyslot" && len(args) == 3:
		x.Out = resp.AppendInt(x.Out, int64(keyspace.Slot(args[2])))
	case sub == "info" && len(args) == 2:
		x.Out = resp.AppendBulkString(x.Out, clustercmd.Info(v.top))
	case sub == "slots" && len(args) == 2:
		shards, _ := s.shards(v)
		x.Out = clustercmd.AppendSlots(x.Out, v.top, shards)
	case sub == "shards" && len(args) == 2:
		shards, _ := s.shards(v)
		x.Out = clustercmd.AppendShards(x.Out, v.top, shards, c.RESP3())
	case sub == "nodes" && len(args) == 2:
		shards, fail := s.shards(v)
		x.Out = resp.AppendBulkString(x.Out, clustercmd.Nodes(v.top, int(v.self)-1, shards, fail))
	case sub == "topology" && len(args) == 2:
		x.Out = resp.AppendBulkString(x.Out, strings.Join(v.top.Args(), " "))
	case sub == "placement" && len(args) == 2:
		if s.rep == nil {
			return errNotReplicated
		}
		text, err := s.placementText()
		if err != nil {
			return err
		}
		x.Out = resp.AppendBulkString(x.Out, text)
	case sub == "place" && len(args) >= 4:
		if s.rep == nil {
			return errNotReplicated
		}
		epoch, err := s.place(args[2:])
		if err != nil {
			return err
		}
		x.Out = resp.AppendInt(x.Out, int64(epoch))
	case sub == "addnode" && (len(args) == 3 || len(args) == 4):
		if s.rep == nil {
			return errNotReplicated
		}
		epoch, err := s.addNode(args[2:])
		if err != nil {
			return err
		}
		x.Out = resp.AppendInt(x.Out, int64(epoch))
	case sub == "removenode" && len(args) == 3:
		if s.rep == nil {
			return errNotReplicated
		}
		epoch, err := s.removeNode(args[2])
		if err != nil {
			return err
		}
		x.Out = resp.AppendInt(x.Out, int64(epoch))
	case s.rep != nil && (sub == "settopology" || sub == "migrate" || sub == "import" || sub == "restore" || sub == "drop"):
		return errReplicatedTopology
	case sub == "settopology" && len(args) >= 5:
		str := make([]string, len(args)-2)
		for i, a := range args[2:] {
			str[i] = string(a)
		}
		if err := s.setTopology(str); err != nil {
			return err
		}
		x.Out = resp.AppendSimple(x.Out, "OK")
	default:
		if ok, err := s.migrateCommand(x, c, sub, args); ok || err != nil {
			return err
		}
		return refuse("unknown subcommand or wrong number of arguments for '" + resp.Preview(args[1]) + "'. Try CLUSTER HELP.")
	}
	return nil
}

// Help is CLUSTER HELP's reply, a line each.
var Help = []string{
	"CLUSTER <subcommand> [<arg> ...]. Subcommands are:",
	"INFO", "    Return information about the cluster.",
	"MYID", "    Return the node id.",
	"KEYSLOT <key>", "    Return the hash slot for <key>.",
	"SLOTS", "    Return information about slots range mappings.",
	"SHARDS", "    Return information about slot range mappings and the nodes serving them.",
	"NODES", "    Return cluster configuration seen by node (Redis' format).",
	"TOPOLOGY", "    Return the topology in use as the arguments of SETTOPOLOGY: <epoch> <host:port> <slots> ...",
	"SETTOPOLOGY <epoch> <host:port> <slots> [<host:port> <slots> ...]",
	"    Replace the topology by one with a higher epoch and store it; <slots> is like 0-5460,6000 or - for none.",
	"MIGRATE START <slots> | PAUSE | DIRTY <count> | CANCEL",
	"    Resharding, on the source: note the keys written in <slots>, pause them (TRYAGAIN), hand over the keys changed, or stop.",
	"DUMP <first-slot> <last-slot> <cursor> <count>",
	"    Resharding, on the source: a page of the slots' records, [next cursor, key, value, ...].",
	"IMPORT START <slots> | DONE <slots> <epoch>",
	"    Resharding, on the target: drop leftovers and take RESTOREs for <slots>, or mark their copy complete for the topology of <epoch>.",
	"RESTORE <key> <value> [<key> <value> ...]",
	"    Resharding, on the target: write records of slots being imported (an empty value deletes).",
	"DROP <slots>",
	"    Delete every record of slots this node does not serve, and end their import.",
	"PLACEMENT",
	"    With --cluster-replicas above 1: the placement's epoch and leader, and each shard's slots and replicas, its home first.",
	"PLACE <shard> <host:port> [<host:port> ...]",
	"    With --cluster-replicas above 1: move the shard's replicas to these nodes, the first its home (on the placement's leader); answers the new epoch.",
	"ADDNODE <host:port> [<replication host:port>]",
	"    With --cluster-replicas above 1: add a node to the cluster, holding no replica until PLACE moves one there (on the placement's leader); answers the new epoch.",
	"REMOVENODE <host:port>",
	"    With --cluster-replicas above 1: remove a node that holds no replica (PLACE moves them away) from the cluster (on the placement's leader); answers the new epoch.",
}

// Close closes the connections kept to other nodes for forwarding.
func (s *Node) Close() {
	s.fwd.closeAll()
	if s.rep != nil {
		if err := s.rep.close(); err != nil {
			s.log.Error("cluster: a shard's replica failed", "err", err)
		}
	}
}

// setTopology takes a pushed topology when its epoch is above the one in
// use, storing it (synced) before using it. The same topology pushed again
// is accepted, so a push can be retried.
func (s *Node) setTopology(args []string) error {
	t, err := cluster.Parse(args)
	if err != nil {
		return refuseErr(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.view.Load().top
	switch {
	case t.Equal(cur):
		return nil
	case cur.Epoch >= cluster.MaxEpoch:
		// Stuck at the cap (or past it, stored by an earlier version): no
		// higher epoch exists, so any is taken (sluice cluster renumber).
		s.log.Warn("cluster: the topology in use is at the epoch cap; taking the pushed one whatever its epoch", "epoch", t.Epoch, "previous_epoch", cur.Epoch)
	case t.Epoch <= cur.Epoch:
		return refuse("epoch " + strconv.FormatUint(t.Epoch, 10) + " is not above the current epoch " + strconv.FormatUint(cur.Epoch, 10) + ": push a topology with a higher epoch")
	}
	nv := newView(t, s.myID)
	// The import table is held from the check to the store, so that no
	// IMPORT START or DROP comes in between.
	s.imp.Lock()
	defer s.imp.Unlock()
	imports, err := s.importsAfterLocked(s.view.Load(), nv)
	if err != nil {
		return err
	}
	if err := s.store.SetMeta(MetaTopology, t.Encode()); err != nil {
		return fmt.Errorf("store the cluster topology: %w", err)
	}
	s.view.Store(nv)
	s.forgetMigrations(nv)
	s.log.Info("cluster: topology replaced", "epoch", t.Epoch, "previous_epoch", cur.Epoch, "nodes", len(t.Nodes), "slots_owned", slotsOf(t, s.myID))
	if *imports != *s.imp.table {
		// After the topology: a restart in between finds the slots owned
		// and ends their import itself (loadImports).
		s.imp.table = imports
		return s.storeImportsLocked()
	}
	return nil
}
