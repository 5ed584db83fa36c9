package replication

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Defaults for TransportConfig.
const (
	DefaultQueue        = 4096
	DefaultDialTimeout  = time.Second
	DefaultWriteTimeout = 2 * time.Second
	DefaultMaxFrame     = 64 << 20
	DefaultMaxConns     = 256
	DefaultMaxSnapshots = 4
	DefaultIdlePeer     = time.Minute
)

// readBufKeep is the largest read buffer a connection keeps between
// frames: a larger one, made for a large frame (up to MaxFrame), is let
// go once its frame is handled, so that idle peers hold little memory.
const readBufKeep = 64 << 10

// ErrTransportClosed is returned once the transport is closed.
var ErrTransportClosed = errors.New("replication: transport closed")

// helloMagic starts every connection between nodes, then a kind byte,
// the dialing node's identity, the identity it dials (0: whichever node
// answers at the address) and its cluster's configuration (8 bytes,
// TransportConfig.Cluster). helloMessages opens the connection of a
// pair, which the node of lower identity dials; helloDial asks that node
// to dial (the connection then closes), so that the node of higher
// identity gets a connection when it has to send first; helloSnapshot
// carries one snapshot; helloStanding asks a node whether its groups have
// lived (one Standing byte answers), and helloJoin asks the leaders among
// a node's groups to add the dialing node to them (see Host), and
// helloMembers asks a node for the members of one of its groups (see
// AskMembers), and helloPlacement for the placement it applied (see
// AskPlacement), asked by a node added to the cluster before it knows its
// ordinal (identity 0).
//
// The identity dialed is checked, so that a node that came back under a
// new identity (its volume lost) refuses the connections meant for its
// old one rather than taking messages addressed to it; so is the
// configuration, so that nodes placed differently (another list of
// nodes, another number of replicas) never share a group.
//
// Version 4: rounds say whether each change's record existed (round
// version 2), which nodes of version 3 cannot apply; and a node added asks
// for the placement (helloPlacement).
const (
	helloMagic     = "sluice-raft 4\n"
	helloMessages  = 'm'
	helloSnapshot  = 's'
	helloDial      = 'd'
	helloStanding  = 'q'
	helloJoin      = 'j'
	helloMembers   = 'w'
	helloPlacement = 'p'
)

// maxJoinGroups bounds the groups one join request names.
const maxJoinGroups = 1024

// Standing is what a node answers when another, starting on an empty data
// directory, asks whether the cluster has lived (Transport.Ask).
type Standing byte

const (
	// StandingEmpty: the node holds no group yet; it is deciding too.
	StandingEmpty Standing = 'e'
	// StandingFresh: every group the node holds is as bootstrapped, with
	// no election or entry since.
	StandingFresh Standing = 'f'
	// StandingLived: a group the node holds has had an election or an
	// entry, or joined by snapshot: the cluster has lived, and a node
	// that finds its data directory empty lost it.
	StandingLived Standing = 'l'
	// standingOtherCluster answers a node whose hello names another
	// configuration; Ask returns ErrOtherCluster.
	standingOtherCluster Standing = 'c'
)

// ErrOtherCluster is wrapped by the error of an Ask answered by a node of
// another cluster configuration (TransportConfig.Cluster).
var ErrOtherCluster = errors.New("replication: the node was started with another cluster configuration")

func (s Standing) String() string {
	switch s {
	case StandingEmpty:
		return "empty"
	case StandingFresh:
		return "fresh"
	case StandingLived:
		return "lived"
	}
	return fmt.Sprintf("standing %q", byte(s))
}

// TransportConfig configures a node's Transport. A zero field means the
// default given.
type TransportConfig struct {
	// Node is this node; 0 for a node added to the cluster that does not
	// know its ordinal yet: such a transport only asks for the placement
	// (AskPlacement).
	Node uint64
	// Cluster identifies the configuration the node was started with
	// (which nodes, how many replicas: a digest of what places the
	// shards). A connection whose hello gives another is refused, so
	// that two nodes that would hold a group under different bounds never
	// exchange its messages. Every node of a cluster must give the same.
	Cluster uint64
	// Addr returns the address of node's transport listener, and false if
	// the node is unknown (then its messages are dropped).
	Addr func(node uint64) (string, bool)
	// ClientTLS and ServerTLS, set together or not at all, secure the
	// connections this node dials and accepts (Serve wraps them) with
	// mutual TLS: ClientTLS needs this node's certificate, ServerTLS the
	// CA of the nodes' certificates in ClientCAs. A peer's certificate
	// must name the host of its address (Addr): a node dials with that
	// host as ServerName, and accepts a node's connection only with a
	// client certificate valid for it.
	ClientTLS, ServerTLS *tls.Config
	// Queue bounds the messages waiting for one peer; more are dropped
	// (and Raft told the peer is unreachable: it retries). Default 4096.
	Queue int
	// DialTimeout bounds a dial, and its TLS handshake; default 1s.
	// WriteTimeout bounds one write of a batch of messages, and each page
	// of a snapshot; default 2s. A connection that times out is closed.
	DialTimeout, WriteTimeout time.Duration
	// MaxFrame bounds one batch of messages, read or written; default 64
	// MiB. A peer that sends more is disconnected; a message larger is
	// dropped. Every node must use the same.
	MaxFrame int
	// MaxConns bounds the connections that other nodes have open to this
	// one, of every kind, handshakes included; one more is closed at
	// once. Default 256: a pair of nodes needs one, and one per snapshot
	// in flight.
	MaxConns int
	// MaxSnapshots bounds the snapshots this node receives at once; one
	// more is refused (closed), and its sender's Raft retries later.
	// Default 4.
	MaxSnapshots int
	// IdlePeer is how long a node nothing was sent to, and that this node
	// cannot reach, is still dialed (or asked to dial); then it is
	// forgotten until a message for it comes. The identity a node had
	// before it lost its data is never sent to again once the groups
	// have replaced it. Default 1 minute.
	IdlePeer time.Duration
	Logger   *slog.Logger // default: discard
}

// Transport carries the Raft messages of every group a node hosts to the
// other nodes, over one connection per pair of nodes (the node with the
// lower identity dials, asked to by the other when that one has to send
// first; both write on it), in batches. Each peer has a
// bounded queue, drained by one writer; a full queue, or a peer that is
// not connected, drops messages, which Raft sends again. A snapshot goes
// over a connection of its own, so that its pages never hold up another
// group's heartbeats. Safe for concurrent use.
type Transport struct {
	cfg TransportConfig
	lg  *slog.Logger

	mu struct {
		sync.Mutex
		groups map[uint64]*Group
		peers  map[uint64]*peer
		ls     []net.Listener
		conns  map[net.Conn]struct{}
		closed bool
		// warned is when the node of each ordinal was last warned of as
		// one of another configuration (warnOtherCluster).
		warned map[int]time.Time
	}
	done chan struct{}
	wg   sync.WaitGroup
	// connSlots and snapSlots hold a token per accepted connection and
	// per snapshot being received (MaxConns, MaxSnapshots).
	connSlots, snapSlots chan struct{}

	// Dropped counts the messages dropped: a full queue, no connection,
	// a failed write.
	Dropped atomic.Int64
}

type outMsg struct {
	group uint64
	m     *pb.Message
}

type peer struct {
	id   uint64
	q    chan outMsg
	mu   sync.Mutex
	conn net.Conn // nil while not connected
	// lost is signalled when the connection closes, wake when the peer
	// asks to be dialed (both hold at most one signal).
	lost, wake chan struct{}
	// sent is when a message for the peer was last queued, in Unix
	// nanoseconds; gone is closed when the peer is forgotten (IdlePeer).
	sent atomic.Int64
	gone chan struct{}
}

// NewTransport returns a transport with no groups, not listening.
func NewTransport(cfg TransportConfig) (*Transport, error) {
	if cfg.Addr == nil {
		return nil, errors.New("replication: TransportConfig needs Addr")
	}
	if (cfg.ClientTLS == nil) != (cfg.ServerTLS == nil) {
		return nil, errors.New("replication: TransportConfig needs both ClientTLS and ServerTLS, or neither")
	}
	if cfg.ServerTLS != nil {
		if cfg.ServerTLS.ClientCAs == nil && cfg.ServerTLS.GetConfigForClient == nil {
			return nil, errors.New("replication: ServerTLS needs ClientCAs, the CA of the nodes' certificates, to verify the nodes that connect")
		}
		if len(cfg.ClientTLS.Certificates) == 0 && cfg.ClientTLS.GetClientCertificate == nil {
			return nil, errors.New("replication: ClientTLS needs this node's certificate, which the other nodes verify")
		}
		cfg.ServerTLS = cfg.ServerTLS.Clone()
		cfg.ServerTLS.ClientAuth = tls.RequireAndVerifyClientCert
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = DefaultMaxFrame
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxSnapshots <= 0 {
		cfg.MaxSnapshots = DefaultMaxSnapshots
	}
	if cfg.IdlePeer <= 0 {
		cfg.IdlePeer = DefaultIdlePeer
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Transport{cfg: cfg, lg: cfg.Logger.With("node", cfg.Node), done: make(chan struct{}),
		connSlots: make(chan struct{}, cfg.MaxConns), snapSlots: make(chan struct{}, cfg.MaxSnapshots)}
	t.mu.groups = map[uint64]*Group{}
	t.mu.peers = map[uint64]*peer{}
	t.mu.conns = map[net.Conn]struct{}{}
	return t, nil
}

// Add makes g's messages go through the transport; g's Config.Send must be
// the transport's Send.
func (t *Transport) Add(g *Group) {
	t.mu.Lock()
	t.mu.groups[g.cfg.Group] = g
	t.mu.Unlock()
}

// Remove stops routing messages to the group.
func (t *Transport) Remove(group uint64) {
	t.mu.Lock()
	delete(t.mu.groups, group)
	t.mu.Unlock()
}

func (t *Transport) group(id uint64) *Group {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mu.groups[id]
}

// Send queues messages of group for their nodes; it never blocks. It is
// what a Group's Config.Send should be.
func (t *Transport) Send(group uint64, msgs []*pb.Message) {
	now := time.Now().UnixNano()
	for _, m := range msgs {
		to := m.GetTo()
		if m.GetType() == pb.MsgSnap {
			m := proto.Clone(m).(*pb.Message)
			t.spawn(func() { t.sendSnapshot(group, m) })
			continue
		}
		p := t.peer(to)
		if p == nil {
			t.drop(group, to)
			continue
		}
		p.sent.Store(now)
		select {
		case p.q <- outMsg{group: group, m: proto.Clone(m).(*pb.Message)}:
		default:
			t.drop(group, to)
		}
	}
}

func (t *Transport) drop(group, to uint64) {
	t.Dropped.Add(1)
	if g := t.group(group); g != nil {
		g.ReportUnreachable(to)
	}
}

// spawn runs f in a goroutine that Close waits for, unless closed; it
// reports whether it did.
func (t *Transport) spawn(f func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.closed {
		return false
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
	return true
}

// take takes a token of slots, if one is free.
func take(slots chan struct{}) bool {
	select {
	case slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// peer returns the peer to, started on first use; nil for this node, an
// unknown node, or a closed transport.
func (t *Transport) peer(to uint64) *peer {
	if to == t.cfg.Node {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.closed {
		return nil
	}
	if p := t.mu.peers[to]; p != nil {
		return p
	}
	if _, ok := t.cfg.Addr(to); !ok {
		return nil
	}
	p := &peer{id: to, q: make(chan outMsg, t.cfg.Queue), lost: make(chan struct{}, 1), wake: make(chan struct{}, 1), gone: make(chan struct{})}
	p.sent.Store(time.Now().UnixNano())
	t.mu.peers[to] = p
	t.wg.Add(2)
	go func() { defer t.wg.Done(); t.write(p) }()
	if t.cfg.Node < to {
		go func() { defer t.wg.Done(); t.dialLoop(p) }()
	} else {
		go func() { defer t.wg.Done(); t.askLoop(p) }()
	}
	return p
}

// Serve accepts the connections of other nodes on l until Close.
func (t *Transport) Serve(l net.Listener) error {
	if t.cfg.ServerTLS != nil {
		l = tls.NewListener(l, t.cfg.ServerTLS)
	}
	t.mu.Lock()
	if t.mu.closed {
		t.mu.Unlock()
		l.Close()
		return ErrTransportClosed
	}
	t.mu.ls = append(t.mu.ls, l)
	t.mu.Unlock()
	for {
		c, err := l.Accept()
		if err != nil {
			select {
			case <-t.done:
				return ErrTransportClosed
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("replication: accept: %w", err)
		}
		if !take(t.connSlots) {
			t.lg.Warn("raft connection refused: too many open", "remote", c.RemoteAddr(), "max", t.cfg.MaxConns)
			c.Close()
			continue
		}
		if !t.spawn(func() { defer func() { <-t.connSlots }(); t.accept(c) }) {
			<-t.connSlots
			c.Close()
		}
	}
}

// track registers c so that Close closes it; false if closed already.
func (t *Transport) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.closed {
		c.Close()
		return false
	}
	t.mu.conns[c] = struct{}{}
	return true
}

func (t *Transport) untrack(c net.Conn) {
	c.Close()
	t.mu.Lock()
	delete(t.mu.conns, c)
	t.mu.Unlock()
}

func (t *Transport) accept(c net.Conn) {
	if !t.track(c) {
		return
	}
	defer t.untrack(c)
	dr := &deadlineReader{c: c, d: t.cfg.DialTimeout}
	br := bufio.NewReader(dr)
	h, err := readHello(br)
	kind, from, to := h.kind, h.from, h.to
	if err == nil && (kind != helloPlacement || from != 0) {
		// A node added to the cluster asks for the placement before it
		// knows its identity; with TLS, its certificate is verified.
		err = t.authenticate(c, from)
	}
	if err == nil && to != t.cfg.Node && (to != 0 || !anyNode(kind)) {
		// Expected for a while after this node came back under a new
		// identity: its peers dial the old one until they forget it.
		t.lg.Debug("raft connection refused: for another identity", "from", from, "to", to)
		return
	}
	if err != nil {
		t.lg.Warn("raft connection refused", "remote", c.RemoteAddr(), "err", err)
		return
	}
	if h.cluster != t.cfg.Cluster {
		if kind == helloStanding {
			c.SetWriteDeadline(time.Now().Add(t.cfg.WriteTimeout))
			c.Write([]byte{byte(standingOtherCluster)})
		}
		t.warnOtherCluster(from, c.RemoteAddr())
		return
	}
	switch kind {
	case helloStanding:
		c.SetWriteDeadline(time.Now().Add(t.cfg.WriteTimeout))
		c.Write([]byte{byte(t.standing())})
	case helloPlacement:
		c.SetWriteDeadline(time.Now().Add(t.cfg.WriteTimeout))
		c.Write(t.placement())
	case helloMembers:
		id, err := binary.ReadUvarint(br)
		if err != nil {
			t.lg.Warn("raft members request refused", "from", from, "err", err)
			return
		}
		c.SetWriteDeadline(time.Now().Add(t.cfg.WriteTimeout))
		c.Write(t.members(id))
	case helloJoin:
		groups, err := readJoin(br)
		if err != nil {
			t.lg.Warn("raft join request refused", "from", from, "err", err)
			return
		}
		for _, id := range groups {
			if g := t.group(id); g != nil {
				g.requestJoin(from)
			}
		}
	case helloSnapshot:
		if !take(t.snapSlots) {
			t.lg.Warn("snapshot refused: too many at once", "from", from, "max", t.cfg.MaxSnapshots)
			return
		}
		defer func() { <-t.snapSlots }()
		// Each read has a deadline: the group processes nothing else
		// while it reads a snapshot, so a stalled sender must not hold it.
		dr.d = t.cfg.WriteTimeout
		t.receiveSnapshot(c, br, from)
	case helloDial:
		if from <= t.cfg.Node {
			t.lg.Warn("raft dial request from a node that should dial itself", "from", from)
			return
		}
		if p := t.peer(from); p != nil {
			signal(p.wake)
		}
	case helloMessages:
		dr.d = 0 // an idle connection between nodes stays
		// The node of lower identity dials.
		p := t.peer(from)
		if p == nil || from >= t.cfg.Node {
			t.lg.Warn("raft connection from a node that should not dial here", "from", from)
			return
		}
		p.setConn(c)
		t.read(c, br, from)
		p.clearConn(c)
	}
}

// warnOtherCluster warns that node from, at remote, was started with
// another configuration, at most once a minute per ordinal: it dials
// again, or asks, every second or more often.
func (t *Transport) warnOtherCluster(from uint64, remote net.Addr) {
	t.mu.Lock()
	now := time.Now()
	last, seen := t.mu.warned[Ordinal(from)]
	if !seen || now.Sub(last) >= time.Minute {
		if t.mu.warned == nil {
			t.mu.warned = map[int]time.Time{}
		}
		t.mu.warned[Ordinal(from)] = now
	}
	t.mu.Unlock()
	if !seen || now.Sub(last) >= time.Minute {
		t.lg.Warn("raft connection refused: that node was started with another cluster configuration (--cluster-nodes, --cluster-replicas or --cluster-shards); every node of a replicated cluster must be started with the same",
			"from_ordinal", Ordinal(from), "remote", remote)
	}
}

// authenticate checks that c, whose hello says it comes from node from,
// may: from is another node of the configuration and, with TLS, c's
// client certificate (verified against ClientCAs already) names the host
// of from's address. Before it, nothing of the connection's reaches
// the node's state, so that no other connection can close its peer's.
func (t *Transport) authenticate(c net.Conn, from uint64) error {
	if from == t.cfg.Node {
		return fmt.Errorf("the hello names node %d, this node", from)
	}
	addr, ok := t.cfg.Addr(from)
	if !ok || from == 0 {
		return fmt.Errorf("the hello names node %d, which is not a node of the configuration", from)
	}
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil
	}
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return fmt.Errorf("node %d: no client certificate", from)
	}
	if err := certs[0].VerifyHostname(addrHost(addr)); err != nil {
		return fmt.Errorf("node %d at %s: %w", from, addr, err)
	}
	return nil
}

// addrHost is the host of a host:port address, or the address itself.
func addrHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// hello is what a connection's hello says.
type hello struct {
	kind              byte
	from, to, cluster uint64
}

func readHello(br *bufio.Reader) (h hello, err error) {
	magic := make([]byte, len(helloMagic))
	if _, err := io.ReadFull(br, magic); err != nil {
		return h, err
	}
	if string(magic) != helloMagic {
		return h, fmt.Errorf("not a sluice Raft connection of this version (%q, want %q)", magic, helloMagic)
	}
	if h.kind, err = br.ReadByte(); err != nil {
		return h, err
	}
	switch h.kind {
	case helloMessages, helloSnapshot, helloDial, helloStanding, helloJoin, helloMembers, helloPlacement:
	default:
		return h, fmt.Errorf("unknown connection kind %q", h.kind)
	}
	if h.from, err = binary.ReadUvarint(br); err != nil {
		return h, err
	}
	if h.to, err = binary.ReadUvarint(br); err != nil {
		return h, err
	}
	var c [8]byte
	if _, err := io.ReadFull(br, c[:]); err != nil {
		return h, err
	}
	h.cluster = binary.BigEndian.Uint64(c[:])
	return h, nil
}

// readJoin reads a join request's groups.
func readJoin(br *bufio.Reader) ([]uint64, error) {
	n, err := binary.ReadUvarint(br)
	if err != nil {
		return nil, err
	}
	if n > maxJoinGroups {
		return nil, fmt.Errorf("%d groups in one join request; at most %d", n, maxJoinGroups)
	}
	groups := make([]uint64, n)
	for i := range groups {
		if groups[i], err = binary.ReadUvarint(br); err != nil {
			return nil, err
		}
	}
	return groups, nil
}

func (t *Transport) hello(kind byte, to uint64) []byte {
	b := binary.AppendUvarint(binary.AppendUvarint(append([]byte(helloMagic), kind), t.cfg.Node), to)
	return binary.BigEndian.AppendUint64(b, t.cfg.Cluster)
}

// standing is what this node answers an Ask.
func (t *Transport) standing() Standing {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.mu.groups) == 0 {
		return StandingEmpty
	}
	for _, g := range t.mu.groups {
		if !g.pristine() {
			return StandingLived
		}
	}
	return StandingFresh
}

// Ask asks the node that answers at node's address, whatever its
// identity now, for its Standing.
func (t *Transport) Ask(node uint64) (Standing, error) {
	c, err := t.dial(node, helloStanding)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(t.cfg.WriteTimeout))
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, fmt.Errorf("replication: node %d's standing: %w", node, err)
	}
	switch s := Standing(b[0]); s {
	case StandingEmpty, StandingFresh, StandingLived:
		return s, nil
	case standingOtherCluster:
		return 0, fmt.Errorf("%w: node %d", ErrOtherCluster, node)
	default:
		return 0, fmt.Errorf("replication: node %d answered %v", node, s)
	}
}

// RequestJoin asks the node that answers at node's address, whatever its
// identity now, to add this node to those of groups it leads.
func (t *Transport) RequestJoin(node uint64, groups []uint64) error {
	if len(groups) > maxJoinGroups {
		return fmt.Errorf("replication: %d groups in one join request; at most %d", len(groups), maxJoinGroups)
	}
	c, err := t.dial(node, helloJoin)
	if err != nil {
		return err
	}
	defer c.Close()
	b := binary.AppendUvarint(nil, uint64(len(groups)))
	for _, g := range groups {
		b = binary.AppendUvarint(b, g)
	}
	c.SetWriteDeadline(time.Now().Add(t.cfg.WriteTimeout))
	_, err = c.Write(b)
	return err
}

// members is the answer to a members request for group: a byte 0 when
// this node holds no replica of it that has members, else 1, then its
// replica's applied index, the length of the ConfState at it and the
// ConfState.
func (t *Transport) members(group uint64) []byte {
	g := t.group(group)
	if g == nil || !g.member() {
		return []byte{0}
	}
	applied, cs := g.log.appliedConf()
	b, err := proto.Marshal(cs)
	if err != nil {
		return []byte{0}
	}
	return appendBytes(binary.AppendUvarint([]byte{1}, applied), b)
}

// anyNode reports whether a request of kind is for whichever node answers
// at an address.
func anyNode(kind byte) bool {
	return kind == helloStanding || kind == helloJoin || kind == helloMembers || kind == helloPlacement
}

// placement is the answer to a placement request: a byte 0 when this
// node holds no placement changed since the cluster first started, else
// 1 and the placement as stored (Placement.Encode).
func (t *Transport) placement() []byte {
	g := t.group(PlacementGroup)
	if g == nil {
		return []byte{0}
	}
	v, ok, err := g.cfg.Store.ReplicaGet(placementKey)
	if err != nil || !ok {
		return []byte{0}
	}
	return appendBytes([]byte{1}, v)
}

// AskPlacement asks the node that answers at node's address, whatever its
// identity now, for the cluster's placement as it applied it; false, and
// no error, when it holds none changed since the cluster first started.
func (t *Transport) AskPlacement(node uint64) (Placement, bool, error) {
	c, err := t.dial(node, helloPlacement)
	if err != nil {
		return Placement{}, false, err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(t.cfg.WriteTimeout))
	br := bufio.NewReader(c)
	has, err := br.ReadByte()
	if err != nil || has == 0 {
		return Placement{}, false, err
	}
	b, err := readBytes(br, maxMembersAnswer)
	if err != nil {
		return Placement{}, false, fmt.Errorf("replication: node %d's placement: %w", node, err)
	}
	p, err := DecodePlacement(b)
	return p, err == nil, err
}

// maxMembersAnswer bounds the ConfState a members request is answered,
// and the placement of a placement request.
const maxMembersAnswer = 64 << 10

// AskMembers asks the node that answers at node's address, whatever its
// identity now, for the members of group as its replica last applied
// them (a configuration the group committed) and the index it applied
// last. Nil, and no error, when that node holds no replica of group with
// members.
func (t *Transport) AskMembers(node, group uint64) (applied uint64, cs *pb.ConfState, err error) {
	c, err := t.dial(node, helloMembers)
	if err != nil {
		return 0, nil, err
	}
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(t.cfg.WriteTimeout))
	if _, err := c.Write(binary.AppendUvarint(nil, group)); err != nil {
		return 0, nil, err
	}
	c.SetReadDeadline(time.Now().Add(t.cfg.WriteTimeout))
	br := bufio.NewReader(c)
	has, err := br.ReadByte()
	if err != nil || has == 0 {
		return 0, nil, err
	}
	var b []byte
	applied, err = binary.ReadUvarint(br)
	if err == nil {
		b, err = readBytes(br, maxMembersAnswer)
	}
	cs = &pb.ConfState{}
	if err == nil {
		err = proto.Unmarshal(b, cs)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("replication: node %d's members of group %d: %w", node, group, err)
	}
	return applied, cs, nil
}

// dial connects to node's address, as this node, for kind: to node
// itself, or for a standing or join request to whichever node answers
// there.
func (t *Transport) dial(node uint64, kind byte) (net.Conn, error) {
	to := node
	if anyNode(kind) {
		to = 0
	}
	addr, ok := t.cfg.Addr(node)
	if !ok {
		return nil, fmt.Errorf("replication: node %d has no address", node)
	}
	d := net.Dialer{Timeout: t.cfg.DialTimeout}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if t.cfg.ClientTLS != nil {
		// The peer's certificate must name its address's host.
		cfg := t.cfg.ClientTLS.Clone()
		cfg.ServerName = addrHost(addr)
		tc := tls.Client(c, cfg)
		tc.SetDeadline(time.Now().Add(t.cfg.DialTimeout))
		if err := tc.Handshake(); err != nil {
			c.Close()
			return nil, fmt.Errorf("replication: TLS with node %d: %w", node, err)
		}
		tc.SetDeadline(time.Time{})
		c = tc
	}
	c.SetWriteDeadline(time.Now().Add(t.cfg.WriteTimeout))
	if _, err := c.Write(t.hello(kind, to)); err != nil {
		c.Close()
		return nil, err
	}
	c.SetWriteDeadline(time.Time{})
	return c, nil
}

// dialLoop keeps a connection to p, a node of higher identity, dialing
// again when it drops, with a backoff up to a second.
func (t *Transport) dialLoop(p *peer) {
	backoff := 10 * time.Millisecond
	for {
		c, err := t.dial(p.id, helloMessages)
		if err == nil && t.track(c) {
			p.setConn(c)
			if t.read(c, bufio.NewReader(c), p.id) {
				// It was up: the backoff starts over. A connection the peer
				// drops before sending anything (a proxy in front of a
				// node that is down) backs off as a failed dial does.
				backoff = 10 * time.Millisecond
			}
			p.clearConn(c)
			t.untrack(c)
		}
		if t.forgotten(p) {
			return
		}
		select {
		case <-t.done:
			return
		case <-p.wake:
			backoff = 10 * time.Millisecond
		case <-time.After(backoff):
			backoff = min(2*backoff, time.Second)
		}
	}
}

// forgotten forgets p, unconnected, if nothing was sent to it for
// IdlePeer, and reports whether it did: its loops then end, and a later
// message for it starts it again.
func (t *Transport) forgotten(p *peer) bool {
	if time.Since(time.Unix(0, p.sent.Load())) < t.cfg.IdlePeer {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.peers[p.id] != p {
		return true
	}
	delete(t.mu.peers, p.id)
	close(p.gone)
	t.lg.Debug("forgot an idle node it cannot reach", "peer", p.id)
	return true
}

// askLoop asks p, a node of lower identity, to dial this node whenever
// they are not connected, with a backoff up to a second: p may have
// nothing to send (a learner, a replica not yet a member never
// campaigns), and only it dials.
func (t *Transport) askLoop(p *peer) {
	backoff := 10 * time.Millisecond
	for {
		if p.current() != nil {
			backoff = 10 * time.Millisecond
			select {
			case <-t.done:
				return
			case <-p.lost:
			}
			continue
		}
		if c, err := t.dial(p.id, helloDial); err == nil {
			c.Close()
		}
		if t.forgotten(p) {
			return
		}
		select {
		case <-t.done:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// signal leaves a signal on ch unless one waits already.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (p *peer) setConn(c net.Conn) {
	p.mu.Lock()
	old := p.conn
	p.conn = c
	p.mu.Unlock()
	if old != nil {
		old.Close() // the peer dialed again: the old connection is dead
	}
}

func (p *peer) clearConn(c net.Conn) {
	p.mu.Lock()
	if p.conn == c {
		p.conn = nil
	}
	p.mu.Unlock()
	signal(p.lost)
}

func (p *peer) current() net.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn
}

// write sends p's queued messages, as many as are waiting, in frames of
// at most MaxFrame bytes, which the receiver refuses beyond (the peer is
// assumed to run with the same MaxFrame). A message that fits in no frame
// is dropped.
func (t *Transport) write(p *peer) {
	var (
		batch []outMsg
		frame []byte
		in    []outMsg // the messages in frame
	)
	for {
		select {
		case <-t.done:
			return
		case <-p.gone:
			return
		case m := <-p.q:
			batch = append(batch[:0], m)
		}
	more:
		for len(batch) < 1024 {
			select {
			case m := <-p.q:
				batch = append(batch, m)
			default:
				break more
			}
		}
		c := p.current()
		failed := c == nil
		send := func() {
			if len(in) == 0 {
				return
			}
			if !failed {
				binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
				c.SetWriteDeadline(time.Now().Add(t.cfg.WriteTimeout))
				if _, err := c.Write(frame); err != nil {
					c.Close() // its reader ends, and the dialer dials again
					failed = true
				}
			}
			if failed {
				for _, m := range in {
					t.drop(m.group, p.id)
				}
			}
			frame, in = frame[:0], in[:0]
		}
		for _, m := range batch {
			b, err := proto.Marshal(m.m)
			if err != nil {
				continue
			}
			size := binary.MaxVarintLen64*2 + len(b)
			if 4+size > t.cfg.MaxFrame {
				t.lg.Warn("raft message larger than a frame, dropped", "group", m.group, "to", p.id, "bytes", len(b), "max", t.cfg.MaxFrame)
				t.drop(m.group, p.id)
				continue
			}
			if len(frame)+size > t.cfg.MaxFrame {
				send()
			}
			if len(frame) == 0 {
				frame = append(frame, 0, 0, 0, 0)
			}
			frame = binary.AppendUvarint(frame, m.group)
			frame = appendBytes(frame, b)
			in = append(in, m)
		}
		send()
	}
}

// frameReader reads the frames of a connection into a buffer it reuses
// while frames are small.
type frameReader struct {
	br  *bufio.Reader
	max int
	buf []byte
}

// next returns the next frame, valid until the next call.
func (r *frameReader) next() ([]byte, error) {
	if cap(r.buf) > readBufKeep {
		r.buf = nil // not kept while the connection waits
	}
	var hdr [4]byte
	if _, err := io.ReadFull(r.br, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if int64(n) > int64(r.max) {
		return nil, fmt.Errorf("a frame of %d bytes, over MaxFrame %d", n, r.max)
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	r.buf = r.buf[:n]
	if _, err := io.ReadFull(r.br, r.buf); err != nil {
		return nil, err
	}
	return r.buf, nil
}

// read delivers the messages of frames read from c, sent by node from,
// until c fails, and reports whether any came. A connection that fails
// before its first frame is not news worth a warning: a proxy, or a
// sidecar in front of a node that is down, accepts the dial and then
// drops it, again at each try.
func (t *Transport) read(c net.Conn, br *bufio.Reader, from uint64) (delivered bool) {
	fr := &frameReader{br: br, max: t.cfg.MaxFrame}
	for {
		buf, err := fr.next()
		if err != nil {
			switch {
			case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
			case delivered:
				t.lg.Warn("raft connection closed", "from", from, "err", err)
			default:
				t.lg.Debug("raft connection closed before its first message", "from", from, "err", err)
			}
			return delivered
		}
		delivered = true
		d := decoder{b: buf}
		for len(d.b) > 0 && d.err == nil {
			group := d.uvarint()
			mb := d.bytes()
			if d.err != nil {
				break
			}
			m := &pb.Message{}
			if err := proto.Unmarshal(mb, m); err != nil {
				t.lg.Warn("bad raft message, disconnecting", "from", from, "err", err)
				return
			}
			if m.GetFrom() != from {
				t.Dropped.Add(1)
				t.lg.Warn("raft message that names another sender, dropped", "from", from, "names", m.GetFrom(), "group", group)
				continue
			}
			if g := t.group(group); g != nil {
				if err := g.Step(m); err != nil {
					t.lg.Debug("raft message refused", "group", group, "from", from, "err", err)
				}
			}
		}
		if d.err != nil {
			t.lg.Warn("bad raft frame, disconnecting", "from", from, "err", d.err)
			return
		}
	}
}

// sendSnapshot streams group's snapshot message m on a connection of its
// own, and reports the outcome to the group.
func (t *Transport) sendSnapshot(group uint64, m *pb.Message) {
	g := t.group(group)
	if g == nil {
		return
	}
	err := func() error {
		c, err := t.dial(m.GetTo(), helloSnapshot)
		if err != nil {
			return err
		}
		if !t.track(c) {
			return ErrTransportClosed
		}
		defer t.untrack(c)
		w := &deadlineWriter{c: c, d: t.cfg.WriteTimeout}
		if _, err := w.Write(binary.AppendUvarint(nil, group)); err != nil {
			return err
		}
		if err := g.WriteSnapshot(w, m); err != nil {
			return err
		}
		// The receiver answers once it has applied the snapshot, which
		// takes the time a large shard takes: no deadline but Close.
		var ok [1]byte
		if _, err := io.ReadFull(c, ok[:]); err != nil {
			return err
		}
		if ok[0] != 0 {
			return errors.New("refused by the receiver")
		}
		return nil
	}()
	if err != nil {
		t.lg.Warn("snapshot not sent", "group", group, "to", m.GetTo(), "err", err)
	}
	g.ReportSnapshot(m.GetTo(), err == nil)
}

func (t *Transport) receiveSnapshot(c net.Conn, br *bufio.Reader, from uint64) {
	group, err := binary.ReadUvarint(br)
	if err != nil {
		return
	}
	g := t.group(group)
	if g == nil {
		err = fmt.Errorf("no group %d here", group)
	} else {
		err = g.readSnapshot(br, from)
	}
	res := byte(0)
	if err != nil {
		res = 1
		t.lg.Warn("snapshot not applied", "group", group, "from", from, "err", err)
	}
	c.SetWriteDeadline(time.Now().Add(t.cfg.WriteTimeout))
	c.Write([]byte{res})
}

// deadlineWriter gives each write its own deadline, so that a stream
// that stalls is cut, however long the whole stream takes.
type deadlineWriter struct {
	c net.Conn
	d time.Duration
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	w.c.SetWriteDeadline(time.Now().Add(w.d))
	return w.c.Write(b)
}

// deadlineReader gives each read its own deadline, d from then; none
// when d is 0.
type deadlineReader struct {
	c net.Conn
	d time.Duration
}

func (r *deadlineReader) Read(b []byte) (int, error) {
	var dl time.Time
	if r.d > 0 {
		dl = time.Now().Add(r.d)
	}
	r.c.SetReadDeadline(dl)
	return r.c.Read(b)
}

// Close closes the listeners and every connection and waits for the
// transport's goroutines.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.mu.closed {
		t.mu.Unlock()
		return nil
	}
	t.mu.closed = true
	close(t.done)
	for _, l := range t.mu.ls {
		l.Close()
	}
	for c := range t.mu.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	return nil
}

// RunTicks ticks every group of the transport's node at each value from
// ticks until ctx is done: the production clock of the groups (tests tick
// them themselves).
func (t *Transport) RunTicks(ctx context.Context, ticks <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		}
		t.mu.Lock()
		gs := make([]*Group, 0, len(t.mu.groups))
		for _, g := range t.mu.groups {
			gs = append(gs, g)
		}
		t.mu.Unlock()
		for _, g := range gs {
			g.Tick()
		}
	}
}
