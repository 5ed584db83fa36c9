package envoy

import (
	"context"
	"math"
	"strconv"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/rls"
)

// A ShouldRateLimit call: its request read from its wire bytes, each
// descriptor's limit found and checked, then hit in one engine.Round,
// committed before the reply.

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
		limit := int64(lim.rpu)
		if lim.rule.Algorithm == policy.GCRA && hits > 1 && lim.l != nil && !lim.override {
			// The burst may follow the descriptor's own limit
			// (RLS.OVERRIDE): read it, only for such a call in a domain
			// that has overrides.
			n, err := s.override(lim.rule, w)
			if err != nil {
				return nil, s.statusErr(i, err)
			}
			if n >= 0 {
				limit = n
			}
		}
		if lim.rule.Algorithm == policy.GCRA && limit > 0 && hits > lim.rule.BurstFor(limit) {
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
		if lim.l != nil && !lim.override {
			// The limit the hit was counted under: the descriptor's own
			// (RLS.OVERRIDE) when its counter has one, which
			// current_limit, the headers and near_limit report.
			lim.rpu = uint32(min(max(out.Rate, 0), math.MaxUint32))
		}
		if lim.never {
			// Denied, and waiting cannot help: no retry-after; unless
			// the dials let it through (shadow mode, enforcement off).
			out.Allowed, out.CreditsLeft, out.RetryAfterMs = false, 0, -1
			out.Allowed, out.Shadowed = w.r.DenyLast()
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

// override returns the override (RLS.OVERRIDE) of the descriptor whose
// entries w holds on rule, -1 for none, reading it only when rule's
// overrides label has some.
func (s *Server) override(rule *policy.Rule, w *rlsWork) (int64, error) {
	label := rule.OverridesLabel()
	if label == "" || !s.opt.Engine.HasOverrides(label) {
		return -1, nil
	}
	w.actor = rls.AppendDescriptor(w.actor[:0], w.entries)
	return s.opt.Engine.Override(label, w.actor)
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
