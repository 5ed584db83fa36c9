// Package server is sluice's composition root: it wires the store, the
// engine (package engine), the cluster node (clusternode) and the front
// ends, each a package of its own (respserver for RESP, divvy, check,
// envoy, httpport), to one kind of listener (package admit), and answers
// what each front end asks of the server through its Host: typed errors
// logged and counted once, the counters they share, the other front ends'
// facts for INFO, reloads (run by package reload). What reads every front
// end is handed them: /metrics (package metrics) and CONFIG GET's table
// (package settings).
//
// Lifecycle: New, then Serve(listener) (and ServeDivvy, ServeCheck,
// ServeRLS, ServeHTTP) until Close. A Server is safe for concurrent use.
package server

import (
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/httpport"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/reload"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// Config configures a Server: the store, its logger and clock at the top,
// and the rest grouped by concern, each front end's settings in a struct
// of its own. A zero field means the default given.
type Config struct {
	Store  *storage.Store   // required
	Logger *slog.Logger     // default: discard
	Clock  func() time.Time // server clock; default time.Now

	// Build is what INFO, HELLO and sluice_build_info report of the
	// binary.
	Build Build
	// Engine configures how every front end's limit operations run.
	Engine engine.Tuning
	// Files configures the files of the configuration: the bytes read of
	// each, and how long a reload of them is waited for.
	Files reload.Config
	// Cluster configures cluster mode; its zero value is standalone.
	Cluster clusternode.Mode

	// Listen configures what every listener shares: admission, protected
	// mode, TLS, the password, the drain on Close.
	Listen admit.Config
	// Policy configures the divvy rules and their dials.
	Policy policycmd.Config
	// RESP configures the RESP front end (Serve), the client memory
	// budget it keeps for every front end (MaxMemoryClients), and where
	// CHECKPOINT and /backup copy the store (BackupDir).
	RESP respserver.Tuning
	// Divvy configures the divvy line protocol (ServeDivvy); its Logger
	// is the server's.
	Divvy divvy.Config
	// Check configures the forward-auth endpoint (ServeCheck).
	Check check.Config
	// RLS configures Envoy's rate limit service (ServeRLS).
	RLS envoy.Config
	// HTTP configures the HTTP listener (ServeHTTP) and /check's.
	HTTP httpport.Config
}

// Build is the binary the server runs as.
type Build struct {
	Version string // default "dev"
	// Revision is the VCS revision sluice was built from, with "-dirty"
	// for uncommitted changes; empty when unknown.
	Revision string
}

// Server is sluice's server: the store, the engine, the cluster node and
// the front ends (RESP, the line protocol, /check, Envoy's rate limit
// service, the HTTP port), wired together behind one listener wrapper
// (package admit).
type Server struct {
	cfg   Config
	store *storage.Store
	log   *slog.Logger
	clock func() time.Time // cfg.Clock shifted by clockOffset
	// clockOffset is DEBUG CLOCK-OFFSET's shift of the server clock, in
	// nanoseconds: atomic, as every round reads the clock.
	clockOffset atomic.Int64
	// stats are the counters every front end adds to.
	stats   respserver.Stats
	closing atomic.Bool
	done    chan struct{} // closed when Close has finished
	// after is time.After for Close's waits; tests see and drive them.
	after func(time.Duration) <-chan time.Time

	// The components, in the order New makes them.

	// adm admits every front end's connections: --maxclients, protected
	// mode, TLS (adm.Guard.TLS, nil without), the listeners.
	adm  *admit.Admission
	pol  rules.File        // the divvy rules in use
	clus *clusternode.Node // nil: standalone
	eng  *engine.Engine    // runs the limit operations of every front end
	// polCmds is POLICY's subcommands but RELOAD: the rules' dials.
	polCmds policycmd.Commands
	check   checkState
	divvy   *divvy.Server  // the divvy line protocol
	rls     *envoy.Server  // Envoy's rate limit service
	reload  *reload.Runner // reloads, one at a time
	resp    *respserver.Server
	http    httpState
}

// StoreOptions returns o with what the store must know of the server's
// record layout: how to upgrade the keys of a store written before hash
// slots (format 1), each record's kind, for the per-kind counts of INFO
// and /metrics, and its partition, the hash slot, for the committers and
// WATCH. Open the store given to New with them.
func StoreOptions(o storage.Options) storage.Options {
	o.Upgrade = keyspace.UpgradeKey
	o.Class = keyspace.Class
	o.Partition, o.Partitions = keyspace.Partition, keyspace.Partitions
	return o
}

// Every kind's class must be one the store counts apart (an array of
// negative length does not compile).
var _ [storage.MaxClasses - 1 - keyspace.MaxClass]struct{}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("server: Config.Store is required")
	}
	// These defaults are their packages'; they are applied here as more
	// than one component reads them.
	cfg.RESP = cfg.RESP.WithDefaults()
	cfg.Files = cfg.Files.WithDefaults()
	if cfg.Build.Version == "" {
		cfg.Build.Version = "dev"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	s := &Server{cfg: cfg, store: cfg.Store, log: cfg.Logger, done: make(chan struct{}), after: time.After}
	base := cfg.Clock
	s.clock = func() time.Time { return base().Add(time.Duration(s.clockOffset.Load())) }
	var err error
	if s.adm, err = admit.New(cfg.Listen, cfg.Files.MaxFileBytes, admit.Shared{
		Closing: &s.closing, Log: s.log,
		RejectedMax: &s.stats.RejectedMax, RejectedDenied: &s.stats.RejectedDenied, NetOut: &s.stats.NetOut,
		After: func(d time.Duration) <-chan time.Time { return s.after(d) },
	}); err != nil {
		return nil, err
	}
	if cfg.Policy.File != "" {
		s.pol.Path, s.pol.MaxBytes = cfg.Policy.File, cfg.Files.MaxFileBytes
		if err := s.pol.Load(); err != nil {
			return nil, err
		}
	}
	if s.clus, err = clusternode.Open(clusternode.Options{
		Store: s.store, Logger: s.log, Clock: s.clock, Mode: cfg.Cluster,
		Password: s.adm.Config.Password, TLS: s.adm.Guard.TLS,
	}); err != nil {
		return nil, err
	}
	ecfg := engine.Config{Store: s.store, Clock: s.clock, Tuning: cfg.Engine, MaxOverrides: int64(cfg.Policy.MaxOverrides), StatsDays: cfg.Policy.StatsDays}
	if s.clus != nil { // not a nil *Node in the interface
		ecfg.Cluster = s.clus
	}
	s.eng = engine.New(ecfg)
	if err := s.initDials(); err != nil {
		return nil, err
	}
	s.initCheck()
	s.initDivvy()
	if err := s.initRLS(); err != nil {
		return nil, err
	}
	s.reload = reload.New(reload.Options{
		Timeout: cfg.Files.Timeout, Log: s.log, Closed: storage.ErrClosed,
		After: func(d time.Duration) <-chan time.Time { return s.after(d) },
	})
	s.initRESP()
	s.initHTTP()
	// A replicated shard is handed back to its home node once the writes
	// under way have ended and its group has committed them.
	s.clus.SetQuiesce(s.resp.Quiesce)
	s.initMetrics()
	s.stats.LastSave.Store(time.Now().Unix())
	return s, nil
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
	start := time.Now()
	s.reload.Stop() // a reload under way is waited for no longer
	defer close(s.done)
	defer s.resp.Closed()
	if s.clus != nil {
		defer s.clus.Close()
	}
	defer s.closeHTTP() // last: /readyz answers 503 while connections drain
	s.closeCheck()      // first: its requests finish before the store may close
	s.resp.Close()      // stops the idle sweep: also ends a running COMPACT early
	// RESP, the line protocol and Envoy's rate limit service drain all at
	// once, the way /check and HTTP do, each in its listener
	// (admit.Admission.Drain).
	s.adm.Drain(start)
	// The threshold data since the last flush (POLICY STATS), now that no
	// round adds to them.
	if err := s.eng.FlushStats(); err != nil {
		s.log.Warn("the policy threshold data since the last flush were not stored", "err", err)
	}
	return nil
}
