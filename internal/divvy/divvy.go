// Package divvy serves the divvy line protocol, a front end of the rules:
// one HIT per line, one reply line per request in order, ERR then close on
// a bad line. The lines read together are run as one engine.Round: their
// writes are committed once, and only then are their replies written, as
// for a RESP pipeline.
//
// The server that runs it hands Serve a listener that admits connections
// already (--maxclients, protected mode) and a Host for what is the
// server's: rendering an error once it is logged and counted, and the
// counters it shares with the other front ends. A Server is safe for
// concurrent use.
package divvy

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
)

// Defaults for the line protocol's limits.
const (
	DefaultMaxLine     = 64 << 10
	DefaultMaxPipeline = 1024
)

// Config configures a Server. A zero field means the default given.
type Config struct {
	// MaxLine is the longest line accepted, without its line end; default
	// DefaultMaxLine. A longer one is answered `ERR unknown "line too
	// long"` and the connection is closed.
	MaxLine int
	// MaxPipeline is the most HIT lines run, and replies held, per round:
	// a client that pipelines more waits for the replies of the first ones
	// before the rest are read. Default DefaultMaxPipeline.
	MaxPipeline int
	// IdleTimeout closes a connection that sends nothing, or does not take
	// its replies, for this long; zero never does.
	IdleTimeout time.Duration
	Logger      *slog.Logger // default: discard
}

// Host is what the line protocol needs of the server that runs it.
type Host interface {
	// Failure returns the typed error of err for a reply, once the server
	// has logged what is not meant for clients and counted the store's
	// errors.
	Failure(err error) *errs.Error
}

// Shared is what the line protocol shares with the server's other front
// ends: the counters it adds to, the --maxclients slots (Gate, which
// also answers a connection refused) and protected mode (Guard).
type Shared struct {
	NetIn, NetOut, Panics, IdleClosed, ConnsTotal *atomic.Int64
	Gate                                          *admit.Gate
	Guard                                         admit.Guard
}

// Server serves the line protocol's connections.
type Server struct {
	cfg    Config
	eng    *engine.Engine
	rules  *rules.File
	host   Host
	shared Shared
	log    *slog.Logger

	// Open is the connections open now (divvy_tcp_connections_total),
	// Total those accepted.
	Open, Total atomic.Int64
	// ErrUnknownCommand and ErrUnknown count the ERR replies by code
	// (divvy_errors_total).
	ErrUnknownCommand, ErrUnknown atomic.Int64
	// Seconds times each round (divvy_hit_duration_seconds).
	Seconds prometheus.Histogram

	closing atomic.Bool
	wg      sync.WaitGroup
	mu      struct {
		sync.Mutex
		conns map[*conn]struct{}
	}
}

// New returns a Server running hits in eng against the rules f has in use.
func New(cfg Config, eng *engine.Engine, f *rules.File, host Host, shared Shared) *Server {
	if cfg.MaxLine <= 0 {
		cfg.MaxLine = DefaultMaxLine
	}
	if cfg.MaxPipeline <= 0 {
		cfg.MaxPipeline = DefaultMaxPipeline
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, eng: eng, rules: f, host: host, shared: shared, log: cfg.Logger}
	s.Seconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "divvy_hit_duration_seconds",
		Help: "Time to execute the HIT lines read together from one line-protocol connection, commit their writes and send the replies (observed once per round: each hit in it waited that long).",
		// divvy's own buckets were Prometheus' defaults; these reach down
		// to the microseconds a hit takes here.
		Buckets: prometheus.ExponentialBuckets(10e-6, 2, 18),
	})
	s.mu.conns = make(map[*conn]struct{})
	return s
}

// Config is the configuration the server runs with, every default
// applied: what CONFIG GET shows.
func (s *Server) Config() Config { return s.cfg }

// conn is one line-protocol connection.
type conn struct {
	s        *Server
	nc       net.Conn
	draining atomic.Bool
	errSent  bool // an ERR was written: close gently, see lingerClose
	buf      []byte
	out      []byte
	r        *engine.Round
}

// Serve serves the connections ln admits until ln is closed (the server
// closes it when it drains the listener); then it returns nil.
func (s *Server) Serve(ln net.Listener) error {
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return nil
			}
			return err
		}
		if c := s.admit(nc); c != nil {
			go c.serve()
		}
	}
}

// Door is how the line protocol's listener admits: a slot of
// --maxclients (Shared.Gate), shared with RESP and HTTP, given back when
// the connection closes, and protected mode unless it is off: the line
// protocol has no authentication. It refuses with an ERR line, counted in
// divvy_errors_total.
func (s *Server) Door() admit.Door {
	guarded := !s.shared.Guard.Off
	return admit.Door{
		Name:    "divvy",
		Take:    s.shared.Gate.Take,
		Guarded: func() bool { return guarded },
		Full:    Refusal("max number of clients reached"),
		Denied:  Refusal("DENIED: sluice is in protected mode and the divvy line protocol has no authentication; it serves clients on loopback only unless started with --protected-mode no"),
		Refused: func() { s.ErrUnknown.Add(1) },
		Conn:    func(c *admit.Conn) net.Conn { return c },
		Drain:   s, // every connection finishes its round and closes
	}
}

// WarnUnauthenticated logs that the line protocol, served on a, has
// neither AUTH nor TLS, when the server's other front ends require either
// (Shared.Guard).
func (s *Server) WarnUnauthenticated(a net.Addr) {
	if g := s.shared.Guard; g.Password || g.CertsRequired() {
		s.log.Warn("the divvy line protocol has no AUTH and no TLS: anyone who can reach its address can use it", "addr", a.String())
	}
}

// PolicyInfo writes the line protocol's lines of INFO's policy section:
// its address, served on by the server ("" when it is off), and the
// connections open.
func (s *Server) PolicyInfo(kv func(k, v string), addr string) {
	kv("divvy_addr", addr)
	kv("divvy_connections", strconv.FormatInt(s.Open.Load(), 10))
}

// Refusal is the line a connection refused for reason gets.
func Refusal(reason string) []byte {
	return (&policy.ProtocolError{Code: policy.CodeUnknown, Reason: reason}).AppendReply(nil)
}

// admit registers an admitted connection, or answers and closes it once
// Finish has begun.
func (s *Server) admit(nc net.Conn) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		s.ErrUnknown.Add(1)
		s.shared.Gate.Refuse(nc, Refusal("server is shutting down"))
		return nil
	}
	c := &conn{s: s, nc: nc, r: s.eng.NewRound()}
	s.mu.conns[c] = struct{}{}
	s.wg.Add(1)
	s.Open.Add(1)
	s.Total.Add(1)
	s.shared.ConnsTotal.Add(1)
	return c
}

// Finish asks every connection to finish its round and close, and refuses
// the connections handed over from now on. The server drains the line
// protocol's listener with Finish, Force and Wait, as every front end's
// (its admitListener's drain); it closes the listener.
func (s *Server) Finish() {
	s.mu.Lock()
	s.closing.Store(true)
	conns := make([]*conn, 0, len(s.mu.conns))
	for c := range s.mu.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.draining.Store(true)
		_ = c.nc.SetReadDeadline(time.Now())
	}
}

// Force closes every connection still open.
func (s *Server) Force() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.mu.conns {
		_ = c.nc.Close()
	}
}

// Wait returns once every connection has ended.
func (s *Server) Wait() { s.wg.Wait() }

func (d *conn) serve() {
	s := d.s
	defer func() {
		if d.errSent {
			d.lingerClose()
		}
		_ = d.nc.Close() // gives its --maxclients slot back
		s.mu.Lock()
		delete(s.mu.conns, d)
		s.mu.Unlock()
		s.Open.Add(-1)
		s.wg.Done()
	}()
	defer func() {
		if r := recover(); r != nil {
			s.shared.Panics.Add(1)
			s.log.Error("divvy line panicked; closing the connection", "remote", d.nc.RemoteAddr().String(), "panic", r)
		}
	}()
	maxLine := s.cfg.MaxLine
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
		if t := s.cfg.IdleTimeout; t > 0 {
			_ = d.nc.SetReadDeadline(time.Now().Add(t))
		}
		if d.draining.Load() {
			return
		}
		n, err := d.nc.Read(d.buf[end:])
		end += n
		if n > 0 {
			s.shared.NetIn.Add(int64(n))
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			eof = true // a last line without "\n" is still executed
		case isTimeout(err) && !d.draining.Load():
			s.shared.IdleClosed.Add(1)
			return
		default:
			return
		}
	}
}

// round executes the complete lines in d.buf[start:end], at most
// MaxPipeline of them, and, when eof, a last line without "\n", in
// one engine.Round; commits it; and writes their replies. It returns where the
// unread bytes start, and stop when the connection must close.
func (d *conn) round(start, end int, eof bool) (next int, stop bool) {
	s := d.s
	t0 := time.Now()
	lp := s.rules.Current()
	d.out = d.out[:0]
	// Resharding: MIGRATE PAUSE waits for the round's hits to be committed
	// (internal/clusternode/migrate.go).
	d.r.Begin()
	defer d.r.End() // a panic, which serve recovers, must not leave it counted
	firstWrite := -1
	for n := 0; n < s.cfg.MaxPipeline && start < end && !stop; {
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
		if len(line) > s.cfg.MaxLine {
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
			d.out = d.errReply(policy.CodeUnknown, s.reason(rules.ErrNoPolicy))
			stop = true
			break
		}
		mark, before := len(d.out), d.r.Len()
		out, err := d.r.Hit(lp, d.r.Req, 1, d.r.Now().UnixNano())
		if err != nil {
			d.out = d.errReply(policy.CodeUnknown, s.reason(err))
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
		d.out = d.errReply(policy.CodeUnknown, s.reason(err))
		stop = true
	}
	if len(d.out) > 0 {
		if t := s.cfg.IdleTimeout; t > 0 {
			_ = d.nc.SetWriteDeadline(time.Now().Add(t))
		}
		n, err := d.nc.Write(d.out)
		s.shared.NetOut.Add(int64(n))
		if err != nil {
			stop = true
		}
	}
	s.Seconds.Observe(time.Since(t0).Seconds())
	return start, stop
}

// lingerClose ends a connection after an ERR without losing the ERR: a
// close with the client's unread lines still queued would send a TCP reset,
// which can discard the reply before the client reads it. So it sends FIN
// first, then reads and drops what the client still sends, for at most a
// second or 1 MiB, before the caller closes.
func (d *conn) lingerClose() {
	cw, ok := d.nc.(interface{ CloseWrite() error })
	if !ok {
		return
	}
	_ = cw.CloseWrite()
	_ = d.nc.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.CopyN(io.Discard, d.nc, 1<<20)
}

// errReply appends an ERR line to d.out and counts it.
func (d *conn) errReply(code, reason string) []byte {
	d.errSent = true
	switch code {
	case policy.CodeUnknownCommand:
		d.s.ErrUnknownCommand.Add(1)
	default:
		d.s.ErrUnknown.Add(1)
	}
	return (&policy.ProtocolError{Code: code, Reason: reason}).AppendReply(d.out)
}

// fail writes one ERR line, for a connection about to close.
func (d *conn) fail(code, reason string) {
	d.out = d.errReply(code, reason)
	_ = d.nc.SetWriteDeadline(time.Now().Add(time.Second))
	n, _ := d.nc.Write(d.out)
	d.s.shared.NetOut.Add(int64(n))
}

// reason renders err as the quoted reason of an ERR line (Reason).
func (s *Server) reason(err error) string { return Reason(s.host.Failure(err)) }

// Reason renders e as the quoted reason of an ERR line: its text, without
// characters the line cannot hold.
func Reason(e *errs.Error) string {
	b := []byte(e.Text())
	for i, c := range b {
		if c == '"' || c == '\n' || c == '\r' {
			b[i] = '\''
		}
	}
	return string(b)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
