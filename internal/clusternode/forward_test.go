package clusternode

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/policy"
)

// TestForwardErrorKeepsItsReplyText: a forwarding failure is of kind
// errs.Forward and still tells RESP clients its reply text unchanged; an
// owner's reply that the request's hit caused stays a plain reply error,
// any other owner reply is a forwarding failure.
func TestForwardErrorKeepsItsReplyText(t *testing.T) {
	rendered := func(err error) string { return resp.ErrorText(engine.Typed(err)) }
	const text = "ERR cluster: forwarding a counter of slot 7 to its owner 10.0.0.1:9049 failed: i/o timeout"
	err := forwardErr("", strings.TrimPrefix(text, "ERR "))
	if errs.KindOf(err) != errs.Forward || rendered(err) != text {
		t.Errorf("forwardErr: Forward %v, text %q; want true, %q", errs.KindOf(err) == errs.Forward, rendered(err), text)
	}
	if code := status.Code(envoy.StatusErr(engine.Typed(err), 0)); code != codes.Unavailable {
		t.Errorf("forwardErr as a gRPC status: %v; want Unavailable", code)
	}
	for _, tc := range []struct {
		reply   string
		forward bool
	}{
		{"ERR hits: 2; a slidingLog rule records one hit at a time (hits 0 or 1)", false},
		{"ERR rule arithmetic out of range: quantity: 9: too large", false},
		{"CLUSTERDOWN Hash slot not served", true},
		{"ERR store unavailable: writes to the data directory are failing", true},
		{"ERR server is shutting down", true},
		{"ERR cluster: this node has no rule with the counter identity of the sender's rule 3", true},
	} {
		err := ownerErr(tc.reply)
		if (errs.KindOf(err) == errs.Forward) != tc.forward || rendered(err) != tc.reply {
			t.Errorf("owner reply %q: forwarding failure %v, text %q; want %v and the reply", tc.reply, errs.KindOf(err) == errs.Forward, rendered(err), tc.forward)
		}
	}
}

// TestForwardNamesARefusedCertificate: an owner that refuses the
// forwarding node's certificate (signed by a CA it does not trust) says
// so only at the first read over TLS 1.3; the error then says what the
// certificates need, as a certificate the forwarder cannot verify does.
func TestForwardNamesARefusedCertificate(t *testing.T) {
	td := filepath.Join("..", "admit", "testdata")
	a, aKey := filepath.Join(td, "node-a.pem"), filepath.Join(td, "node-a-key.pem")
	owner, err := admit.NewTLS(admit.TLSFiles{Cert: a, Key: aKey, CA: a}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	// The forwarder trusts the owner's CA, but presents node b's
	// certificate, of a CA the owner does not trust.
	self, err := admit.NewTLS(admit.TLSFiles{Cert: filepath.Join(td, "node-b.pem"), Key: filepath.Join(td, "node-b-key.pem"), CA: a}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", owner.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.(*tls.Conn).Handshake() // refuses the certificate
	}()
	f := &forwarder{tls: self.NodeClient}
	c := &fwdCall{args: [][]byte{[]byte("PING")}, deadline: time.Now().Add(time.Minute), done: make(chan struct{}, 1)}
	err = f.call(&Node{}, l.Addr().String(), c)
	if err == nil || !strings.Contains(err.Error(), "the owner refused this node's certificate") || !strings.Contains(err.Error(), "--tls-ca") {
		t.Fatalf("a call the owner refused the certificate of: %v; want the refusal, naming --tls-ca", err)
	}
}

// forwardOne forwards one hit to o as a node forwards a counter's.
func forwardOne(s *Node, o *fakeOwner) (policy.Outcome, error) {
	return s.forwardHit(o.l.Addr().String(), 1, []byte("some-counter-key"), &policy.Rule{Pos: 1}, 10, 1, 1)
}

// TestForwardSharesOneConnection: hits forwarded at once to one owner
// share one connection, each getting its own reply.
func TestForwardSharesOneConnection(t *testing.T) {
	o := startFakeOwner(t)
	s := &Node{}
	defer s.fwd.closeAll()
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := forwardOne(s, o)
			if err == nil && (!out.Allowed || out.CreditsLeft != 9 || out.ResetAfterMs != 60000) {
				err = fmt.Errorf("outcome %+v; want the owner's", out)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n, m := o.dials.Load(), o.reqs.Load(); n != 1 || m != 200 {
		t.Errorf("the owner accepted %d connections and read %d hits; want 1 and 200", n, m)
	}
	if st := s.ForwardMetrics(); st != (ForwardStats{OK: 200, Dials: 1}) {
		t.Errorf("ForwardMetrics = %+v; want 200 ok on 1 connection", st)
	}
}

// TestForwardQueueIsBounded: once --cluster-forward-queue hits wait for
// an owner's replies, another waits for room until its deadline, and gets
// an error naming the flag; when the owner answers, hits go through again.
func TestForwardQueueIsBounded(t *testing.T) {
	o := startFakeOwner(t)
	hold := make(chan struct{})
	o.setHold(hold)
	s := &Node{cfg: Config{ForwardTimeout: time.Minute}}
	s.fwd.queue = 4
	defer s.fwd.closeAll()
	addr := o.l.Addr().String()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := forwardOne(s, o); err != nil {
				t.Error(err)
			}
		}()
	}
	p, err := s.fwd.peer(addr)
	if err != nil {
		t.Fatal(err)
	}
	for len(p.room) < 4 {
		runtime.Gosched()
	}
	c := &fwdCall{args: [][]byte{[]byte("PING")}, deadline: time.Now(), done: make(chan struct{}, 1)}
	if err := s.fwd.call(s, addr, c); err == nil || !strings.Contains(err.Error(), "4 hits already wait") || !strings.Contains(err.Error(), "--cluster-forward-queue") {
		t.Errorf("a hit over the queue: %v; want it refused, naming the flag", err)
	}
	close(hold)
	wg.Wait()
	if _, err := forwardOne(s, o); err != nil {
		t.Errorf("a hit once the owner answered: %v", err)
	}
	if n := o.dials.Load(); n != 1 {
		t.Errorf("the owner accepted %d connections; want 1", n)
	}
}

// TestForwardTimeoutReplacesTheConnection: an owner that does not answer
// within the timeout fails the hits waiting on its connection, whose
// replies would now come out of order; the next hit dials again.
func TestForwardTimeoutReplacesTheConnection(t *testing.T) {
	o := startFakeOwner(t)
	s := &Node{}
	defer s.fwd.closeAll()
	if _, err := forwardOne(s, o); err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	o.setHold(hold)
	s.cfg.ForwardTimeout = 50 * time.Millisecond
	if _, err := forwardOne(s, o); err == nil || !strings.Contains(err.Error(), "i/o timeout") {
		t.Errorf("a hit the owner did not answer: %v; want a timeout", err)
	}
	o.setHold(nil)
	close(hold) // the late reply goes to a closed connection
	s.cfg.ForwardTimeout = time.Minute
	if out, err := forwardOne(s, o); err != nil || out.CreditsLeft != 9 {
		t.Errorf("the next hit: %+v, %v; want the owner's reply", out, err)
	}
	if n := o.dials.Load(); n != 2 {
		t.Errorf("the owner accepted %d connections; want 2", n)
	}
}

// TestForwardRedialsAfterAClose: a connection the owner closed (a
// restart) fails the hit sent on it, and the next hit dials again; a reply
// that is not SLUICE.COUNTERHIT's fails the connection the same way.
func TestForwardRedialsAfterAClose(t *testing.T) {
	o := startFakeOwner(t)
	s := &Node{}
	defer s.fwd.closeAll()
	if _, err := forwardOne(s, o); err != nil {
		t.Fatal(err)
	}
	o.closeNext.Store(1)
	if _, err := forwardOne(s, o); err == nil || !strings.Contains(err.Error(), "EOF") {
		t.Errorf("a hit whose connection the owner closed: %v; want EOF", err)
	}
	if _, err := forwardOne(s, o); err != nil {
		t.Errorf("the next hit: %v", err)
	}
	o.setReply("+PONG\r\n")
	if _, err := forwardOne(s, o); err == nil || !strings.Contains(err.Error(), `unexpected reply "+PONG"`) {
		t.Errorf("a hit answered +PONG: %v; want the reply named", err)
	}
	o.setReply("-ERR server is shutting down\r\n")
	if _, err := forwardOne(s, o); err == nil || err.Error() != "server is shutting down" {
		t.Errorf("a hit the owner refused: %v; want its reply", err)
	}
	o.setReply("")
	if _, err := forwardOne(s, o); err != nil {
		t.Errorf("the hit after it: %v", err)
	}
	if n := o.dials.Load(); n != 3 {
		t.Errorf("the owner accepted %d connections; want 3", n)
	}
	if st := s.ForwardMetrics(); st != (ForwardStats{OK: 3, Refused: 1, Failed: 2, Dials: 3}) {
		t.Errorf("ForwardMetrics = %+v; want 3 ok, 1 refused, 2 failed, on 3 connections", st)
	}
}

// TestForwardCloseFailsWaitingHits: closing the node fails the hits
// waiting for replies, and refuses later ones.
func TestForwardCloseFailsWaitingHits(t *testing.T) {
	o := startFakeOwner(t)
	hold := make(chan struct{})
	o.setHold(hold)
	defer close(hold)
	s := &Node{cfg: Config{ForwardTimeout: time.Minute}}
	done := make(chan error, 1)
	go func() {
		_, err := forwardOne(s, o)
		done <- err
	}()
	p, err := s.fwd.peer(o.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for {
		p.mu.Lock()
		n := 0
		if p.conn != nil {
			n = p.conn.pending.len()
		}
		p.mu.Unlock()
		if n == 1 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the hit returned before the close: %v", err)
		default:
			runtime.Gosched()
		}
	}
	s.fwd.closeAll()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("a hit waiting at the close: %v; want the shutdown named", err)
	}
	if _, err := forwardOne(s, o); err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("a hit after the close: %v; want the shutdown named", err)
	}
}

// TestCallQueueStaysSmall: a queue of hits that never empties, a few in
// flight at a time, holds about twice them, not every hit it took.
func TestCallQueueStaysSmall(t *testing.T) {
	var q callQueue
	calls := make([]fwdCall, 3)
	for i := range calls {
		q.push(&calls[i])
	}
	for i := range 10000 {
		if c := q.pop(); c != &calls[i%3] {
			t.Fatalf("pop %d: call %p; want %p, the oldest", i, c, &calls[i%3])
		}
		q.push(&calls[i%3])
	}
	if q.len() != 3 || cap(q.calls) > 8 {
		t.Fatalf("after 10000 hits, 3 in flight: %d queued in room for %d; want 3 in at most 8", q.len(), cap(q.calls))
	}
}

// TestForwardDialOutlivesItsCaller: a dial runs with the forward timeout
// of its own, not the deadline of the hit that started it: that hit gives
// up at its deadline, a hit that waits for the same dial with time left
// gets the connection, and the connection is kept.
func TestForwardDialOutlivesItsCaller(t *testing.T) {
	o := startFakeOwner(t)
	hold := make(chan struct{})
	o.setHold(hold) // the AUTH of the dial waits
	s := &Node{pass: "pw", cfg: Config{ForwardTimeout: time.Minute}}
	defer s.fwd.closeAll()
	addr := o.l.Addr().String()
	short := &fwdCall{args: [][]byte{[]byte("PING")}, deadline: time.Now().Add(100 * time.Millisecond), done: make(chan struct{}, 1)}
	shortErr := make(chan error, 1)
	go func() { shortErr <- s.fwd.call(s, addr, short) }()
	for o.reqs.Load() < 1 { // the owner has the AUTH: the dial is under way
		runtime.Gosched()
	}
	long := make(chan error, 1)
	go func() {
		_, err := forwardOne(s, o)
		long <- err
	}()
	if err := <-shortErr; err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the hit whose deadline passed during the dial: %v; want its deadline exceeded", err)
	}
	o.setHold(nil)
	close(hold)
	if err := <-long; err != nil {
		t.Errorf("the hit that waited for the same dial: %v; want the owner's reply", err)
	}
	if n := o.dials.Load(); n != 1 {
		t.Errorf("the owner accepted %d connections; want 1", n)
	}
}

// TestForwardUnderLoadOutlivesTheTimeout: hits forwarded without a pause
// for several times the forward timeout all get their replies: no hit's
// deadline bounds the writes of the others.
func TestForwardUnderLoadOutlivesTheTimeout(t *testing.T) {
	o := startFakeOwner(t)
	s := &Node{cfg: Config{ForwardTimeout: 20 * time.Millisecond}}
	defer s.fwd.closeAll()
	if _, err := forwardOne(s, o); err != nil { // connected
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < 10*s.cfg.ForwardTimeout {
				if _, err := forwardOne(s, o); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if st := s.ForwardMetrics(); failed.Load() != 0 || st.Failed != 0 || st.Dials != 1 {
		t.Errorf("hits for 10 timeouts: %d failed (metrics: %+v); want none, on 1 connection", failed.Load(), st)
	}
}
