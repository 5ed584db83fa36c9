package policy

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/bucket"
)

// Counter evaluates hits on one rule's stored counter, whatever the rule's
// algorithm: a server sets its fields for a hit and hands Apply the stored
// value, as a storage mutator. It keeps its scratch space between hits, so
// that a hit allocates nothing once the space has grown to the counters'
// size; one Counter serves one goroutine.
//
// Each algorithm keeps its state in the encoding of its kind and computes
// with the bucket package's arithmetic, as its commands do: Divvy a Window
// (Rule.Take), FixedWindow a bucket.WindowState (FW.PINCR), TokenBucket a
// bucket.State (RL.REDUCE), GCRA a bucket.GCRAState (CL.PTHROTTLE),
// SlidingLog a bucket.LogState (ROLL.LIMIT).
type Counter struct {
	Rule  *Rule
	Limit int64 // from Rule.Limit; > 0 for a counted hit
	Hits  int64 // credits the hit takes; >= 0 (0 reads)
	Now   int64 // unix ns
	// ID is the counter's identity, Rule.AppendCounterID: a staggered
	// fixedWindow hashes it for its offset.
	ID []byte

	Out Outcome // the answer, after Apply
	// Ended is set by Apply when the hit replaced a stored window that
	// was over with a new one (divvy and fixedWindow rules): EndedUsed is
	// the credits that window had used, under Limit, and EndedAt when it
	// ended (unix ms). A window's used only grows, so it is its peak.
	Ended              bool
	EndedUsed, EndedAt int64

	val     []byte
	entries []int64
}

// ErrHits is a hit a rule cannot count as asked.
var ErrHits = errors.New("policy: hits")

// Apply applies the hit to the counter's stored value old (found false for
// none) and returns the value to store when write is true. Errors are a
// stored value that does not decode (wrapping the kind's ErrCorrupt), or a
// hit the algorithm refuses (ErrHits, or a *bucket.ArgError for
// arithmetic that overflows).
//
// val aliases c's scratch space, valid until the next Apply.
func (c *Counter) Apply(old []byte, found bool) (val []byte, write bool, err error) {
	r := c.Rule
	c.Ended = false
	if c.Hits < 0 {
		return nil, false, fmt.Errorf("%w: %d; expected 0 or more", ErrHits, c.Hits)
	}
	if c.Limit <= 0 || r.ResetSeconds <= 0 {
		_, _, c.Out = r.Take(Window{}, false, floorDiv(c.Now, 1e6), c.Limit, c.Hits)
		c.Out.Rule = r
		return nil, false, nil
	}
	var d bucket.Decision
	switch r.Algorithm {
	case Divvy:
		var w Window
		if found {
			if w, err = DecodeWindow(old); err != nil {
				return nil, false, err
			}
		}
		now := floorDiv(c.Now, 1e6)
		next, write, out := r.Take(w, found, now, c.Limit, c.Hits)
		out.Rule = c.Rule
		c.Out = out
		if !write {
			return nil, false, nil
		}
		if found && w.Expired(now) {
			// Used as Take counts it: the credits left clamped to the
			// limit's, so a window opened under another limit (a quota, a
			// runtime limit) has used at least one.
			c.Ended, c.EndedUsed, c.EndedAt = true, c.Limit-min(w.Left, c.Limit-1), w.End
		}
		c.val = AppendWindow(c.val[:0], next)
		return c.val, true, nil
	case FixedWindow:
		fw, err := bucket.NewWindow(r.WindowParams(c.Limit, c.Hits), c.ID)
		if err != nil {
			return nil, false, err
		}
		var s bucket.WindowState
		if found {
			if s, err = bucket.DecodeWindowState(old); err != nil {
				return nil, false, err
			}
		}
		now := floorDiv(c.Now, 1e6)
		next, w, dec, err := fw.Incr(s, found, now)
		if err != nil {
			return nil, false, err
		}
		d, write = dec, w
		if write && found && s.End != next.End && s.Idle(now) {
			c.Ended, c.EndedUsed, c.EndedAt = true, s.Count, s.End
		}
		if write {
			c.val = bucket.AppendWindowState(c.val[:0], next)
		}
	case TokenBucket:
		p := r.BucketParams(c.Limit)
		var s bucket.State
		if found {
			if s, err = bucket.DecodeState(old); err != nil {
				return nil, false, err
			}
		}
		now := floorDiv(c.Now, 1e6)
		var before int64
		var next bucket.State
		if c.Hits == 0 {
			var anchor int64
			before, anchor = p.Available(s, found, now)
			next = bucket.State{Amount: before, Anchor: anchor}
		} else {
			before, next, write = p.Reduce(s, found, bucket.Request{Now: now, Server: now, Take: c.Hits})
			// An empty bucket that denies stays as stored but for its
			// last write time, which only the sweep reads: Idle measures
			// from it, and from the older one it still judges right, as
			// the stored anchor is no later and the stored tokens no
			// more. So a client hammering an empty bucket writes nothing.
			write = write && before > 0
		}
		d = p.Decision(before, c.Hits, next, now, bucket.Millisecond)
		if write {
			c.val = bucket.AppendState(c.val[:0], next)
		}
	case GCRA:
		g, err := bucket.NewGCRA(r.GCRAParams(c.Limit))
		if err != nil {
			return nil, false, err
		}
		var s bucket.GCRAState
		if found {
			if s, err = bucket.DecodeGCRAState(old); err != nil {
				return nil, false, err
			}
		}
		next, w, dec, err := g.Throttle(s, found, c.Now, c.Hits)
		if err != nil {
			return nil, false, err
		}
		// A check (hits 0) stores nothing, though CL.THROTTLE's look
		// stores the TAT it moves to now: rules run on the server clock,
		// on which that TAT changes no later reply.
		d, write = dec, w && c.Hits > 0
		if write {
			c.val = bucket.AppendGCRAState(c.val[:0], next)
		}
	case SlidingLog:
		if c.Hits > 1 {
			return nil, false, fmt.Errorf("%w: %d; a slidingLog rule records one hit at a time (hits 0 or 1)", ErrHits, c.Hits)
		}
		l, err := bucket.NewLog(r.LogParams(c.Limit))
		if err != nil {
			return nil, false, err
		}
		s := bucket.LogState{Entries: c.entries[:0]}
		if found {
			if s, err = bucket.DecodeLogState(c.entries[:0], old); err != nil {
				return nil, false, err
			}
		}
		now := floorDiv(c.Now, 1e3)
		var res bucket.LogResult
		if c.Hits == 0 {
			// A check stores nothing, though ROLL.WOULDLIMIT stores the
			// entries it dropped: on the server clock, with the rule's one
			// interval, the next call drops them too.
			_, _, res, err = l.WouldLimit(s, now)
		} else {
			var next bucket.LogState
			next, write, res, err = l.Limit(s, now)
			s = next
		}
		if err != nil {
			return nil, false, err
		}
		if cap(s.Entries) > cap(c.entries) {
			c.entries = s.Entries[:0] // keep the grown array
		}
		if write {
			c.val = bucket.AppendLogState(c.val[:0], s)
		}
		d = res.Decision()
	default:
		return nil, false, fmt.Errorf("policy: rule %d: unknown algorithm %d", r.Pos, r.Algorithm)
	}
	c.Out = Outcome{
		Allowed:           !d.Limited,
		CreditsLeft:       d.Remaining,
		SecondsUntilReset: ceilSeconds(d.ResetAfter),
		Limit:             d.Limit,
		RetryAfterMs:      d.RetryAfter,
		ResetAfterMs:      d.ResetAfter,
		Rule:              r,
	}
	if !write {
		return nil, false, nil
	}
	return c.val, true, nil
}

// Shrink lets go of scratch space beyond keep bytes, as a connection does
// with its buffers after a large request.
func (c *Counter) Shrink(keep int) {
	if cap(c.val) > keep {
		c.val = nil
	}
	if cap(c.entries)*8 > keep {
		c.entries = nil
	}
	c.Rule, c.ID = nil, nil
	c.Out.Rule = nil
}

// Footprint is the bytes of c's scratch space.
func (c *Counter) Footprint() int { return cap(c.val) + 8*cap(c.entries) }

// floorDiv divides by b > 0 rounding toward minus infinity, for unix ns to
// ms and µs before 1970.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
