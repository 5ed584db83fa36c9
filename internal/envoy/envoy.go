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
	"log/slog"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

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
	// MaxMemoryClients is --maxmemory-clients, for a refusal's message.
	MaxMemoryClients int64
	// TLS, when set, returns the TLS configuration in use for a new
	// connection (reloaded certificates): the service is served over TLS.
	TLS func() *tls.Config
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

type rlsMetricKey struct{ domain, key string }

// rlsCounts are envoyproxy/ratelimit's per-limit statistics.
type rlsCounts struct {
	domain, key                                     string
	totalHits, overLimit, nearLimit, within, shadow atomic.Int64
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

// rlsWork is one call's reusable state.
type rlsWork struct {
	r        *engine.Round
	entries  []rls.Entry
	actor    []byte
	rpu      []byte
	metric   []byte
	req      policy.Request
	limits   []rlsLimit
	outs     []policy.Outcome
	replaced map[string]bool
}

// The request fields' names, as policy.Request holds them; read-only.
var (
	rlsDescriptorKey = []byte(rls.DescriptorField)
	rlsOverrideKey   = []byte(rls.OverrideField)
)

// rlsLimit is what applies to one descriptor.
type rlsLimit struct {
	l         *rls.Limit // nil for none or an override
	rule      *policy.Rule
	unit      rls.Unit
	rpu       uint32
	name      string
	unlimited bool
	override  bool
	// never: the descriptor asks more hits at once than the limit can
	// ever let through, and more than its arithmetic can take (a gcra
	// limit's burst); it is OVER_LIMIT, from a read of its counter.
	never bool
}

// New returns the rate limit service of cfg, its configuration loaded
// when cfg.Dir is set; cfg's limits are the defaults where zero.
func New(cfg Config, opt Options) (*Server, error) {
	orDefault(&cfg.MaxMessage, DefaultMaxMessage)
	orDefault(&cfg.MaxStreams, DefaultMaxStreams)
	orDefault(&cfg.MaxDescriptors, DefaultMaxDescriptors)
	orDefault(&cfg.MaxHeaderBytes, DefaultMaxHeaderBytes)
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

func (s *Server) countsLocked(domain, key string) *rlsCounts {
	k := rlsMetricKey{domain, key}
	c := s.mu.metrics[k]
	if c == nil {
		c = &rlsCounts{domain: domain, key: key}
		s.mu.metrics[k] = c
	}
	return c
}

// detailedCounts returns the counters of a detailed_metric key, creating
// them while there are fewer than rlsMaxDetailedKeys; nil past it.
func (s *Server) detailedCounts(domain string, key []byte) *rlsCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.mu.metrics[rlsMetricKey{domain, string(key)}]; c != nil {
		return c
	}
	if len(s.mu.metrics) >= rlsMaxDetailedKeys {
		return nil
	}
	return s.countsLocked(domain, string(key))
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

// Info is the service's state and counters, as INFO and the metrics
// report them.
type Info struct {
	Limits   int   // limits of the configuration in use
	LoadedAt int64 // unix seconds it was loaded; 0 for none
	// Calls: Requests in all, of which OverLimit and Errors; Refused at
	// --maxmemory-clients, calls and streams, not counted in Requests.
	Requests, OverLimit, Errors, Refused int64
	Reloads, ReloadFailures              int64
}

// Info returns the service's state and counters.
func (s *Server) Info() Info {
	i := Info{
		Requests: s.requests.Load(), OverLimit: s.overLimit.Load(), Errors: s.errors.Load(), Refused: s.refused.Load(),
		Reloads: s.reloads.Load(), ReloadFailures: s.reloadFailures.Load(),
	}
	if ld := s.cur.Load(); ld != nil {
		i.Limits, i.LoadedAt = len(ld.cfg.Limits()), ld.at.Unix()
	}
	return i
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

// Serve serves the rate limit service and the gRPC health service on ln,
// a listener that has admitted each connection, until Finish, over TLS
// when Options.TLS is set. It returns net.ErrClosed after Finish, and
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
	if s.opt.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"h2"},
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				c := s.opt.TLS().Clone()
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

// serveShouldRateLimit serves a ShouldRateLimit call from its request's
// wire bytes, which dec reads: it counts the descriptors and takes what
// decoding and evaluating them hold from --maxmemory-clients before it
// decodes them (mem.go).
func (s *Server) serveShouldRateLimit(ctx context.Context, dec func(any) error) (*rlspb.RateLimitResponse, error) {
	var wire rlsWire
	if err := dec(&wire); err != nil {
		return nil, err
	}
	sh, err := scanRLSRequest(wire.b)
	if err != nil {
		err = status.Errorf(codes.InvalidArgument, "request is not a RateLimitRequest: %v", err)
	} else if sh.descriptors > s.cfg.MaxDescriptors {
		err = status.Errorf(codes.InvalidArgument, "request has %d descriptors; at most %d are accepted (--rls-max-descriptors)", sh.descriptors, s.cfg.MaxDescriptors)
	}
	var req rlspb.RateLimitRequest
	if err == nil {
		n := sh.memory(len(wire.b))
		if !s.opt.Host.ReserveClients(n) {
			return nil, s.refuse(n)
		}
		defer s.opt.Host.ReleaseClients(n)
		if err = proto.Unmarshal(wire.b, &req); err != nil {
			err = status.Errorf(codes.InvalidArgument, "request is not a RateLimitRequest: %v", err)
		}
	}
	s.requests.Add(1)
	var resp *rlspb.RateLimitResponse
	if err == nil {
		wire.b = nil // decoded: the request holds what it needs
		resp, err = s.ShouldRateLimit(ctx, &req)
	}
	if err != nil {
		s.errors.Add(1)
		return nil, err
	}
	if resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
		s.overLimit.Add(1)
	}
	return resp, nil
}

// ShouldRateLimit evaluates a call from its decoded request (the service
// serves it from its wire bytes: serveShouldRateLimit). It stops, with the context's error,
// when the call's context ends (its client cancelled it or went away)
// before every descriptor is evaluated; those evaluated are counted, as
// after any failure during evaluation.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	ld := s.cur.Load()
	w := s.work.Get().(*rlsWork)
	defer func() {
		// Nothing of this request or of a configuration a reload
		// replaces stays reachable from the pool.
		clear(w.entries[:cap(w.entries)])
		clear(w.limits)
		clear(w.outs)
		s.work.Put(w)
	}()
	now := s.opt.Clock()
	domain := req.Domain
	n := len(req.Descriptors)
	w.limits = resizeSlice(w.limits, n)
	w.outs = resizeSlice(w.outs, n)
	clear(w.replaced)

	// Which limit applies to each descriptor, then which are replaced, as
	// envoyproxy/ratelimit's constructLimitsToCheck.
	for i, d := range req.Descriptors {
		lim := &w.limits[i]
		*lim = rlsLimit{}
		w.entries = appendEntries(w.entries[:0], d)
		l := ld.cfg.Find(domain, w.entries)
		if o := d.GetLimit(); o != nil {
			unit, ok := rls.UnitOfEnum(int32(o.Unit))
			if !ok {
				// envoyproxy/ratelimit fails the call too; ignoring the
				// override would drop the configured limit with it.
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: limit override unit %v; expected SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR", i, o.Unit)
			}
			if l == nil || l.MaxOverride == 0 || l.Unit != unit {
				// Envoy's override: a fixed window of its own, as in
				// envoyproxy/ratelimit.
				if r := ld.cfg.Override(domain, unit); r != nil {
					*lim = rlsLimit{rule: r, unit: unit, rpu: o.RequestsPerUnit, override: true}
				}
				continue
			}
			// sluice's max_requests_per_unit: the override changes the
			// configured limit, up to the cap (below).
		}
		if l == nil {
			continue
		}
		for _, name := range l.Replaces {
			w.replaced[name] = true
		}
		if l.Unlimited {
			lim.unlimited = true
			continue
		}
		*lim = rlsLimit{l: l, rule: l.Rule, unit: l.Unit, rpu: l.RequestsPerUnit, name: l.Name}
		if o := d.GetLimit(); o != nil {
			lim.rpu, lim.override = min(o.RequestsPerUnit, l.MaxOverride), true
		}
	}
	// Every descriptor is checked before the first one is counted, so a
	// refused request changes nothing, as a refused HIT. Changes are
	// visible in the store as each descriptor is evaluated (Batch.Modify),
	// so whatever a request can cause is refused here: after this loop
	// evaluation fails only when the store does (a read error, a store
	// that fails or closes during the call), when a counter's owner in
	// cluster mode cannot apply its hit, or with a clock centuries away;
	// then the descriptors evaluated before are counted, and committed, as
	// what is visible must be stored.
	for i, d := range req.Descriptors {
		lim := &w.limits[i]
		if lim.rule == nil {
			continue
		}
		w.entries = appendEntries(w.entries[:0], d)
		if err := s.opt.Engine.CheckKeySize("the key of its entries", rls.DescriptorLen(w.entries)); err != nil {
			return nil, s.statusErr(i, err)
		}
		hits := hitsAddend(req, d)
		if lim.rule.Algorithm == policy.SlidingLog && hits > 1 {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: hits_addend %d; a sliding_log limit counts one request at a time (hits_addend 0 or 1)", i, hits)
		}
		// A gcra limit lets at most its burst through at once, and its
		// arithmetic (hits × emission interval) is bounded only that
		// far: more is OVER_LIMIT, as any hits_addend over the limit is
		// in envoyproxy/ratelimit, without the arithmetic.
		if limit := int64(lim.rpu); lim.rule.Algorithm == policy.GCRA && limit > 0 && hits > lim.rule.BurstFor(limit) {
			lim.never = true
		}
	}
	for i := range w.limits {
		if lim := &w.limits[i]; lim.name != "" && w.replaced[lim.name] {
			*lim = rlsLimit{}
		}
	}

	// Evaluate, then commit before answering.
	nowNs := now.UnixNano()
	w.r.Begin() // resharding: MIGRATE PAUSE waits for it
	var evalErr error
	for i, d := range req.Descriptors {
		lim := &w.limits[i]
		if lim.rule == nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			evalErr = status.FromContextError(err).Err()
			break
		}
		w.entries = appendEntries(w.entries[:0], d)
		w.actor = rls.AppendDescriptor(w.actor[:0], w.entries)
		w.req = append(w.req[:0], policy.Field{Key: rlsDescriptorKey, Value: w.actor})
		if lim.override {
			w.rpu = rls.FormatOverride(w.rpu[:0], lim.rpu)
			w.req = append(w.req, policy.Field{Key: rlsOverrideKey, Value: w.rpu})
		}
		hits := hitsAddend(req, d)
		if lim.never {
			hits = 0 // read the counter for the reply; take nothing
		}
		out, err := w.r.HitRule(ld.lp, lim.rule, w.req, hits, false, nowNs)
		if err != nil {
			evalErr = s.statusErr(i, err)
			break
		}
		if lim.never {
			// Denied, and waiting cannot help: no retry-after.
			out.Allowed, out.CreditsLeft, out.RetryAfterMs = false, 0, -1
			w.r.DenyLast()
		}
		w.outs[i] = out
	}
	if evalErr != nil {
		w.r.Fail() // what it changed is committed, but was not told
	}
	if ok, err := w.r.Commit(); !ok && evalErr == nil {
		evalErr = s.statusErr(-1, err)
	}
	w.r.Trim(s.opt.KeepBuf)
	if evalErr != nil {
		return nil, evalErr
	}

	resp := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: make([]*rlspb.RateLimitResponse_DescriptorStatus, n)}
	var closest *rlspb.RateLimitResponse_DescriptorStatus
	minLeft := uint32(math.MaxUint32)
	for i, d := range req.Descriptors {
		lim := &w.limits[i]
		st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch {
		case lim.unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		case lim.rule == nil:
			continue
		}
		out := &w.outs[i]
		st.CurrentLimit = &rlspb.RateLimitResponse_RateLimit{Name: lim.name, RequestsPerUnit: lim.rpu, Unit: rlspb.RateLimitResponse_RateLimit_Unit(lim.unit.Enum())}
		st.DurationUntilReset = durationpb.New(time.Duration(resetSeconds(lim, out, now)) * time.Second)
		shadow := lim.l != nil && lim.l.ShadowMode
		if out.Allowed {
			st.LimitRemaining = uint32(max(0, min64(out.CreditsLeft, math.MaxUint32)))
		} else if !shadow {
			st.Code = rlspb.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
		}
		// The headers describe the descriptor closest to its limit, and
		// an over-limit one over any other (the last, as envoyproxy's).
		if st.Code == rlspb.RateLimitResponse_OVER_LIMIT {
			closest, minLeft = st, 0
		} else if st.LimitRemaining < minLeft {
			closest, minLeft = st, st.LimitRemaining
		}
		s.count(ld, w, lim, d, out, hitsAddend(req, d), shadow)
	}
	if s.cfg.ResponseHeaders && closest != nil {
		resp.ResponseHeadersToAdd = []*core.HeaderValue{
			{Key: "RateLimit-Limit", Value: strconv.FormatUint(uint64(closest.CurrentLimit.RequestsPerUnit), 10)},
			{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(closest.LimitRemaining), 10)},
			{Key: "RateLimit-Reset", Value: strconv.FormatInt(closest.DurationUntilReset.GetSeconds(), 10)},
		}
	}
	return resp, nil
}

// count adds one descriptor's hits to envoyproxy/ratelimit's
// statistics: total_hits; within_limit and, past 80 % of the limit,
// near_limit for an allowed hit; over_limit (and shadow_mode in shadow
// mode) for a denied one, which sluice does not count toward the limit.
func (s *Server) count(ld *loadedRLS, w *rlsWork, lim *rlsLimit, d *rlcommon.RateLimitDescriptor, out *policy.Outcome, hits int64, shadow bool) {
	var c *rlsCounts
	switch {
	case lim.l == nil: // Envoy's override
		c = ld.override[lim.rule.Operation[0].Value]
	case lim.l.DetailedMetric:
		w.entries = appendEntries(w.entries[:0], d)
		w.metric = rls.MetricKey(w.metric[:0], w.entries)
		c = s.detailedCounts(lim.l.Domain, w.metric)
	}
	if c == nil && lim.l != nil {
		c = ld.counts[lim.l]
	}
	if c == nil {
		return
	}
	addSat(&c.totalHits, hits)
	if !out.Allowed {
		addSat(&c.overLimit, hits)
		if shadow {
			addSat(&c.shadow, hits)
		}
		return
	}
	addSat(&c.within, hits)
	near := int64(math.Floor(float64(float32(lim.rpu) * rlsNearLimitRatio)))
	if used := out.Limit - out.CreditsLeft; out.Limit == int64(lim.rpu) && used > near {
		addSat(&c.nearLimit, min64(hits, used-near))
	}
}

// addSat adds n (>= 0) to a metric counter, stopping at math.MaxInt64: a
// hits_addend may be as large as that, and a counter must never go back.
func addSat(c *atomic.Int64, n int64) {
	for {
		old := c.Load()
		v := old + n
		if v < old {
			v = math.MaxInt64
		}
		if c.CompareAndSwap(old, v) {
			return
		}
	}
}

// appendEntries appends a descriptor's entries; the strings are the
// request's, not copies.
func appendEntries(dst []rls.Entry, d *rlcommon.RateLimitDescriptor) []rls.Entry {
	for _, e := range d.GetEntries() {
		dst = append(dst, rls.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	return dst
}

// resetSeconds is duration_until_reset: the time until the counter is
// whole again, rounded up to seconds, which for a fixed window is the end
// of the unit, as envoyproxy/ratelimit computes it (unit - now % unit).
// A window that has not opened, or a limit of 0, gives that too.
func resetSeconds(lim *rlsLimit, out *policy.Outcome, now time.Time) int64 {
	if out.ResetAfterMs > 0 {
		return (out.ResetAfterMs + 999) / 1000
	}
	if lim.rule.Algorithm == policy.FixedWindow || out.ResetAfterMs < 0 {
		u := int64(lim.unit)
		return u - now.Unix()%u
	}
	return 0
}

// hitsAddend is a descriptor's hits: its own hits_addend when set (0 only
// checks), else the request's, where 0 means 1.
func hitsAddend(req *rlspb.RateLimitRequest, d *rlcommon.RateLimitDescriptor) int64 {
	var h uint64
	if a := d.GetHitsAddend(); a != nil {
		h = a.GetValue()
	} else {
		h = max(1, uint64(req.GetHitsAddend()))
	}
	return int64(min(h, math.MaxInt64))
}

func min64(a, b int64) int64 {
	if a < b {
		return a
	}
	return b
}

func resizeSlice[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

var (
	descRLSTotal   = prometheus.NewDesc("sluice_rls_total_hits", "Hits on each configured limit of Envoy's rate limit service (envoyproxy/ratelimit's ratelimit.service.rate_limit.DOMAIN.KEY.total_hits), hits_addend counted.", []string{"domain", "key"}, nil)
	descRLSOver    = prometheus.NewDesc("sluice_rls_over_limit", "Hits denied by a limit (envoyproxy/ratelimit's over_limit), shadow mode included.", []string{"domain", "key"}, nil)
	descRLSNear    = prometheus.NewDesc("sluice_rls_near_limit", "Allowed hits past 80% of a limit (envoyproxy/ratelimit's near_limit).", []string{"domain", "key"}, nil)
	descRLSWithin  = prometheus.NewDesc("sluice_rls_within_limit", "Allowed hits (envoyproxy/ratelimit's within_limit).", []string{"domain", "key"}, nil)
	descRLSShadow  = prometheus.NewDesc("sluice_rls_shadow_mode", "Hits over a shadow_mode limit that were allowed (envoyproxy/ratelimit's shadow_mode).", []string{"domain", "key"}, nil)
	descRLSCalls   = prometheus.NewDesc("sluice_rls_requests_total", "ShouldRateLimit calls, by result: ok, over_limit, error, or refused (calls and streams of the listener refused at --maxmemory-clients).", []string{"result"}, nil)
	descRLSReloads = prometheus.NewDesc("sluice_rls_config_reloads_total", "Reloads of --rls-config, by result: ok, or failed (the configuration in use was kept).", []string{"result"}, nil)
	descRLSLimits  = prometheus.NewDesc("sluice_rls_config_limits", "Limits of the --rls-config configuration in use.", nil, nil)
	descRLSLoaded  = prometheus.NewDesc("sluice_rls_config_loaded_timestamp_seconds", "Unix time the --rls-config configuration in use was loaded.", nil, nil)
)

// Describe implements prometheus.Collector: the service's metrics, which
// the server registers when the service is on.
func (s *Server) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(s, ch) }

// Collect implements prometheus.Collector.
func (s *Server) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	s.mu.Lock()
	all := slices.Collect(maps.Values(s.mu.metrics))
	s.mu.Unlock()
	for _, m := range all {
		counter(descRLSTotal, m.totalHits.Load(), m.domain, m.key)
		counter(descRLSOver, m.overLimit.Load(), m.domain, m.key)
		counter(descRLSNear, m.nearLimit.Load(), m.domain, m.key)
		counter(descRLSWithin, m.within.Load(), m.domain, m.key)
		counter(descRLSShadow, m.shadow.Load(), m.domain, m.key)
	}
	i := s.Info()
	counter(descRLSCalls, i.Requests-i.OverLimit-i.Errors, "ok")
	counter(descRLSCalls, i.OverLimit, "over_limit")
	counter(descRLSCalls, i.Errors, "error")
	counter(descRLSCalls, i.Refused, "refused")
	counter(descRLSReloads, i.Reloads, "ok")
	counter(descRLSReloads, i.ReloadFailures, "failed")
	if ld := s.cur.Load(); ld != nil {
		ch <- prometheus.MustNewConstMetric(descRLSLimits, prometheus.GaugeValue, float64(len(ld.cfg.Limits())))
		ch <- prometheus.MustNewConstMetric(descRLSLoaded, prometheus.GaugeValue, float64(ld.at.Unix()))
	}
}

// statusErr renders an evaluation or commit error as a gRPC status;
// i >= 0 names the descriptor it came from.
func (s *Server) statusErr(i int, err error) error { return StatusErr(s.opt.Host.Failure(err), i) }

// StatusErr renders a typed error of a call as a gRPC status; i >= 0
// names the descriptor it came from. Its code is Unavailable for the
// store, a shutdown or a cluster that could not apply a counter's hit
// (Envoy's failure_mode_deny decides), InvalidArgument for a hit the rule
// cannot take.
func StatusErr(e *errs.Error, i int) error {
	msg := e.Text()
	if i >= 0 {
		msg = "descriptor " + strconv.Itoa(i) + ": " + msg
	}
	code := codes.Unavailable
	if e.Kind == errs.Request {
		code = codes.InvalidArgument
	}
	return status.Error(code, msg)
}
