package bucket

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// GCRAParams are the arguments of one CL.THROTTLE (Unit Second) or
// CL.PTHROTTLE (Unit Millisecond): Count requests per Period, in bursts of
// up to MaxBurst+1. They are not part of a key's identity: a call with other
// parameters reinterprets the stored TAT, as redis-cell does.
type GCRAParams struct {
	MaxBurst int64 // >= 0
	Count    int64 // >= 1
	Period   int64 // in Unit; >= 1
	Unit     Unit
}

// GCRA is a validated GCRAParams, with the spec's derived quantities in
// nanoseconds. Build it with NewGCRA.
type GCRA struct {
	limit int64 // max_burst + 1
	ei    int64 // emission interval: period / count
	dvt   int64 // delay variation tolerance: ei * limit
	unit  Unit
}

// NewGCRA validates p and computes its emission interval. It refuses, with
// an *ArgError naming the argument, values out of range and parameter sets
// whose arithmetic overflows int64 nanoseconds.
func NewGCRA(p GCRAParams) (GCRA, error) {
	switch {
	case !p.Unit.valid():
		return GCRA{}, &ArgError{Arg: "unit", Msg: fmt.Sprintf("unknown unit %d", p.Unit)}
	case p.MaxBurst < 0:
		return GCRA{}, &ArgError{Arg: "max_burst", Msg: fmt.Sprintf("%d: want 0 or more", p.MaxBurst)}
	case p.Count < 1:
		return GCRA{}, &ArgError{Arg: "count", Msg: fmt.Sprintf("%d: want 1 or more", p.Count)}
	case p.Period < 1:
		return GCRA{}, &ArgError{Arg: "period", Msg: fmt.Sprintf("%d: want 1 or more", p.Period)}
	}
	unitNs := p.Unit.millis() * 1e6
	t, ok := mulOK(p.Period, unitNs)
	if !ok {
		return GCRA{}, &ArgError{Arg: "period", Msg: fmt.Sprintf("%d: too long, its nanoseconds overflow int64: want at most %d", p.Period, math.MaxInt64/unitNs)}
	}
	ei := t / p.Count
	if ei == 0 {
		return GCRA{}, &ArgError{Arg: "count", Msg: fmt.Sprintf("%d: rate too high, more than one request per nanosecond: want at most %d for this period", p.Count, t)}
	}
	// limit <= dvt since ei >= 1, so checking dvt covers max_burst + 1.
	limit := p.MaxBurst + 1
	dvt, ok := mulOK(limit, ei)
	if p.MaxBurst == math.MaxInt64 || !ok {
		return GCRA{}, &ArgError{Arg: "max_burst", Msg: fmt.Sprintf("%d: (max_burst + 1) × emission interval (%d ns) overflows int64: want at most %d for this rate", p.MaxBurst, ei, math.MaxInt64/ei-1)}
	}
	return GCRA{limit: limit, ei: ei, dvt: dvt, unit: p.Unit}, nil
}

// Limit is max_burst + 1, the first element of the reply after limited.
func (g GCRA) Limit() int64 { return g.limit }

// EmissionInterval is period / count in nanoseconds.
func (g GCRA) EmissionInterval() int64 { return g.ei }

// GCRAState is what is stored for a GCRA key: its theoretical arrival time.
type GCRAState struct {
	TAT int64 // unix ns
}

// Throttle answers one call of quantity at now (unix ns: AT converted with
// Unit.Nanos, or the server clock) on a key whose stored state is s when
// found, by the spec's arithmetic. It returns the state to store when write
// is true.
//
// An allowed call stores its TAT, as redis-cell does, a call of quantity 0
// (a look) included: on a new key, or one whose TAT has passed, the TAT
// becomes now. On a clock that only moves forward that changes no reply,
// but a later call with an earlier AT counts from it, as in redis-cell. A
// look that leaves the TAT as it was does not write.
func (g GCRA) Throttle(s GCRAState, found bool, now, quantity int64) (next GCRAState, write bool, d Decision, err error) {
	if g.ei == 0 {
		return s, false, Decision{}, &ArgError{Arg: "params", Msg: "GCRA not built by NewGCRA"}
	}
	if quantity < 0 {
		return s, false, Decision{}, &ArgError{Arg: "quantity", Msg: fmt.Sprintf("%d: want 0 or more", quantity)}
	}
	inc, ok := mulOK(g.ei, quantity)
	if !ok {
		return s, false, Decision{}, &ArgError{Arg: "quantity", Msg: fmt.Sprintf("%d: quantity × emission interval (%d ns) overflows int64: want at most %d for this rate", quantity, g.ei, math.MaxInt64/g.ei)}
	}
	tat := now
	if found {
		tat = s.TAT
	}
	base := max(tat, now)
	newTAT, ok := addOK(base, inc)
	if !ok {
		if base > now {
			return s, false, Decision{}, &ArgError{Arg: "quantity", Msg: fmt.Sprintf("%d: the key's TAT (%d ns) plus quantity × emission interval overflows int64", quantity, base)}
		}
		// Named after what the caller can change: with no AT, the server
		// clock is not it.
		return s, false, Decision{}, &ArgError{Arg: "period", Msg: fmt.Sprintf("now (%d ns) plus quantity %d × emission interval (%d ns) overflows int64: want a shorter period, a smaller quantity or an earlier AT", now, quantity, g.ei)}
	}
	lo, ok1 := subOK(newTAT, g.dvt)
	diff, ok2 := subOK(now, lo)
	if !ok1 || !ok2 || diff == math.MinInt64 {
		return s, false, Decision{}, atRangeErr(now)
	}
	var ttl, resetAt int64
	retry := int64(-1)
	if diff < 0 {
		d.Limited = true
		if inc <= g.dvt {
			retry = -diff
		}
		ttl, ok = subOK(base, now) // max(tat-now, 0)
		resetAt = base
	} else {
		next, write = GCRAState{TAT: newTAT}, !found || newTAT != s.TAT
		ttl, ok = subOK(newTAT, now)
		resetAt = newTAT
	}
	if !ok {
		return s, false, Decision{}, atRangeErr(now)
	}
	if !write {
		next = s
	}
	d.Limit = g.limit
	d.Remaining = max(g.dvt-ttl, 0) / g.ei
	d.Used = g.limit - d.Remaining
	d.ResetAfter = g.unit.fromNanos(ttl)
	d.RetryAfter = -1
	if retry >= 0 {
		d.RetryAfter = g.unit.fromNanos(retry)
	}
	d.ResetAt = g.unit.fromNanos(resetAt)
	return next, write, d, nil
}

func atRangeErr(now int64) error {
	return &ArgError{Arg: "AT", Msg: fmt.Sprintf("%d ns is too far from the key's TAT: the arithmetic overflows int64", now)}
}

// fromNanos rounds d (ns) to u as the CL replies do: for Second, truncated
// to milliseconds and then rounded up to whole seconds, as redis-cell 0.4
// does (2.0004 s is 2); for Millisecond, rounded up.
func (u Unit) fromNanos(d int64) int64 {
	if u == Millisecond {
		return ceilDiv(d, 1e6)
	}
	return ceilDiv(floorDiv(d, 1e6), 1000)
}

// Idle reports whether s means a full allowance at now (unix ns on the
// server clock): its TAT is at or before now, the same as no record, so the
// sweep may delete it.
func (s GCRAState) Idle(now int64) bool { return s.TAT <= now }

// Describe is a one-line summary of s at now (unix ns) for sluice inspect.
func (s GCRAState) Describe(now int64) string {
	if s.Idle(now) {
		return fmt.Sprintf("gcra tat=%s idle", fmtNanos(s.TAT))
	}
	// As unsigned, tat-now cannot wrap: tat > now.
	return fmt.Sprintf("gcra tat=%s full_in=%dns", fmtNanos(s.TAT), uint64(s.TAT)-uint64(now))
}

func fmtNanos(ns int64) string {
	return time.Unix(0, ns).UTC().Format("2006-01-02T15:04:05.000000000Z")
}

// gcraVersion1 is the only GCRA value format so far.
const gcraVersion1 = 1

// MaxGCRAStateLen is the most bytes AppendGCRAState appends.
const MaxGCRAStateLen = 1 + binary.MaxVarintLen64

// AppendGCRAState appends the encoding of s: a version byte, then the TAT as
// a signed varint.
func AppendGCRAState(dst []byte, s GCRAState) []byte {
	dst = append(dst, gcraVersion1)
	return binary.AppendVarint(dst, s.TAT)
}

// DecodeGCRAState decodes a value made by AppendGCRAState.
func DecodeGCRAState(b []byte) (GCRAState, error) {
	if len(b) < 2 {
		return GCRAState{}, fmt.Errorf("%w: GCRA value of %d bytes, want at least 2", ErrCorrupt, len(b))
	}
	if b[0] != gcraVersion1 {
		return GCRAState{}, fmt.Errorf("%w: GCRA format version %d, this build reads version %d", ErrCorrupt, b[0], gcraVersion1)
	}
	tat, n := binary.Varint(b[1:])
	if n <= 0 {
		return GCRAState{}, fmt.Errorf("%w: GCRA TAT truncated or too long", ErrCorrupt)
	}
	if 1+n != len(b) {
		return GCRAState{}, fmt.Errorf("%w: %d trailing bytes after the GCRA TAT", ErrCorrupt, len(b)-1-n)
	}
	return GCRAState{TAT: tat}, nil
}
