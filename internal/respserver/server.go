// Package respserver is sluice's RESP front end: it serves sluice's
// commands over RESP, the Redis protocol.
//
// It holds a connection loop around a framing check (so no client input
// can crash or stall the process, and no buffer outlives the command that
// grew it), the command table, per-pipeline execution with one
// durability wait per pipeline, MULTI/EXEC/WATCH, and connection state for
// HELLO, AUTH, CLIENT and INFO. Limit operations run in the engine
// (package engine); the command families are packages of their own
// (limitcmd, conncmd, policycmd, clusternode). What belongs to the whole
// server (the listener and its admission, the counters the front ends
// share, the other front ends' facts for INFO, reloads) comes from the
// composition root, package server, through Options: a Host and the
// Shared counters.
//
// Lifecycle: New, then Serve(listener) until the listener is closed; the
// listener drains the connections (Finish, Force, Wait: admit.Drainer). A
// Server is safe for concurrent use.
package respserver

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/storage"
)

// Defaults for Config.
const (
	DefaultMaxArgs         = 1024
	DefaultMaxBulk         = 1 << 20
	DefaultMaxInline       = 64 << 10
	DefaultMaxQueryBuffer  = 8 << 20
	DefaultMaxReplyBuffer  = 64 << 20
	DefaultMaxAuthFailures = 5
	// DefaultMaxMemoryClients: Redis' maxmemory-clients is off by
	// default, ours must bound. Sluice's commands are a few hundred bytes,
	// so 64 MiB holds the read buffers of thousands of connections (4 KiB
	// each when idle) and several clients at the default
	// --max-query-buffer at once, while an attack through big commands
	// adds up to about 3.5 times this to peak RSS (measured; garbage the
	// collector has not reclaimed yet makes up the rest).
	DefaultMaxMemoryClients = 64 << 20
	// DefaultBackupDir is where CHECKPOINT writes.
	DefaultBackupDir = "sluice-backups"
)

// Tuning is what an operator sets of the RESP front end itself
// (server.Config.RESP): its bounds, who may run DEBUG, the idle sweep's
// pacing, the memory limit INFO reports, the client memory budget it
// keeps for every front end, and where CHECKPOINT writes. A zero field
// means the default given.
type Tuning struct {
	MaxArgs        int   // most arguments in one command; default DefaultMaxArgs
	MaxBulk        int64 // most bytes in one argument; default DefaultMaxBulk
	MaxInline      int   // most bytes in one inline (telnet) command line; default DefaultMaxInline
	MaxQueryBuffer int   // most bytes of one incomplete command held for a client; default DefaultMaxQueryBuffer
	// MaxAuthFailures is how many failed AUTH or HELLO AUTH attempts a
	// connection may make: the last one is answered WRONGPASS and the
	// connection is closed. Default DefaultMaxAuthFailures; NoLimit never
	// closes.
	MaxAuthFailures Limit[int]
	// IdleTimeout closes a connection that sends nothing for this long;
	// zero never does.
	IdleTimeout time.Duration
	// MaxReplyBuffer bounds the replies queued for a client: past it the
	// rest of the pipeline is answered with an error and the connection is
	// closed. Default DefaultMaxReplyBuffer. A long pipeline's replies are
	// sent every 16 KiB, so this bounds one reply (plus that chunk).
	MaxReplyBuffer int
	// MaxMultiBytes bounds a connection's transaction: the bytes of the
	// commands queued after MULTI plus 64 for each command and each key
	// WATCH watches; past it the transaction is discarded (EXEC answers
	// EXECABORT). Default DefaultMaxMultiBytes. The queue also counts
	// against MaxMemoryClients.
	MaxMultiBytes int

	// Debug says who may run DEBUG, whose CLOCK-OFFSET shifts the server
	// clock (fault-injection tests): nobody (the zero value, as Redis 7's
	// enable-debug-command no), clients on loopback, or every client.
	Debug DebugAccess
	// SweepInterval is the pause between two passes of the idle sweep
	// (maintenance.go), which deletes buckets that have refilled to full;
	// default DefaultSweepInterval, NoLimit turns the background sweep off
	// (COMPACT still sweeps).
	SweepInterval Limit[time.Duration]
	// SweepRate is the most records the background sweep examines per
	// second; default DefaultSweepRate, NoLimit for no pacing.
	SweepRate Limit[int]
	// MemoryLimit is the Go runtime's soft memory limit the process runs
	// with (0: none), and MemoryLimitSource where it came from (auto,
	// --memory-limit, GOMEMLIMIT, off). For INFO only: the command sets
	// the limit, as it is the process's.
	MemoryLimit       int64
	MemoryLimitSource string
	// MaxMemoryClients bounds the bytes of all RESP clients' buffers
	// together (query and reply, as Redis' maxmemory-clients;
	// Stats.ClientMem): a client whose buffers grow the total past it is
	// answered with an error and closed. The front end keeps this budget
	// for every front end (ReserveClients): calls of the rate limit
	// service in flight and HTTP request headers being read count against
	// it too, and past it a call is refused (RESOURCE_EXHAUSTED) and an
	// HTTP connection closed. Default DefaultMaxMemoryClients; NoLimit: no
	// bound.
	MaxMemoryClients Limit[int64]
	// BackupDir is where CHECKPOINT writes, and a backup over HTTP
	// (httpport) makes its copy; default DefaultBackupDir.
	BackupDir string
}

// Config configures the RESP front end: its Tuning, and what it is
// handed of the server's configuration. A zero field means the default
// given; the fields "for INFO" are reported as they are.
type Config struct {
	Tuning

	Password          string // required by AUTH; empty: none
	Version, Revision string // for INFO and HELLO; Version default "dev"
	AllowOnStoreError bool   // for INFO: the engine applies it

	// For INFO only: the longest key a command may name (the engine
	// enforces it); the connections admitted at once, as configured and as
	// the open-file limit left them; that limit's sharing.
	MaxKeySize                             int
	MaxClients, MaxClientsRequested        int
	FDLimit, FDReserved, StoreMaxOpenFiles int
}

// orDefault sets a limit that is zero or negative to its default.
func orDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// WithDefaults is t with its zero fields set to their defaults: the
// composition root applies them before it hands MaxMemoryClients and
// BackupDir to the other front ends.
func (t Tuning) WithDefaults() Tuning {
	orDefault(&t.MaxArgs, DefaultMaxArgs)
	orDefault(&t.MaxBulk, DefaultMaxBulk)
	orDefault(&t.MaxInline, DefaultMaxInline)
	orDefault(&t.MaxQueryBuffer, DefaultMaxQueryBuffer)
	orDefault(&t.MaxReplyBuffer, DefaultMaxReplyBuffer)
	orDefault(&t.MaxMultiBytes, DefaultMaxMultiBytes)
	t.MaxAuthFailures = t.MaxAuthFailures.OrDefault(DefaultMaxAuthFailures)
	t.MaxMemoryClients = t.MaxMemoryClients.OrDefault(DefaultMaxMemoryClients)
	t.SweepInterval = t.SweepInterval.OrDefault(DefaultSweepInterval)
	t.SweepRate = t.SweepRate.OrDefault(DefaultSweepRate)
	if t.BackupDir == "" {
		t.BackupDir = DefaultBackupDir
	}
	return t
}

// withDefaults is cfg with its zero fields set to their defaults.
func (cfg Config) withDefaults() Config {
	cfg.Tuning = cfg.Tuning.WithDefaults()
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	return cfg
}

// Host is what the RESP front end asks of the server that runs it.
type Host interface {
	// Failure returns the typed error of err for a reply, once the server
	// has logged what is not meant for clients and counted the store's
	// errors.
	Failure(err error) *errs.Error
	// Addr is the RESP listener's address, nil before Serve.
	Addr() net.Addr
	// Settings is every setting CONFIG GET answers.
	Settings() []Setting
	// PolicyInfo writes the rest of INFO's policy section: the other
	// front ends that hit the rules.
	PolicyInfo(kv func(k, v string))
	// ReloadRules is POLICY RELOAD: it reloads the --policy file and the
	// --rls-config directory, as one reload, and returns a *ReloadError
	// naming the bad ones (rules.ErrNoPolicy as the policy's without
	// either), or the reload's own error (reload.ErrTimeout, the server
	// closing).
	ReloadRules() error
}

// Stats are the server's counters, reported by INFO and the metrics: the
// composition root owns them and every front end adds to them.
type Stats struct {
	ConnsTotal      atomic.Int64
	Commands        atomic.Int64
	NetIn           atomic.Int64
	NetOut          atomic.Int64
	ProtocolErrors  atomic.Int64
	ErrorReplies    atomic.Int64
	RlAllowed       atomic.Int64
	RlDenied        atomic.Int64
	StoreErrors     atomic.Int64
	Panics          atomic.Int64
	AuthFailures    atomic.Int64
	AuthClosed      atomic.Int64 // connections closed: MaxAuthFailures
	RejectedMax     atomic.Int64 // connections refused: MaxClients
	RejectedDenied  atomic.Int64 // connections refused: protected mode
	IdleClosed      atomic.Int64
	ReplyOverflows  atomic.Int64
	EvictedClients  atomic.Int64 // closed: MaxMemoryClients
	UnknownCommands atomic.Int64
	CrossProtocol   atomic.Int64 // connections closed: POST or Host: as a command
	// ClientMem is the bytes of all RESP connections' buffers, of RLS
	// calls in flight and of HTTP request headers being read, bounded by
	// MaxMemoryClients; ClientMemPeak the most it has been.
	ClientMem, ClientMemPeak atomic.Int64
	// LastSave is the unix seconds of the last CHECKPOINT (or backup), or
	// of the start.
	LastSave atomic.Int64
}

// Options are what the RESP front end runs on, made by the composition
// root.
type Options struct {
	Store   *storage.Store
	Engine  *engine.Engine
	Rules   *rules.File         // the divvy rules in use (HIT, POLICY)
	Policy  *policycmd.Commands // POLICY's subcommands but RELOAD
	Cluster *clusternode.Node   // nil: standalone
	RLS     clusternode.RuleSet // Envoy's rules, for forwarded counters
	Logger  *slog.Logger
	// Clock is the server clock, which ClockOffset (DEBUG CLOCK-OFFSET)
	// shifts.
	Clock       func() time.Time
	ClockOffset *atomic.Int64
	Host        Host
	Stats       *Stats
	// Gate is every front end's --maxclients slots: a connection gives
	// back the one its door took, and INFO counts those taken.
	Gate *admit.Gate
	// Closing is set when the server begins to close; Done is closed
	// when it has.
	Closing *atomic.Bool
	Done    <-chan struct{}
}

// Server is the RESP front end.
type Server struct {
	cfg         Config
	host        Host
	gate        *admit.Gate
	store       *storage.Store
	log         *slog.Logger
	clock       func() time.Time
	clockOffset *atomic.Int64
	cmds        map[string]*command
	eng         *engine.Engine // runs the limit operations of every front end
	runID       string
	start       time.Time

	pol     *rules.File
	polCmds *policycmd.Commands
	rls     clusternode.RuleSet
	clus    *clusternode.Node // nil: standalone

	closing *atomic.Bool
	done    <-chan struct{}
	nextID  atomic.Int64
	conns   sync.WaitGroup // one per RESP connection, until its goroutine ends
	stats   *Stats

	sweep    sweeper
	passHash [32]byte // of cfg.Password, compared in constant time
	authLog  authLog
	mem      memState

	// BatchSeconds times each pipeline (sluice_pipeline_duration_seconds).
	BatchSeconds prometheus.Histogram

	mu struct {
		sync.Mutex
		guards  map[*conn]struct{} // RESP connections being served
		clients map[int64]*client
	}
	// crossLogged is the unix second of the last cross-protocol warning.
	crossLogged atomic.Int64
}

// New returns the RESP front end for cfg over o.
func New(cfg Config, o Options) *Server {
	cfg = cfg.withDefaults()
	var id [20]byte
	_, _ = rand.Read(id[:])
	s := &Server{
		cfg:         cfg,
		host:        o.Host,
		gate:        o.Gate,
		store:       o.Store,
		log:         o.Logger,
		clock:       o.Clock,
		clockOffset: o.ClockOffset,
		eng:         o.Engine,
		runID:       hex.EncodeToString(id[:]),
		start:       time.Now(),
		pol:         o.Rules,
		polCmds:     o.Policy,
		rls:         o.RLS,
		clus:        o.Cluster,
		closing:     o.Closing,
		done:        o.Done,
		stats:       o.Stats,
	}
	s.cmds = commandTable(s.pol)
	s.passHash = sha256.Sum256([]byte(cfg.Password))
	s.BatchSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sluice_pipeline_duration_seconds",
		Help: "Time to execute one pipeline of commands read together and commit its writes (observed once per pipeline, not per command).",
		// 10µs to ~1.3s: a cached reduce takes microseconds, an fsync
		// in --fsync always a millisecond or more.
		Buckets: prometheus.ExponentialBuckets(10e-6, 2, 18),
	})
	s.sweep.stop = make(chan struct{})
	s.mu.guards = make(map[*conn]struct{})
	s.mu.clients = make(map[int64]*client)
	return s
}

// Config is the configuration the front end runs with, every default
// applied: what CONFIG GET shows.
func (s *Server) Config() Config { return s.cfg }

// Serve serves the connections ln admits until it is closed: it returns
// nil when the server is closing, and the accept error otherwise. It
// starts the idle sweep and the memory sampler first.
func (s *Server) Serve(ln net.Listener) error {
	s.startSweeper()
	s.startMemory()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return nil
			}
			return err
		}
		cn := s.newConn(nc)
		if cn == nil { // closing
			_ = nc.Close()
			s.gate.Release()
			return nil
		}
		go cn.serve()
	}
}

// Door is how the RESP listener admits: a slot of --maxclients (Gate),
// held until the connection finishes (then given back), and
// protected mode when guard says it applies (a password or TLS client
// certificates keep strangers out otherwise); it refuses with Redis'
// errors, over TLS when guard has it.
func (s *Server) Door(guard admit.Guard) admit.Door {
	d := admit.Door{
		Name:    "resp",
		Take:    s.gate.Take,
		Guarded: guard.Protected,
		Full:    resp.AppendError(nil, "ERR max number of clients reached"),
		Denied:  resp.AppendError(nil, admit.DeniedMessage),
		Drain:   s,
	}
	if guard.TLS != nil {
		d.TLS = guard.TLS.Config()
	}
	return d
}

// Close stops the idle sweep (a running COMPACT ends early); the
// composition root calls it when it begins to close.
func (s *Server) Close() { s.stopSweeper() }

// Closed stops the authentication log, which logs what it has left; the
// composition root calls it once the connections have drained.
func (s *Server) Closed() { s.authLog.stop(s) }

// Clients is the RESP connections open now.
func (s *Server) Clients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.mu.clients)
}

// EachCommand calls fn with every command's counters, for the metrics.
func (s *Server) EachCommand(fn func(name string, calls, errors, allowed, denied int64)) {
	for _, cmd := range s.cmds {
		fn(cmd.Name, cmd.stat.calls.Load(), cmd.stat.errors.Load(), cmd.stat.allowed.Load(), cmd.stat.denied.Load())
	}
}

// execAll runs the commands in cmds, the framer's output, in order,
// appending their replies to the client's; it stops after QUIT, a panic or
// a limit. A long pipeline's replies are sent in chunks, each after the
// writes before it are committed, so a client holds about replyChunk plus
// one reply. It returns how many commands ran.
func (s *Server) execAll(cn *conn, cmds []byte) (n int) {
	c := cn.cl
	defer func() {
		if r := recover(); r != nil {
			s.stats.Panics.Add(1)
			s.log.Error("command panicked; closing the connection", "client", c.id, "panic", r, "stack", string(debug.Stack()))
			// Drop the half-written reply so the error stands alone.
			c.Out = resp.AppendError(c.Out[:c.replyStart], "ERR internal error")
			c.quit = true
			c.failed = true // close gently, so the error reply is read
		}
	}()
	for len(cmds) > 0 {
		rest := cmds
		cn.args, cmds = resp.NextCommand(cmds, cn.args)
		n++
		before := c.Round.Len()
		start := len(c.Out)
		c.replyStart = start
		s.exec(c, cn.args)
		if c.Round.Len() > before {
			c.writes = append(c.writes, span{start, len(c.Out), c.cur, c.Result})
			c.batchBytes += len(rest) - len(cmds)
		}
		if c.quit {
			break
		}
		if len(c.Out) > s.cfg.MaxReplyBuffer {
			s.stats.ReplyOverflows.Add(1)
			s.log.Warn("closing a client whose reply exceeds the reply buffer limit", "client", c.id, "remote", c.addr, "limit", s.cfg.MaxReplyBuffer)
			c.failed = true
			c.Out = resp.AppendError(c.Out, "ERR reply buffer limit reached (--max-reply-buffer); closing the connection")
			c.quit = true
			break
		}
		if (cap(c.Out) != cn.outCap || c.tx.grew) && !cn.account() {
			cn.evict()
			break
		}
		// Replies go out in chunks, and writes are committed in chunks too:
		// a pipeline of large sliding logs must not hold more than a
		// quarter of --commit-queue-memory before the committer sees it.
		if (len(c.Out) >= replyChunk || c.Round.Full()) && !cn.commitAndSend() {
			c.quit = true
			break
		}
	}
	return n
}

// commitWrites commits the writes the client's pipeline has made so far:
// at the end of a pipeline, before a chunk of replies is sent, and in a
// command that needs them in the store first (COMPACT, CHECKPOINT), through
// the connection's engine.Round. When the commit fails, their replies
// become the error (unless AllowOnStoreError lets them stand), so that no
// reply of a write that is not as durable as the mode promises is ever
// sent. It returns the commit's error, for a command that must fail with
// it.
func (s *Server) commitWrites(c *client) error {
	committed, err := c.Round.Commit()
	if !committed {
		s.failWrites(c, err)
	}
	c.Committed(committed)
	c.writes = c.writes[:0]
	c.replyStart = len(c.Out) // failWrites may have moved it
	return err
}

// span is the reply of a command that wrote, within client.Out.
type span struct {
	start, end int
	t          *tally // its command's tally
	result     dispatch.Result
}

// failWrites replaces the replies of the pipeline's writes by the error that
// kept them from being committed. Replies of reads stay as they are.
func (s *Server) failWrites(c *client, err error) {
	msg := s.errorText(err)
	out := make([]byte, 0, len(c.Out))
	prev := 0
	for _, w := range c.writes {
		out = append(out, c.Out[prev:w.start]...)
		out = resp.AppendError(out, msg)
		s.stats.ErrorReplies.Add(1)
		if w.t != nil {
			w.t.errors++
			switch w.result {
			case dispatch.Allowed:
				w.t.allowed--
			case dispatch.Denied:
				w.t.denied--
			}
		}
		prev = w.end
	}
	c.Out = append(out, c.Out[prev:]...)
}

// newCtx is a new connection's command context.
func (s *Server) newCtx() dispatch.Ctx {
	return dispatch.Ctx{Round: s.eng.NewRound()}
}
