// Package admit is every front end's listener. A Gate counts the open
// connections of every listener against one limit (--maxclients), so that
// no front end can take the file descriptors the store needs; a Listener
// hands its front end only the connections its Door admits (a slot of the
// Gate, then protected mode), answers the others in the front end's
// protocol, retries failed Accepts with a backoff, and drains its front
// end on shutdown the same way for every front end (Drain). What a door
// decides by is here too: the open-file budget that bounds --maxclients
// (FDBudget), protected mode (Guard) and the TLS certificates, reloaded
// while connections stay open (TLS), and what an operator sets of them
// (Config). New makes a server's Admission of them all.
//
// An Admission, a Gate, a Listener and a TLS are safe for concurrent use.
package admit

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// RefusalSlots is how many refused connections may be answered at once;
// beyond that a refused connection is closed without a reply, so that a
// flood cannot hold descriptors or goroutines.
const RefusalSlots = 16

// DefaultMaxClients is --maxclients' default, as in Redis: Gate.Max
// before the open-file limit lowers it (FDBudget.MaxClients).
const DefaultMaxClients = 10000

// Gate is what every listener of a server shares: the connection slots,
// the counters of refusals and the state of the server. Set its fields
// before the first Listen.
type Gate struct {
	// Max is the most connections open at once (--maxclients).
	Max int64
	Shared

	open     atomic.Int64 // connections admitted and not yet closed
	refusing atomic.Int64 // refusals being written
}

// Shared is what a Gate shares with its server: its state, its counters,
// its logger and its clock.
type Shared struct {
	// Closing reports that the server is closing: an Accept error then
	// ends the listener instead of being retried.
	Closing *atomic.Bool
	// RejectedMax and RejectedDenied count the connections refused at Max
	// and by protected mode; NetOut the bytes of the refusals written.
	RejectedMax, RejectedDenied, NetOut *atomic.Int64
	Log                                 *slog.Logger
	// After is time.After for Drain's waits; tests see and drive it.
	After func(time.Duration) <-chan time.Time
}

// Take admits a connection, or reports false when Max are open.
func (g *Gate) Take() bool { return g.TakeUpTo(g.Max) }

// TakeUpTo admits a connection while fewer than limit are open: a
// listener with slots of its own past Max (the probes') takes up to more.
func (g *Gate) TakeUpTo(limit int64) bool {
	for {
		n := g.open.Load()
		if n >= limit {
			return false
		}
		if g.open.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release gives a slot back.
func (g *Gate) Release() { g.open.Add(-1) }

// Open is the connections admitted and not yet closed.
func (g *Gate) Open() int64 { return g.open.Load() }

// Refuse answers a connection that was not admitted with reply and closes
// it. The answer is written by a goroutine (a TLS handshake can take a
// while), at most RefusalSlots at once; past that the connection is closed
// without a reply. The goroutine sends the reply, half-closes, and reads
// what the client still sends for up to a second before closing, so that
// unread client input does not turn the close into a reset that could
// discard the reply.
func (g *Gate) Refuse(c net.Conn, reply []byte) {
	if g.refusing.Add(1) > RefusalSlots {
		g.refusing.Add(-1)
		_ = c.Close()
		return
	}
	go func() {
		defer g.refusing.Add(-1)
		_ = c.SetDeadline(time.Now().Add(time.Second))
		n, err := c.Write(reply)
		g.NetOut.Add(int64(n))
		if cw, ok := c.(interface{ CloseWrite() error }); ok && err == nil {
			if cw.CloseWrite() == nil {
				_, _ = io.CopyN(io.Discard, c, 64<<10)
			}
		}
		_ = c.Close()
	}()
}

// Door is how one front end's listener admits a connection: against the
// Gate's slots, shared by every front end, then by protected mode; how it
// answers a connection it refuses; and how its connections finish when the
// server closes.
type Door struct {
	Name string // the listener, in the log
	// Take takes a connection slot: the Gate's Take, or a TakeUpTo for the
	// probes' listener.
	Take func() bool
	// Guarded reports whether protected mode refuses peers that are not on
	// loopback now; nil never refuses (/check decides per request).
	Guarded func() bool
	// Full and Denied are the answers to a connection refused at the
	// Gate's Max or by protected mode, written by Refuse; nil closes it
	// without one.
	Full, Denied []byte
	// Refused counts a refusal where the front end counts its own
	// (divvy_errors_total); nil for none.
	Refused func()
	// TLS, when set, serves the front end over TLS above admission: a
	// refusal is answered over TLS too. (HTTP and gRPC do their own TLS.)
	TLS *tls.Config
	// Conn wraps an admitted connection, which gives its slot back when
	// closed; nil hands the connection over as it is, and the front end
	// releases the slot itself when the connection ends (RESP: it unwraps
	// the socket for CLIENT LIST and half-closes).
	Conn func(*Conn) net.Conn
	// Drain is how the front end's connections finish when the server
	// closes (Listener.Drain); nil: the listener is only closed.
	Drain Drainer
}

// Drainer is how a front end's connections finish when the server closes.
// Every listener with one drains the same way (Listener.Drain).
type Drainer interface {
	// Finish asks every connection to finish what it has under way and
	// close, and the front end to refuse the connections handed over from
	// now on: RESP and the line protocol read no more and answer what
	// they read; gRPC sends GOAWAY and lets the calls under way end.
	Finish()
	// Force closes every connection still open.
	Force()
	// Wait returns once every connection has ended.
	Wait()
}

// Listener is every front end's listener: it accepts, retrying a failed
// Accept (out of file descriptors, for example) with a backoff instead of
// returning it, so that no front end spins or stops serving; and it hands
// over only the connections its door admits. Accept returns an error only
// once the listener is closed or the server is closing.
type Listener struct {
	net.Listener
	gate    *Gate
	door    Door
	backoff backoff
}

// Listen wraps ln in a Listener of door d.
func (g *Gate) Listen(ln net.Listener, d Door) *Listener {
	return &Listener{Listener: ln, gate: g, door: d}
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	g, d := l.gate, &l.door
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || g.Closing.Load() {
				return nil, err
			}
			l.backoff.wait(g.Log, d.Name, err)
			continue
		}
		l.backoff.delay = 0
		if d.TLS != nil {
			c = tls.Server(c, d.TLS)
		}
		var reply []byte
		switch {
		case !d.Take():
			g.RejectedMax.Add(1)
			reply = d.Full
		case d.Guarded != nil && d.Guarded() && !IsLoopback(c.RemoteAddr()):
			g.Release()
			g.RejectedDenied.Add(1)
			reply = d.Denied
		case d.Conn != nil:
			return d.Conn(&Conn{Conn: c, gate: g}), nil
		default:
			return c, nil
		}
		if d.Refused != nil {
			d.Refused()
		}
		if reply == nil {
			_ = c.Close()
			continue
		}
		g.Refuse(c, reply)
	}
}

// Drain closes the listener and drains its front end's connections, the
// same way for every front end: it asks them to finish, waits for them
// until forceAt, then closes the ones left and waits for them for rest at
// most, giving up on a handler stuck below the network (in an fsync that
// does not return, say) rather than hang. timeout is the shutdown timeout
// the two come from, for the log. A listener without a Drainer is only
// closed.
func (l *Listener) Drain(forceAt time.Time, rest, timeout time.Duration) {
	g, d := l.gate, l.door.Drain
	_ = l.Listener.Close()
	if d == nil {
		return
	}
	d.Finish()
	done := make(chan struct{})
	go func() {
		d.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-g.After(time.Until(forceAt)):
	}
	d.Force()
	g.Log.Warn("shutdown timeout: closing connections that are still busy", "listener", l.door.Name, "timeout", timeout)
	select {
	case <-done:
	case <-g.After(rest):
		g.Log.Error("shutdown: connections still busy after closing them; giving up on them", "listener", l.door.Name)
	}
}

// backoff paces a listener's retries after failed Accepts (out of file
// descriptors, for example) as net/http does: 5ms, doubling to 1s, so that
// no accept loop spins; a success resets it.
type backoff struct {
	delay time.Duration
	sleep func(time.Duration) // time.Sleep; tests replace it
}

// wait logs err and sleeps before the next Accept.
func (b *backoff) wait(log *slog.Logger, listener string, err error) {
	b.delay = min(max(2*b.delay, 5*time.Millisecond), time.Second)
	log.Warn("accept failed; retrying", "listener", listener, "err", err, "retry_in", b.delay)
	sleep := b.sleep
	if sleep == nil {
		sleep = time.Sleep
	}
	sleep(b.delay)
}

// Conn is an admitted connection that gives its slot back when closed.
type Conn struct {
	net.Conn
	gate *Gate
	once sync.Once
}

// Close implements net.Conn, and gives the slot back once.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.gate.Release)
	return err
}

// CloseWrite lets net/http half-close, as it does on a plain TCP conn.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// IsLoopback reports whether a is a loopback address (or a Unix socket):
// a peer protected mode serves.
func IsLoopback(a net.Addr) bool {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
