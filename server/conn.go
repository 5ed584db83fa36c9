package server

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// guardConn sits between a client's socket and redcon. Everything redcon
// reads has passed the framer: complete, canonical commands within the
// limits. A framing violation is answered with an error reply and ends the
// connection. It also counts bytes and lets a graceful shutdown end the
// read side while the last pipeline's replies are still written.
type guardConn struct {
	net.Conn
	srv *Server
	f   *framer

	rbuf []byte // socket reads
	obuf []byte // framer output, reused
	out  []byte // unread part of obuf
	err  error  // sticky read error

	draining  atomic.Bool // shutdown: stop reading, finish what was read
	readDone  atomic.Bool // the reader has seen its last byte
	closeOnce sync.Once
}

// errProtocolClosed ends a connection after a framing violation.
var errProtocolClosed = errors.New("connection closed after a protocol error")

// Read hands redcon the next complete commands.
func (g *guardConn) Read(p []byte) (int, error) {
	for len(g.out) == 0 {
		if pe, ok := g.err.(*pendingProtocolError); ok {
			g.replyProtocolError(pe.err)
			g.err = errProtocolClosed
		}
		if g.err != nil {
			return 0, g.endRead(g.err)
		}
		if g.draining.Load() {
			return 0, g.endRead(io.EOF)
		}
		if t := g.srv.cfg.IdleTimeout; t > 0 {
			_ = g.Conn.SetReadDeadline(time.Now().Add(t))
			if g.draining.Load() {
				// startDrain's deadline may have been overwritten.
				return 0, g.endRead(io.EOF)
			}
		}
		n, err := g.Conn.Read(g.rbuf)
		if err != nil && g.srv.cfg.IdleTimeout > 0 && !g.draining.Load() && isTimeout(err) {
			g.srv.stats.idleClosed.Add(1)
			g.srv.log.Debug("closing idle connection", "remote", g.RemoteAddr().String(), "timeout", g.srv.cfg.IdleTimeout)
		}
		if n > 0 {
			g.srv.stats.netIn.Add(int64(n))
			var ferr error
			g.obuf, ferr = g.f.feed(g.obuf[:0], g.rbuf[:n])
			g.out = g.obuf
			if ferr != nil {
				g.srv.stats.protocolErrors.Add(1)
				g.srv.log.Debug("closing connection after a protocol error", "remote", g.RemoteAddr().String(), "err", ferr)
				// Commands before the violation still run; the error reply
				// goes out when redcon asks for more.
				g.err = &pendingProtocolError{ferr}
			}
		}
		if err != nil && g.err == nil {
			if g.draining.Load() {
				err = io.EOF
			}
			g.err = err
		}
	}
	n := copy(p, g.out)
	g.out = g.out[n:]
	return n, nil
}

type pendingProtocolError struct{ err error }

func (e *pendingProtocolError) Error() string { return e.err.Error() }

func (g *guardConn) endRead(err error) error {
	g.readDone.Store(true)
	return err
}

// replyProtocolError writes the error reply straight to the socket. redcon
// has flushed every earlier reply before it asks for more input, so the
// order holds.
func (g *guardConn) replyProtocolError(err error) {
	msg := appendError(nil, "ERR "+err.Error())
	_ = g.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = g.Write(msg)
}

// Write sends replies and counts them.
func (g *guardConn) Write(p []byte) (int, error) {
	n, err := g.Conn.Write(p)
	g.srv.stats.netOut.Add(int64(n))
	return n, err
}

// Close closes the socket, except while draining for a shutdown before the
// reader has finished: then it only stops further reads, so that the
// pipeline being executed can still send its replies. redcon closes again
// when its reader returns.
func (g *guardConn) Close() error {
	if g.draining.Load() && !g.readDone.Load() {
		return g.Conn.SetReadDeadline(time.Now())
	}
	return g.forceClose()
}

func (g *guardConn) forceClose() error {
	var err error
	g.closeOnce.Do(func() {
		err = g.Conn.Close()
		g.srv.forgetConn(g)
	})
	return err
}

// startDrain stops reading more commands from this connection.
func (g *guardConn) startDrain() {
	g.draining.Store(true)
	_ = g.Conn.SetReadDeadline(time.Now())
}

// guardListener wraps accepted connections in guardConns and retries
// temporary accept errors with a backoff, which redcon does not.
type guardListener struct {
	net.Listener
	srv *Server
}

func (l *guardListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			g, closing := l.srv.newGuardConn(c)
			if g != nil {
				return g, nil
			}
			if closing {
				c.Close()
				return nil, net.ErrClosed
			}
			continue // refused; admit answers and closes it
		}
		if errors.Is(err, net.ErrClosed) || l.srv.closing.Load() {
			return nil, net.ErrClosed
		}
		// Out of file descriptors and the like: wait rather than spin.
		if delay == 0 {
			delay = 5 * time.Millisecond
		} else if delay *= 2; delay > time.Second {
			delay = time.Second
		}
		l.srv.log.Warn("accept failed; retrying", "err", err, "retry_in", delay)
		time.Sleep(delay)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
