// Package envoy serves Envoy's rate limit service
// (envoy.service.ratelimit.v3) over gRPC, a front end of its own: it
// answers ShouldRateLimit from an envoyproxy/ratelimit YAML configuration
// (package rls), each descriptor's limit a policy.Rule evaluated with the
// same step as HIT's deciding rule (engine.Round's HitRule), and sends the
// reply after the request's round is committed. The server hands it an
// admitted listener (--maxclients, protected mode), and a Host for what it
// shares with the other front ends: the rendering of errors, the client
// memory budget (--maxmemory-clients) and the store's health.
//
// A Server is safe for concurrent use.
package envoy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/rls"
)

// Defaults for the gRPC listener's limits.
const (
	// DefaultMaxMessage is the largest request accepted: a
	// ShouldRateLimit request is a few hundred bytes; 64 KiB leaves room
	// for DefaultMaxDescriptors descriptors of a KiB. Each open stream
	// counts this much against --maxmemory-clients (StreamMemory), as the
	// transport may hold that much of its request.
	DefaultMaxMessage = 64 << 10
	// DefaultMaxStreams is the most calls in flight on one connection.
	// Envoy multiplexes its calls over few connections, so this is its
	// concurrency per connection.
	DefaultMaxStreams = 1024
	// DefaultMaxDescriptors is the most descriptors one call may
	// carry: Envoy sends one per rate_limits action of the route, rarely
	// more than a few.
	DefaultMaxDescriptors = 64
	// DefaultMaxHeaderBytes bounds a call's header list, as HTTP/2
	// counts it (names and values, and 32 per field); Envoy's are well
	// under 2 KiB. gRPC's own default is 16 MiB.
	DefaultMaxHeaderBytes = 16 << 10
	// rlsNearLimitRatio is envoyproxy/ratelimit's NEAR_LIMIT_RATIO default.
	rlsNearLimitRatio = 0.8
	// rlsMaxDetailedKeys bounds the metric keys detailed_metric limits
	// create from request values; past it, hits are counted under the
	// configured key.
	rlsMaxDetailedKeys = 10000
	rlsServiceName     = "envoy.service.ratelimit.v3.RateLimitService"
)

// Config configures Envoy's rate limit service. A zero field means the
// default given.
type Config struct {
	// Dir is a directory of envoyproxy/ratelimit YAML files. New loads it
	// and fails with its validation error; Reload reads it again.
	// Empty: no rate limit service.
	Dir string
	// ResponseHeaders adds the RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset headers to every reply with a limit
	// (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED).
	ResponseHeaders bool
	// MaxMessage is the largest gRPC request accepted, in bytes; default
	// DefaultMaxMessage.
	MaxMessage int
	// MaxStreams is the most gRPC calls in flight on one connection;
	// default DefaultMaxStreams.
	MaxStreams int
	// MaxDescriptors is the most descriptors one ShouldRateLimit call may
	// carry; more is INVALID_ARGUMENT. Default DefaultMaxDescriptors.
	MaxDescriptors int
	// MaxHeaderBytes bounds a gRPC call's header list (names, values and
	// 32 bytes per field, as HTTP/2 counts them); default
	// DefaultMaxHeaderBytes.
	MaxHeaderBytes int
}

// Host is what the rate limit service needs of the server that runs it.
type Host interface {
	// Failure returns the typed error of err for an answer, once the
	// server has logged what is not meant for clients and counted the
	// store's errors.
	Failure(err error) *errs.Error
	// ReserveClients takes n bytes from --maxmemory-clients, or reports
	// false when they would exceed it; ReleaseClients gives them back.
	ReserveClients(n int64) bool
	ReleaseClients(n int64)
	// ClientMemory is what the clients and calls in flight hold of
	// --maxmemory-clients, for a refusal's message.
	ClientMemory() int64
	// NotReady says why the server cannot serve (the store failed, a
	// shutdown), or "" when it can: the health service's answer.
	NotReady() string
}

// Options are what a Server runs with besides its Config.
type Options struct {
	Engine *engine.Engine
	Host   Host
	Logger *slog.Logger
	Clock  func() time.Time
	// MaxConfigFile bounds the bytes read from the files of Config.Dir
	// together (conffile).
	MaxConfigFile int64
	// MaxMemoryClients is --maxmemory-clients, for a refusal's message;
	// New fails when one call may hold more. Zero: no bound.
	MaxMemoryClients int64
	// Guard is protected mode, which the service's listener applies
	// unless TLS client certificates are required (Door), and TLS: with
	// Guard.TLS the service is served over TLS, each new connection with
	// the certificates as last reloaded.
	Guard admit.Guard
	// Gate is every front end's --maxclients slots (Door).
	Gate *admit.Gate
	// ConnsTotal counts the connections admitted, every front end's.
	ConnsTotal *atomic.Int64
	// KeepBuf is the most buffer a call's round keeps for the next one.
	KeepBuf int
}

// Server is the rate limit service: the configuration in use, the gRPC
// server once Serve runs, and the metrics.
type Server struct {
	cfg Config
	opt Options
	log *slog.Logger
	cur atomic.Pointer[loadedRLS]

	mu struct {
		sync.Mutex
		srv     *grpc.Server
		closed  bool
		done    chan struct{}               // closed when srv has stopped, after Finish
		metrics map[rlsMetricKey]*rlsCounts // kept across reloads, so counters never go back
	}
	loadMu sync.Mutex // one load at a time
	health *health.Server
	stop   chan struct{} // closed by Finish: ends the Watch streams

	work sync.Pool // *rlsWork

	reloads, reloadFailures atomic.Int64
	requests, overLimit     atomic.Int64
	errors                  atomic.Int64
	refused                 atomic.Int64 // at MaxMemoryClients (mem.go)
}

// loadedRLS is a configuration in use, replaced as a whole on reload.
type loadedRLS struct {
	cfg    *rls.Config
	lp     *rules.Set // HitRule's bookkeeping for the configuration's rules
	counts map[*rls.Limit]*rlsCounts
	// override counts an override's hits, per domain.
	override map[string]*rlsCounts
	at       time.Time
	byID     map[rules.ID]*policy.Rule // for forwarded hits (Rule)
}

// New returns the rate limit service of cfg, its configuration loaded
// when cfg.Dir is set; cfg's limits are the defaults where zero. It fails
// when one call may hold more than opt.MaxMemoryClients (StreamMemory).
func New(cfg Config, opt Options) (*Server, error) {
	orDefault(&cfg.MaxMessage, DefaultMaxMessage)
	orDefault(&cfg.MaxStreams, DefaultMaxStreams)
	orDefault(&cfg.MaxDescriptors, DefaultMaxDescriptors)
	orDefault(&cfg.MaxHeaderBytes, DefaultMaxHeaderBytes)
	if n := StreamMemory(cfg.MaxHeaderBytes, cfg.MaxMessage); cfg.Dir != "" && opt.MaxMemoryClients > 0 && n > opt.MaxMemoryClients {
		// The text names the server, as it did when the server checked.
		return nil, fmt.Errorf("server: a rate limit service call may hold %d bytes with --rls-max-message %d and --rls-max-header-bytes %d, more than --maxmemory-clients %d: every call would be refused; raise --maxmemory-clients or lower the others",
			n, cfg.MaxMessage, cfg.MaxHeaderBytes, opt.MaxMemoryClients)
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.Clock == nil {
		opt.Clock = time.Now
	}
	s := &Server{cfg: cfg, opt: opt, log: opt.Logger, stop: make(chan struct{})}
	s.work.New = func() any { return &rlsWork{r: opt.Engine.NewRound(), replaced: make(map[string]bool)} }
	if cfg.Dir == "" {
		return s, nil
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

// Settings is the Config in use, with every default applied.
func (s *Server) Settings() Config { return s.cfg }

// orDefault sets a limit that is zero or negative to its default.
func orDefault(v *int, def int) {
	if *v <= 0 {
		*v = def
	}
}

func (s *Server) load() error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	c, err := rls.Load(s.cfg.Dir, s.opt.MaxConfigFile)
	if err != nil {
		return err
	}
	rs := c.Rules()
	ld := &loadedRLS{cfg: c, lp: &rules.Set{Counts: make([]*rules.Counts, len(rs))}, counts: make(map[*rls.Limit]*rlsCounts), override: make(map[string]*rlsCounts), at: time.Now(), byID: rules.Index(rs)}
	for i, r := range rs {
		ld.lp.Counts[i] = &rules.Counts{Label: r.Label}
	}
	s.mu.Lock()
	if s.mu.metrics == nil {
		s.mu.metrics = make(map[rlsMetricKey]*rlsCounts)
	}
	for _, l := range c.Limits() {
		if !l.Unlimited {
			ld.counts[l] = s.countsLocked(l.Domain, l.Key)
		}
	}
	for _, r := range rs {
		if r.QuotaField == rls.OverrideField {
			d := r.Operation[0].Value
			ld.override[d] = s.countsLocked(d, "override")
		}
	}
	s.mu.Unlock()
	s.cur.Store(ld)
	return nil
}

// Reload reads the Config.Dir directory again and, if every file is
// valid, puts the new configuration in use at once; calls under way
// finish with the one they started with. A bad directory keeps the
// configuration in use, is logged and counted, and its error is
// returned. Without a directory it does nothing. The server runs it as
// one of its reloads (one at a time, bounded by --reload-timeout).
func (s *Server) Reload() error {
	if s.cfg.Dir == "" {
		return nil
	}
	if err := s.load(); err != nil {
		s.reloadFailures.Add(1)
		s.log.Error("rls config reload failed; keeping the configuration in use", "dir", s.cfg.Dir, "err", err)
		return err
	}
	s.reloads.Add(1)
	c := s.cur.Load().cfg
	s.log.Info("rls config reloaded", "dir", s.cfg.Dir, "domains", c.Domains(), "limits", len(c.Limits()))
	return nil
}

// Config returns the configuration in use, nil without one.
func (s *Server) Config() *rls.Config {
	if ld := s.cur.Load(); ld != nil {
		return ld.cfg
	}
	return nil
}

// Rule returns the rule of the configuration in use whose identity is id,
// and the number of rules of that configuration, for a counter hit
// another node forwards; nil when it has none. loaded is false without a
// configuration.
func (s *Server) Rule(id rules.ID) (r *policy.Rule, n int, loaded bool) {
	ld := s.cur.Load()
	if ld == nil {
		return nil, 0, false
	}
	return ld.byID[id], len(ld.lp.Counts), true
}

// Door is how the gRPC listener admits: a slot of --maxclients
// (Options.Gate), given back when the connection closes, and protected
// mode (the service has no password: unless TLS client certificates are
// required or protected mode is off). A refused connection is closed: a
// gRPC client reads no text. Each connection admitted counts in
// Options.ConnsTotal.
func (s *Server) Door() admit.Door {
	g := s.opt.Guard
	guarded := !g.Off && !g.CertsRequired()
	return admit.Door{
		Name:    "rls",
		Take:    s.opt.Gate.Take,
		Guarded: func() bool { return guarded },
		Conn: func(c *admit.Conn) net.Conn {
			s.opt.ConnsTotal.Add(1)
			return c
		},
		Drain: s, // a graceful stop of its gRPC server, then a hard one
	}
}

// Serve serves the rate limit service and the gRPC health service on ln,
// a listener that has admitted each connection, until Finish, over TLS
// when Options.Guard has it. It returns net.ErrClosed after Finish, and
// nil when Finish stopped it.
func (s *Server) Serve(ln net.Listener) error {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(s.cfg.MaxMessage),
		grpc.MaxConcurrentStreams(uint32(s.cfg.MaxStreams)),
		grpc.MaxHeaderListSize(uint32(s.cfg.MaxHeaderBytes)),
		grpc.InitialWindowSize(rlsWindow),
		grpc.InTapHandle(s.admitStream),
		grpc.ForceServerCodecV2(rlsCodec{encoding.GetCodecV2(protoenc.Name)}),
	}
	if t := s.opt.Guard.TLS; t != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"h2"},
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				c := t.Current().Clone()
				c.NextProtos = []string{"h2"}
				return c, nil
			},
		})))
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&rlsServiceDesc, s)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(srv, rlsHealth{s.health, s})
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return net.ErrClosed
	}
	s.mu.srv = srv
	s.mu.Unlock()
	s.updateHealth()
	err := srv.Serve(ln)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Finish starts stopping the service: the health service answers
// NOT_SERVING, Watch streams end, and the gRPC server stops gracefully in
// the background (GOAWAY: calls under way finish, no new one starts); a
// later Serve returns net.ErrClosed. The server drains the service's
// listener with Finish, Force and Wait, as every front end's (its
// admitListener's drain).
func (s *Server) Finish() {
	s.mu.Lock()
	srv := s.mu.srv
	already := s.mu.closed
	s.mu.closed = true
	if !already {
		s.mu.done = make(chan struct{})
	}
	done := s.mu.done
	s.mu.Unlock()
	if already {
		return
	}
	if srv == nil {
		close(s.stop)
		close(done)
		return
	}
	s.health.Shutdown() // Check answers NOT_SERVING while calls drain
	close(s.stop)       // ends the Watch streams
	go func() {
		srv.GracefulStop()
		close(done)
	}()
}

// Force cuts off the calls and connections still open.
func (s *Server) Force() {
	s.mu.Lock()
	srv := s.mu.srv
	s.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// Wait returns once the gRPC server has stopped, after Finish.
func (s *Server) Wait() {
	s.mu.Lock()
	done := s.mu.done
	s.mu.Unlock()
	<-done
}

func (s *Server) updateHealth() {
	st := healthpb.HealthCheckResponse_SERVING
	if s.opt.Host.NotReady() != "" {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(rlsServiceName, st)
}

// rlsHealth answers Check with the store's state at the time of the call,
// and Watch by looking at it once a second; Watch streams end when the
// server closes, so that they do not hold its graceful stop.
type rlsHealth struct {
	*health.Server
	s *Server
}

// rlsWatchInterval is how often a Watch stream looks at the store's state.
const rlsWatchInterval = time.Second

// Watch implements grpc.health.v1.Health/Watch.
func (h rlsHealth) Watch(in *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	t := time.NewTicker(rlsWatchInterval)
	defer t.Stop()
	last := healthpb.HealthCheckResponse_ServingStatus(-1)
	send := func(st healthpb.HealthCheckResponse_ServingStatus) error {
		if st == last {
			return nil
		}
		last = st
		return stream.Send(&healthpb.HealthCheckResponse{Status: st})
	}
	for {
		st := healthpb.HealthCheckResponse_SERVICE_UNKNOWN
		if resp, err := h.Check(stream.Context(), in); err == nil {
			st = resp.Status
		}
		if err := send(st); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-h.s.stop:
			_ = send(healthpb.HealthCheckResponse_NOT_SERVING)
			return status.Error(codes.Unavailable, "server is shutting down")
		case <-t.C:
		}
	}
}

// Check implements grpc.health.v1.Health/Check with the store's state
// now. After Finish has called Shutdown, the health server ignores the
// update and answers NOT_SERVING.
func (h rlsHealth) Check(ctx context.Context, in *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.s.updateHealth()
	return h.Server.Check(ctx, in)
}
