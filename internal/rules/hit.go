package rules

import (
	"errors"
	"strings"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// Engine executes hits for a server.
type Engine struct {
	// Env is the server's key size limit and Modify (which honours
	// --on-store-error).
	Env *dispatch.Env
	// Forward is the cluster's hook: when another node owns the slot of
	// the counter key key, it has that node apply hits of r under limit at
	// now (unix ns) and returns its outcome with forwarded true; otherwise
	// forwarded false, and the hit is applied here. Nil applies every hit
	// here.
	Forward func(key []byte, r *policy.Rule, limit, hits, now int64) (forwarded bool, out policy.Outcome, err error)
}

func (e *Engine) forward(key []byte, r *policy.Rule, limit, hits, now int64) (bool, policy.Outcome, error) {
	if e.Forward == nil {
		return false, policy.Outcome{}, nil
	}
	return e.Forward(key, r, limit, hits, now)
}

// Hitter is one connection's reusable state for executing hits, so that a
// hit allocates nothing.
type Hitter struct {
	// Req is room for the request's fields: front ends parse into it.
	Req      policy.Request
	canaries []*policy.Rule
	// ID and Key are room for a counter ID and its store key.
	ID, Key []byte
	m       ruleMutator
	// done holds the outcomes of this round's hits until its writes are
	// committed; the metrics count only what clients were told.
	done []hitDone
}

// FieldSize is the bytes of one of a request's fields (policy.Field: two
// slice headers), for a Hitter's footprint.
const FieldSize = 48

// hitDoneSize is the bytes of a hitDone: a pointer and three bools, padded.
const hitDoneSize = 16

// Trim lets go of what a pipeline's hits grew beyond keep bytes, as the
// connection does for its buffers. Req's fields point into the framer's output of
// the last pipeline, so its whole capacity is cleared: a slice header left
// beyond len would keep a dropped multi-MiB command reachable for the life
// of the connection.
func (h *Hitter) Trim(keep int) {
	if cap(h.Req)*FieldSize > keep {
		h.Req = nil
	} else {
		clear(h.Req[:cap(h.Req)])
		h.Req = h.Req[:0]
	}
	if cap(h.canaries)*8 > keep {
		h.canaries = nil
	} else {
		clear(h.canaries[:cap(h.canaries)]) // rules of a policy a reload may replace
		h.canaries = h.canaries[:0]
	}
	if cap(h.Key) > keep {
		h.Key = nil
	}
	if cap(h.ID) > keep {
		h.ID = nil
	}
	if cap(h.done)*hitDoneSize > keep {
		h.done = nil
	}
	h.m.c.Shrink(keep)
}

// Footprint is the bytes of h's buffers, counted with the connection's.
func (h *Hitter) Footprint() int {
	return FieldSize*cap(h.Req) + 8*cap(h.canaries) + cap(h.ID) + cap(h.Key) + hitDoneSize*cap(h.done) + h.m.c.Footprint()
}

type hitDone struct {
	counts        *Counts
	canary, wrote bool
	allowed       bool
}

// ruleMutator applies one hit of one rule to its stored counter, whatever
// the rule's algorithm (policy.Counter).
type ruleMutator struct {
	c policy.Counter
}

// Mutate implements storage.Mutator.
func (m *ruleMutator) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	val, write, err := m.c.Apply(old, found)
	switch {
	case err != nil:
		return nil, storage.Keep, Err(err)
	case !write:
		return nil, storage.Keep, nil
	}
	return val, storage.Put, nil
}

// Err turns what policy.Counter refuses into the request's error: a hit
// count the rule cannot take, or arithmetic out of range, which the
// loader's checks leave only to extreme clocks. A stored value that does
// not decode is passed on as it is.
func Err(err error) error {
	var ae *bucket.ArgError
	switch {
	case errors.Is(err, policy.ErrHits):
		return &errs.Error{Kind: errs.Request, Msg: strings.TrimPrefix(err.Error(), "policy: "), Err: err}
	case errors.As(err, &ae):
		return &errs.Error{Kind: errs.Request, Msg: "rule arithmetic out of range: " + ae.Arg + ": " + ae.Msg, Err: err}
	}
	return err
}

// Hit is the entry point every front end uses to evaluate a request
// against the rules: HIT over RESP, the divvy line protocol, GET /check and
// (later) Envoy's rate-limit service. It evaluates req, the request's
// fields, at now (unix ns) under lp, for a cost of hits (Envoy's
// hits_addend; 1 for one request, 0 to read without counting): each canary
// rule matched before the deciding rule takes its hits, then the deciding
// rule answers. The answer carries the deciding rule (Outcome.Rule) and
// what rate-limit headers need.
//
// h is the caller's reusable state (one per connection or goroutine); req
// may be h.Req. Changes are queued in b; the caller commits them before
// it answers, then calls h.CountHits for the metrics.
func (e *Engine) Hit(h *Hitter, lp *Set, req policy.Request, hits int64, b *storage.Batch, now int64) (policy.Outcome, error) {
	decider, canaries := lp.Policy.Match(req, h.canaries[:0])
	h.canaries = canaries
	// Every key is checked before the first rule takes its credit, so a
	// refused hit changes nothing.
	if err := e.checkActorKey(req, decider); err != nil {
		return policy.Outcome{}, err
	}
	for _, r := range canaries {
		if err := e.checkActorKey(req, r); err != nil {
			return policy.Outcome{}, err
		}
	}
	for _, r := range canaries {
		if _, err := e.HitRule(h, lp, r, req, hits, true, b, now); err != nil {
			return policy.Outcome{}, err
		}
	}
	return e.HitRule(h, lp, decider, req, hits, false, b, now)
}

// checkActorKey refuses a hit whose value of r's actor field, the part of
// r's counter key the client chooses, is longer than MaxKeySize.
func (e *Engine) checkActorKey(req policy.Request, r *policy.Rule) error {
	if !r.MayCount() || r.ActorField == "" {
		return nil
	}
	v, _ := req.Get(r.ActorField)
	if len(v) <= e.Env.MaxKeySize { // before building the name: no allocation on the way
		return nil
	}
	return e.Env.CheckKeySize("value of actor field "+r.ActorField, len(v))
}

// HitRule applies a hit of the one rule r, as Hit does for each rule it
// matched; canary says r is a canary rule, for the metrics.
func (e *Engine) HitRule(h *Hitter, lp *Set, r *policy.Rule, req policy.Request, hits int64, canary bool, b *storage.Batch, now int64) (policy.Outcome, error) {
	d := hitDone{counts: lp.Counts[r.Pos-1], canary: canary}
	c := &h.m.c
	c.Rule, c.Hits, c.Now = r, hits, now
	var quota policy.QuotaStatus
	c.Limit, quota = r.Limit(req)
	if c.Limit > 0 && r.ResetSeconds > 0 {
		h.ID = r.AppendCounterID(h.ID[:0], req)
		c.ID = h.ID
		h.Key = keyspace.AppendRuleKey(h.Key[:0], r, c.Limit, h.ID)
		before := b.Len()
		// In cluster mode another node may own the counter's slot: it
		// applies the same hit (rule, counter ID, limit, hits, now) and
		// answers the whole outcome (server's forwarder, the Engine's Forward).
		if fwd, o, err := e.forward(h.Key, r, c.Limit, hits, now); fwd {
			if err != nil {
				return policy.Outcome{}, err
			}
			o.Rule = r
			c.Out = o
		} else if err := e.Env.Modify(b, h.Key, &h.m); err != nil {
			return policy.Outcome{}, err
		}
		d.wrote = b.Len() > before
	} else if _, _, err := c.Apply(nil, false); err != nil {
		return policy.Outcome{}, Err(err)
	}
	out := c.Out
	out.Quota, out.Rate = quota, c.Limit
	d.allowed = out.Allowed
	h.done = append(h.done, d)
	return out, nil
}

// CountHits adds the round's hits to the metrics; with committed false
// (the writes were not stored) only the hits that wrote nothing count.
func (h *Hitter) CountHits(committed bool) {
	for _, d := range h.done {
		if !committed && d.wrote {
			continue
		}
		switch {
		case d.canary && d.allowed:
			d.counts.CanaryAccepted.Add(1)
		case d.canary:
			d.counts.CanaryRejected.Add(1)
		case d.allowed:
			d.counts.Accepted.Add(1)
		default:
			d.counts.Rejected.Add(1)
		}
	}
	h.done = h.done[:0]
}

// DenyLast counts the last hit as denied in the metrics, for a front end
// that denies whatever the counter said (Envoy's unlimited: false with
// no requests per unit).
func (h *Hitter) DenyLast() { h.done[len(h.done)-1].allowed = false }

// ApplyCounter is the owner's side of a forwarded hit: it applies hits of
// r under limit at now (unix ns) to the counter key, of counter ID id,
// through b, and returns the outcome without Quota and Rule.
func (e *Engine) ApplyCounter(h *Hitter, b *storage.Batch, key []byte, r *policy.Rule, limit, hits, now int64, id []byte) (policy.Outcome, error) {
	m := &h.m.c
	m.Rule, m.Limit, m.Hits, m.Now, m.ID = r, limit, hits, now, id
	err := e.Env.Modify(b, key, &h.m)
	m.ID = nil // aliases the caller's arguments
	if err != nil {
		return policy.Outcome{}, err
	}
	return m.Out, nil
}
