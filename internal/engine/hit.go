package engine

import (
	"errors"
	"strings"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// Rule hits (divvy's model): every rule front end (HIT over RESP, the
// divvy line protocol, GET /check, Envoy's rate limit service) evaluates a
// request with Hit or HitRule. A hit of a counted rule applies to the
// rule's stored counter here, or, in a cluster, at the node owning its
// slot (Cluster.ForwardCounter); the metrics of a rule set (rules.Counts)
// count the hits once Commit knows whether their answers were told.

// hits is a Round's reusable state for rule hits, so that a hit
// allocates nothing.
type hits struct {
	canaries []*policy.Rule
	// id and key are room for a counter ID and its store key, okey for
	// an override's key, ovr for its read, oval for a cluster node's
	// override value (nodeoverrides.go).
	id, key, okey, oval []byte
	ovr                 overrideReader
	m                   ruleMutator
	// done holds the outcomes of this round's hits until its changes are
	// committed; the metrics count only what clients were told.
	done []hitDone
	// ends holds the windows this round's hits ended, for the threshold
	// data once the round's changes are stored (stats.go).
	ends []windowEnd
	// lastMode is the enforcement of the last hit, for DenyLast.
	lastMode Mode
}

// hitDoneSize is the bytes of a hitDone: a pointer and four bools, padded.
const hitDoneSize = 16

type hitDone struct {
	counts            *rules.Counts
	canary, wrote     bool
	allowed, shadowed bool
}

func (h *hits) trim(keep int) {
	if cap(h.canaries)*8 > keep {
		h.canaries = nil
	} else {
		clear(h.canaries[:cap(h.canaries)]) // rules of a policy a reload may replace
		h.canaries = h.canaries[:0]
	}
	if cap(h.key) > keep {
		h.key = nil
	}
	if cap(h.id) > keep {
		h.id = nil
	}
	if cap(h.okey) > keep {
		h.okey = nil
	}
	if cap(h.oval) > keep {
		h.oval = nil
	}
	if cap(h.m.marked) > keep {
		h.m.marked = nil
	}
	if cap(h.done)*hitDoneSize > keep {
		h.done = nil
	}
	if cap(h.ends)*windowEndSize > keep {
		h.ends = nil
	}
	h.m.c.Shrink(keep)
}

func (h *hits) footprint() int {
	return 8*cap(h.canaries) + cap(h.id) + cap(h.key) + cap(h.okey) + cap(h.oval) + cap(h.m.marked) + hitDoneSize*cap(h.done) + windowEndSize*cap(h.ends) + h.m.c.Footprint()
}

// ruleMutator applies one hit of one rule to its stored counter, whatever
// the rule's algorithm (policy.Counter), under the actor's override when
// the counter carries one (overrides.go).
type ruleMutator struct {
	c policy.Counter
	// base is the hit's limit without an override: c.Limit is set from
	// it at each Mutate, then replaced by the counter's override.
	base int64
	// lookup is what a counter that does not exist yet needs.
	lookup lookup
	// For lookupDone and lookupLocal: the override read (has, limit);
	// for lookupDone, the epoch of the overrides when it was read.
	has   bool
	limit int64
	epoch uint64
	ov    *overrides
	// marked is room for a value with its override.
	marked []byte
}

type lookup uint8

const (
	lookupNone   lookup = iota // the label has no overrides: none to read
	lookupNeeded               // the label has some: a new counter reads the actor's
	lookupDo                   // Mutate found no counter: read the override, then again
	lookupDone                 // read: create the counter under it, if the epoch holds
	lookupRetry                // the overrides changed meanwhile: read again
	lookupLocal                // a cluster node's: read before, base is the actor's limit
)

// Mutate implements storage.Mutator.
func (m *ruleMutator) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	c := &m.c
	c.Limit = m.base
	// carried is the override the counter carries, kept in what is
	// written back.
	carried, override := int64(0), false
	switch {
	case found:
		limit, ok, inner, err := keyspace.SplitMarked(old)
		if err != nil {
			return nil, storage.Keep, err
		}
		carried, override = limit, ok
		switch {
		case m.lookup == lookupLocal:
			// The copy is only what the counter's last hit used: the
			// override read now is the node's (nodeoverrides.go).
			carried, override = m.limit, m.has
		case m.ov.local:
			// The label has no overrides on this cluster node: the copy
			// goes with the next write, as no RESET takes it.
			override = false
		case ok && m.ov.has(c.Rule.OverridesLabel()):
			// A label that has no overrides now (a reload dropped or
			// renamed it) leaves its counters' copies unused, until it
			// has again.
			c.Limit = limit
		}
		old = inner
	case m.lookup == lookupLocal:
		carried, override = m.limit, m.has
	case m.lookup == lookupNeeded:
		m.lookup = lookupDo
		return nil, storage.Keep, nil
	case m.lookup == lookupDone:
		if m.ov.epoch.Load() != m.epoch {
			m.lookup = lookupRetry
			return nil, storage.Keep, nil
		}
		if m.has {
			c.Limit, carried, override = m.limit, m.limit, true
		}
	}
	val, write, err := c.Apply(old, found)
	switch {
	case err != nil:
		return nil, storage.Keep, ruleErr(err)
	case !write:
		return nil, storage.Keep, nil
	case override:
		m.marked = keyspace.AppendMarked(m.marked[:0], carried, val)
		val = m.marked
	}
	return val, storage.Put, nil
}

// ruleErr turns what policy.Counter refuses into the request's error: a
// hit count the rule cannot take, or arithmetic out of range, which the
// loader's checks leave only to extreme clocks. A stored value that does
// not decode is passed on as it is.
func ruleErr(err error) error {
	var ae *bucket.ArgError
	switch {
	case errors.Is(err, policy.ErrHits):
		return &errs.Error{Kind: errs.Request, Msg: strings.TrimPrefix(err.Error(), "policy: "), Err: err}
	case errors.As(err, &ae):
		return &errs.Error{Kind: errs.Request, Msg: "rule arithmetic out of range: " + ae.Arg + ": " + ae.Msg, Err: err}
	}
	return err
}

// Hit evaluates req, a request's fields, against the rule set lp at now
// (unix ns), for a cost of hits (Envoy's hits_addend; 1 for one request,
// 0 to read without counting): each canary rule matched before the
// deciding rule takes its hits, then the deciding rule answers. The answer
// carries the deciding rule (Outcome.Rule) and what rate-limit headers
// need. req may be r.Req. Every key is checked before the first rule takes
// its credit, so a refused hit changes nothing.
func (r *Round) Hit(lp *rules.Set, req policy.Request, hits, now int64) (policy.Outcome, error) {
	defer r.count(r.b.Len())
	decider, canaries := lp.Policy.Match(req, r.canaries[:0])
	r.canaries = canaries
	if err := r.checkActorKey(req, decider); err != nil {
		return policy.Outcome{}, err
	}
	for _, c := range canaries {
		if err := r.checkActorKey(req, c); err != nil {
			return policy.Outcome{}, err
		}
	}
	for _, c := range canaries {
		if _, err := r.hitRule(lp, c, req, hits, true, now); err != nil {
			return policy.Outcome{}, err
		}
	}
	return r.hitRule(lp, decider, req, hits, false, now)
}

// checkActorKey refuses a hit whose value of rule's actor field, the part
// of rule's counter key the client chooses, is longer than MaxKeySize.
func (r *Round) checkActorKey(req policy.Request, rule *policy.Rule) error {
	if !rule.MayCount() || rule.ActorField == "" {
		return nil
	}
	v, _ := req.Get(rule.ActorField)
	if len(v) <= r.e.maxKeySize { // before building the name: no allocation on the way
		return nil
	}
	return r.e.CheckKeySize("value of actor field "+rule.ActorField, len(v))
}

// HitRule applies a hit of the one rule rule of lp, as Hit does for each
// rule it matched; canary says it is a canary rule, for the metrics.
func (r *Round) HitRule(lp *rules.Set, rule *policy.Rule, req policy.Request, hits int64, canary bool, now int64) (policy.Outcome, error) {
	defer r.count(r.b.Len())
	return r.hitRule(lp, rule, req, hits, canary, now)
}

// hitRule is the one place a rule's limit is read: the dials apply here
// (dials.go), for every front end at once. A runtime limit replaces the
// rule by the rule with that limit; in shadow mode (POLICY ENFORCE
// shadow, or the rule's shadow field) a hit the limit refuses is let
// through and marked Shadowed; with enforcement off a hit is allowed
// without touching its counter.
func (r *Round) hitRule(lp *rules.Set, rule *policy.Rule, req policy.Request, hits int64, canary bool, now int64) (policy.Outcome, error) {
	d := hitDone{counts: lp.Counts[rule.Pos-1], canary: canary}
	ds := r.e.dials.load()
	rule = ds.ruleOf(lp, rule)
	mode := ds.mode
	if rule.Shadow && mode == Enforce {
		mode = Shadow
	}
	r.lastMode = mode
	c := &r.m.c
	c.Rule, c.Hits, c.Now, c.Ended = rule, hits, now, false
	var quota policy.QuotaStatus
	c.Limit, quota = rule.Limit(req)
	if mode == Off {
		out := policy.Outcome{Allowed: true, CreditsLeft: c.Limit, Limit: c.Limit, RetryAfterMs: -1, Quota: quota, Rate: c.Limit, Rule: rule}
		d.allowed = true
		r.done = append(r.done, d)
		return out, nil
	}
	if c.Limit > 0 && rule.ResetSeconds > 0 {
		r.id = rule.AppendCounterID(r.id[:0], req)
		c.ID = r.id
		r.key = keyspace.AppendRuleKey(r.key[:0], rule, c.Limit, r.id)
		before := r.b.Len()
		// In cluster mode another node may own the counter's slot: it
		// applies the same hit (rule, counter ID, limit, hits, now) and
		// answers the whole outcome.
		if fwd, o, err := r.forward(r.key, rule, c.Limit, hits, now); fwd {
			if err != nil {
				return policy.Outcome{}, err
			}
			o.Rule = rule
			c.Out, c.Limit = o, o.Rate // the owner's override, if the actor has one there
		} else if err := r.count1(rule); err != nil {
			return policy.Outcome{}, err
		} else {
			r.noteEnd(rule)
		}
		d.wrote = r.b.Len() > before
	} else if _, _, err := c.Apply(nil, false); err != nil {
		return policy.Outcome{}, ruleErr(err)
	}
	out := c.Out
	out.Quota, out.Rate = quota, c.Limit
	d.allowed = out.Allowed
	if !out.Allowed && mode == Shadow {
		out.Allowed, out.Shadowed, d.shadowed = true, true, true
	}
	r.done = append(r.done, d)
	return out, nil
}

// count1 applies the hit set up in r.m to the counter r.key of rule, of
// counter ID r.id; a new counter of a label with overrides is created
// under the actor's, read from its override record (overrides.go).
func (r *Round) count1(rule *policy.Rule) error {
	m := &r.m
	m.base, m.lookup, m.ov = m.c.Limit, lookupNone, &r.e.ov
	if r.e.ov.has(rule.OverridesLabel()) && notOverridable(rule) == "" {
		if r.e.ov.local {
			if err := r.nodeLookup(rule, r.id[policy.CounterIDLen:]); err != nil {
				return err
			}
			return r.limit(r.key, m)
		}
		m.lookup = lookupNeeded
	}
	if err := r.limit(r.key, m); err != nil || m.lookup != lookupDo {
		return err
	}
	actor := r.id[policy.CounterIDLen:]
	r.okey = keyspace.AppendOverrideKey(r.okey[:0], rule.OverridesLabel(), actor)
	for try := 0; ; try++ {
		// A change of the overrides between the read and the counter's
		// creation makes the hit read again; after a few, it waits for
		// the changes to stop.
		locked := try >= 3
		if locked {
			r.e.ov.mu.Lock()
		}
		m.epoch = r.e.ov.epoch.Load()
		r.ovr = overrideReader{}
		err := r.limit(r.okey, &r.ovr)
		if err == nil {
			m.lookup, m.has, m.limit = lookupDone, r.ovr.found, r.ovr.limit
			if h := r.e.afterOverrideRead; h != nil {
				h()
			}
			err = r.limit(r.key, m)
		}
		if locked {
			r.e.ov.mu.Unlock()
		}
		if err != nil || m.lookup != lookupRetry {
			return err
		}
	}
}

func (r *Round) forward(key []byte, rule *policy.Rule, limit, hits, now int64) (bool, policy.Outcome, error) {
	if r.e.cluster == nil {
		return false, policy.Outcome{}, nil
	}
	return r.e.cluster.ForwardCounter(key, rule, limit, hits, now)
}

// DenyLast counts the last hit as denied in the metrics, for a front end
// that denies whatever the counter said (a gcra descriptor asking more
// than its burst at once), and reports how the dials take the denial: in
// shadow mode (POLICY ENFORCE, or the rule's shadow field) it is let
// through, counted as denied and shadowed (allowed and shadowed true);
// with enforcement off it is allowed (allowed true); else it stands.
func (r *Round) DenyLast() (allowed, shadowed bool) {
	d := &r.done[len(r.done)-1]
	switch r.lastMode {
	case Off:
		d.allowed, d.shadowed = true, false
		return true, false
	case Shadow:
		d.allowed, d.shadowed = false, true
		return true, true
	}
	d.allowed, d.shadowed = false, false
	return false, false
}

// ApplyCounter is the owner's side of a forwarded hit: it applies hits of
// rule under limit at now (unix ns) to the counter key, of counter ID id,
// or under the actor's override on this node, and returns the outcome
// without Quota and Rule, its Rate the limit it applied. The sender
// counts the hit in its metrics, not the owner.
func (r *Round) ApplyCounter(key []byte, rule *policy.Rule, limit, hits, now int64, id []byte) (policy.Outcome, error) {
	m := &r.m.c
	m.Rule, m.Limit, m.Hits, m.Now, m.ID, m.Ended = rule, limit, hits, now, id, false
	r.m.base, r.m.lookup, r.m.ov = limit, lookupNone, &r.e.ov
	var err error
	if r.e.ov.local && r.e.ov.has(rule.OverridesLabel()) && notOverridable(rule) == "" {
		err = r.nodeLookup(rule, id[policy.CounterIDLen:])
	}
	if err == nil {
		err = r.Limit(key, &r.m) // one operation, counted
	}
	if err == nil {
		r.noteEnd(rule) // the owner keeps the threshold data of its counters
	}
	m.ID = nil // aliases the caller's arguments
	if err != nil {
		return policy.Outcome{}, err
	}
	out := m.Out
	out.Rate = m.Limit
	return out, nil
}

// settle adds the round's hits to the metrics; with told false (their
// answers were not told) only the hits that wrote nothing count.
func (h *hits) settle(told bool) {
	for _, d := range h.done {
		if !told && d.wrote {
			continue
		}
		if d.shadowed {
			d.counts.Shadowed.Add(1) // and Rejected below: what the limit decided
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
