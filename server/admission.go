package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Connection admission: one count of open connections for every listener
// (RESP, the divvy line protocol, HTTP, /check, Envoy's rate limit
// service) against MaxClients, so that no listener can take the file
// descriptors the store needs. MaxClients itself is lowered to what the
// open-file limit leaves (see FDBudget). Every front end serves on one
// kind of listener, an admitListener: its door says how it admits
// (--maxclients, protected mode, TLS above admission), how it answers a
// refusal, and how its connections finish when the server closes (its
// drainer); the listener retries failed Accepts with a backoff, and Close
// drains every listener the same way (admitListener.drain).

// FDBudget is how the process's open-file limit (the soft RLIMIT_NOFILE) is
// shared: StoreFiles for the store's tables, ProcessFiles for everything
// else the process opens, and the rest for client connections, as Redis
// lowers maxclients to its limit minus a reserve.
type FDBudget struct {
	Limit      int // the open-file limit the process runs with
	StoreFiles int // Pebble's MaxOpenFiles: tables kept open, its logs and lock
	Reserved   int // StoreFiles + ProcessFiles: never given to connections
}

// File-descriptor reserve.
const (
	// ProcessFiles are the descriptors kept for everything but the store's
	// table cache and the connections: stdin, stdout and stderr, the
	// network poller, three listeners, the store's directory handles,
	// compaction outputs and the WAL being rotated (which Pebble does not
	// count in MaxOpenFiles), tables iterators keep open past the cache's
	// soft limit, CHECKPOINT copies, TLS and policy reloads, /proc reads
	// of the metrics collector, HTTPReserve probes, and RefusalSlots
	// connections being refused.
	ProcessFiles = 64
	// HTTPReserve is how many HTTP connections may be open past MaxClients,
	// so that liveness and readiness probes and metric scrapes are still
	// answered while RESP or line-protocol clients hold every slot (a probe
	// refused then would have the orchestrator restart a healthy server).
	// They are part of ProcessFiles.
	HTTPReserve = 8
	// RefusalSlots is how many refused connections may be answered at once;
	// beyond that a refused connection is closed without a reply, so that
	// a flood cannot hold descriptors or goroutines.
	RefusalSlots = 16
	// MinStoreFiles is the least MaxOpenFiles sluice gives Pebble: its
	// table cache never goes below 64 tables plus 10 other files.
	MinStoreFiles = 100
	// MaxStoreFiles is Pebble's own default MaxOpenFiles, the most sluice
	// gives it: a store of a few GiB has far fewer tables.
	MaxStoreFiles = 1000
	// MinClients is the fewest connections worth starting for: a limit
	// leaving fewer is an error.
	MinClients = 16
)

// ErrFDLimit is returned when the open-file limit is too low to run.
var ErrFDLimit = errors.New("server: open-file limit too low")

// BudgetFDs shares an open-file limit: a quarter of it, between
// MinStoreFiles and MaxStoreFiles, for the store, ProcessFiles for the
// process, the rest for connections. It fails with ErrFDLimit when fewer
// than MinClients connections would be left.
func BudgetFDs(limit int) (FDBudget, error) {
	b := FDBudget{Limit: limit, StoreFiles: min(max(limit/4, MinStoreFiles), MaxStoreFiles)}
	b.Reserved = b.StoreFiles + ProcessFiles
	if need := b.Reserved + MinClients; limit < need {
		return b, fmt.Errorf("%w: the open-file limit (RLIMIT_NOFILE) is %d; sluice needs at least %d: %d for the store, %d for itself and %d for clients; raise it (ulimit -n, or LimitNOFILE= in a systemd unit, or --ulimit nofile= for docker)",
			ErrFDLimit, limit, need, b.StoreFiles, ProcessFiles, MinClients)
	}
	return b, nil
}

// Clients is the most connections the budget leaves.
func (b FDBudget) Clients() int { return b.Limit - b.Reserved }

// admission counts open connections of every listener.
type admission struct {
	max       int64        // effective MaxClients
	requested int          // MaxClients as configured
	open      atomic.Int64 // connections admitted and not yet closed
	refusing  atomic.Int64 // refusals being written
}

// take admits a connection, or reports false when max are open.
func (a *admission) take() bool { return a.takeUpTo(a.max) }

// takeHTTP admits an HTTP connection, which may also use HTTPReserve
// slots past max.
func (a *admission) takeHTTP() bool { return a.takeUpTo(a.max + HTTPReserve) }

func (a *admission) takeUpTo(limit int64) bool {
	for {
		n := a.open.Load()
		if n >= limit {
			return false
		}
		if a.open.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (a *admission) release() { a.open.Add(-1) }

// initAdmission sets the effective MaxClients: the configured one, lowered
// to what Config.Files leaves for connections, with a warning that names
// both numbers, as Redis logs when it lowers maxclients.
func (s *Server) initAdmission() error {
	s.adm.requested = s.cfg.MaxClients
	if b := s.cfg.Files; b.Limit > 0 {
		if b.Clients() < MinClients {
			_, err := BudgetFDs(b.Limit)
			if err == nil {
				err = fmt.Errorf("%w: %d files reserved of %d", ErrFDLimit, b.Reserved, b.Limit)
			}
			return err
		}
		if b.Clients() < s.cfg.MaxClients {
			s.cfg.MaxClients = b.Clients()
			s.log.Warn("maxclients lowered to what the open-file limit allows; raise the limit (ulimit -n, LimitNOFILE=) to serve more clients",
				"maxclients", s.cfg.MaxClients, "requested", s.adm.requested, "fd_limit", b.Limit, "fd_reserved", b.Reserved, "store_max_open_files", b.StoreFiles)
		}
	}
	s.adm.max = int64(s.cfg.MaxClients)
	return nil
}

// refuse answers a connection that was not admitted with reply and closes
// it. The answer is written by a goroutine (a TLS handshake can take a
// while), at most RefusalSlots at once; past that the connection is closed
// without a reply. The goroutine sends the reply, half-closes, and reads
// what the client still sends for up to a second before closing, so that
// unread client input does not turn the close into a reset that could
// discard the reply.
func (s *Server) refuse(c net.Conn, reply []byte) {
	if s.adm.refusing.Add(1) > RefusalSlots {
		s.adm.refusing.Add(-1)
		_ = c.Close()
		return
	}
	go func() {
		defer s.adm.refusing.Add(-1)
		_ = c.SetDeadline(time.Now().Add(time.Second))
		n, err := c.Write(reply)
		s.stats.netOut.Add(int64(n))
		if cw, ok := c.(interface{ CloseWrite() error }); ok && err == nil {
			if cw.CloseWrite() == nil {
				_, _ = io.CopyN(io.Discard, c, 64<<10)
			}
		}
		_ = c.Close()
	}()
}

// acceptBackoff paces a listener's retries after failed Accepts (out of
// file descriptors, for example) as net/http does: 5ms, doubling to 1s, so
// that no accept loop spins; a success resets it.
type acceptBackoff struct {
	delay time.Duration
	sleep func(time.Duration) // time.Sleep; tests replace it
}

// wait logs err and sleeps before the next Accept.
func (b *acceptBackoff) wait(s *Server, listener string, err error) {
	b.delay = min(max(2*b.delay, 5*time.Millisecond), time.Second)
	s.log.Warn("accept failed; retrying", "listener", listener, "err", err, "retry_in", b.delay)
	sleep := b.sleep
	if sleep == nil {
		sleep = time.Sleep
	}
	sleep(b.delay)
}

// door is how one front end's listener admits a connection (admitListener):
// against --maxclients, shared by every front end, then by protected mode,
// and how it answers a connection it refuses.
type door struct {
	name string // the listener, in the log
	// take takes a connection slot: admission's take, or takeHTTP for the
	// probes' listener.
	take func() bool
	// guarded reports whether protected mode refuses peers that are not on
	// loopback now; nil never refuses (/check decides per request).
	guarded func() bool
	// full and denied are the answers to a connection refused at
	// --maxclients or by protected mode, written by refuse; nil closes it
	// without one.
	full, denied []byte
	// refused counts a refusal where the front end counts its own
	// (divvy_errors_total); nil for none.
	refused func()
	// tls, when set, serves the front end over TLS above admission: a
	// refusal is answered over TLS too. (HTTP and gRPC do their own TLS.)
	tls *tls.Config
	// conn wraps an admitted connection, which gives its slot back when
	// closed; nil hands the connection over as it is, and the front end
	// releases the slot itself when the connection ends (RESP: it unwraps
	// the socket for CLIENT LIST and half-closes).
	conn func(*admittedConn) net.Conn
	// drain is how the front end's connections finish when the server
	// closes (admitListener.drain); nil for a listener whose front end
	// drains itself (HTTP and /check: net/http's Shutdown, last, so that
	// /readyz answers 503 while the others drain).
	drain drainer
}

// drainer is how a front end's connections finish when the server closes.
// Every listener with one drains the same way (admitListener.drain).
type drainer interface {
	// finish asks every connection to finish what it has under way and
	// close, and the front end to refuse the connections handed over from
	// now on: RESP and the line protocol read no more and answer what
	// they read; gRPC sends GOAWAY and lets the calls under way end.
	finish()
	// force closes every connection still open.
	force()
	// wait returns once every connection has ended.
	wait()
}

// drain closes the listener and drains its front end's connections, the
// same way for every front end: it asks them to finish, waits for them
// until forceAt, then closes the ones left and waits for them for rest at
// most, giving up on a handler stuck below the network (in an fsync that
// does not return, say) rather than hang. Close calls it for every
// listener at once.
func (l *admitListener) drain(forceAt time.Time, rest time.Duration) {
	s, d := l.srv, l.door.drain
	_ = l.Listener.Close()
	d.finish()
	done := make(chan struct{})
	go func() {
		d.wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-s.after(time.Until(forceAt)):
	}
	d.force()
	s.log.Warn("shutdown timeout: closing connections that are still busy", "listener", l.door.name, "timeout", s.cfg.ShutdownTimeout)
	select {
	case <-done:
	case <-s.after(rest):
		s.log.Error("shutdown: connections still busy after closing them; giving up on them", "listener", l.door.name)
	}
}

// admitListener is every front end's listener: it accepts, retrying a
// failed Accept (out of file descriptors, for example) with a backoff
// instead of returning it, so that no front end spins or stops serving;
// and it hands over only the connections its door admits. Accept returns
// an error only once the listener is closed or the server is closing.
type admitListener struct {
	net.Listener
	srv     *Server
	door    door
	backoff acceptBackoff
}

// listen wraps ln in an admitListener of door d.
func (s *Server) listen(ln net.Listener, d door) *admitListener {
	return &admitListener{Listener: ln, srv: s, door: d}
}

// serve makes ln, wrapped in an admitListener of door d, the listener of
// a front end whose slot is *ln0, which Close drains; it fails once the
// server is closing (net.ErrClosed) or when the front end has one already
// (ErrServing). *ln0 is guarded by s.mu.
func (s *Server) serve(ln0 *net.Listener, ln net.Listener, d door) (*admitListener, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case *ln0 != nil:
		return nil, ErrServing
	case s.closing.Load():
		return nil, net.ErrClosed
	}
	*ln0 = ln
	l := s.listen(ln, d)
	s.mu.drain = append(s.mu.drain, l)
	return l, nil
}

// Accept implements net.Listener.
func (l *admitListener) Accept() (net.Conn, error) {
	s, d := l.srv, &l.door
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || s.closing.Load() {
				return nil, err
			}
			l.backoff.wait(s, d.name, err)
			continue
		}
		l.backoff.delay = 0
		if d.tls != nil {
			c = tls.Server(c, d.tls)
		}
		var reply []byte
		switch {
		case !d.take():
			s.stats.rejectedMax.Add(1)
			reply = d.full
		case d.guarded != nil && d.guarded() && !isLoopback(c.RemoteAddr()):
			s.adm.release()
			s.stats.rejectedDenied.Add(1)
			reply = d.denied
		case d.conn != nil:
			return d.conn(&admittedConn{Conn: c, adm: &s.adm}), nil
		default:
			return c, nil
		}
		if d.refused != nil {
			d.refused()
		}
		if reply == nil {
			_ = c.Close()
			continue
		}
		s.refuse(c, reply)
	}
}

// acceptEach accepts the connections l admits and hands each to serve,
// until Close (nil), the listener's close (its error), or serve reports
// false (nil).
func (s *Server) acceptEach(l *admitListener, serve func(net.Conn) bool) error {
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.closing.Load() {
				return nil
			}
			return err
		}
		if !serve(nc) {
			return nil
		}
	}
}

var http503 = []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 30\r\nConnection: close\r\n\r\nmax number of clients reached\n")

// admittedConn gives its slot back when closed.
type admittedConn struct {
	net.Conn
	adm  *admission
	once sync.Once
}

func (c *admittedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.adm.release)
	return err
}

// CloseWrite lets net/http half-close, as it does on a plain TCP conn.
func (c *admittedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
