// Package server serves sluice's commands over RESP, the Redis protocol.
//
// It wires the pieces: a connection loop around a framing check (so no
// client input can crash or stall the process, and no buffer outlives the
// command that grew it), the command table, per-pipeline
// execution with one durability wait per pipeline, and connection state for
// HELLO, CLIENT and INFO. Bucket arithmetic lives in package bucket and
// persistence in package storage.
//
// Lifecycle: New, then Serve(listener) until Close. A Server is safe for
// concurrent use.
package server

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/conffile"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/storage"
)

// Config configures a Server. A zero field means the default given.
type Config struct {
	Store  *storage.Store // required
	Logger *slog.Logger   // default: discard

	// RESP configures the RESP front end (Serve).
	RESP RESPConfig

	// MaxKeySize is the longest key a command may name: the key of an
	// RL.* command, the actor value of a HIT. A longer one is refused with
	// an error reply naming both lengths, and the store is not touched.
	// Default 16 KiB: past it the costs that grow with each key (its
	// copies on the way to the disk, Pebble's first and last key of every
	// table) dominate; 4000 commands with 512 KiB keys took peak RSS to
	// 785-950 MiB, with 16 KiB keys to 247-265 MiB.
	MaxKeySize int

	// ShutdownTimeout bounds Close: connections get nine tenths of it to
	// finish their last pipeline, are then closed, and Close waits for them
	// at most the last tenth; default 10s.
	ShutdownTimeout time.Duration

	Version string           // reported by INFO and HELLO; default "dev"
	Clock   func() time.Time // server clock; default time.Now

	// Debug says who may run DEBUG, whose CLOCK-OFFSET shifts the server
	// clock (fault-injection tests): nobody (the zero value, as Redis 7's
	// enable-debug-command no), clients on loopback, or every client.
	Debug DebugAccess

	// Revision is the VCS revision sluice was built from, with "-dirty"
	// for uncommitted changes, reported by INFO and sluice_build_info;
	// empty when unknown.
	Revision string

	// SweepInterval is the pause between two passes of the idle sweep,
	// which deletes buckets that have refilled to full; default 10m,
	// NoLimit turns the background sweep off (COMPACT still sweeps).
	SweepInterval Limit[time.Duration]
	// SweepRate is the most records the background sweep examines per
	// second; default 20000, NoLimit for no pacing.
	SweepRate Limit[int]
	// BackupDir is where CHECKPOINT writes; default "sluice-backups".
	BackupDir string
	// AllowOnStoreError makes limit commands answer normally when the store
	// cannot take or give a bucket's state (disk full, I/O error): the
	// reply is computed from the state the server can still read, or from
	// a full bucket when it cannot, and the change is not stored. By
	// default (false) such commands get an error reply, which clients of
	// a rate limiter usually treat as a denial.
	AllowOnStoreError bool

	// Check configures the forward-auth endpoint (ServeCheck).
	Check CheckConfig

	// Password, when set, must be given with AUTH or HELLO ... AUTH before
	// any command other than AUTH, HELLO, PING and QUIT, as with Redis'
	// requirepass (user "default").
	Password string
	// AllowRemoteWithoutAuth turns protected mode off. In protected mode
	// (the default) a server with neither a Password nor TLS client
	// certificates answers clients from addresses other than loopback
	// with a DENIED error and closes them, as Redis does.
	AllowRemoteWithoutAuth bool
	// MaxClients is the most connections served at once, RESP, line
	// protocol and HTTP together; more are answered "ERR max number of
	// clients reached" (HTTP: 503) and closed. Default 10000, as in
	// Redis; lowered to what Files leaves.
	MaxClients int
	// Files is how the process's open-file limit is shared (see
	// BudgetFDs); with its Limit set, MaxClients is lowered to
	// Files.Clients() and New fails when that is below MinClients. Zero:
	// MaxClients as given.
	Files FDBudget
	// MaxMemoryClients bounds the bytes of all RESP clients' buffers
	// together (query and reply, as Redis' maxmemory-clients): a client
	// whose buffers grow the total past it is answered with an error and
	// closed. Calls of the rate limit service in flight and HTTP request
	// headers being read count against it too: past it a call is refused
	// (RESOURCE_EXHAUSTED) and an HTTP connection closed. Default 64 MiB;
	// NoLimit: no bound.
	MaxMemoryClients Limit[int64]
	// TLS, when set, serves RESP (and HTTP) over TLS only.
	TLS *TLSFiles
	// MemoryLimit is the Go runtime's soft memory limit the process runs
	// with (0: none), and MemoryLimitSource where it came from (auto,
	// --memory-limit, GOMEMLIMIT, off). For INFO only: the command sets
	// the limit, as it is the process's.
	MemoryLimit       int64
	MemoryLimitSource string

	// PolicyFile is a divvy rule file (.ini or .json) for HIT and the line
	// protocol. New loads it and fails with its validation error;
	// ReloadPolicy reads it again. Empty: no rules, and HIT answers an
	// error.
	PolicyFile string
	// PolicyMaxOverrides is the most per-actor overrides (POLICY
	// OVERRIDE) the server keeps; default DefaultPolicyMaxOverrides.
	PolicyMaxOverrides int
	// PolicyStatsDays is the days of threshold data (POLICY STATS) kept;
	// default DefaultPolicyStatsDays.
	PolicyStatsDays int
	// Divvy configures the divvy line protocol (ServeDivvy).
	Divvy DivvyConfig

	// Cluster, when set, serves the Redis Cluster protocol (package
	// clusternode); nil: standalone.
	Cluster *ClusterConfig
	// AcceptRepairedClusterState starts on a store whose cluster state
	// sluice repair brought back older than it may have been
	// (storage.StaleMetaName), which is otherwise refused
	// (ErrClusterStateRepaired): an operator has checked it is current.
	AcceptRepairedClusterState bool
	// RLS configures Envoy's rate limit service (ServeRLS).
	RLS RLSConfig

	// MaxConfigFile bounds the bytes read from each file of the
	// configuration: PolicyFile, each TLS file, and the files of
	// RLS.Dir together; default DefaultMaxConfigFile. Only regular
	// files (or symlinks to them) are read: a named pipe or a device is
	// refused without being opened.
	MaxConfigFile int64
	// ReloadTimeout is the most Reload, ReloadTLS, ReloadPolicy, ReloadRLS
	// and POLICY RELOAD wait for a reload to read its files, and for
	// another one to finish first (reload.go); past it they return
	// ErrReloadTimeout, and the reload goes on. Default
	// DefaultReloadTimeout.
	ReloadTimeout time.Duration
	// HTTPMaxHeaderBytes bounds a request's header on the HTTP listener
	// and on /check (http.Server.MaxHeaderBytes: the request line, names
	// and values; net/http allows 4 KiB more); past it the request is
	// answered 431. Default DefaultHTTPMaxHeaderBytes.
	HTTPMaxHeaderBytes int
}

// RESPConfig configures the RESP front end. A zero field means the
// default given.
type RESPConfig struct {
	MaxArgs        int   // most arguments in one command; default 1024
	MaxBulk        int64 // most bytes in one argument; default 1 MiB
	MaxInline      int   // most bytes in one inline (telnet) command line; default 64 KiB
	MaxQueryBuffer int   // most bytes of one incomplete command held for a client; default 8 MiB
	// MaxAuthFailures is how many failed AUTH or HELLO AUTH attempts a
	// connection may make: the last one is answered WRONGPASS and the
	// connection is closed. Default 5; NoLimit never closes.
	MaxAuthFailures Limit[int]
	// IdleTimeout closes a connection that sends nothing for this long;
	// zero never does.
	IdleTimeout time.Duration
	// MaxReplyBuffer bounds the replies queued for a client: past it the
	// rest of the pipeline is answered with an error and the connection is
	// closed. Default 64 MiB. A long pipeline's replies are sent every
	// 16 KiB, so this bounds one reply (plus that chunk).
	MaxReplyBuffer int
	// MaxMultiBytes bounds a connection's transaction: the bytes of the
	// commands queued after MULTI plus 64 for each command and each key
	// WATCH watches; past it the transaction is discarded (EXEC answers
	// EXECABORT). Default DefaultMaxMultiBytes. The queue also counts
	// against Config.MaxMemoryClients.
	MaxMultiBytes int
}

// DivvyConfig configures the divvy line protocol. A zero field means the
// default given.
type DivvyConfig struct {
	// MaxLine is the longest line the line protocol accepts, without its
	// line end; default 64 KiB. A longer one is answered
	// `ERR unknown "line too long"` and the connection is closed.
	MaxLine int
	// MaxPipeline is the most HIT lines executed, and replies held, per
	// round: a client that pipelines more waits for the replies of the
	// first ones before the rest are read. Default 1024.
	MaxPipeline int
	// IdleTimeout closes a line-protocol connection that sends nothing,
	// or does not take its replies, for this long; zero never does.
	IdleTimeout time.Duration
}

// Defaults for Config.
const (
	DefaultMaxArgs        = 1024
	DefaultMaxBulk        = 1 << 20
	DefaultMaxInline      = 64 << 10
	DefaultMaxQueryBuffer = 8 << 20
	DefaultMaxKeySize     = 16 << 10
	// DefaultPolicyMaxOverrides is engine.DefaultMaxOverrides.
	DefaultPolicyMaxOverrides = engine.DefaultMaxOverrides
	// DefaultPolicyStatsDays is engine.DefaultStatsDays.
	DefaultPolicyStatsDays = engine.DefaultStatsDays
	// MaxPolicyStatsDays is engine.MaxStatsDays.
	MaxPolicyStatsDays     = engine.MaxStatsDays
	DefaultShutdownTimeout = 10 * time.Second
	DefaultMaxClients      = 10000
	DefaultMaxReplyBuffer  = 64 << 20
	// DefaultMaxMemoryClients: Redis' maxmemory-clients is off by
	// default, ours must bound. Sluice's commands are a few hundred bytes,
	// so 64 MiB holds the read buffers of thousands of connections (4 KiB
	// each when idle) and several clients at the default
	// --max-query-buffer at once, while an attack through big commands
	// adds up to about 3.5 times this to peak RSS (measured; garbage the
	// collector has not reclaimed yet makes up the rest).
	DefaultMaxMemoryClients = 64 << 20
	DefaultMaxAuthFailures  = 5
	DefaultMaxConfigFile    = conffile.DefaultLimit
	// DefaultReloadTimeout: a reload of local files takes milliseconds;
	// seconds mean a file system that does not answer.
	DefaultReloadTimeout = 5 * time.Second
	// DefaultHTTPMaxHeaderBytes bounds an HTTP request's header: what a
	// proxy forwards to /check (Envoy accepts 60 KiB of request headers
	// by default, nginx 32 KiB) and far more than a scraper sends.
	DefaultHTTPMaxHeaderBytes = 64 << 10
)

// Server is a RESP server for sluice's commands.
type Server struct {
	cfg   Config
	store *storage.Store
	log   *slog.Logger
	clock func() time.Time // cfg.Clock shifted by clockOffset
	// clockOffset is DEBUG CLOCK-OFFSET's shift of the server clock, in
	// nanoseconds: atomic, as every round reads the clock.
	clockOffset atomic.Int64
	cmds        map[string]*command
	eng         *engine.Engine // runs the limit operations of every front end
	runID       string
	start       time.Time

	// polCmds is POLICY's subcommands but RELOAD: the rules' dials.
	polCmds policycmd.Commands

	closing atomic.Bool
	done    chan struct{} // closed when Close has finished
	// after is time.After for Close's waits; tests see and drive them.
	after  func(time.Duration) <-chan time.Time
	nextID atomic.Int64
	conns  sync.WaitGroup // one per RESP connection, until its goroutine ends
	// clientMem is the bytes of all RESP connections' buffers, of RLS
	// calls in flight and of HTTP request headers being read, bounded by
	// MaxMemoryClients.
	clientMem     atomic.Int64
	clientMemPeak atomic.Int64 // the most clientMem has been

	sweep    sweeper
	tls      *tlsState // nil without TLS
	passHash [32]byte  // of cfg.Password, compared in constant time
	http     httpState
	lastSave atomic.Int64 // unix seconds of the last CHECKPOINT, or of the start
	pol      rules.File
	reload   reloader
	divvy    divvyState
	check    checkState
	rls      *envoy.Server // Envoy's rate limit service
	adm      admission
	authLog  authLog
	mem      memState
	clus     *clusternode.Node // nil: standalone

	mu struct {
		sync.Mutex
		// The listeners of RESP, the line protocol and Envoy's rate limit
		// service, once served, and their admit.Listeners, which Close
		// drains.
		ln, divvyLn, rlsLn net.Listener
		drain              []*admit.Listener
		guards             map[*conn]struct{} // RESP connections being served
		clients            map[int64]*client
	}

	stats struct {
		connsTotal      atomic.Int64
		commands        atomic.Int64
		netIn           atomic.Int64
		netOut          atomic.Int64
		protocolErrors  atomic.Int64
		errorReplies    atomic.Int64
		rlAllowed       atomic.Int64
		rlDenied        atomic.Int64
		storeErrors     atomic.Int64
		panics          atomic.Int64
		authFailures    atomic.Int64
		authClosed      atomic.Int64 // connections closed: MaxAuthFailures
		rejectedMax     atomic.Int64 // connections refused: MaxClients
		rejectedDenied  atomic.Int64 // connections refused: protected mode
		idleClosed      atomic.Int64
		replyOverflows  atomic.Int64
		evictedClients  atomic.Int64 // closed: MaxMemoryClients
		unknownCommands atomic.Int64
		crossProtocol   atomic.Int64 // connections closed: POST or Host: as a command
	}
	// crossLogged is the unix second of the last cross-protocol warning.
	crossLogged atomic.Int64
}

// orDefault sets a limit that is zero or negative to its default.
func orDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// ErrServing is returned by Serve on a Server that is already serving.
var ErrServing = errors.New("server: already serving")

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("server: Config.Store is required")
	}
	orDefault(&cfg.RESP.MaxArgs, DefaultMaxArgs)
	orDefault(&cfg.RESP.MaxBulk, DefaultMaxBulk)
	orDefault(&cfg.RESP.MaxInline, DefaultMaxInline)
	orDefault(&cfg.RESP.MaxQueryBuffer, DefaultMaxQueryBuffer)
	orDefault(&cfg.MaxKeySize, DefaultMaxKeySize)
	orDefault(&cfg.ShutdownTimeout, DefaultShutdownTimeout)
	orDefault(&cfg.MaxClients, DefaultMaxClients)
	orDefault(&cfg.RESP.MaxReplyBuffer, DefaultMaxReplyBuffer)
	orDefault(&cfg.RESP.MaxMultiBytes, DefaultMaxMultiBytes)
	cfg.MaxMemoryClients = cfg.MaxMemoryClients.orDefault(DefaultMaxMemoryClients)
	orDefault(&cfg.Divvy.MaxLine, DefaultDivvyMaxLine)
	orDefault(&cfg.Divvy.MaxPipeline, DefaultDivvyMaxPipeline)
	orDefault(&cfg.PolicyMaxOverrides, DefaultPolicyMaxOverrides)
	orDefault(&cfg.PolicyStatsDays, DefaultPolicyStatsDays)
	orDefault(&cfg.RLS.MaxMessage, DefaultRLSMaxMessage)
	orDefault(&cfg.RLS.MaxStreams, DefaultRLSMaxStreams)
	orDefault(&cfg.RLS.MaxDescriptors, DefaultRLSMaxDescriptors)
	orDefault(&cfg.RLS.MaxHeaderBytes, DefaultRLSMaxHeaderBytes)
	orDefault(&cfg.HTTPMaxHeaderBytes, DefaultHTTPMaxHeaderBytes)
	cfg.RESP.MaxAuthFailures = cfg.RESP.MaxAuthFailures.orDefault(DefaultMaxAuthFailures)
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	cfg.SweepInterval = cfg.SweepInterval.orDefault(DefaultSweepInterval)
	cfg.SweepRate = cfg.SweepRate.orDefault(DefaultSweepRate)
	if cfg.BackupDir == "" {
		cfg.BackupDir = "sluice-backups"
	}
	if cfg.ReloadTimeout <= 0 {
		cfg.ReloadTimeout = DefaultReloadTimeout
	}
	var id [20]byte
	_, _ = rand.Read(id[:])
	s := &Server{
		cfg:   cfg,
		store: cfg.Store,
		log:   cfg.Logger,
		runID: hex.EncodeToString(id[:]),
		start: time.Now(),
	}
	base := cfg.Clock
	s.clock = func() time.Time { return base().Add(time.Duration(s.clockOffset.Load())) }
	if cfg.TLS != nil {
		t, err := newTLSState(*cfg.TLS, cfg.MaxConfigFile)
		if err != nil {
			return nil, err
		}
		s.tls = t
	}
	if err := s.initAdmission(); err != nil {
		return nil, err
	}
	s.passHash = sha256.Sum256([]byte(cfg.Password))
	if cfg.PolicyFile != "" {
		s.pol.Path, s.pol.MaxBytes = cfg.PolicyFile, cfg.MaxConfigFile
		if err := s.pol.Load(); err != nil {
			return nil, err
		}
	}
	co := clusternode.Options{
		Store: s.store, Logger: s.log, Clock: s.clock, Cluster: cfg.Cluster,
		AcceptRepairedClusterState: cfg.AcceptRepairedClusterState,
		Password:                   cfg.Password, TLS: cfg.TLS != nil,
	}
	if s.tls != nil && cfg.Cluster != nil && cfg.Cluster.Replicas > 1 {
		var err error
		if co.ReplicationClientTLS, co.ReplicationServerTLS, err = s.tls.replication(); err != nil {
			return nil, err
		}
	}
	clus, err := clusternode.Open(co)
	if err != nil {
		return nil, err
	}
	s.clus = clus
	s.cmds = commandTable(&s.pol)
	ecfg := engine.Config{Store: s.store, Clock: s.clock, MaxKeySize: cfg.MaxKeySize, MaxOverrides: int64(cfg.PolicyMaxOverrides), StatsDays: cfg.PolicyStatsDays}
	if cfg.AllowOnStoreError {
		ecfg.OnStoreError = engine.Allow
	}
	if s.clus != nil { // not a nil *Node in the interface
		ecfg.Cluster = s.clus
	}
	s.eng = engine.New(ecfg)
	if err := s.initDials(); err != nil {
		return nil, err
	}
	s.initCheck()
	s.initDivvy()
	s.initHTTP()
	s.initMetrics()
	if err := s.initRLS(); err != nil {
		return nil, err
	}
	s.done = make(chan struct{})
	s.after = time.After
	s.reload.init()
	s.sweep.stop = make(chan struct{})
	s.lastSave.Store(s.start.Unix())
	s.mu.guards = make(map[*conn]struct{})
	s.mu.clients = make(map[int64]*client)
	return s, nil
}

// Serve accepts connections on ln until Close. It returns nil after Close.
func (s *Server) Serve(ln net.Listener) error {
	l, err := s.serve(&s.mu.ln, ln, s.respDoor())
	if err != nil {
		return err
	}
	s.log.Info("serving RESP", "addr", ln.Addr().String(), "fsync", s.store.Mode().String(), "data", s.store.Dir())
	s.startSweeper()
	s.startMemory()
	s.warnIfExposed(ln.Addr())
	return s.acceptLoop(l)
}

// Addr returns the listening address, or nil before Serve.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.ln == nil {
		return nil
	}
	return s.mu.ln.Addr()
}

// Close shuts the server down gracefully: it stops accepting, stops reading
// new commands, lets every connection finish and answer the pipeline it is
// executing, and closes the connections. Connections still busy after
// nine tenths of ShutdownTimeout (a client that does not read its
// replies) are closed forcibly, and Close waits for them at most the last
// tenth. Close does not close the store: whoever opened it does, after
// Close returns, or, as cmd/sluice does, once nine tenths of the same
// timeout have passed: Close's forced close is timed to that moment rather
// than the whole timeout, so connections are not left serving for a tenth
// of it on a closed store.
func (s *Server) Close() error {
	if !s.closing.CompareAndSwap(false, true) {
		<-s.done
		return nil
	}
	// From now, as cmd/sluice's own timer: a slow stopSweeper does not
	// push the forced close past the moment the store is closed.
	close(s.reload.stop) // a reload under way is waited for no longer
	rest := s.cfg.ShutdownTimeout / 10
	forceAt := time.Now().Add(s.cfg.ShutdownTimeout - rest)
	defer close(s.done)
	defer s.authLog.stop(s)
	if s.clus != nil {
		defer s.clus.Close()
	}
	defer s.closeHTTP() // last: /readyz answers 503 while connections drain
	s.closeCheck()      // first: its requests finish before the store may close
	s.stopSweeper()     // also ends a running COMPACT early
	// RESP, the line protocol and Envoy's rate limit service drain all at
	// once, the way /check and HTTP do, each in its listener
	// (admit.Listener.Drain).
	s.mu.Lock()
	lns := slices.Clone(s.mu.drain)
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, l := range lns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.Drain(forceAt, rest, s.cfg.ShutdownTimeout)
		}()
	}
	wg.Wait()
	// The threshold data since the last flush (POLICY STATS), now that no
	// round adds to them.
	if err := s.eng.FlushStats(); err != nil {
		s.log.Warn("the policy threshold data since the last flush were not stored", "err", err)
	}
	return nil
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
			s.stats.panics.Add(1)
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
		if len(c.Out) > s.cfg.RESP.MaxReplyBuffer {
			s.stats.replyOverflows.Add(1)
			s.log.Warn("closing a client whose reply exceeds the reply buffer limit", "client", c.id, "remote", c.addr, "limit", s.cfg.RESP.MaxReplyBuffer)
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
		s.stats.errorReplies.Add(1)
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
