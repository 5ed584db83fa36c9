package server

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
)

// The divvy line protocol: one HIT per line, one reply line per request in
// order, ERR then close on a bad line. Lines read together are executed as
// one round: their writes are committed once, and only then are their
// replies written, as for a RESP pipeline.

// Defaults for the line protocol's limits.
const (
	DefaultDivvyMaxLine     = 64 << 10
	DefaultDivvyMaxPipeline = 1024
)

// divvyState is the line-protocol listener and its connections.
type divvyState struct {
	open  atomic.Int64 // connections open (divvy_tcp_connections_total)
	total atomic.Int64 // connections accepted
	// divvy_errors_total, by code.
	errUnknownCommand, errUnknown atomic.Int64
	wg                            sync.WaitGroup
	// guarded by Server.mu
	ln    net.Listener
	conns map[*divvyConn]struct{}
}

// divvyConn is one line-protocol connection.
type divvyConn struct {
	s        *Server
	nc       net.Conn
	draining atomic.Bool
	errSent  bool // an ERR was written: close gently, see lingerClose
	buf      []byte
	out      []byte
	r        *engine.Round
}

// ServeDivvy accepts line-protocol connections on ln until Close. It
// returns nil after Close. The line protocol has no authentication: in
// protected mode (the default) it serves loopback clients only.
func (s *Server) ServeDivvy(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		return net.ErrClosed
	}
	if s.divvy.ln != nil {
		s.mu.Unlock()
		return ErrServing
	}
	s.divvy.ln = ln
	s.mu.Unlock()
	s.log.Info("serving the divvy line protocol", "addr", ln.Addr().String(), "policy", s.pol.Path)
	if s.cfg.Password != "" || s.clientCertsRequired() {
		s.log.Warn("the divvy line protocol has no AUTH and no TLS: anyone who can reach its address can use it", "addr", ln.Addr().String())
	}
	return s.acceptEach(s.listen(ln, s.divvyDoor()), func(nc net.Conn) bool {
		if d := s.admitDivvy(nc); d != nil {
			go d.serve()
		}
		return true
	})
}

// divvyDoor is how the line protocol's listener admits: a slot of
// --maxclients, shared with RESP and HTTP, held until the connection
// finishes (serve gives it back), and protected mode unless it is off:
// the line protocol has no authentication. It refuses with an ERR line,
// counted in divvy_errors_total.
func (s *Server) divvyDoor() door {
	refusal := func(reason string) []byte {
		return (&policy.ProtocolError{Code: policy.CodeUnknown, Reason: reason}).AppendReply(nil)
	}
	return door{
		name:    "divvy",
		take:    s.adm.take,
		guarded: func() bool { return !s.cfg.AllowRemoteWithoutAuth },
		full:    refusal("max number of clients reached"),
		denied:  refusal("DENIED: sluice is in protected mode and the divvy line protocol has no authentication; it serves clients on loopback only unless started with --protected-mode no"),
		refused: func() { s.divvy.errUnknown.Add(1) },
	}
}

// divvyAddr is the line protocol's address, or "" when it is off.
func (s *Server) divvyAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.divvy.ln == nil {
		return ""
	}
	return s.divvy.ln.Addr().String()
}

// admitDivvy registers a connection its door admitted, or answers and
// closes it when the server is closing.
func (s *Server) admitDivvy(nc net.Conn) *divvyConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closing.Load() {
		d := &divvyConn{s: s, nc: nc, r: s.eng.NewRound()}
		if s.divvy.conns == nil {
			s.divvy.conns = make(map[*divvyConn]struct{})
		}
		s.divvy.conns[d] = struct{}{}
		s.divvy.wg.Add(1)
		s.divvy.open.Add(1)
		s.divvy.total.Add(1)
		s.stats.connsTotal.Add(1)
		return d
	}
	s.adm.release()
	s.divvy.errUnknown.Add(1)
	s.refuse(nc, (&policy.ProtocolError{Code: policy.CodeUnknown, Reason: "server is shutting down"}).AppendReply(nil))
	return nil
}

// closeDivvy stops accepting, asks every connection to finish its round
// and close, and waits for them until forceAt, then closes the ones left
// and waits for them for rest at most. Close calls it.
func (s *Server) closeDivvy(forceAt time.Time, rest time.Duration) {
	s.mu.Lock()
	ln := s.divvy.ln
	conns := make([]*divvyConn, 0, len(s.divvy.conns))
	for d := range s.divvy.conns {
		conns = append(conns, d)
	}
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	for _, d := range conns {
		d.draining.Store(true)
		_ = d.nc.SetReadDeadline(time.Now())
	}
	done := make(chan struct{})
	go func() {
		s.divvy.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-s.after(time.Until(forceAt)):
		s.mu.Lock()
		for d := range s.divvy.conns {
			_ = d.nc.Close()
		}
		s.mu.Unlock()
		select {
		case <-done:
		case <-s.after(rest):
			// As in Close: a hit stuck below the network is given up on.
			s.log.Error("shutdown: line-protocol connections still busy after closing them; giving up on them")
		}
	}
}

func (d *divvyConn) serve() {
	s := d.s
	defer func() {
		if d.errSent {
			d.lingerClose()
		}
		_ = d.nc.Close()
		s.mu.Lock()
		delete(s.divvy.conns, d)
		s.mu.Unlock()
		s.divvy.open.Add(-1)
		s.adm.release()
		s.divvy.wg.Done()
	}()
	defer func() {
		if r := recover(); r != nil {
			s.stats.panics.Add(1)
			s.log.Error("divvy line panicked; closing the connection", "remote", d.nc.RemoteAddr().String(), "panic", r)
		}
	}()
	maxLine := s.cfg.DivvyMaxLine
	// 16 KiB brings in many pipelined lines per read; the buffer grows, up
	// to one whole line and its "\r\n", only for a client that sends long
	// lines.
	d.buf = make([]byte, min(maxLine+2, 16<<10))
	start, end := 0, 0
	eof := false
	for {
		if bytes.IndexByte(d.buf[start:end], '\n') >= 0 || (eof && end > start) {
			var stop bool
			start, stop = d.round(start, end, eof)
			if stop {
				return
			}
			continue
		}
		if eof || d.draining.Load() {
			return
		}
		if end-start > maxLine+1 { // a "\r" may still come before the "\n"
			d.fail(policy.CodeUnknown, "line too long")
			return
		}
		if start > 0 {
			end = copy(d.buf, d.buf[start:end])
			start = 0
		}
		if end == len(d.buf) {
			grown := make([]byte, min(2*len(d.buf), maxLine+2))
			end = copy(grown, d.buf[:end])
			d.buf = grown
		}
		if t := s.cfg.DivvyIdleTimeout; t > 0 {
			_ = d.nc.SetReadDeadline(time.Now().Add(t))
		}
		if d.draining.Load() {
			return
		}
		n, err := d.nc.Read(d.buf[end:])
		end += n
		if n > 0 {
			s.stats.netIn.Add(int64(n))
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			eof = true // a last line without "\n" is still executed
		case isTimeout(err) && !d.draining.Load():
			s.stats.idleClosed.Add(1)
			return
		default:
			return
		}
	}
}

// round executes the complete lines in d.buf[start:end], at most
// DivvyMaxPipeline of them, and, when eof, a last line without "\n", in
// one engine.Round; commits it; and writes their replies. It returns where the
// unread bytes start, and stop when the connection must close.
func (d *divvyConn) round(start, end int, eof bool) (next int, stop bool) {
	s := d.s
	t0 := time.Now()
	lp := s.pol.Current()
	d.out = d.out[:0]
	// Resharding: MIGRATE PAUSE waits for the round's hits to be committed
	// (migrate.go).
	d.r.Begin()
	firstWrite := -1
	for n := 0; n < s.cfg.DivvyMaxPipeline && start < end && !stop; {
		var line []byte
		if i := bytes.IndexByte(d.buf[start:end], '\n'); i >= 0 {
			line = d.buf[start : start+i]
			start += i + 1
		} else if eof {
			line = d.buf[start:end]
			start = end
		} else {
			break
		}
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1]
		}
		if len(line) > s.cfg.DivvyMaxLine {
			d.out = d.errReply(policy.CodeUnknown, "line too long")
			stop = true
			break
		}
		cmd, req, err := policy.ParseLine(line, d.r.Req)
		if req != nil {
			d.r.Req = req
		}
		if err != nil {
			var pe *policy.ProtocolError
			if !errors.As(err, &pe) {
				pe = &policy.ProtocolError{Code: policy.CodeUnknown, Reason: err.Error()}
			}
			d.out = d.errReply(pe.Code, pe.Reason)
			stop = true
			break
		}
		if cmd == policy.CmdNone {
			continue
		}
		n++
		if lp == nil {
			d.out = d.errReply(policy.CodeUnknown, s.lineReason(rules.ErrNoPolicy))
			stop = true
			break
		}
		mark, before := len(d.out), d.r.Len()
		out, err := d.r.Hit(lp, d.r.Req, 1, d.r.Now().UnixNano())
		if err != nil {
			d.out = d.errReply(policy.CodeUnknown, s.lineReason(err))
			stop = true
			break
		}
		if firstWrite < 0 && d.r.Len() > before {
			firstWrite = mark
		}
		d.out = out.AppendReply(d.out)
	}
	// Before the reply's write, which a slow reader may hold up.
	if ok, err := d.r.Commit(); !ok {
		// No reply may show a change that was not stored: the replies
		// from the first write on become one error, and the connection
		// closes, as after any ERR.
		if firstWrite >= 0 {
			d.out = d.out[:firstWrite]
		}
		d.out = d.errReply(policy.CodeUnknown, s.lineReason(err))
		stop = true
	}
	if len(d.out) > 0 {
		if t := s.cfg.DivvyIdleTimeout; t > 0 {
			_ = d.nc.SetWriteDeadline(time.Now().Add(t))
		}
		n, err := d.nc.Write(d.out)
		s.stats.netOut.Add(int64(n))
		if err != nil {
			stop = true
		}
	}
	s.http.hitSeconds.Observe(time.Since(t0).Seconds())
	return start, stop
}

// lingerClose ends a connection after an ERR without losing the ERR: a
// close with the client's unread lines still queued would send a TCP reset,
// which can discard the reply before the client reads it. So it sends FIN
// first, then reads and drops what the client still sends, for at most a
// second or 1 MiB, before the caller closes.
func (d *divvyConn) lingerClose() {
	tc, ok := d.nc.(*net.TCPConn)
	if !ok {
		return
	}
	_ = tc.CloseWrite()
	_ = tc.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.CopyN(io.Discard, tc, 1<<20)
}

// errReply appends an ERR line to d.out and counts it.
func (d *divvyConn) errReply(code, reason string) []byte {
	d.errSent = true
	switch code {
	case policy.CodeUnknownCommand:
		d.s.divvy.errUnknownCommand.Add(1)
	default:
		d.s.divvy.errUnknown.Add(1)
	}
	return (&policy.ProtocolError{Code: code, Reason: reason}).AppendReply(d.out)
}

// fail writes one ERR line, for a connection about to close.
func (d *divvyConn) fail(code, reason string) {
	d.out = d.errReply(code, reason)
	_ = d.nc.SetWriteDeadline(time.Now().Add(time.Second))
	n, _ := d.nc.Write(d.out)
	d.s.stats.netOut.Add(int64(n))
}
