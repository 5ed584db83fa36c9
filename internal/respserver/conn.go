package respserver

import (
	"errors"
	"io"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/resp"
)

// sluice serves each RESP connection with its own loop around the framer
// rather than with redcon's server. redcon's reader can be crashed or hung
// by one malformed command (design.md), and it keeps the largest buffer it
// ever grew for the life of the connection (it reslices its buffer instead
// of letting it go), so an idle client that once sent a 7 MiB command pinned
// tens of MiB for good. Here every buffer goes back to a small size after
// the command or pipeline that grew it.

// Buffer sizes of a connection.
const (
	// ConnReadMin is the socket read buffer of a connection; it doubles
	// while reads fill it, up to connReadMax, and goes back when the client
	// is between commands.
	ConnReadMin = 4 << 10
	connReadMax = 64 << 10
	// connKeepBuf is the largest buffer a connection keeps between
	// pipelines; a larger one is let go.
	connKeepBuf = 8 << 10
	// KeepBuf is connKeepBuf, for the front ends that keep buffers the
	// same way (the rate limit service).
	KeepBuf = connKeepBuf
	// replyChunk is how many reply bytes a pipeline queues before its
	// pending writes are committed and the replies sent, so a long
	// pipeline holds about this plus one reply.
	replyChunk = 16 << 10
)

// Limits for clients that have not authenticated (a password is set and
// the client has not given it), as Redis hard-codes them: AUTH, HELLO,
// PING and QUIT need no more.
const (
	unauthMaxArgs  = 10
	unauthMaxBulk  = 16 << 10
	unauthMaxQuery = 64 << 10
)

var unauthLimits = resp.Limits{
	MaxArgs:    unauthMaxArgs,
	MaxBulk:    unauthMaxBulk,
	MaxInline:  unauthMaxBulk,
	MaxPending: unauthMaxQuery,
	Unauth:     true,
}

// conn is one RESP connection. Its goroutine reads, frames, executes and
// answers; Close's goroutine may only mark it draining or close its socket.
type conn struct {
	srv *Server
	nc  net.Conn
	cl  *client
	f   *resp.Framer
	lim resp.Limits // the framer's limits once authenticated

	rbuf []byte   // socket reads
	obuf []byte   // the framer's output: the canonical commands of one read
	args [][]byte // the arguments of the command being executed, into obuf

	mem    int64 // bytes of buffers counted in srv.stats.ClientMem
	outCap int   // cap(cl.Out) when mem was last counted

	draining  atomic.Bool // shutdown: finish the pipeline, read no more
	killed    atomic.Bool // by CLIENT KILL: no later CLIENT KILL counts it
	closeOnce sync.Once
}

// newConn registers an admitted connection. It returns nil once Close has
// begun: counting under s.mu, after checking closing, keeps every Add
// before Close's Wait.
func (s *Server) newConn(nc net.Conn) *conn {
	lim := resp.Limits{
		MaxArgs:    s.cfg.MaxArgs,
		MaxBulk:    s.cfg.MaxBulk,
		MaxInline:  s.cfg.MaxInline,
		MaxPending: s.cfg.MaxQueryBuffer,
	}
	c := &client{
		addr:    nc.RemoteAddr().String(),
		laddr:   nc.LocalAddr().String(),
		fd:      connFD(nc),
		created: s.clock(),
		resp:    2,
		Ctx:     s.newCtx(),
		authed:  s.cfg.Password == "",
		tally:   make([]tally, len(s.cmds)),
	}
	flim := lim
	if !c.authed {
		flim = unauthLimits
	}
	cn := &conn{srv: s, nc: nc, cl: c, f: resp.NewFramer(flim), lim: lim, rbuf: make([]byte, ConnReadMin)}
	c.conn = cn
	c.lastAt = c.created.UnixMilli()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return nil
	}
	c.id = s.nextID.Add(1)
	s.mu.guards[cn] = struct{}{}
	s.mu.clients[c.id] = c
	s.conns.Add(1)
	s.stats.ConnsTotal.Add(1)
	cn.account()
	return cn
}

// The RESP front end drains (admit.Drainer): every connection reads no
// more commands, answers the pipeline it is executing and closes.

// Finish implements admit.Drainer.
func (s *Server) Finish() {
	s.mu.Lock()
	guards := make([]*conn, 0, len(s.mu.guards))
	for g := range s.mu.guards {
		guards = append(guards, g)
	}
	s.mu.Unlock()
	for _, g := range guards {
		g.startDrain()
	}
}

// Force implements admit.Drainer.
func (s *Server) Force() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for g := range s.mu.guards {
		go g.forceClose()
	}
}

// Wait implements admit.Drainer.
func (s *Server) Wait() { s.conns.Wait() }

// serve reads and executes pipelines until the client leaves, breaks a
// limit, or the server shuts down.
func (cn *conn) serve() {
	s := cn.srv
	defer cn.finish()
	defer func() {
		// Commands recover their own panics (execAll); this is for the
		// connection's own code, so that a bug ends one connection only.
		if r := recover(); r != nil {
			s.stats.Panics.Add(1)
			s.log.Error("connection panicked; closing it", "client", cn.cl.id, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	for !cn.draining.Load() {
		if t := s.cfg.IdleTimeout; t > 0 {
			_ = cn.nc.SetReadDeadline(time.Now().Add(t))
			if cn.draining.Load() {
				return // startDrain's deadline may have been overwritten
			}
		}
		n, err := cn.nc.Read(cn.rbuf)
		if n > 0 {
			s.stats.NetIn.Add(int64(n))
			if !cn.process(cn.rbuf[:n]) {
				return
			}
			cn.resize(n)
		}
		if err != nil {
			if s.cfg.IdleTimeout > 0 && !cn.draining.Load() && isTimeout(err) {
				s.stats.IdleClosed.Add(1)
				s.log.Debug("closing idle connection", "remote", cn.cl.addr, "timeout", s.cfg.IdleTimeout)
			}
			return
		}
	}
}

// process frames and executes the commands p completes, as one pipeline:
// their replies are released only once their writes are committed
// (commitAndSend). It reports whether to go on reading.
func (cn *conn) process(p []byte) bool {
	s, c := cn.srv, cn.cl
	c.pipes.Add(1)
	defer c.pipes.Add(1)
	t0 := time.Now()
	c.lastAt = s.clock().UnixMilli() // CLIENT LIST's idle; the clock tests drive
	c.Out = c.Out[:0]
	c.writes = c.writes[:0]
	var ferr error
	for len(p) > 0 && !c.quit {
		// Before AUTH each command is framed alone, so that AUTH lifts the
		// small limits for the commands pipelined behind it.
		one := !c.authed
		var used int
		cn.obuf, used, ferr = cn.f.FeedSome(cn.obuf[:0], p, one)
		p = p[used:]
		if !cn.account() {
			cn.evict()
			break
		}
		c.ran += s.execAll(cn, cn.obuf)
		if ferr != nil {
			break
		}
		if one && c.authed {
			cn.f.SetLimits(cn.lim)
		}
	}
	sent := cn.commitAndSend()
	s.BatchSeconds.Observe(time.Since(t0).Seconds())
	if ferr != nil && !c.quit {
		s.stats.ProtocolErrors.Add(1)
		s.log.Debug("closing connection after a protocol error", "remote", c.addr, "err", ferr)
		if sent {
			// Bounded: a client that sent garbage gets no more patience.
			_ = cn.nc.SetWriteDeadline(time.Now().Add(time.Second))
			cn.write(resp.AppendError(nil, "ERR "+ferr.Error()))
			c.failed = true
		}
		return false
	}
	return sent && !c.quit
}

// evict answers a client whose buffers pushed the total of all clients'
// buffers past --maxmemory-clients, and ends it.
func (cn *conn) evict() {
	s, c := cn.srv, cn.cl
	s.stats.EvictedClients.Add(1)
	s.log.Warn("closing a client: the buffers of all clients exceed --maxmemory-clients", "client", c.id, "remote", c.addr,
		"limit", s.cfg.MaxMemoryClients.N(), "client_buffers", cn.mem)
	c.Out = resp.AppendError(c.Out, "ERR client memory limit reached: the buffers of all clients exceed --maxmemory-clients; closing the connection")
	c.quit = true
	c.failed = true
}

// commitAndSend commits the pipeline's pending writes, replaces their
// replies by the error if that fails, counts the commands, and sends every
// reply queued: a client that has its replies sees them in the metrics. It
// reports whether the client can still be written to.
func (cn *conn) commitAndSend() bool {
	s, c := cn.srv, cn.cl
	_ = s.commitWrites(c) // a failure is in the replies now
	s.stats.Commands.Add(int64(c.ran))
	c.ran = 0
	s.flushTally(c)
	c.outPeak = max(c.outPeak, len(c.Out))
	cn.publish(cn.footprint()) // before the replies: a client that saw them sees its changes in CLIENT LIST
	ok := true
	if len(c.Out) > 0 && !c.silent {
		ok = cn.write(c.Out)
	}
	c.Out = c.Out[:0]
	return ok
}

func (cn *conn) write(b []byte) bool {
	n, err := cn.nc.Write(b)
	cn.srv.stats.NetOut.Add(int64(n))
	return err == nil
}

// resize lets go of buffers a command or pipeline grew. n is how much the
// last read returned.
func (cn *conn) resize(n int) {
	c := cn.cl
	switch {
	case n == len(cn.rbuf) && len(cn.rbuf) < connReadMax:
		cn.rbuf = make([]byte, 2*len(cn.rbuf))
	case len(cn.rbuf) > ConnReadMin && cn.f.Between():
		cn.rbuf = make([]byte, ConnReadMin)
	}
	if cap(cn.obuf) > connKeepBuf {
		cn.obuf = nil
	}
	if cap(cn.args) > connKeepBuf/24 {
		cn.args = nil
	} else {
		clear(cn.args[:cap(cn.args)]) // no pointers into a dropped obuf
	}
	if cap(c.Out) > connKeepBuf {
		c.Out = nil
	}
	if cap(c.writes) > connKeepBuf/48 {
		c.writes = nil
	}
	if cap(c.Key) > connKeepBuf {
		c.Key = nil
	}
	c.Round.Trim(connKeepBuf)
	c.Trim(connKeepBuf)
	if c.batchBytes > connKeepBuf {
		// The batch keeps the keys of its largest pipeline.
		c.Round.Reset()
	}
	c.batchBytes = 0
	if cn.f.Between() {
		cn.f.Trim(connKeepBuf)
	}
	cn.account()
}

// footprint is the bytes of the connection's buffers, as counted against
// --maxmemory-clients.
func (cn *conn) footprint() int64 {
	c := cn.cl
	return int64(cap(cn.rbuf) + cap(cn.obuf) + 24*cap(cn.args) + cn.f.Footprint() +
		cap(c.Out) + 48*cap(c.writes) + cap(c.Key) + c.Round.Footprint() + c.Footprint() +
		cap(c.tx.buf) + 24*cap(c.tx.args) + 16*cap(c.tx.watches))
}

// account updates the connection's share of the clients' memory. It
// reports false when the connection has just grown it past
// --maxmemory-clients.
func (cn *conn) account() bool {
	s := cn.srv
	m := cn.footprint()
	cn.outCap = cap(cn.cl.Out)
	cn.publish(m)
	cn.cl.tx.grew = false
	d := m - cn.mem
	if d == 0 {
		return true
	}
	cn.mem = m
	total := s.stats.ClientMem.Add(d)
	if d < 0 {
		return true
	}
	s.noteClientsPeak(total)
	return s.cfg.MaxMemoryClients.Within(total)
}

// noteClientsPeak records total as the peak of Stats.ClientMem if it is
// one.
func (s *Server) noteClientsPeak(total int64) {
	for {
		peak := s.stats.ClientMemPeak.Load()
		if total <= peak || s.stats.ClientMemPeak.CompareAndSwap(peak, total) {
			return
		}
	}
}

// ReserveClients adds n bytes to the clients' memory (Stats.ClientMem) if the
// total stays within --maxmemory-clients, and reports whether it did. The
// front ends that refuse work rather than close a connection (an RLS
// call, an HTTP request header) take their memory with it, before they
// hold it where they can, and give it back with ReleaseClients.
func (s *Server) ReserveClients(n int64) bool {
	for {
		cur := s.stats.ClientMem.Load()
		if !s.cfg.MaxMemoryClients.Within(cur + n) {
			return false
		}
		if s.stats.ClientMem.CompareAndSwap(cur, cur+n) {
			s.noteClientsPeak(cur + n)
			return true
		}
	}
}

// ReleaseClients gives back n bytes reserveClients took.
func (s *Server) ReleaseClients(n int64) { s.stats.ClientMem.Add(-n) }

// finish closes the connection and forgets it.
func (cn *conn) finish() {
	s := cn.srv
	s.txEnd(cn.cl) // a watch it holds makes every write count
	cn.rbuf, cn.obuf, cn.args, cn.cl.Out = nil, nil, nil, nil
	cn.f = nil
	s.stats.ClientMem.Add(-cn.mem)
	cn.mem = 0
	if cn.cl.failed {
		cn.lingerClose()
	}
	cn.forceClose()
	s.mu.Lock()
	delete(s.mu.guards, cn)
	delete(s.mu.clients, cn.cl.id)
	s.mu.Unlock()
	s.gate.Release() // the slot its door took
	s.conns.Done()
}

// lingerClose ends the sending side first and drains (boundedly) what the
// client still sends, so that closing with unread input, which makes the
// kernel reset the connection, cannot discard the error reply just sent.
func (cn *conn) lingerClose() {
	cw, ok := cn.nc.(interface{ CloseWrite() error })
	if !ok {
		return
	}
	_ = cw.CloseWrite()
	_ = cn.nc.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.CopyN(io.Discard, cn.nc, 1<<20)
}

func (cn *conn) forceClose() {
	cn.closeOnce.Do(func() { _ = cn.nc.Close() })
}

// startDrain stops reading more commands from this connection; the
// pipeline being executed still gets its replies.
func (cn *conn) startDrain() {
	cn.draining.Store(true)
	_ = cn.nc.SetReadDeadline(time.Now())
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
