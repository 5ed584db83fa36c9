package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
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
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/rls"
)

// Envoy's rate limit service (envoy.service.ratelimit.v3): a gRPC listener
// answering ShouldRateLimit from an envoyproxy/ratelimit YAML
// configuration (package rls). Each descriptor's limit is a policy.Rule,
// evaluated with the same step as HIT's deciding rule (engine.Round's
// HitRule), and the reply is sent after the request's round is committed,
// as HIT's is.

// Defaults for the gRPC listener's limits.
const (
	// DefaultRLSMaxMessage is the largest request accepted: a
	// ShouldRateLimit request is a few hundred bytes; 64 KiB leaves room
	// for DefaultRLSMaxDescriptors descriptors of a KiB. Each open stream
	// counts this much against MaxMemoryClients (rlsStreamMemory), as the
	// transport may hold that much of its request.
	DefaultRLSMaxMessage = 64 << 10
	// DefaultRLSMaxStreams is the most calls in flight on one connection.
	// Envoy multiplexes its calls over few connections, so this is its
	// concurrency per connection.
	DefaultRLSMaxStreams = 1024
	// DefaultRLSMaxDescriptors is the most descriptors one call may
	// carry: Envoy sends one per rate_limits action of the route, rarely
	// more than a few.
	DefaultRLSMaxDescriptors = 64
	// DefaultRLSMaxHeaderBytes bounds a call's header list, as HTTP/2
	// counts it (names and values, and 32 per field); Envoy's are well
	// under 2 KiB. gRPC's own default is 16 MiB.
	DefaultRLSMaxHeaderBytes = 16 << 10
	// rlsNearLimitRatio is envoyproxy/ratelimit's NEAR_LIMIT_RATIO default.
	rlsNearLimitRatio = 0.8
	// rlsMaxDetailedKeys bounds the metric keys detailed_metric limits
	// create from request values; past it, hits are counted under the
	// configured key.
	rlsMaxDetailedKeys = 10000
	rlsServiceName     = "envoy.service.ratelimit.v3.RateLimitService"
)

// rlsState is the RLS configuration in use, the listener and the metrics.
type rlsState struct {
	dir string // "" when RLS is off
	cur atomic.Pointer[loadedRLS]

	mu struct {
		sync.Mutex
		srv     *grpc.Server
		ln      net.Listener
		closed  bool
		metrics map[rlsMetricKey]*rlsCounts // kept across reloads, so counters never go back
	}
	loadMu sync.Mutex // one load at a time
	health *health.Server
	stop   chan struct{} // closed by closeRLS: ends the Watch streams

	work sync.Pool // *rlsWork

	reloads, reloadFailures atomic.Int64
	requests, overLimit     atomic.Int64
	errors                  atomic.Int64
	refused                 atomic.Int64 // at MaxMemoryClients (rlsmem.go)
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
	byID     map[rules.ID]*policy.Rule // for forwarded hits (counterRule)
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

// initRLS loads the configuration; New calls it.
func (s *Server) initRLS() error {
	st := &s.rls
	st.dir = s.cfg.RLS.Dir
	st.stop = make(chan struct{})
	st.work.New = func() any { return &rlsWork{r: s.eng.NewRound(), replaced: make(map[string]bool)} }
	if st.dir == "" {
		return nil
	}
	if n := rlsStreamMemory(s.cfg.RLS.MaxHeaderBytes, s.cfg.RLS.MaxMessage); !s.cfg.MaxMemoryClients.within(n) {
		return fmt.Errorf("server: a rate limit service call may hold %d bytes with --rls-max-message %d and --rls-max-header-bytes %d, more than --maxmemory-clients %d: every call would be refused; raise --maxmemory-clients or lower the others",
			n, s.cfg.RLS.MaxMessage, s.cfg.RLS.MaxHeaderBytes, s.cfg.MaxMemoryClients.N())
	}
	if err := s.loadRLS(); err != nil {
		return err
	}
	s.http.reg.MustRegister((*rlsCollector)(s))
	return nil
}

func (s *Server) loadRLS() error {
	st := &s.rls
	st.loadMu.Lock()
	defer st.loadMu.Unlock()
	c, err := rls.Load(st.dir, s.cfg.MaxConfigFile)
	if err != nil {
		return err
	}
	rs := c.Rules()
	ld := &loadedRLS{cfg: c, lp: &rules.Set{Counts: make([]*rules.Counts, len(rs))}, counts: make(map[*rls.Limit]*rlsCounts), override: make(map[string]*rlsCounts), at: time.Now(), byID: rules.Index(rs)}
	for i, r := range rs {
		ld.lp.Counts[i] = &rules.Counts{Label: r.Label}
	}
	st.mu.Lock()
	if st.mu.metrics == nil {
		st.mu.metrics = make(map[rlsMetricKey]*rlsCounts)
	}
	for _, l := range c.Limits() {
		if !l.Unlimited {
			ld.counts[l] = st.countsLocked(l.Domain, l.Key)
		}
	}
	for _, r := range rs {
		if r.QuotaField == rls.OverrideField {
			d := r.Operation[0].Value
			ld.override[d] = st.countsLocked(d, "override")
		}
	}
	st.mu.Unlock()
	st.cur.Store(ld)
	return nil
}

func (st *rlsState) countsLocked(domain, key string) *rlsCounts {
	k := rlsMetricKey{domain, key}
	c := st.mu.metrics[k]
	if c == nil {
		c = &rlsCounts{domain: domain, key: key}
		st.mu.metrics[k] = c
	}
	return c
}

// detailedCounts returns the counters of a detailed_metric key, creating
// them while there are fewer than rlsMaxDetailedKeys; nil past it.
func (st *rlsState) detailedCounts(domain string, key []byte) *rlsCounts {
	st.mu.Lock()
	defer st.mu.Unlock()
	if c := st.mu.metrics[rlsMetricKey{domain, string(key)}]; c != nil {
		return c
	}
	if len(st.mu.metrics) >= rlsMaxDetailedKeys {
		return nil
	}
	return st.countsLocked(domain, string(key))
}

// ReloadRLS reads the --rls-config directory again, as a reload
// (reload.go), and, if every file is valid, puts the new configuration in
// use at once; calls under way finish with the one they started with. A
// bad directory keeps the configuration in use, is logged and counted,
// and its error is returned. Without RLS it does nothing.
func (s *Server) ReloadRLS() error { return s.reloading(s.reloadRLS) }

func (s *Server) reloadRLS() error {
	if s.rls.dir == "" {
		return nil
	}
	if err := s.loadRLS(); err != nil {
		s.rls.reloadFailures.Add(1)
		s.log.Error("rls config reload failed; keeping the configuration in use", "dir", s.rls.dir, "err", err)
		return err
	}
	s.rls.reloads.Add(1)
	c := s.rls.cur.Load().cfg
	s.log.Info("rls config reloaded", "dir", s.rls.dir, "domains", c.Domains(), "limits", len(c.Limits()))
	return nil
}

// ServeRLS serves Envoy's rate limit service and the gRPC health service
// on ln until Close, over TLS when the server has TLS (client
// certificates required when --tls-ca is given, as for RESP). The service
// has no password: in protected mode it serves loopback clients only,
// unless TLS client certificates are required.
func (s *Server) ServeRLS(ln net.Listener) error {
	st := &s.rls
	if st.dir == "" {
		return errors.New("server: RLS needs Config.RLS.Dir")
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(s.cfg.RLS.MaxMessage),
		grpc.MaxConcurrentStreams(uint32(s.cfg.RLS.MaxStreams)),
		grpc.MaxHeaderListSize(uint32(s.cfg.RLS.MaxHeaderBytes)),
		grpc.InitialWindowSize(rlsWindow),
		grpc.InTapHandle(s.admitRLSStream),
		grpc.ForceServerCodecV2(rlsCodec{encoding.GetCodecV2(protoenc.Name)}),
	}
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"h2"},
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
				c := s.tls.cur.Load().Clone()
				c.NextProtos = []string{"h2"}
				return c, nil
			},
		})))
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&rlsServiceDesc, s)
	st.health = health.NewServer()
	healthpb.RegisterHealthServer(srv, rlsHealth{st.health, s})
	st.mu.Lock()
	switch {
	case st.mu.closed || s.closing.Load():
		st.mu.Unlock()
		return net.ErrClosed
	case st.mu.srv != nil:
		st.mu.Unlock()
		return ErrServing
	}
	st.mu.srv, st.mu.ln = srv, ln
	st.mu.Unlock()
	s.updateRLSHealth()
	s.log.Info("serving Envoy's rate limit service (gRPC)", "addr", ln.Addr().String(), "config", st.dir, "tls", s.tls != nil)
	s.warnIfExposed(ln.Addr())
	err := srv.Serve(s.listen(ln, s.rlsDoor()))
	if errors.Is(err, grpc.ErrServerStopped) || s.closing.Load() {
		return nil
	}
	return err
}

// RLSAddr returns the gRPC listener's address, or nil when it is off.
func (s *Server) RLSAddr() net.Addr {
	s.rls.mu.Lock()
	defer s.rls.mu.Unlock()
	if s.rls.mu.ln == nil {
		return nil
	}
	return s.rls.mu.ln.Addr()
}

// closeRLS starts stopping the listener, in the background: calls under
// way finish, until forceAt, when the rest are cut off. Close calls it as
// it starts, alongside the other listeners, and at its end calls the
// returned function, which waits.
func (s *Server) closeRLS(forceAt time.Time) (wait func()) {
	st := &s.rls
	st.mu.Lock()
	srv := st.mu.srv
	already := st.mu.closed
	st.mu.closed = true
	st.mu.Unlock()
	if already {
		return func() {}
	}
	if srv == nil {
		close(st.stop)
		return func() {}
	}
	st.health.Shutdown() // Check answers NOT_SERVING while calls drain
	close(st.stop)       // ends the Watch streams
	done := make(chan struct{})
	go func() {
		stopped := make(chan struct{})
		go func() {
			srv.GracefulStop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-s.after(time.Until(forceAt)):
			srv.Stop()
		}
		close(done)
	}()
	return func() { <-done }
}

func (s *Server) updateRLSHealth() {
	st := healthpb.HealthCheckResponse_SERVING
	if s.notReady() != "" {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.rls.health.SetServingStatus("", st)
	s.rls.health.SetServingStatus(rlsServiceName, st)
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
		case <-h.s.rls.stop:
			_ = send(healthpb.HealthCheckResponse_NOT_SERVING)
			return status.Error(codes.Unavailable, "server is shutting down")
		case <-t.C:
		}
	}
}

// Check implements grpc.health.v1.Health/Check with the store's state
// now. After closeRLS has called Shutdown, the health server ignores the
// update and answers NOT_SERVING.
func (h rlsHealth) Check(ctx context.Context, in *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.s.updateRLSHealth()
	return h.Server.Check(ctx, in)
}

// rlsDoor is how the gRPC listener admits: a slot of --maxclients, given
// back when the connection closes, and protected mode (the service has no
// password) unless TLS client certificates are required or protected mode
// is off. A refused connection is closed: a gRPC client reads no text.
func (s *Server) rlsDoor() door {
	return door{
		name:    "rls",
		take:    s.adm.take,
		guarded: func() bool { return !s.cfg.AllowRemoteWithoutAuth && !s.clientCertsRequired() },
		conn: func(c *admittedConn) net.Conn {
			s.stats.connsTotal.Add(1)
			return c
		},
	}
}

// serveShouldRateLimit serves a ShouldRateLimit call from its request's
// wire bytes, which dec reads: it counts the descriptors and takes what
// decoding and evaluating them hold from --maxmemory-clients before it
// decodes them (rlsmem.go).
func (s *Server) serveShouldRateLimit(ctx context.Context, dec func(any) error) (*rlspb.RateLimitResponse, error) {
	var wire rlsWire
	if err := dec(&wire); err != nil {
		return nil, err
	}
	sh, err := scanRLSRequest(wire.b)
	if err != nil {
		err = status.Errorf(codes.InvalidArgument, "request is not a RateLimitRequest: %v", err)
	} else if sh.descriptors > s.cfg.RLS.MaxDescriptors {
		err = status.Errorf(codes.InvalidArgument, "request has %d descriptors; at most %d are accepted (--rls-max-descriptors)", sh.descriptors, s.cfg.RLS.MaxDescriptors)
	}
	var req rlspb.RateLimitRequest
	if err == nil {
		n := sh.memory(len(wire.b))
		if !s.reserveClients(n) {
			return nil, s.refuseRLS(n)
		}
		defer s.releaseClients(n)
		if err = proto.Unmarshal(wire.b, &req); err != nil {
			err = status.Errorf(codes.InvalidArgument, "request is not a RateLimitRequest: %v", err)
		}
	}
	s.rls.requests.Add(1)
	var resp *rlspb.RateLimitResponse
	if err == nil {
		wire.b = nil // decoded: the request holds what it needs
		resp, err = s.shouldRateLimit(ctx, &req)
	}
	if err != nil {
		s.rls.errors.Add(1)
		return nil, err
	}
	if resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
		s.rls.overLimit.Add(1)
	}
	return resp, nil
}

// shouldRateLimit evaluates a call. It stops, with the context's error,
// when the call's context ends (its client cancelled it or went away)
// before every descriptor is evaluated; those evaluated are counted, as
// after any failure during evaluation.
func (s *Server) shouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	ld := s.rls.cur.Load()
	w := s.rls.work.Get().(*rlsWork)
	defer func() {
		// Nothing of this request or of a configuration a reload
		// replaces stays reachable from the pool.
		clear(w.entries[:cap(w.entries)])
		clear(w.limits)
		clear(w.outs)
		s.rls.work.Put(w)
	}()
	now := s.clock()
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
		if err := s.eng.CheckKeySize("the key of its entries", rls.DescriptorLen(w.entries)); err != nil {
			return nil, rlsStatusErr(s, i, err)
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
	w.r.Begin() // resharding: MIGRATE PAUSE waits for it (migrate.go)
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
			evalErr = rlsStatusErr(s, i, err)
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
		evalErr = rlsStatusErr(s, -1, err)
	}
	w.r.Trim(connKeepBuf)
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
		s.countRLS(ld, w, lim, d, out, hitsAddend(req, d), shadow)
	}
	if s.cfg.RLS.ResponseHeaders && closest != nil {
		resp.ResponseHeadersToAdd = []*core.HeaderValue{
			{Key: "RateLimit-Limit", Value: strconv.FormatUint(uint64(closest.CurrentLimit.RequestsPerUnit), 10)},
			{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(closest.LimitRemaining), 10)},
			{Key: "RateLimit-Reset", Value: strconv.FormatInt(closest.DurationUntilReset.GetSeconds(), 10)},
		}
	}
	return resp, nil
}

// countRLS adds one descriptor's hits to envoyproxy/ratelimit's
// statistics: total_hits; within_limit and, past 80 % of the limit,
// near_limit for an allowed hit; over_limit (and shadow_mode in shadow
// mode) for a denied one, which sluice does not count toward the limit.
func (s *Server) countRLS(ld *loadedRLS, w *rlsWork, lim *rlsLimit, d *rlcommon.RateLimitDescriptor, out *policy.Outcome, hits int64, shadow bool) {
	var c *rlsCounts
	switch {
	case lim.l == nil: // Envoy's override
		c = ld.override[lim.rule.Operation[0].Value]
	case lim.l.DetailedMetric:
		w.entries = appendEntries(w.entries[:0], d)
		w.metric = rls.MetricKey(w.metric[:0], w.entries)
		c = s.rls.detailedCounts(lim.l.Domain, w.metric)
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

// rlsCollector reports the RLS metrics.
type rlsCollector Server

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

// Describe implements prometheus.Collector.
func (c *rlsCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

// Collect implements prometheus.Collector.
func (c *rlsCollector) Collect(ch chan<- prometheus.Metric) {
	s := (*Server)(c)
	st := &s.rls
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	st.mu.Lock()
	all := make([]*rlsCounts, 0, len(st.mu.metrics))
	for _, m := range st.mu.metrics {
		all = append(all, m)
	}
	st.mu.Unlock()
	for _, m := range all {
		counter(descRLSTotal, m.totalHits.Load(), m.domain, m.key)
		counter(descRLSOver, m.overLimit.Load(), m.domain, m.key)
		counter(descRLSNear, m.nearLimit.Load(), m.domain, m.key)
		counter(descRLSWithin, m.within.Load(), m.domain, m.key)
		counter(descRLSShadow, m.shadow.Load(), m.domain, m.key)
	}
	req, over, errs := st.requests.Load(), st.overLimit.Load(), st.errors.Load()
	counter(descRLSCalls, req-over-errs, "ok")
	counter(descRLSCalls, over, "over_limit")
	counter(descRLSCalls, errs, "error")
	counter(descRLSCalls, st.refused.Load(), "refused")
	counter(descRLSReloads, st.reloads.Load(), "ok")
	counter(descRLSReloads, st.reloadFailures.Load(), "failed")
	if ld := st.cur.Load(); ld != nil {
		ch <- prometheus.MustNewConstMetric(descRLSLimits, prometheus.GaugeValue, float64(len(ld.cfg.Limits())))
		ch <- prometheus.MustNewConstMetric(descRLSLoaded, prometheus.GaugeValue, float64(ld.at.Unix()))
	}
}
