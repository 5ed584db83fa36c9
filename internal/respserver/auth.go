package respserver

import (
	"crypto/sha256"
	"crypto/subtle"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/resp"
)

// CheckAuth compares a user and password with the configuration in
// constant time. The only user is "default", as in Redis without ACLs.
func (s *Server) CheckAuth(user, pass []byte) bool {
	h := sha256.Sum256(pass)
	okPass := subtle.ConstantTimeCompare(h[:], s.passHash[:]) == 1
	return okPass && string(user) == "default" && s.cfg.Password != ""
}

// allowedBeforeAuth are the commands a client may send before AUTH.
func allowedBeforeAuth(name string) bool {
	switch name {
	case "auth", "hello", "ping", "quit":
		return true
	}
	return false
}

var (
	errNoAuth    = resp.Error("NOAUTH Authentication required.")
	errWrongPass = resp.Error("WRONGPASS invalid username-password pair or user is disabled.")
	errNoPass    = resp.Error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")
)

// authFailed answers a failed AUTH or HELLO AUTH, counts it, and closes
// the connection after its MaxAuthFailures-th failure: one connection can
// then try a few passwords, not hundreds of thousands a second.
func (s *Server) authFailed(c *client) {
	s.stats.AuthFailures.Add(1)
	c.authFails++
	closing := !s.cfg.MaxAuthFailures.Off() && c.authFails >= s.cfg.MaxAuthFailures.N()
	if closing {
		s.stats.AuthClosed.Add(1)
		c.quit = true // after this reply; the rest of the pipeline is not run
		c.failed = true
	}
	s.authLog.failed(s, c, closing)
	s.replyErr(c, errWrongPass)
}

// authLogWindow is the most often failed authentications are logged: the
// first failure after a quiet window is logged at once, later ones are
// summed up in one line per window.
const authLogWindow = 10 * time.Second

// authLogMaxAddrs bounds the distinct addresses a summary counts, so that
// failures from many addresses cannot grow memory.
const authLogMaxAddrs = 1024

// authLog rate-limits the warnings about failed authentications.
type authLog struct {
	mu struct {
		sync.Mutex
		timer    *time.Timer // set while a window is open
		stopped  bool
		failures int // since the last line
		closed   int // connections closed for too many failures, since the last line
		addrs    map[string]struct{}
	}
}

func (a *authLog) failed(s *Server, c *client, closing bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mu.stopped {
		return
	}
	if a.mu.timer == nil {
		s.log.Warn("authentication failed", "client", c.id, "remote", c.addr, "failures_on_connection", c.authFails, "connection_closed", closing,
			"note", "further failures are summed up every "+authLogWindow.String())
		a.mu.timer = time.AfterFunc(authLogWindow, func() { a.flush(s) })
		return
	}
	a.mu.failures++
	if closing {
		a.mu.closed++
	}
	if a.mu.addrs == nil {
		a.mu.addrs = make(map[string]struct{})
	}
	if len(a.mu.addrs) < authLogMaxAddrs {
		host, _, err := net.SplitHostPort(c.addr)
		if err != nil {
			host = c.addr
		}
		a.mu.addrs[host] = struct{}{}
	}
}

// flush ends a window: it logs the failures since the last line, if any,
// and opens the next window; after a quiet window the next failure is
// logged at once again.
func (a *authLog) flush(s *Server) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mu.stopped {
		return
	}
	if a.mu.failures == 0 {
		a.mu.timer = nil
		return
	}
	a.logLocked(s)
	a.mu.timer.Reset(authLogWindow)
}

func (a *authLog) logLocked(s *Server) {
	addrs := strconv.Itoa(len(a.mu.addrs))
	if len(a.mu.addrs) >= authLogMaxAddrs {
		addrs += " or more"
	}
	s.log.Warn("authentication failures", "failures", a.mu.failures, "addresses", addrs, "connections_closed", a.mu.closed,
		"failures_total", s.stats.AuthFailures.Load(), "window", authLogWindow.String())
	a.mu.failures, a.mu.closed = 0, 0
	clear(a.mu.addrs)
}

// stop logs what is left and ends the windows; Closed calls it.
func (a *authLog) stop(s *Server) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mu.stopped {
		return
	}
	a.mu.stopped = true
	if a.mu.timer != nil {
		a.mu.timer.Stop()
	}
	if a.mu.failures > 0 {
		a.logLocked(s)
	}
}

// crossProtocolLogEvery is the least time between two warnings about
// cross-protocol attacks, as Redis (securityWarningCommand): one a minute,
// so that a flood of them cannot flood the log.
const crossProtocolLogEvery = 60 // seconds

// isCrossProtocol reports whether a command name is POST or Host:, any
// case: the first words of an HTTP POST request's line and of its Host
// header, which no RESP client sends. A browser that a web page makes POST
// to the RESP port sends its body, which can hold commands, behind them
// ("cross-protocol scripting"); the headers of any HTTP request have Host:.
func isCrossProtocol(name []byte) bool {
	return resp.EqualFold(name, "post") || resp.EqualFold(name, "host:")
}

// crossProtocol closes a connection that sent POST or Host: as a command,
// as Redis does: without running it or what follows, and without sending
// the replies not yet sent. It is counted and logged at most once a
// minute.
func (s *Server) crossProtocol(c *client) {
	s.stats.CrossProtocol.Add(1)
	c.quit = true
	c.silent = true
	now := s.clock().Unix()
	last := s.crossLogged.Load()
	if (now-last > crossProtocolLogEvery || last-now > crossProtocolLogEvery) && s.crossLogged.CompareAndSwap(last, now) {
		s.log.Warn("possible SECURITY ATTACK detected: a client sent POST or Host: as a command, as an HTTP request does, maybe a web page attempting cross-protocol scripting; connection closed",
			"client", c.id, "remote", c.addr, "note", "logged at most once a minute; INFO stats cross_protocol_closed and sluice_cross_protocol_closed_total count them all")
	}
}
