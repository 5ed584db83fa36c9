package policy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Window is the stored state of one counter: a fixed window that opened at
// the counter's first hit. It records its end rather than its start so that
// a sweep can drop ended windows without the rule, which a reload may have
// removed.
type Window struct {
	End  int64 // when the window ends, in unix milliseconds
	Left int64 // credits left
}

// Expired reports whether w has ended at now (unix ms). An ended window is
// the same as none: the next hit opens a new one, and a sweep may delete it.
func (w Window) Expired(now int64) bool { return now >= w.End }

// Outcome is the answer to one hit on one rule, for every algorithm.
//
// Allowed, CreditsLeft and SecondsUntilReset are the reply of HIT over RESP
// and the line protocol; the other fields are for front ends that answer
// with rate-limit headers (GET /check, Envoy's RLS), already rounded so that
// none redoes an algorithm's arithmetic.
type Outcome struct {
	Allowed bool
	// CreditsLeft is the hits the counter lets through now, after this one
	// (the remaining of X-RateLimit-Remaining); for always-allow rules the
	// limit.
	CreditsLeft int64
	// SecondsUntilReset is ResetAfterMs rounded up to whole seconds, so that
	// a counter in use never reports 0; -1 for always-deny rules and 0 for
	// always-allow rules. For divvy it is the time until the window ends.
	SecondsUntilReset int64

	// Limit is what CreditsLeft counts toward: the limit that applied
	// (creditLimit, or the request's quota), or for gcra and tokenBucket
	// the burst, which is the limit unless the rule sets one.
	Limit int64
	// RetryAfterMs is, for a denied hit, the time until the same hit would
	// be allowed; -1 when it was allowed or when waiting cannot help (an
	// always-deny rule, or more hits than the limit at once).
	RetryAfterMs int64
	// ResetAfterMs is the time until the counter is whole again (the
	// window ends, the bucket or GCRA is full, every hit has left the
	// log); 0 when nothing is used (but a fixedWindow's window always has
	// an end), -1 for always-deny rules.
	ResetAfterMs int64
	// Quota says where Limit came from.
	Quota QuotaStatus
	// Rate is the hits the rule lets through per period for this hit: the
	// limit that applied, creditLimit or the request's quota (Limit is the
	// burst instead for gcra and tokenBucket rules that set one). Set by
	// the server, as Quota.
	Rate int64
	// Rule is the rule that answered; its Label, Algorithm and
	// PeriodMillis describe the limit. Set by Counter and the server, not
	// by Rule.Hit.
	Rule *Rule
	// Shadowed is a hit the limit refused and shadow mode let through
	// (the rule's shadow field, or POLICY ENFORCE shadow): Allowed is
	// true, and the other fields say what the limit decided. Set by the
	// server, as Quota.
	Shadowed bool
}

// AppendReply appends the line protocol's reply, e.g. "OK true 2 3600\n".
func (o Outcome) AppendReply(dst []byte) []byte {
	dst = append(dst, "OK "...)
	dst = strconv.AppendBool(dst, o.Allowed)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, o.CreditsLeft, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, o.SecondsUntilReset, 10)
	return append(dst, '\n')
}

const msPerSecond = 1000

// Hit applies one hit at now (unix ms) to r's counter, whose stored window
// is w when found, under r's own CreditLimit. It returns the window to
// store when write is true; otherwise the store is left as it is.
//
// The first hit, or the first after the window ended, opens a window of
// ResetSeconds with CreditLimit-1 credits left. Each allowed hit takes one
// credit; a hit with none left is denied and changes nothing. Rules that are
// not Counted never write: CreditLimit 0 answers false 0 -1, ResetSeconds 0
// answers true CreditLimit 0.
func (r *Rule) Hit(w Window, found bool, now int64) (next Window, write bool, out Outcome) {
	return r.Take(w, found, now, r.CreditLimit, 1)
}

// Take is Hit for hits credits at once under limit (CreditLimit or a
// request's quota, see Limit). A window opens when the hits fit in limit;
// an allowed take leaves Left - hits; a denied one changes nothing. Hits 0
// reads without writing.
//
// Left is stored, not the count, so a window opened under a larger quota
// keeps at most limit-1 credits under a smaller one (the clamp below):
// lowering a quota takes effect at once, raising it at the next window.
func (r *Rule) Take(w Window, found bool, now, limit, hits int64) (next Window, write bool, out Outcome) {
	switch {
	case limit <= 0:
		return w, false, denyAll(limit)
	case r.ResetSeconds <= 0:
		return w, false, allowAll(limit)
	}
	out = Outcome{Limit: limit, RetryAfterMs: -1}
	if !found || w.Expired(now) {
		if hits == 0 || hits > limit {
			// Nothing to count, or more than a window holds: no window
			// opens, and the reply describes the one a hit would open.
			out.Allowed = hits == 0
			out.CreditsLeft = limit
			out.SecondsUntilReset = r.ResetSeconds
			return w, false, out
		}
		w = Window{End: satAdd(now, r.PeriodMillis()), Left: limit - hits}
		out.Allowed, out.CreditsLeft = true, w.Left
		out.ResetAfterMs = r.msUntil(w.End, now)
		out.SecondsUntilReset = ceilSeconds(out.ResetAfterMs)
		return w, true, out
	}
	// A window written under other limits cannot reach here (the limits are
	// part of the counter key) unless the limit is a quota, but a damaged
	// one is clamped all the same.
	left := min(w.Left, limit-1)
	out.ResetAfterMs = r.msUntil(w.End, now)
	out.SecondsUntilReset = ceilSeconds(out.ResetAfterMs)
	if left < hits {
		out.CreditsLeft = max(left, 0)
		if hits <= limit {
			out.RetryAfterMs = out.ResetAfterMs
		}
		return w, false, out
	}
	out.Allowed, out.CreditsLeft = true, left-hits
	if hits == 0 {
		return w, false, out
	}
	w.Left = left - hits
	return w, true, out
}

// denyAll is the answer of an always-deny rule, or of a quota of 0.
func denyAll(limit int64) Outcome {
	return Outcome{Allowed: false, CreditsLeft: 0, SecondsUntilReset: -1, Limit: max(limit, 0), RetryAfterMs: -1, ResetAfterMs: -1}
}

// allowAll is the answer of an always-allow rule (ResetSeconds 0).
func allowAll(limit int64) Outcome {
	return Outcome{Allowed: true, CreditsLeft: limit, SecondsUntilReset: 0, Limit: limit, RetryAfterMs: -1}
}

// ceilSeconds rounds a duration in ms >= 0 up to whole seconds.
func ceilSeconds(ms int64) int64 {
	s := ms / msPerSecond
	if ms%msPerSecond > 0 {
		s++
	}
	return s
}

// msUntil is end-now for end > now, clamped to the period in case the
// clock went back.
func (r *Rule) msUntil(end, now int64) int64 {
	d := uint64(end) - uint64(now) // exact: end > now
	return int64(min(d, uint64(r.PeriodMillis())))
}

// satAdd adds b >= 0 to a, saturating at MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// satMul multiplies two non-negative numbers, saturating at MaxInt64.
func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// windowVersion1 is the only stored format so far; the byte lets a later
// format coexist with stored ones.
const windowVersion1 = 1

// WindowLen is the length of every encoded Window.
const WindowLen = 1 + 8 + 8

// AppendWindow appends the encoding of w: a version byte, then End and Left
// as big-endian 64-bit integers.
func AppendWindow(dst []byte, w Window) []byte {
	dst = append(dst, windowVersion1)
	dst = binary.BigEndian.AppendUint64(dst, uint64(w.End))
	return binary.BigEndian.AppendUint64(dst, uint64(w.Left))
}

// ErrCorrupt is returned for a stored window that cannot be decoded.
var ErrCorrupt = errors.New("policy: stored window is corrupt")

// DecodeWindow decodes a value made by AppendWindow.
func DecodeWindow(b []byte) (Window, error) {
	if len(b) != WindowLen {
		return Window{}, fmt.Errorf("%w: %d bytes, want %d", ErrCorrupt, len(b), WindowLen)
	}
	if b[0] != windowVersion1 {
		return Window{}, fmt.Errorf("%w: format version %d, this build reads version %d", ErrCorrupt, b[0], windowVersion1)
	}
	w := Window{End: int64(binary.BigEndian.Uint64(b[1:])), Left: int64(binary.BigEndian.Uint64(b[9:]))}
	if w.Left < 0 {
		return Window{}, fmt.Errorf("%w: %d credits left", ErrCorrupt, w.Left)
	}
	return w, nil
}
