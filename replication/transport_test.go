package replication

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/storage"
)

// newProxy is a link through faultnet's proxy, closed with the test.
func newProxy(t *testing.T, target string) *faultnet.Proxy {
	p, err := faultnet.Listen(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// netNode is a node of the networked tests: its store, transport, and
// one group run by Group.Run.
type netNode struct {
	id     uint64
	store  *storage.Store
	tr     *Transport
	g      *Group
	cancel context.CancelFunc
	done   chan error
}

// netCluster runs nodes whose links go through a proxy per ordered pair
// (links[a][b] is what node a dials to reach node b).
type netCluster struct {
	t     *testing.T
	nodes map[uint64]*netNode
	ls    map[uint64]net.Listener
	links map[uint64]map[uint64]*faultnet.Proxy
	tls   *tls.Config
	keep  uint64
}

func newNetCluster(t *testing.T, ids []uint64, tlsCfg *tls.Config, keep uint64) *netCluster {
	c := &netCluster{t: t, nodes: map[uint64]*netNode{}, ls: map[uint64]net.Listener{}, links: map[uint64]map[uint64]*faultnet.Proxy{}, tls: tlsCfg, keep: keep}
	for _, id := range ids {
		c.listen(id)
	}
	for _, id := range ids {
		c.startNode(id, ids)
	}
	return c
}

func (c *netCluster) listen(id uint64) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	c.ls[id] = l
	for a := range c.ls {
		for _, pair := range [][2]uint64{{a, id}, {id, a}} {
			if pair[0] == pair[1] {
				continue
			}
			if c.links[pair[0]] == nil {
				c.links[pair[0]] = map[uint64]*faultnet.Proxy{}
			}
			if c.links[pair[0]][pair[1]] == nil {
				c.links[pair[0]][pair[1]] = newProxy(c.t, c.ls[pair[1]].Addr().String())
			}
		}
	}
}

func (c *netCluster) startNode(id uint64, bootstrap []uint64) {
	t := c.t
	s, err := storage.Open(filepath.Join(t.TempDir(), "db"), storage.Options{Sync: storage.SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTransport(TransportConfig{
		Node: id,
		Addr: func(to uint64) (string, bool) {
			if p := c.links[id][to]; p != nil {
				return p.Addr(), true
			}
			return "", false
		},
		ClientTLS: c.tls, ServerTLS: c.tls,
	})
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGroup(Config{Group: testGroup, Node: id, Bootstrap: bootstrap, Lower: testLower, Upper: testUpper,
		Store: s, Send: tr.Send, LogKeep: c.keep})
	if err != nil {
		t.Fatal(err)
	}
	tr.Add(g)
	go tr.Serve(c.ls[id])
	ctx, cancel := context.WithCancel(context.Background())
	n := &netNode{id: id, store: s, tr: tr, g: g, cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- g.Run(ctx) }()
	c.nodes[id] = n
	t.Cleanup(func() {
		cancel()
		<-n.done
		tr.Close()
		s.Close()
	})
}

// partition cuts (or heals) every link of node id.
func (c *netCluster) partition(id uint64, cut bool) {
	for a, m := range c.links {
		for b, p := range m {
			if a == id || b == id {
				if cut {
					p.Cut()
				} else {
					p.Heal()
				}
			}
		}
	}
}

// waitFor ticks every node's group, a tick each 5ms, until cond
// holds; the deadline only bounds a hang.
func (c *netCluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for !cond() {
		select {
		case <-deadline:
			c.t.Fatalf("waiting for %s", what)
		case <-tick.C:
		}
		for _, n := range c.nodes {
			n.g.Tick()
		}
	}
}

func (c *netCluster) leader(among ...uint64) uint64 {
	var lead uint64
	for _, id := range among {
		st := c.nodes[id].g.Status()
		if st.Leader == 0 || (lead != 0 && st.Leader != lead) {
			return 0
		}
		lead = st.Leader
	}
	if c.nodes[lead] == nil || !c.nodes[lead].g.Status().Serving {
		return 0
	}
	return lead
}

// onLeader calls f with the leader among ids until it is done without
// ErrNotLeader (leadership may move meanwhile), and returns that leader.
func (c *netCluster) onLeader(ids []uint64, f func(lead uint64) error) uint64 {
	c.t.Helper()
	for range 100 {
		var lead uint64
		c.waitFor("a leader", func() bool { lead = c.leader(ids...); return lead != 0 })
		err := f(lead)
		if err == nil {
			return lead
		}
		if !errors.Is(err, ErrNotLeader) {
			c.t.Fatal(err)
		}
	}
	c.t.Fatal("no leader took it in 100 tries")
	return 0
}

// propose proposes a round on the leader among ids until one is applied:
// over a real network, with ticks paced by a timer, leadership may move
// meanwhile (the rounds are idempotent puts).
func (c *netCluster) propose(ids []uint64, ops ...Op) uint64 {
	c.t.Helper()
	for range 100 {
		var ch <-chan error
		lead := c.onLeader(ids, func(lead uint64) (err error) {
			ch, err = c.nodes[lead].g.Propose(ops)
			return err
		})
		var perr error
		c.waitFor("the proposal to be answered", func() bool {
			select {
			case perr = <-ch:
				return true
			default:
				return false
			}
		})
		if perr == nil {
			return lead
		}
		if !errors.Is(perr, ErrProposalLost) {
			c.t.Fatal(perr)
		}
	}
	c.t.Fatal("no proposal applied in 100 tries")
	return 0
}

// addLearner has the leader among ids add node id as a learner, and
// returns that leader.
func (c *netCluster) addLearner(ids []uint64, id uint64) uint64 {
	cc := &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: pb.ConfChangeAddLearnerNode.Enum(), NodeId: proto.Uint64(id)}}}
	return c.onLeader(ids, func(lead uint64) error { return c.nodes[lead].g.ChangeMembers(cc) })
}

func (c *netCluster) caughtUp(ids ...uint64) func() bool {
	return func() bool {
		a := c.nodes[ids[0]].g.Status().Applied
		for _, id := range ids[1:] {
			if c.nodes[id].g.Status().Applied != a {
				return false
			}
		}
		return true
	}
}

func (c *netCluster) records(id uint64) map[string]string {
	m := map[string]string{}
	if err := c.nodes[id].store.Scan(testLower, testUpper, func(k, v []byte) bool { m[string(k)] = string(v); return true }); err != nil {
		c.t.Fatal(err)
	}
	return m
}

// Over real connections, through proxies: a leader elected, rounds
// replicated, and a leader cut off from the others by a partition steps
// down while they elect another; healed, it follows.
func TestTransportPartitionedLeader(t *testing.T) {
	ids := []uint64{1, 2, 3}
	c := newNetCluster(t, ids, nil, 0)
	var lead uint64
	c.waitFor("a leader", func() bool { lead = c.leader(ids...); return lead != 0 })
	for i := range 20 {
		lead = c.propose(ids, put(testKey(i), fmt.Sprint(i)))
	}
	c.partition(lead, true)
	rest := others(ids, lead)
	var next uint64
	c.waitFor("a new leader and the old one stepping down", func() bool {
		next = c.leader(rest...)
		return next != 0 && next != lead && c.nodes[lead].g.Status().Role != "leader"
	})
	next = c.propose(rest, put(testKey(100), "after the partition"))
	c.partition(lead, false)
	c.waitFor("the old leader to follow", func() bool { return c.leader(ids...) == next && c.caughtUp(ids...)() })
	want := c.records(next)
	if len(want) != 21 {
		t.Fatalf("the leader holds %d records, want 21", len(want))
	}
	for _, id := range ids {
		if got := c.records(id); len(got) != len(want) {
			t.Fatalf("node %d holds %d records, want %d", id, len(got), len(want))
		}
	}
}

// With TLS on every link, a replica added to a group whose log is
// truncated catches up by a snapshot streamed over its own connection.
func TestTransportTLSAndSnapshot(t *testing.T) {
	ids := []uint64{1, 2, 3}
	c := newNetCluster(t, ids, testTLS(t), 3)
	var lead uint64
	c.waitFor("a leader", func() bool { lead = c.leader(ids...); return lead != 0 })
	for i := range 30 {
		lead = c.propose(ids, put(testKey(i), fmt.Sprint(i)), put(testKey(1000+i), "x"))
	}
	if first, _ := c.nodes[lead].g.log.FirstIndex(); first <= 2 {
		t.Fatalf("log not truncated: first index %d", first)
	}
	c.listen(4)
	c.startNode(4, nil)
	lead = c.addLearner(ids, 4)
	c.waitFor("the learner to catch up", c.caughtUp(lead, 4))
	want, got := c.records(lead), c.records(4)
	if len(got) != 60 || len(got) != len(want) {
		t.Fatalf("the learner holds %d records, the leader %d, want 60", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("record %q = %q on the learner, %q on the leader", k, got[k], v)
		}
	}
}

// A peer that cannot be reached costs its messages, never a blocked
// sender: Send queues or drops, and Raft is told.
func TestTransportDropsWhenUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there
	tr, err := NewTransport(TransportConfig{Node: 1, Queue: 1, Addr: func(uint64) (string, bool) { return addr, true }})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	msgs := make([]*pb.Message, 100)
	for i := range msgs {
		msgs[i] = &pb.Message{Type: pb.MsgHeartbeat.Enum(), To: proto.Uint64(2), From: proto.Uint64(1)}
	}
	tr.Send(testGroup, msgs)
	deadline := time.After(30 * time.Second)
	for tr.Dropped.Load() != 100 {
		select {
		case <-deadline:
			t.Fatalf("dropped %d of 100", tr.Dropped.Load())
		case <-time.After(time.Millisecond):
		}
	}
	// A connection that is not sluice's Raft is refused.
	if _, err := readHello(bufioString("GET / HTTP/1.1\r\n\r\n")); err == nil {
		t.Fatal("an HTTP request passed for a hello")
	}
}

// testTLS returns a configuration with a fresh certificate for
// 127.0.0.1 from a fresh CA that both ends trust.
func testTLS(t *testing.T) *tls.Config {
	pki := newTestPKI(t)
	return &tls.Config{
		Certificates: []tls.Certificate{pki.cert(t, []net.IP{net.IPv4(127, 0, 0, 1)})},
		RootCAs:      pki.pool, ClientCAs: pki.pool, MinVersion: tls.VersionTLS13,
	}
}

func bufioString(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }

// The writer never sends a frame larger than MaxFrame, which the receiver
// would refuse by disconnecting, dropping the messages of every group on
// the connection, again at each retry: the messages waiting for a peer
// go in as many frames as they need, and one message that cannot fit in
// any frame is dropped alone.
func TestTransportFramesFitMaxFrame(t *testing.T) {
	const maxFrame = 64 << 10
	tr, err := NewTransport(TransportConfig{Node: 1, MaxFrame: maxFrame, Addr: func(uint64) (string, bool) { return "", false }})
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{id: 2, q: make(chan outMsg, 64)}
	msg := func(i, size int) outMsg {
		return outMsg{group: testGroup, m: &pb.Message{Type: pb.MsgApp.Enum(), To: proto.Uint64(2), From: proto.Uint64(1),
			Index: proto.Uint64(uint64(i)), Entries: []*pb.Entry{{Data: make([]byte, size)}}}}
	}
	const n = 20
	for i := range n {
		p.q <- msg(i, 8<<10) // n of them make 160 KiB
		if i == n/2 {
			p.q <- msg(-1, maxFrame) // fits no frame
		}
	}
	local, remote := net.Pipe()
	p.conn = local
	done := make(chan struct{})
	go func() { defer close(done); tr.write(p) }()
	defer func() { tr.Close(); local.Close(); <-done }()

	br := bufio.NewReader(remote)
	var got []uint64
	for len(got) < n {
		var hdr [4]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			t.Fatal(err)
		}
		size := binary.BigEndian.Uint32(hdr[:])
		if size > maxFrame {
			t.Fatalf("a frame of %d bytes, over MaxFrame %d", size, maxFrame)
		}
		d := decoder{b: make([]byte, size)}
		if _, err := io.ReadFull(br, d.b); err != nil {
			t.Fatal(err)
		}
		for len(d.b) > 0 && d.err == nil {
			d.uvarint()
			m := &pb.Message{}
			if err := proto.Unmarshal(d.bytes(), m); err != nil {
				t.Fatal(err)
			}
			got = append(got, m.GetIndex())
		}
		if d.err != nil {
			t.Fatal(d.err)
		}
	}
	for i, idx := range got {
		if idx != uint64(i) {
			t.Fatalf("messages in order %v, want 0 to %d", got, n-1)
		}
	}
	if d := tr.Dropped.Load(); d != 1 {
		t.Fatalf("dropped %d messages, want the one too large", d)
	}
}

// A learner whose identity is lower than every member's never campaigns,
// so it has nothing to send until it hears from the leader; the leader,
// whose identity is higher, must still get a connection to it.
func TestTransportLearnerBelowLeader(t *testing.T) {
	ids := []uint64{2, 3, 4}
	c := newNetCluster(t, ids, nil, 0)
	lead := c.propose(ids, put(testKey(1), "a"))
	c.listen(1)
	c.startNode(1, nil)
	lead = c.addLearner(ids, 1)
	c.waitFor("the learner to catch up", func() bool {
		return c.nodes[1].g.Status().Applied == c.nodes[lead].g.Status().Applied
	})
	if got := c.records(1)[string(testKey(1))]; got != "a" {
		t.Fatalf("record %q on the learner, want \"a\"", got)
	}
}

// testPKI is a CA and the certificates it signs.
type testPKI struct {
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &testPKI{ca: ca, key: key, pool: pool}
}

// cert returns a certificate for the names given, for servers and
// clients alike.
func (p *testPKI) cert(t *testing.T, ips []net.IP, dns ...string) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "sluice test node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: ips, DNSNames: dns, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// A node's connection is taken only from a node of its configuration
// whose certificate, from the nodes' CA, names that node's address: a
// client without a certificate, with one for another host or from
// another CA, a hello naming an unknown node or the node itself, are
// refused before they touch anything, and never close the connection
// that the real peer holds.
func TestTransportAuthenticatesPeers(t *testing.T) {
	pki := newTestPKI(t)
	loopback := []net.IP{net.IPv4(127, 0, 0, 1)}
	tr, l := serveTransport(t, TransportConfig{
		Node:      2,
		Addr:      func(n uint64) (string, bool) { return "127.0.0.1:1", n == 1 || n == 3 }, // never dialed here
		ServerTLS: &tls.Config{Certificates: []tls.Certificate{pki.cert(t, loopback)}, ClientCAs: pki.pool, MinVersion: tls.VersionTLS13},
		ClientTLS: &tls.Config{Certificates: []tls.Certificate{pki.cert(t, loopback)}, RootCAs: pki.pool, MinVersion: tls.VersionTLS13},
	})

	connect := func(cert *tls.Certificate, kind byte, from uint64) net.Conn {
		cfg := &tls.Config{RootCAs: pki.pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		c, err := tls.Dial("tcp", l.Addr().String(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second)) // bounds a hang only
		hello := testHello(kind, from, 2, 0)
		if kind == helloSnapshot {
			hello = binary.AppendUvarint(hello, testGroup)
		}
		c.Write(hello) // an error shows in the reads below
		return c
	}
	realCert := pki.cert(t, loopback)
	real := connect(&realCert, helloMessages, 1)
	p := tr.peer(1)
	waitUntil(t, "the real peer's connection to be taken", func() bool { return p.current() != nil })
	// alive checks that the real peer still has its connection: a
	// message sent to it arrives.
	alive := func(after string) {
		t.Helper()
		hb := &pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(2), To: proto.Uint64(1), Term: proto.Uint64(1)}
		tr.Send(testGroup, []*pb.Message{hb})
		var hdr [4]byte
		if _, err := io.ReadFull(real, hdr[:]); err != nil {
			t.Fatalf("after %s, the real peer's connection: %v", after, err)
		}
		if _, err := io.ReadFull(real, make([]byte, binary.BigEndian.Uint32(hdr[:]))); err != nil {
			t.Fatalf("after %s, the real peer's connection: %v", after, err)
		}
	}
	alive("connecting")

	impostor := pki.cert(t, nil, "impostor.test")
	stranger := newTestPKI(t).cert(t, loopback)
	for _, tc := range []struct {
		name string
		cert *tls.Certificate
		kind byte
		from uint64
	}{
		{"no certificate", nil, helloMessages, 1},
		{"a certificate for another host", &impostor, helloMessages, 1},
		{"a certificate from another CA", &stranger, helloMessages, 1},
		{"an unknown node", &realCert, helloMessages, 99},
		{"the node itself", &realCert, helloMessages, 2},
		{"a snapshot from an unknown node", &realCert, helloSnapshot, 99},
		{"a snapshot from the node itself", &realCert, helloSnapshot, 2},
		{"node 0", &realCert, helloSnapshot, 0},
	} {
		refused(t, tc.name, connect(tc.cert, tc.kind, tc.from))
		alive(tc.name)
	}
}

// serveTransport serves a transport of cfg on a listener of its own,
// until the test ends.
func serveTransport(t *testing.T, cfg TransportConfig) (*Transport, net.Listener) {
	tr, err := NewTransport(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go tr.Serve(l)
	t.Cleanup(func() { tr.Close() })
	return tr, l
}

// waitUntil polls cond until it holds; the deadline only bounds a hang.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-deadline:
			t.Fatalf("waiting for %s", what)
		case <-time.After(time.Millisecond):
		}
	}
}

// refused fails the test unless the other end closes c without a word.
func refused(t *testing.T, what string, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) // bounds a hang only
	n, err := c.Read(make([]byte, 1))
	var ne net.Error
	if n > 0 || err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("%s: the connection was taken (read %d bytes, %v)", what, n, err)
	}
}

// Connections from other nodes are bounded, handshakes included, and so
// are the snapshots received at once: one more is closed at once.
func TestTransportBoundsConnections(t *testing.T) {
	tr, l := serveTransport(t, TransportConfig{
		Node: 2, Addr: func(n uint64) (string, bool) { return "127.0.0.1:1", n == 1 },
		MaxConns: 3, MaxSnapshots: 1,
		DialTimeout: time.Hour, WriteTimeout: time.Hour, // hellos and snapshots that never come stay open
	})

	dial := func(hello []byte) net.Conn {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(hello); err != nil {
			t.Fatal(err)
		}
		return c
	}
	snap := testHello(helloSnapshot, 1, 2, 0)
	dial(snap) // a snapshot whose group never comes: it holds its slot
	waitUntil(t, "the first snapshot to be taken", func() bool { return len(tr.snapSlots) == 1 })
	refused(t, "a second snapshot", dial(snap))
	dial(nil) // a connection whose hello never comes
	dial(nil)
	refused(t, "a fourth connection", dial(nil))
}

// A large frame's buffer is let go after it: a connection that carried
// one burst keeps no more than readBufKeep between frames.
func TestFrameReaderShrinks(t *testing.T) {
	var stream []byte
	for _, n := range []int{100, 1 << 20, 100} {
		stream = binary.BigEndian.AppendUint32(stream, uint32(n))
		stream = append(stream, make([]byte, n)...)
	}
	fr := &frameReader{br: bufio.NewReader(bytes.NewReader(stream)), max: 2 << 20}
	for i, want := range []int{100, 1 << 20, 100} {
		b, err := fr.next()
		if err != nil || len(b) != want {
			t.Fatalf("frame %d: %d bytes, %v; want %d", i, len(b), err, want)
		}
		if i == 2 && cap(fr.buf) > readBufKeep {
			t.Fatalf("after the large frame, the reader keeps a buffer of %d bytes, over %d", cap(fr.buf), readBufKeep)
		}
	}
}

// A peer whose address accepts the dial and then drops it at once (a
// proxy, or a sidecar, in front of a node that is down) is not a
// connection that was up: no warning for each drop, and the dialer backs
// off as from a refused dial, instead of dialing again every 10ms with a
// warning each time.
func TestTransportQuietOnAPeerThatDropsAtOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.(*net.TCPConn).SetLinger(0) // a reset, as a proxy with no backend sends
			c.Close()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	var logs bytes.Buffer
	var mu sync.Mutex
	lg := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tr, err := NewTransport(TransportConfig{Node: 1, Logger: lg, Addr: func(uint64) (string, bool) { return l.Addr().String(), true }})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tr.Send(testGroup, []*pb.Message{{Type: pb.MsgHeartbeat.Enum(), To: proto.Uint64(2), From: proto.Uint64(1)}})
	for range 4 {
		select {
		case <-accepted:
		case <-time.After(30 * time.Second):
			t.Fatal("the transport did not dial node 2 again")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), "raft connection closed") {
		t.Errorf("a connection dropped before its first message was logged as a warning:\n%s", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// testHello is the hello of a connection of kind from node from to node
// to, of the cluster configuration cluster.
func testHello(kind byte, from, to, cluster uint64) []byte {
	return (&Transport{cfg: TransportConfig{Node: from, Cluster: cluster}}).hello(kind, to)
}
