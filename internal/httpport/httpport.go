// Package httpport serves sluice's HTTP listeners: the HTTP port
// (/metrics, /healthz, /readyz and /backup: Routes) and the http.Server
// every HTTP listener runs with, this one's and GET /check's (Port): the
// timeouts, net/http's log lines in the server's logger, TLS, a request
// header's bytes counted against --maxmemory-clients while it is read,
// admission through an admit.Listener, and the drain on shutdown
// (Listener).
//
// A Port and a Listener are safe for concurrent use.
package httpport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/storage"
)

// Host is what the HTTP listeners ask of the server.
type Host interface {
	// ReserveClients takes n bytes of --maxmemory-clients, or reports
	// false when they would pass it.
	ReserveClients(n int64) bool
	// ReleaseClients gives back n bytes ReserveClients took.
	ReleaseClients(n int64)
	// NotReady says why the server should get no traffic (/readyz), or
	// "" when it should.
	NotReady() string
	// CheckAuth reports whether user and pass are a user and its
	// password, as AUTH checks them (Access).
	CheckAuth(user, pass []byte) bool
	BackupHost
}

// DefaultMaxHeaderBytes is the default bound of an HTTP request's header:
// what a proxy forwards to /check (Envoy accepts 60 KiB of request
// headers by default, nginx 32 KiB) and far more than a scraper sends.
const DefaultMaxHeaderBytes = 64 << 10

// Config is what an operator sets of the HTTP listeners, the HTTP
// port's and /check's. A zero field means the default given.
type Config struct {
	// MaxHeaderBytes bounds a request's header on the HTTP listener and
	// on /check (http.Server.MaxHeaderBytes: the request line, names and
	// values; net/http allows 4 KiB more); past it the request is
	// answered 431. Default DefaultMaxHeaderBytes.
	MaxHeaderBytes int
}

// Options configures a Port. Every field is required but Config.
type Options struct {
	Config
	Logger *slog.Logger
	Host   Host
	// Gate counts the connections against --maxclients.
	Gate *admit.Gate
	// Guard is protected mode, which /backup and Routes.Policy apply
	// (Access), and TLS: with Guard.TLS every listener serves over TLS.
	Guard admit.Guard
	// Closing is set once the server closes: a listener started then
	// refuses to serve.
	Closing *atomic.Bool
	// MaxMemoryClients is --maxmemory-clients, for the log.
	MaxMemoryClients int64
	// Evicted counts the connections closed at --maxmemory-clients.
	Evicted *atomic.Int64
	// AuthFailures counts failed authentications (Access.Failures).
	AuthFailures *atomic.Int64
	// Store is what /backup copies, under BackupDir (--backup-dir).
	Store     *storage.Store
	BackupDir string
}

// Port is what the HTTP listeners of one server share.
type Port struct {
	o      Options
	tls    *tls.Config // every listener's; nil: plain HTTP
	access Access      // who may take a backup or change the dials
	backup Backup
}

// New returns a Port for o.
func New(o Options) *Port {
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	p := &Port{o: o}
	if o.Guard.TLS != nil {
		p.tls = o.Guard.TLS.HTTPConfig()
	}
	p.access = Access{Guard: o.Guard, CheckAuth: o.Host.CheckAuth, Failures: o.AuthFailures, Logger: o.Logger}
	p.backup = Backup{Store: o.Store, Dir: o.BackupDir, Logger: o.Logger, Access: &p.access, Host: o.Host}
	return p
}

// Config is the Config in use, with every default applied.
func (p *Port) Config() Config { return p.o.Config }

// Grace is how long an HTTP listener's requests may take to finish once
// Stop stops it.
const Grace = time.Second

// Listener is the http.Server of one HTTP listener (the HTTP port, or
// /check): set once by Start, and drained by Stop as every front end's
// listener is (admit.Listener.Drain), within Grace: net/http's graceful
// shutdown, then a close of the connections left.
type Listener struct {
	mu      sync.Mutex
	srv     *http.Server
	ln      *admit.Listener // once srv serves on it
	stopped bool
	done    chan struct{} // closed once srv is shut down or closed
	end     sync.Once
}

// Start records srv as the one v serves. It reports false, and srv must
// not be served, when the server is closing or v was started already.
func (p *Port) Start(v *Listener, srv *http.Server) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if p.o.Closing.Load() || v.stopped || v.srv != nil {
		return false
	}
	v.srv, v.done = srv, make(chan struct{})
	return true
}

// listen records l as the listener srv serves on.
func (v *Listener) listen(l *admit.Listener) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.ln = l
}

// Stop drains the served server and makes a later Start refuse.
func (v *Listener) Stop() {
	v.mu.Lock()
	srv, ln, already := v.srv, v.ln, v.stopped
	v.stopped = true
	v.mu.Unlock()
	switch {
	case srv == nil || already:
	case ln == nil:
		_ = srv.Close() // not serving yet: Serve returns at once
	default:
		ln.Drain(time.Now().Add(Grace), Grace/10, Grace)
	}
}

// Finish implements admit.Drainer: net/http's graceful shutdown, which
// closes the idle connections and lets the requests under way finish.
func (v *Listener) Finish() {
	go func() {
		_ = v.srv.Shutdown(context.Background())
		v.end.Do(func() { close(v.done) })
	}()
}

// Force implements admit.Drainer.
func (v *Listener) Force() {
	_ = v.srv.Close()
	v.end.Do(func() { close(v.done) })
}

// Wait implements admit.Drainer.
func (v *Listener) Wait() { <-v.done }

// http503 answers a connection past --maxclients.
var http503 = []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 30\r\nConnection: close\r\n\r\nmax number of clients reached\n")

// Serve serves v's server, once started, on ln until Stop, counting its
// connections against --maxclients with take, below TLS, so that a
// refusal costs no handshake. name names the listener in the log.
func (p *Port) Serve(v *Listener, ln net.Listener, name string, take func() bool) error {
	srv := v.srv
	d := admit.Door{Name: name, Take: take, Conn: func(c *admit.Conn) net.Conn { return &conn{Conn: c, p: p} }, Drain: v}
	if p.tls == nil {
		d.Full = http503 // with TLS, which runs above, a refusal is closed
	}
	l := p.o.Gate.Listen(ln, d)
	v.listen(l)
	ln = l
	var err error
	if p.tls != nil {
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	if errors.Is(err, http.ErrServerClosed) || p.o.Closing.Load() {
		return nil
	}
	return err
}

// logWriter takes net/http's own log lines (failed TLS handshakes,
// accept errors, recovered handler panics) into the server's logger, so
// that --log-format json stays one JSON object per line. Failed handshakes
// are routine (port scanners, TCP probes on a TLS port) and go to debug,
// as protocol errors on RESP do; the rest are warnings.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	msg := strings.TrimRight(string(p), "\n")
	level := slog.LevelWarn
	if strings.HasPrefix(msg, "http: TLS handshake error") {
		level = slog.LevelDebug
	}
	w.log.Log(context.Background(), level, msg, "component", "http")
	return len(p), nil
}

// NewServer is an HTTP server for one of sluice's HTTP listeners, with
// their shared timeouts, logging and TLS.
func (p *Port) NewServer(h http.Handler) *http.Server {
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c, ok := r.Context().Value(connKey{}).(*conn); ok {
				c.handling(true)
				defer c.handling(false)
			}
			h.ServeHTTP(w, r)
		}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tls.Conn); ok {
				c = tc.NetConn()
			}
			return context.WithValue(ctx, connKey{}, c)
		},
		MaxHeaderBytes:    p.o.MaxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          log.New(logWriter{p.o.Logger}, "", 0),
	}
	if p.tls != nil {
		srv.TLSConfig = p.tls.Clone()
	}
	return srv
}

// connKey is the context key of a request's *conn.
type connKey struct{}

// conn takes what an HTTP connection reads while a request's header is
// read from --maxmemory-clients: net/http holds a header until it is
// whole, so connections that send long headers and never end them would
// otherwise hold up to --http-max-header-bytes each until the header
// timeout. The charge is given back when the request's handler starts
// (NewServer), when the next request's begins, and at close. A read
// that would pass the bound ends the connection, answered 503 when no TLS
// runs above.
type conn struct {
	*admit.Conn
	p  *Port
	mu struct {
		sync.Mutex
		held    int64 // taken with Host.ReserveClients
		handled bool  // a handler runs: reads are its body's
		closed  bool
		over    bool // a read passed --maxmemory-clients: the connection ends
	}
}

var http503Memory = func() []byte {
	const msg = "client memory limit reached: the clients' buffers exceed --maxmemory-clients\n"
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(msg), msg)
}()

// errClientMemory ends an HTTP connection at --maxmemory-clients.
var errClientMemory = errors.New("server: client memory limit reached")

func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n == 0 {
		return n, err
	}
	switch c.take(int64(n)) {
	case taken:
		return n, err
	case overNow:
		o := &c.p.o
		o.Evicted.Add(1)
		o.Logger.Warn("closing an HTTP connection: its request header and the buffers of all clients exceed --maxmemory-clients", "remote", c.RemoteAddr().String(), "limit", o.MaxMemoryClients)
		if c.p.tls == nil {
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write(http503Memory)
		}
	}
	// A read error net/http ends the connection on without answering (it
	// may read once more first).
	return 0, &net.OpError{Op: "read", Net: "tcp", Addr: c.RemoteAddr(), Err: errClientMemory}
}

// What take did with the bytes read.
const (
	taken   = iota
	overNow // they pass the bound: the connection is to be closed
	over    // it passed before
)

// take counts n bytes read against --maxmemory-clients.
func (c *conn) take(n int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.mu.over:
		return over
	case c.mu.handled || c.mu.closed:
		return taken
	case !c.p.o.Host.ReserveClients(n):
		c.mu.over = true
		return overNow
	}
	c.mu.held += n
	return taken
}

// handling marks the start (true) and end of a request's handler.
func (c *conn) handling(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.handled = on
	c.p.o.Host.ReleaseClients(c.mu.held)
	c.mu.held = 0
}

// Close implements net.Conn.
func (c *conn) Close() error {
	c.mu.Lock()
	c.mu.closed = true
	c.p.o.Host.ReleaseClients(c.mu.held)
	c.mu.held = 0
	c.mu.Unlock()
	return c.Conn.Close()
}

// Routes are the HTTP port's handlers that are not the port's own.
type Routes struct {
	Metrics http.Handler // GET /metrics
	// Policy is /v1/policy/, the rules' dials, behind /backup's checks
	// (Access); nil for none.
	Policy http.Handler
}

// Handler is the HTTP port's: /metrics and /v1/policy/ as r gives them,
// /backup (Backup), /healthz (the process answers) and /readyz
// (Host.NotReady).
func (p *Port) Handler(r Routes) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", r.Metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /backup", &p.backup)
	if r.Policy != nil {
		mux.Handle("/v1/policy/", p.access.Protect(r.Policy))
	}
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if reason := p.o.Host.NotReady(); reason != "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(reason + "\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}
