package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/conffile"
	"github.com/sluicehq/sluice/internal/resp"
)

// TLSFiles names the PEM files of the server's TLS identity. With CA set,
// clients must present a certificate signed by it.
type TLSFiles struct {
	Cert, Key string
	CA        string // optional
}

// tlsState holds the loaded certificates; Reload swaps them while
// connections stay open, new handshakes use the new ones.
type tlsState struct {
	files    TLSFiles
	maxBytes int64 // each file's (Config.MaxConfigFile)
	cur      atomic.Pointer[tls.Config]
}

func newTLSState(f TLSFiles, maxBytes int64) (*tlsState, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("server: TLS needs both a certificate and a key file")
	}
	t := &tlsState{files: f, maxBytes: maxBytes}
	if err := t.load(); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *tlsState) load() error {
	certPEM, err := conffile.Read(t.files.Cert, t.maxBytes)
	if err != nil {
		return fmt.Errorf("server: read TLS certificate: %w", err)
	}
	keyPEM, err := conffile.Read(t.files.Key, t.maxBytes)
	if err != nil {
		return fmt.Errorf("server: read TLS key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("server: load TLS certificate %s and key %s: %w", t.files.Cert, t.files.Key, err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.files.CA != "" {
		pem, err := conffile.Read(t.files.CA, t.maxBytes)
		if err != nil {
			return fmt.Errorf("server: read TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("server: TLS CA file %s holds no PEM certificate", t.files.CA)
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	t.cur.Store(c)
	return nil
}

// config is the listener's configuration: every handshake asks for the
// current one.
func (t *tlsState) config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.cur.Load(), nil
		},
	}
}

// httpConfig is the configuration of the HTTP listeners (the probes and
// metrics port, /check): like config, but a client certificate is checked
// when given rather than required in the handshake, so that probes and
// proxies on loopback need none; each handler decides what a request
// without one may do.
func (t *tlsState) httpConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := t.cur.Load().Clone()
			if c.ClientAuth == tls.RequireAndVerifyClientCert {
				c.ClientAuth = tls.VerifyClientCertIfGiven
			}
			return c, nil
		},
	}
}

// replication returns the configurations of the replication transport
// between the nodes of replicated shards: mutual TLS, each node
// presenting the server's certificate and verifying the others' against
// the CA of --tls-ca, both as reloaded (new connections take the new
// certificate). Without a CA the nodes could not tell each other from
// anyone: refused.
func (t *tlsState) replication() (client, server *tls.Config, err error) {
	if t.files.CA == "" {
		return nil, nil, errors.New("server: --cluster-replicas with --tls-cert needs --tls-ca: the nodes authenticate each other's replication connections with certificates that CA signed, each allowing client and server authentication and naming the host of its node's replication address")
	}
	server = &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.cur.Load(), nil
		},
	}
	client = &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    t.cur.Load().ClientCAs,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &t.cur.Load().Certificates[0], nil
		},
	}
	return client, server, nil
}

// ReloadTLS reads the TLS files again, for SIGHUP after a certificate
// renewal, as a reload (reload.go). Open connections keep their session;
// on an error the old certificates stay in use.
func (s *Server) ReloadTLS() error { return s.reloading(s.reloadTLS) }

func (s *Server) reloadTLS() error {
	if s.tls == nil {
		return nil
	}
	if err := s.tls.load(); err != nil {
		s.log.Error("TLS reload failed; keeping the certificates in use", "err", err)
		return err
	}
	s.log.Info("TLS certificates reloaded", "cert", s.tls.files.Cert)
	return nil
}

// clientCertsRequired reports whether TLS admits only clients with a
// certificate from the configured CA.
func (s *Server) clientCertsRequired() bool {
	return s.tls != nil && s.tls.files.CA != ""
}

// protected reports whether protected mode applies: on, and neither a
// password nor client certificates keep strangers out.
func (s *Server) protected() bool {
	return !s.cfg.AllowRemoteWithoutAuth && s.cfg.Password == "" && !s.clientCertsRequired()
}

const deniedMessage = "DENIED sluice is running in protected mode because protected mode is enabled and no password is set. " +
	"In this mode connections are only accepted from the loopback interface. To accept others, set a password " +
	"(--requirepass or --requirepass-file), require TLS client certificates (--tls-ca), or, if this server is " +
	"only reachable from a network you trust, start it with --protected-mode no."

// warnIfExposed logs loudly when the listener is reachable from other
// machines and nothing but the network keeps strangers out.
func (s *Server) warnIfExposed(a net.Addr) {
	if s.cfg.Password != "" || s.clientCertsRequired() {
		return
	}
	if ta, ok := a.(*net.TCPAddr); ok && ta.IP.IsLoopback() {
		return
	}
	if s.cfg.AllowRemoteWithoutAuth {
		s.log.Warn("WARNING: listening on a non-loopback address with no password and no TLS client certificates, and protected mode is off: anyone who can reach this port can use and exhaust every limit",
			"addr", a.String())
		return
	}
	s.log.Warn("WARNING: listening on a non-loopback address with no password and no TLS client certificates: protected mode refuses every client that is not on loopback (set --requirepass-file, or --tls-ca, or --protected-mode no)",
		"addr", a.String())
}

// checkAuth compares a user and password with the configuration in
// constant time. The only user is "default", as in Redis without ACLs.
func (s *Server) checkAuth(user, pass []byte) bool {
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
	s.stats.authFailures.Add(1)
	c.authFails++
	closing := !s.cfg.RESP.MaxAuthFailures.Off() && c.authFails >= s.cfg.RESP.MaxAuthFailures.N()
	if closing {
		s.stats.authClosed.Add(1)
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
		"failures_total", s.stats.authFailures.Load(), "window", authLogWindow.String())
	a.mu.failures, a.mu.closed = 0, 0
	clear(a.mu.addrs)
}

// stop logs what is left and ends the windows; Close calls it.
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
	s.stats.crossProtocol.Add(1)
	c.quit = true
	c.silent = true
	now := s.clock().Unix()
	last := s.crossLogged.Load()
	if (now-last > crossProtocolLogEvery || last-now > crossProtocolLogEvery) && s.crossLogged.CompareAndSwap(last, now) {
		s.log.Warn("possible SECURITY ATTACK detected: a client sent POST or Host: as a command, as an HTTP request does, maybe a web page attempting cross-protocol scripting; connection closed",
			"client", c.id, "remote", c.addr, "note", "logged at most once a minute; INFO stats cross_protocol_closed and sluice_cross_protocol_closed_total count them all")
	}
}
