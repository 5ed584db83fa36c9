package clusternode

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/counterhit"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
)

// Keyless requests in cluster mode. A HIT (over RESP or the divvy line
// protocol) has no client key: it is matched against the rules on the node
// that receives it, and each counted rule's counter lives in the slot of
// its own key (rule identity and actor). When another node owns that slot,
// the hit of that one counter is forwarded to it as SLUICE.COUNTERHIT over
// RESP, on one connection to each owner with a timeout (over TLS when the
// nodes serve RESP over TLS: Options.ForwardTLS), and the owner applies it
// under the same rule (the nodes must run the same --policy and
// --rls-config; the owner checks the rule's identity). The engine asks
// through engine.Cluster, which Node implements: one call in its
// Round.HitRule.
//
// The owner applies exactly what the receiving node would: the rule, by
// position, with its algorithm; the counter ID, from the key; the limit
// the receiving node resolved from the request (r.Limit: the request's
// quota, which the owner cannot see, or creditLimit), unless the owner
// has a per-actor override of the counter's actor (each node keeps its
// own: engine's nodeoverrides.go); the hit count (0 reads without
// counting); and the receiving node's now. It answers the whole
// policy.Outcome but Quota and Rule, which the receiving node sets, and
// Rate, the limit it applied, only when that is not the one sent.

// DefaultForwardTimeout bounds one forwarded counter hit, connecting
// included.
const DefaultForwardTimeout = 2 * time.Second

// DefaultForwardQueue is how many counter hits may wait for their
// owner's replies on the connection to it (Config.ForwardQueue).
const DefaultForwardQueue = 1024

// forwarder holds one connection to each node hits were forwarded to,
// shared by all of them: RESP is pipelined, so every hit is written on it
// as it comes (those that come while another is written go together in
// one write) and the replies come back in the order of the hits. One
// connection per pair of nodes, rather than one per hit in flight, keeps
// the owner's clients, TLS handshakes and system calls to a few however
// many hits are forwarded at once.
type forwarder struct {
	// tls is Options.ForwardTLS, set before the node serves.
	tls func() (*tls.Config, error)
	// queue is Config.ForwardQueue; zero means DefaultForwardQueue.
	queue int

	mu struct {
		sync.Mutex
		peers  map[string]*peer
		closed bool
	}
	stats forwardCounters
}

// forwardCounters are what ForwardMetrics reads.
type forwardCounters struct {
	ok, refused, failed, dials atomic.Uint64
	inFlight                   atomic.Int64
}

// ForwardStats are a node's forwarded counter hits (ForwardMetrics).
type ForwardStats struct {
	// OK, Refused and Failed count the hits forwarded: the owner's
	// outcome, an error the owner answered, and no answer (the owner
	// unreachable or slower than the timeout, a full queue, a shutdown)
	// or no owner (CLUSTERDOWN: no node serves the slot).
	OK, Refused, Failed uint64
	// InFlight is the hits waiting for their owners' replies now.
	InFlight int64
	// Dials counts the connections opened to other nodes: one per node,
	// and one more each time one failed.
	Dials uint64
}

// ForwardMetrics returns the node's forwarded counter hits; zero for a
// nil Node (standalone).
func (s *Node) ForwardMetrics() ForwardStats {
	if s == nil {
		return ForwardStats{}
	}
	c := &s.fwd.stats
	return ForwardStats{OK: c.ok.Load(), Refused: c.refused.Load(), Failed: c.failed.Load(), InFlight: c.inFlight.Load(), Dials: c.dials.Load()}
}

// errForwarderClosed is what a hit forwarded during a shutdown gets.
var errForwarderClosed = errors.New("this node is shutting down")

// peer is the forwarder's link to one node: its connection, when one is
// open, and the room left in its queue.
type peer struct {
	addr string
	// room holds a token for each hit in flight to the node, so that at
	// most cap(room) wait for its replies; the others wait for room.
	room chan struct{}

	mu      sync.Mutex
	conn    *fwdConn // nil until dialed, and again once it failed
	dialing *dialing // the dial under way, nil when none
}

// dialing is a dial that hits forwarded meanwhile wait for.
type dialing struct {
	done chan struct{}
	err  error
}

// fwdConn is a connection to a node, its requests written in order by
// its writer goroutine (writeRequests) and its replies read in order by
// its reader goroutine (readReplies). The fields but nc, r, wake and
// timeout are guarded by the peer's mu.
type fwdConn struct {
	nc net.Conn
	r  *bufio.Reader
	// wake tells the writer that out has requests, or that the
	// connection failed.
	wake chan struct{}
	// timeout is the forward timeout: a write the node does not take
	// within it fails the connection.
	timeout time.Duration
	// out are the requests queued and not yet written; spare is the
	// buffer the writer hands back.
	out, spare []byte
	pending    callQueue // the hits written or queued, in order
	err        error     // why the connection failed; nil while it serves
}

// callQueue is the hits waiting for their replies, oldest first: a slice
// taken from its head, moved back to its start once half of it is taken,
// so that it holds at most about twice the hits in flight however long
// it never empties.
type callQueue struct {
	calls []*fwdCall
	head  int
}

func (q *callQueue) len() int { return len(q.calls) - q.head }

// first returns the oldest call; the queue must not be empty.
func (q *callQueue) first() *fwdCall { return q.calls[q.head] }

func (q *callQueue) push(c *fwdCall) {
	if q.head > 0 && q.head >= len(q.calls)/2 {
		n := copy(q.calls, q.calls[q.head:])
		clear(q.calls[n:])
		q.calls, q.head = q.calls[:n], 0
	}
	q.calls = append(q.calls, c)
}

// pop takes the oldest call; the queue must not be empty.
func (q *callQueue) pop() *fwdCall {
	c := q.calls[q.head]
	q.calls[q.head] = nil
	q.head++
	if q.head == len(q.calls) {
		q.calls, q.head = q.calls[:0], 0
	}
	return c
}

// fwdCall is one forwarded hit: its request's arguments (with room for
// the numbers) and its deadline, then its reply or error. The calls are
// pooled: a forwarded hit allocates nothing.
type fwdCall struct {
	args     [][]byte
	nums     [4][20]byte
	deadline time.Time
	done     chan struct{}
	rep      counterhit.Reply
	err      error
}

var fwdCalls = sync.Pool{New: func() any { return &fwdCall{args: make([][]byte, 0, 6), done: make(chan struct{}, 1)} }}

// ForwardCounter implements engine.Cluster: when another node owns the
// slot of the counter key key (keyspace.AppendRuleKey's, any kind), it
// has that node apply hits of r under limit at now (unix ns) and returns
// its outcome with forwarded true. Otherwise it returns forwarded false and
// the engine applies the hit here.
func (s *Node) ForwardCounter(key []byte, r *policy.Rule, limit, hits, now int64) (forwarded bool, out policy.Outcome, err error) {
	slot, _ := keyspace.RecordSlot(key)
	v := s.view.Load()
	o := v.owner[slot]
	switch {
	case o == v.self && o != 0 && !s.SlotMigrating(slot):
		return false, out, nil
	case o == 0:
		s.fwd.stats.failed.Add(1)
		return true, out, forwardErr("CLUSTERDOWN", "Hash slot not served")
	}
	out, err = s.forwardHit(v.top.Nodes[o-1].Addr, slot, key, r, limit, hits, now)
	return true, out, err
}

// forwardHit sends SLUICE.COUNTERHIT to addr, following a MOVED and
// retrying a TRYAGAIN (a slot being handed over) until the timeout.
func (s *Node) forwardHit(addr string, slot uint16, key []byte, r *policy.Rule, limit, hits, now int64) (policy.Outcome, error) {
	c := fwdCalls.Get().(*fwdCall)
	defer fwdCalls.Put(c)
	c.deadline = time.Now().Add(s.forwardTimeout())
	c.args = append(c.args[:0], counterHitCmd, key, strconv.AppendInt(c.nums[0][:0], int64(r.Pos), 10), strconv.AppendInt(c.nums[1][:0], now, 10),
		strconv.AppendInt(c.nums[2][:0], limit, 10), strconv.AppendInt(c.nums[3][:0], hits, 10))
	defer clear(c.args) // the pool keeps no key
	st := &s.fwd.stats
	for hops := 0; ; hops++ {
		if err := s.fwd.call(s, addr, c); err != nil {
			st.failed.Add(1)
			return policy.Outcome{}, forwardErr("", fmt.Sprintf("cluster: forwarding a counter of slot %d to its owner %s failed: %v", slot, addr, resp.OneLine(err.Error())))
		}
		reply := c.rep
		if reply.Err == nil {
			st.ok.Add(1)
			return reply.Outcome(limit), nil
		}
		var re resp.Error
		if !errors.As(reply.Err, &re) {
			st.refused.Add(1)
			return policy.Outcome{}, reply.Err
		}
		msg := string(re)
		switch {
		case strings.HasPrefix(msg, "MOVED ") && hops < 3:
			if f := strings.Fields(msg); len(f) == 3 {
				addr = f[2]
				continue
			}
		case strings.HasPrefix(msg, "TRYAGAIN") && time.Now().Before(c.deadline):
			time.Sleep(5 * time.Millisecond)
			continue
		}
		st.refused.Add(1)
		return policy.Outcome{}, ownerErr(msg)
	}
}

var counterHitCmd = []byte("SLUICE.COUNTERHIT")

// forwardErr is a counter hit the cluster could not apply for reasons
// that are not the request's: the counter's owner unreachable or slower
// than the forward timeout, its slot not served, or the owner refusing
// the hit (another rule set, a store that takes no writes, a shutdown).
// Front ends answer it as they answer a store that is unavailable
// (Envoy's UNAVAILABLE, /check's 503), not as a bad request; code is a
// RESP error code other than ERR, or "".
func forwardErr(code, msg string) error {
	return &errs.Error{Kind: errs.Forward, Code: code, Msg: msg}
}

// ownerErr is the error of an owner's error reply msg (without its "-"),
// as this node would have answered it: the request's when the hit itself
// is what the rule cannot take (policy.ErrHits or arithmetic out of
// range, the words of rules.Err), else a forwarding failure. The owner's
// reply is RESP on the wire between nodes (SLUICE.COUNTERHIT), so its code
// and words are all there is to go by.
func ownerErr(msg string) error {
	code, text, _ := strings.Cut(msg, " ")
	kind := errs.Forward
	if code == "ERR" {
		code = ""
		if strings.HasPrefix(text, "hits: ") || strings.HasPrefix(text, "rule arithmetic out of range") {
			kind = errs.Request
		}
	}
	return &errs.Error{Kind: kind, Code: code, Msg: text}
}

// DefaultMaxClockSkew is how far SLUICE.COUNTERHIT's now may be from the
// owner's clock before it is clamped.
const DefaultMaxClockSkew = 5 * time.Second

func (s *Node) maxClockSkew() time.Duration {
	if d := s.cfg.MaxClockSkew; d > 0 {
		return d
	}
	return DefaultMaxClockSkew
}

func (s *Node) forwardTimeout() time.Duration {
	if t := s.cfg.ForwardTimeout; t > 0 {
		return t
	}
	return DefaultForwardTimeout
}

// call sends c.args to addr and waits for the reply, into c.rep, or
// for c.deadline: a hit waits for room in the node's queue, for the dial
// when there is no connection, then for its reply.
func (f *forwarder) call(s *Node, addr string, c *fwdCall) error {
	p, err := f.peer(addr)
	if err != nil {
		return err
	}
	select {
	case p.room <- struct{}{}:
	default:
		t := time.NewTimer(time.Until(c.deadline))
		select {
		case p.room <- struct{}{}:
			t.Stop()
		case <-t.C:
			return fmt.Errorf("timed out waiting for room: %d hits already wait for this node's replies (--cluster-forward-queue)", cap(p.room))
		}
	}
	f.stats.inFlight.Add(1)
	defer func() {
		<-p.room
		f.stats.inFlight.Add(-1)
	}()
	conn, err := p.connect(f, s, c.deadline)
	if err != nil {
		return err
	}
	// p.mu is held, and conn serves: a failed connection is no longer p's.
	if !time.Now().Before(c.deadline) {
		p.mu.Unlock()
		return os.ErrDeadlineExceeded
	}
	c.err = nil
	conn.out = resp.AppendCommand(conn.out, c.args)
	if conn.pending.len() == 0 {
		// The reader waits for this reply first.
		_ = conn.nc.SetReadDeadline(c.deadline)
	}
	conn.pending.push(c)
	p.mu.Unlock()
	wake(conn.wake)
	<-c.done
	return c.err
}

// wake signals ch without waiting: one signal pending is enough.
func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// writeRequests writes conn.out, what was queued since the last write
// in one write, until the connection fails. A write has the forward
// timeout of its own, not a hit's: a node that takes no byte for that
// long fails the connection.
func (p *peer) writeRequests(conn *fwdConn) {
	for range conn.wake {
		p.mu.Lock()
		for len(conn.out) > 0 && conn.err == nil {
			buf := conn.out
			conn.out = conn.spare[:0]
			p.mu.Unlock()
			_ = conn.nc.SetWriteDeadline(time.Now().Add(conn.timeout))
			_, err := conn.nc.Write(buf)
			p.mu.Lock()
			conn.spare = buf[:0]
			if err != nil {
				p.failLocked(conn, err)
			}
		}
		failed := conn.err != nil
		p.mu.Unlock()
		if failed {
			return
		}
	}
}

// readReplies hands each reply read on conn to the hit at the head of its
// queue, until the connection fails: a read error (the oldest hit's
// deadline passed: the read deadline is always the head's), or a reply
// that is not one.
func (p *peer) readReplies(conn *fwdConn) {
	for {
		rep, err := counterhit.ReadReply(conn.r)
		p.mu.Lock()
		if conn.err != nil { // failed meanwhile, its hits with it
			p.mu.Unlock()
			return
		}
		if err == nil && conn.pending.len() == 0 {
			err = errors.New("a reply to no request")
		}
		if err != nil {
			p.failLocked(conn, refusedCertHint(err))
			p.mu.Unlock()
			return
		}
		c := conn.pending.pop()
		if conn.pending.len() > 0 {
			_ = conn.nc.SetReadDeadline(conn.pending.first().deadline)
		} else {
			_ = conn.nc.SetReadDeadline(time.Time{}) // idle: only a close is read
		}
		p.mu.Unlock()
		c.rep = rep
		c.done <- struct{}{}
	}
}

// failLocked closes conn for err, fails the hits waiting on it, and has
// the next hit dial again. p.mu must be held. The close runs apart: over
// TLS it may wait to send its alert to a node that reads nothing.
func (p *peer) failLocked(conn *fwdConn, err error) {
	if conn.err != nil {
		return
	}
	conn.err = err
	go conn.nc.Close()
	wake(conn.wake) // the writer leaves
	for conn.pending.len() > 0 {
		c := conn.pending.pop()
		c.err = err
		c.done <- struct{}{}
	}
	if p.conn == conn {
		p.conn = nil
	}
}

// peer returns the forwarder's link to addr.
func (f *forwarder) peer(addr string) (*peer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mu.closed {
		return nil, errForwarderClosed
	}
	p := f.mu.peers[addr]
	if p == nil {
		if f.mu.peers == nil {
			f.mu.peers = make(map[string]*peer)
		}
		q := f.queue
		if q <= 0 {
			q = DefaultForwardQueue
		}
		p = &peer{addr: addr, room: make(chan struct{}, q)}
		f.mu.peers[addr] = p
	}
	return p, nil
}

// connect returns p's connection with p.mu held, dialing one when there
// is none. The dial runs on its own, with a timeout of its own, and hits
// that come meanwhile wait for it, each until its own deadline; they get
// its error.
func (p *peer) connect(f *forwarder, s *Node, deadline time.Time) (*fwdConn, error) {
	p.mu.Lock()
	for p.conn == nil {
		d := p.dialing
		if d == nil {
			d = &dialing{done: make(chan struct{})}
			p.dialing = d
			go p.dial(f, s, d)
		}
		p.mu.Unlock()
		select {
		case <-d.done:
		default:
			t := time.NewTimer(time.Until(deadline))
			select {
			case <-d.done:
				t.Stop()
			case <-t.C:
				return nil, fmt.Errorf("connecting: %w", os.ErrDeadlineExceeded)
			}
		}
		if d.err != nil {
			return nil, d.err
		}
		p.mu.Lock()
	}
	return p.conn, nil
}

// dial connects p for d, and starts the connection's reader and writer.
func (p *peer) dial(f *forwarder, s *Node, d *dialing) {
	timeout := s.forwardTimeout()
	conn, err := f.dial(s, p.addr, time.Now().Add(timeout))
	f.mu.Lock()
	if err == nil && f.mu.closed {
		conn.nc.Close()
		err = errForwarderClosed
	}
	p.mu.Lock()
	f.mu.Unlock()
	p.dialing, d.err = nil, err
	if err == nil {
		conn.wake, conn.timeout = make(chan struct{}, 1), timeout
		p.conn = conn
		f.stats.dials.Add(1)
		go p.readReplies(conn)
		go p.writeRequests(conn)
	}
	p.mu.Unlock()
	close(d.done)
}

// dial connects to addr and authenticates with this node's password (the
// nodes of a cluster share it).
func (f *forwarder) dial(s *Node, addr string, deadline time.Time) (*fwdConn, error) {
	d := net.Dialer{Deadline: deadline}
	var nc net.Conn
	var err error
	if f.tls != nil {
		nc, err = f.dialTLS(&d, addr)
	} else {
		nc, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	c := &fwdConn{nc: nc, r: bufio.NewReaderSize(nc, 4096)}
	if s.pass != "" {
		_ = nc.SetDeadline(deadline)
		c.out = resp.AppendCommand(c.out[:0], [][]byte{[]byte("AUTH"), []byte(s.pass)})
		if _, err := nc.Write(c.out); err != nil {
			nc.Close()
			return nil, err
		}
		c.out = c.out[:0]
		line, err := c.r.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "+OK") {
			nc.Close()
			if err == nil {
				err = fmt.Errorf("AUTH refused: %s (the nodes of a cluster must share --requirepass)", strings.TrimSpace(line))
			}
			return nil, refusedCertHint(err)
		}
		_ = nc.SetDeadline(time.Time{})
	}
	return c, nil
}

// refusedCertHint adds to err, when it is an alert the other node sent,
// what usually makes a node refuse another's certificate. Over TLS 1.3 a
// server checks the client's certificate after the client's handshake
// is done, so its refusal arrives at the first read, not at the dial.
func refusedCertHint(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" {
		return fmt.Errorf("%w (the owner refused this node's certificate: every node's certificate must be signed by the --tls-ca of the others and allow client authentication)", err)
	}
	return err
}

// dialTLS connects to addr over TLS, the handshake within d's deadline.
// The owner's certificate must name the host of its address, as
// CLUSTER SLOTS gives it: the address its clients verify it by.
func (f *forwarder) dialTLS(d *net.Dialer, addr string) (net.Conn, error) {
	cfg, err := f.tls()
	if err != nil {
		return nil, err
	}
	if cfg.ServerName, _, err = net.SplitHostPort(addr); err != nil {
		return nil, err
	}
	nc, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	var ve *tls.CertificateVerificationError
	if errors.As(err, &ve) {
		return nil, fmt.Errorf("%w (every node's certificate must be signed by --tls-ca and name the host of its address)", err)
	}
	return nc, err
}

// closeAll closes the connections and fails the hits waiting on them;
// hits forwarded later get errForwarderClosed.
func (f *forwarder) closeAll() {
	f.mu.Lock()
	f.mu.closed = true
	peers := f.mu.peers
	f.mu.Unlock()
	for _, p := range peers {
		p.mu.Lock()
		if p.conn != nil {
			p.failLocked(p.conn, errForwarderClosed)
		}
		p.mu.Unlock()
	}
}

// CounterHit runs SLUICE.COUNTERHIT key rule-position now-ns limit hits,
// what a node forwards to the owner of a rule's counter: apply hits of the
// rule at that position of its rule set (counterRule: of pol, the divvy
// rules, or of rls, the rate limit service's), under limit, at now (unix
// ns), to the counter key (a store key of any kind
// keyspace.AppendRuleKey makes), and append the Outcome to x.Out
// (counterhit.AppendReply), or return the error to answer instead.
//
// Nothing is taken on trust: the rule's identity must be the key's (the
// nodes run the same rules), limit one the rule can resolve (creditLimit,
// or 1 to maxQuota with a quotaField), hits 0 or more, and the key exactly
// the one the rule makes for its counter ID under that limit (kind,
// parameters and slot).
func (s *Node) CounterHit(x *dispatch.Ctx, args [][]byte, pol *rules.File, rls RuleSet, eng *engine.Engine) error {
	key := args[1]
	rec, err := keyspace.Parse(key)
	var id []byte
	if err == nil {
		id = rec.ID()
	}
	if err != nil || len(id) < policy.CounterIDLen {
		return refuse("SLUICE.COUNTERHIT: not a rule counter key; expected a store key keyspace.AppendRuleKey makes")
	}
	pos, ok1 := resp.ParseInt(args[2])
	now, ok2 := resp.ParseInt(args[3])
	limit, ok3 := resp.ParseInt(args[4])
	hits, ok4 := resp.ParseInt(args[5])
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return errs.NotInteger
	}
	if moved, err := s.Route(rec.Slot); err != nil || moved != "" {
		return routeErr(rec.Slot, moved, err)
	}
	r, err := counterRule(id, pos, pol, rls, eng)
	if err != nil {
		return err
	}
	// x.Key is scratch here until it holds the key below.
	x.Key = r.AppendCounterID(x.Key[:0], nil) // the identity alone: no actor
	if !r.MayCount() || string(x.Key) != string(id[:policy.CounterIDLen]) {
		return refuse("cluster: rule " + strconv.FormatInt(pos, 10) + " of this node's rule file is not the sender's: every node must run the same rules")
	}
	if limit < 1 || (limit != r.CreditLimit && (r.QuotaField == "" || limit > r.MaxQuota)) {
		return refuse("SLUICE.COUNTERHIT: limit " + strconv.FormatInt(limit, 10) + " is not one rule " + strconv.FormatInt(pos, 10) +
			" can apply; expected its creditLimit " + strconv.FormatInt(r.CreditLimit, 10) + " or, with a quotaField, 1 to its maxQuota " + strconv.FormatInt(r.MaxQuota, 10))
	}
	if hits < 0 {
		return refuse("SLUICE.COUNTERHIT: hits " + strconv.FormatInt(hits, 10) + "; expected 0 or more")
	}
	// The key must be the one the rule makes for this counter under this
	// limit: the kind is the rule's algorithm, the parameters (a bucket's
	// depend on the limit, a window's on the period) and the slot are the
	// rule's and the ID's.
	x.Key = keyspace.AppendRuleKey(x.Key[:0], r, limit, id)
	if string(x.Key) != string(key) {
		return refuse("SLUICE.COUNTERHIT: the key is not rule " + strconv.FormatInt(pos, 10) + "'s counter under limit " + strconv.FormatInt(limit, 10) +
			"; expected a " + r.Algorithm.String() + " counter of its parameters, in the slot of its counter ID")
	}
	// The sender's clock is trusted only within the skew allowed between
	// nodes: a clock far ahead would stamp the counter in the future and
	// lock the actor out until then.
	own := s.clock().UnixNano()
	skew := int64(s.maxClockSkew())
	now = max(min(now, own+skew), own-skew)
	out, err := x.Round.ApplyCounter(key, r, limit, hits, now, id)
	if err != nil {
		return err
	}
	x.Out = counterhit.AppendReply(x.Out, out, limit)
	return nil
}
