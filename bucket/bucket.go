// Package bucket holds the arithmetic of sluice's limiter kinds and the byte
// encodings of their stored states:
//
//   - the token bucket of the RL.* commands (Params, State, Reduce);
//   - GCRA, the generic cell rate algorithm of CL.THROTTLE and CL.PTHROTTLE
//     (GCRAParams, GCRA, GCRAState), in nanoseconds;
//   - fixed windows aligned to the Unix epoch, optionally staggered per key,
//     of FW.INCR, FW.PINCR, FW.GET and FW.PGET (WindowParams, Window,
//     WindowState), in milliseconds.
//
// GCRA and the windows answer with one Decision, which carries every value
// of their replies and of X-RateLimit-* headers already rounded to the
// command's Unit; Params.Decision describes a token bucket's call the same
// way, so that no later layer redoes any kind's arithmetic. Each kind's state has a versioned codec, an Idle predicate
// for the sweep and, for the newer kinds, a Describe line for sluice inspect.
//
// Store keys are package keyspace's. It is pure: no I/O, no clock, no
// locks. Time is an argument (milliseconds
// for token buckets and windows, nanoseconds for GCRA), so every result is
// reproducible from its inputs. All functions are safe for concurrent use;
// none allocates unless it is handed a destination slice that is too small,
// or fails, or describes a state.
//
// Arithmetic is int64 with no floats and no fractional tokens. In the token
// bucket overflow saturates instead of wrapping, so 0 <= tokens <= Max always
// holds; GCRA and the windows follow a spec that refuses, with an *ArgError
// naming the argument, any call whose arithmetic would overflow.
package bucket

import "math"

// Params identify a bucket: two requests with the same key and Params use the
// same bucket; any difference in Params is another bucket, which starts full.
type Params struct {
	Max          int64 // tokens when full; >= 1
	RefillAmount int64 // tokens added per refill period; >= 1
	RefillMs     int64 // refill period in milliseconds; >= 1
}

// State is what is stored for a bucket.
type State struct {
	Amount       int64 // tokens left at Anchor
	Anchor       int64 // last refill mark (ms); refills happen on its grid
	LastReduce   int64 // server clock (ms) of the last write; used only to judge idleness
	SessionStart int64 // start of the current session (ms), when HasSession
	HasSession   bool  // false for buckets only ever written by REDUCE
}

// Valid reports whether p is a usable parameter set.
func (p Params) Valid() bool {
	return p.Max >= 1 && p.RefillAmount >= 1 && p.RefillMs >= 1
}

// Available returns the tokens available at now and the refill anchor that
// goes with them. found is false for a bucket that does not exist yet: it is
// full, anchored at now.
//
// Refills are whole periods since the anchor; the anchor advances by whole
// periods only, keeping its phase even when the bucket is already full. Time
// before the anchor gives no refill and leaves the anchor where it is.
func (p Params) Available(s State, found bool, now int64) (tokens, anchor int64) {
	if !found {
		return p.Max, now
	}
	tokens, anchor = clamp(s.Amount, 0, p.Max), s.Anchor
	if now > anchor {
		refills := (now - anchor) / p.RefillMs
		// refills*RefillMs <= now-anchor, so the anchor cannot overflow.
		anchor += refills * p.RefillMs
		tokens = min(p.Max, satAdd(tokens, satMul(refills, p.RefillAmount)))
	}
	return tokens, anchor
}

// Request is one REDUCE or SESSIONIZE.
type Request struct {
	Now    int64 // request time (ms): the client's AT or the server clock
	Server int64 // server clock (ms), recorded as LastReduce
	Take   int64 // tokens to take; >= 0
	Strict bool  // restart the refill period when the bucket is emptied
}

// Reduce takes r.Take tokens. It returns the tokens available before the
// take (the request is allowed iff before >= r.Take), the new state, and
// whether that state must be written.
//
// A take of at least one always writes, also when it is denied: the bucket
// is drained to zero rather than going negative. A take of zero reads only.
func (p Params) Reduce(s State, found bool, r Request) (before int64, next State, write bool) {
	before, anchor := p.Available(s, found, r.Now)
	if r.Take <= 0 {
		return before, s, false
	}
	next = State{
		Amount:       max(before-r.Take, 0),
		Anchor:       anchor,
		LastReduce:   r.Server,
		SessionStart: s.SessionStart,
		HasSession:   found && s.HasSession,
	}
	if r.Strict && next.Amount == 0 && r.Now > next.Anchor {
		next.Anchor = r.Now
	}
	return before, next, true
}

// Sessionize is Reduce in strict mode that also tracks when the current
// session started: a request that is allowed starts a new session at r.Now;
// one that is denied keeps the stored start. A bucket last written by REDUCE
// has no stored start; a denied request then reports the bucket's current
// refill mark (its anchor after this request's refills), and stores it.
//
// A take of 0 writes nothing and starts nothing: it reports the session
// the bucket is in, as the Smyte server does (the stored start, r.Now for
// a new bucket, the refill mark for one with no stored start).
func (p Params) Sessionize(s State, found bool, r Request) (before, sessionStart int64, next State, write bool) {
	r.Strict = true
	before, next, write = p.Reduce(s, found, r)
	switch {
	case r.Take > 0 && before >= r.Take:
		sessionStart = r.Now
	case found && s.HasSession:
		sessionStart = s.SessionStart
	default:
		_, sessionStart = p.Available(s, found, r.Now)
	}
	if write {
		next.SessionStart, next.HasSession = sessionStart, true
	}
	return before, sessionStart, next, write
}

// Idle reports whether a stored state is equivalent to a missing bucket at
// server time now, by the conservative rule of the original server: enough
// whole refill periods have passed since the last write to refill an empty
// bucket. Deleting an idle bucket changes no reply made on the server clock.
func (p Params) Idle(s State, now int64) bool {
	if now <= s.LastReduce {
		return false
	}
	return satMul((now-s.LastReduce)/p.RefillMs, p.RefillAmount) >= p.Max
}

func clamp(v, lo, hi int64) int64 { return min(max(v, lo), hi) }

// satAdd adds two non-negative numbers, saturating at MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// satMul multiplies two non-negative numbers, saturating at MaxInt64.
func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

// Decision describes one Reduce, Sessionize or read (a take of 0) the way
// the newer kinds answer, for the layers that reply with X-RateLimit-*
// headers, so that they need not redo the bucket's arithmetic. before and
// next are what Reduce returned for a take of take at now (ms); for a take
// of 0, pass next = State{Amount: before, Anchor: anchor} from Available.
// Durations are in u, rounded up.
//
// Remaining is the tokens left after the call (a denied take drains the
// bucket, as Reduce does); ResetAfter the time until the refills make it
// full again, ResetAt that instant; RetryAfter, for a denied call, the time
// until take tokens will have refilled, or -1 when take exceeds Max or the
// call was allowed. Used is Max - Remaining.
func (p Params) Decision(before, take int64, next State, now int64, u Unit) Decision {
	left := clamp(next.Amount, 0, p.Max)
	d := Decision{
		Limited:    before < take,
		Limit:      p.Max,
		Remaining:  left,
		Used:       p.Max - left,
		RetryAfter: -1,
	}
	// refilledAt is when whole refills from next.Anchor bring the bucket to
	// n tokens (n <= Max), in ms; saturating, as the bucket is.
	refilledAt := func(n int64) int64 {
		if left >= n {
			return now
		}
		periods := (n - left + p.RefillAmount - 1) / p.RefillAmount // n-left >= 1: no overflow
		return max(satAddSigned(next.Anchor, satMul(periods, p.RefillMs)), now)
	}
	// wait is the time until n tokens, at least 1 ms when there are fewer:
	// near the end of int64 time the instant saturates at now.
	wait := func(n int64) int64 {
		w := satSubNonNeg(refilledAt(n), now)
		if left < n {
			w = max(w, 1)
		}
		return w
	}
	d.ResetAfter = u.fromMillis(wait(p.Max))
	d.ResetAt = u.fromMillis(refilledAt(p.Max))
	if d.Limited && take <= p.Max {
		d.RetryAfter = u.fromMillis(wait(take))
	}
	return d
}

// satAddSigned adds b >= 0 to any a, saturating at MaxInt64.
func satAddSigned(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// satSubNonNeg is a - b for a >= b, saturating at MaxInt64.
func satSubNonNeg(a, b int64) int64 {
	d, ok := subOK(a, b)
	if !ok {
		return math.MaxInt64
	}
	return d
}
