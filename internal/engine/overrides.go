package engine

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// Per-actor overrides (POLICY OVERRIDE, issue 30): one actor of a labelled
// rule gets its own limit. The source of truth is one record per label
// and actor (keyspace.AppendOverrideKey); the actor's rule counter carries
// a copy of the limit in its value (keyspace.AppendMarked), so a hit on a
// live counter reads that one record, as without overrides. Only a hit
// that creates the counter, of a label that has overrides, reads the
// override record too; a label without any costs nothing.
//
// A change writes the override, its label's count and the live counter
// in one transaction (storage.Batch.Hold), under one lock, so that of two
// changes of one actor the later to take the lock wins. A hit creating a
// counter meanwhile is caught by the epoch, which every change moves
// between its override's write and its counter's: the hit reads the epoch,
// then the override, and creates the counter only if the epoch, read
// again under the counter's lock, has not moved; otherwise it reads again.

// DefaultMaxOverrides is the most overrides a server keeps when
// Config.MaxOverrides is zero.
const DefaultMaxOverrides = 1_000_000

// MaxOverridesPage is the most overrides one Overrides call lists.
const MaxOverridesPage = 1000

// overrides is an Engine's overrides: the counts by label, in memory, and
// what orders changes against counter creations.
type overrides struct {
	mu     sync.Mutex // one change at a time
	epoch  atomic.Uint64
	counts atomic.Pointer[map[string]int64] // replaced whole by a change
	total  atomic.Int64
	max    int64
	// local: a cluster node's own overrides, kept among the store's own
	// values and looked up at every hit, through filter, the filter of
	// their keys (nodeoverrides.go; nil until built), and cache.
	local  bool
	filter atomic.Pointer[nodeFilter]
	cache  *nodeCache // a cluster node's, nil otherwise
}

// has reports whether label has overrides: whether a hit creating one of
// its counters must read the actor's.
func (o *overrides) has(label string) bool {
	m := o.counts.Load()
	return m != nil && label != "" && (*m)[label] > 0
}

// Override is one actor's override, as Overrides lists them.
type Override struct {
	Actor []byte
	Limit int64
}

// OverrideCounts returns the number of overrides by label, and in all.
func (e *Engine) OverrideCounts() (byLabel map[string]int64, total int64) {
	if m := e.ov.counts.Load(); m != nil {
		byLabel = maps.Clone(*m)
	}
	return byLabel, e.ov.total.Load()
}

// MaxOverrides is the most overrides the server keeps.
func (e *Engine) MaxOverrides() int64 { return e.ov.max }

// LoadOverrides reads the overrides' counts from the store, at start, and
// on a cluster node builds the filter of its overrides' keys.
func (e *Engine) LoadOverrides() error {
	scan := e.scanRecordCounts
	if e.ov.local {
		scan = e.scanNodeCounts
	}
	o := &e.ov
	o.mu.Lock()
	defer o.mu.Unlock()
	m, total, err := readCounts(scan)
	if err != nil {
		return err
	}
	o.counts.Store(&m)
	o.total.Store(total)
	if o.local {
		_, err = e.buildFilterLocked(total)
	}
	return err
}

// RecordOverrides is how many overrides the store holds as records, a
// standalone server's, which a cluster node does not use: a standalone
// store started as a cluster node keeps them, unused.
func (e *Engine) RecordOverrides() (int64, error) {
	_, total, err := readCounts(e.scanRecordCounts)
	return total, err
}

// readCounts reads the counts of overrides by label that scan gives, each
// label with its stored count.
func readCounts(scan func(fn func(label string, v []byte) bool) error) (map[string]int64, int64, error) {
	m := make(map[string]int64)
	var total int64
	var derr error
	err := scan(func(label string, v []byte) bool {
		n, err := keyspace.DecodeUint(v)
		if err != nil {
			derr = fmt.Errorf("engine: the count of overrides of label %q: %w", label, err)
			return false
		}
		m[label] = n
		total += n
		return true
	})
	if err = cmp.Or(err, derr); err != nil {
		return nil, 0, err
	}
	return m, total, nil
}

// scanRecordCounts calls fn with each count of overrides kept as a
// record (a standalone server's).
func (e *Engine) scanRecordCounts(fn func(label string, v []byte) bool) error {
	lo, hi := keyspace.OverrideCountRange()
	return e.store.Scan(lo, hi, func(k, v []byte) bool { return fn(keyspace.OverrideCountLabel(k), v) })
}

// overrideRule returns the rule of lp labelled label as its hits use it
// (under a runtime limit), or says why it cannot take an override.
func (e *Engine) overrideRule(lp *rules.Set, label string) (*policy.Rule, error) {
	file := ruleByLabel(lp, label)
	if file == nil {
		return nil, unknownLabel(lp, label)
	}
	r := e.dials.load().ruleOf(lp, file)
	if why := notOverridable(r); why != "" {
		return nil, errs.New(errs.Request, fmt.Sprintf("label %s: the rule %s; expected a divvy, fixedWindow, gcra or slidingLog rule with an actorField, counted, without a quotaField", label, why))
	}
	return r, nil
}

// notOverridable says why r cannot take per-actor overrides, "" when it
// can.
func notOverridable(r *policy.Rule) string {
	switch {
	case r.ActorField == "":
		return "has no actorField: its hits share one counter"
	case r.QuotaField != "":
		return "takes its limit from the request's quotaField " + r.QuotaField
	case r.Algorithm == policy.TokenBucket:
		return "is a tokenBucket, whose buckets are keyed by their limit"
	case !r.Counted():
		return "counts no hits (creditLimit or resetSeconds 0)"
	}
	return ""
}

// checkActor refuses an actor longer than a hit's actor value may be.
func (e *Engine) checkActor(r *policy.Rule, actor []byte) error {
	return e.CheckKeySize("value of actor field "+r.ActorField, len(actor))
}

// counterKey appends the key of the counter of r for actor, as a hit
// builds it.
func counterKey(dst []byte, r *policy.Rule, actor []byte) []byte {
	id := r.AppendCounterID(nil, policy.Request{{Key: []byte(r.ActorField), Value: actor}})
	return keyspace.AppendRuleKey(dst, r, r.CreditLimit, id)
}

// SetOverride gives actor its own limit in the rule of lp labelled
// label, and stores it, with the counter the actor has now. The rule must
// take the limit as a runtime limit (policy.Rule.WithLimit); past
// MaxOverrides a new override is refused.
func (e *Engine) SetOverride(lp *rules.Set, label string, actor []byte, limit int64) error {
	r, err := e.overrideRule(lp, label)
	if err != nil {
		return err
	}
	if err := e.checkActor(r, actor); err != nil {
		return err
	}
	if _, err := r.WithLimit(limit, r.ResetSeconds); err != nil {
		le := err.(*policy.LimitError)
		return &errs.Error{Kind: errs.Request, Msg: "label " + label + ": override " + le.Problem, Err: err}
	}
	_, err = e.changeOverride(label, actor, r, limit, true)
	return err
}

// ResetOverride removes actor's override in label's rule, so that its
// hits use the rule's limit again, and reports whether it had one. A label
// that has overrides may be reset when its rule could not take one now
// (a reload dropped the label or changed the rule).
func (e *Engine) ResetOverride(lp *rules.Set, label string, actor []byte) (bool, error) {
	r, err := e.overrideRule(lp, label)
	switch {
	case err == nil:
		if err := e.checkActor(r, actor); err != nil {
			return false, err
		}
	case !e.ov.has(label):
		return false, err
	default:
		r = nil // no live counter of the label's takes an override
	}
	return e.changeOverride(label, actor, r, 0, false)
}

// SetRuleOverride gives actor its own limit in r, a front end's rule
// whose overrides are kept under its OverrideLabel (Envoy's limits, by
// domain, the descriptor's entries the actor), and stores it, as
// SetOverride does for a rule file's: r is the rule the caller found for
// actor, whose live counter takes the override too.
func (e *Engine) SetRuleOverride(r *policy.Rule, actor []byte, limit int64) error {
	label := r.OverridesLabel()
	if label == "" {
		return errs.New(errs.Request, "the limit "+r.String()+" takes no per-actor overrides")
	}
	if why := notOverridable(r); why != "" {
		return errs.New(errs.Request, "the limit "+r.String()+" "+why)
	}
	if err := e.checkActor(r, actor); err != nil {
		return err
	}
	if _, err := r.WithLimit(limit, r.ResetSeconds); err != nil {
		le := err.(*policy.LimitError)
		return &errs.Error{Kind: errs.Request, Msg: "override " + le.Problem, Err: err}
	}
	_, err := e.changeOverride(label, actor, r, limit, true)
	return err
}

// ResetRuleOverride removes actor's override kept under label, the
// OverrideLabel of a front end's rules, and reports whether it had one;
// r is the rule the caller found for actor, whose live counter drops its
// copy, or nil when none takes an override now.
func (e *Engine) ResetRuleOverride(label string, r *policy.Rule, actor []byte) (bool, error) {
	if r != nil && (r.OverridesLabel() != label || notOverridable(r) != "") {
		r = nil
	}
	return e.changeOverride(label, actor, r, 0, false)
}

// HasOverrides reports whether label has overrides.
func (e *Engine) HasOverrides(label string) bool { return e.ov.has(label) }

// CheckOverrideLabel refuses a label that is neither one of lp's nor has
// overrides, for a command that reads them.
func (e *Engine) CheckOverrideLabel(lp *rules.Set, label string) error {
	if !e.ov.has(label) && ruleByLabel(lp, label) == nil {
		return unknownLabel(lp, label)
	}
	return nil
}

// Override returns actor's override in label, or -1 for none.
func (e *Engine) Override(label string, actor []byte) (int64, error) {
	if e.ov.local {
		return e.nodeOverride(label, actor)
	}
	var rd overrideReader
	b := e.store.NewBatch()
	err := b.Modify(keyspace.AppendOverrideKey(nil, label, actor), &rd)
	// In always, a read of a change not yet synced waits for it.
	if cerr := b.Commit(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, Typed(StoreErr(err))
	}
	if !rd.found {
		return -1, nil
	}
	return rd.limit, nil
}

// changeOverride sets (set) or removes actor's override of label, with
// its count and the live counter of r (nil: none), in one transaction,
// and reports whether actor had an override.
func (e *Engine) changeOverride(label string, actor []byte, r *policy.Rule, limit int64, set bool) (existed bool, err error) {
	if e.ov.local {
		return e.changeNodeOverride(label, actor, limit, set)
	}
	o := &e.ov
	o.mu.Lock()
	defer o.mu.Unlock()
	okey := keyspace.AppendOverrideKey(nil, label, actor)
	// Read first: a new override past the bound is refused before
	// anything changes. Only a change, under o.mu, adds one.
	if set {
		had, err := e.Override(label, actor)
		if err != nil {
			return false, err
		}
		if had < 0 && o.total.Load() >= o.max {
			return false, errBound(o.max)
		}
	}
	b := e.store.NewBatch()
	ow := overrideWriter{set: set, limit: limit}
	b.Hold(false)
	err = b.Modify(okey, &ow)
	delta := int64(0)
	switch {
	case err != nil:
	case set && !ow.existed:
		delta = 1
	case !set && ow.existed:
		delta = -1
	}
	if err == nil && delta != 0 {
		cw := countWriter{delta: delta}
		err = b.Modify(keyspace.AppendOverrideCountKey(nil, label), &cw)
	}
	o.epoch.Add(1) // after the override, before the counter: see above
	if err == nil && r != nil {
		err = b.Modify(counterKey(nil, r, actor), &markWriter{set: set, limit: limit})
	}
	b.Release()
	if cerr := b.Commit(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, Typed(StoreErr(err))
	}
	o.add(label, delta)
	return ow.existed, nil
}

// errBound refuses a new override past max.
func errBound(max int64) error {
	return errs.New(errs.Request, "overrides are at their bound, "+strconv.FormatInt(max, 10)+" (--policy-max-overrides); expected a reset of some first, or a higher bound")
}

// Overrides lists label's overrides in actor order, at most count (1 to
// MaxOverridesPage) after the actor after (nil: from the first), and
// returns the actor to continue after, nil when the list is done. The
// label must be one of lp's or have overrides.
func (e *Engine) Overrides(lp *rules.Set, label string, after []byte, count int) (list []Override, next []byte, err error) {
	if err := e.CheckOverrideLabel(lp, label); err != nil {
		return nil, nil, err
	}
	return e.ListOverrides(label, after, count)
}

// ListOverrides lists label's overrides as Overrides does, whatever
// rules have the label.
func (e *Engine) ListOverrides(label string, after []byte, count int) (list []Override, next []byte, err error) {
	if count < 1 || count > MaxOverridesPage {
		return nil, nil, errs.New(errs.Request, "COUNT is "+strconv.Itoa(count)+"; expected 1 to "+strconv.Itoa(MaxOverridesPage))
	}
	if e.ov.local {
		return e.listNodeOverrides(label, after, count)
	}
	// Scan reads what Pebble holds: every change answered before is in it
	// after a Flush.
	if err := e.store.Flush(); err != nil {
		return nil, nil, Typed(err)
	}
	prefix := keyspace.AppendOverridePrefix(nil, label)
	lower := prefix
	if after != nil {
		lower = append(append(bytes.Clone(prefix), after...), 0)
	}
	// The first key past the prefix: an Envoy domain's label may end in
	// any byte. The kind byte 'O' stops the carry.
	upper := bytes.Clone(prefix)
	for i := len(upper) - 1; i >= 0; i-- {
		if upper[i]++; upper[i] != 0 {
			upper = upper[:i+1]
			break
		}
	}
	var derr error
	err = e.store.Scan(lower, upper, func(k, v []byte) bool {
		if len(list) == count {
			next = bytes.Clone(list[len(list)-1].Actor)
			return false
		}
		n, err := keyspace.DecodeUint(v)
		if err != nil {
			derr = err
			return false
		}
		list = append(list, Override{Actor: bytes.Clone(k[len(prefix):]), Limit: n})
		return true
	})
	if err = cmp.Or(err, derr); err != nil {
		return nil, nil, Typed(StoreErr(err))
	}
	return list, next, nil
}

// overrideReader reads an override record.
type overrideReader struct {
	found bool
	limit int64
}

func (m *overrideReader) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	m.found = found
	if found {
		n, err := keyspace.DecodeUint(old)
		if err != nil {
			return nil, storage.Keep, err
		}
		m.limit = n
	}
	return nil, storage.Keep, nil
}

// overrideWriter puts (set) or deletes an override record, and says
// whether there was one.
type overrideWriter struct {
	set, existed bool
	limit        int64
}

func (m *overrideWriter) Mutate(_ []byte, found bool) ([]byte, storage.Op, error) {
	m.existed = found
	if !m.set {
		return nil, storage.Delete, nil
	}
	return keyspace.AppendUint(nil, m.limit), storage.Put, nil
}

// countWriter adds delta to a label's count of overrides, deleting it at
// zero.
type countWriter struct{ delta int64 }

func (m *countWriter) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	var n int64
	if found {
		var err error
		if n, err = keyspace.DecodeUint(old); err != nil {
			return nil, storage.Keep, err
		}
	}
	if n += m.delta; n <= 0 {
		return nil, storage.Delete, nil
	}
	return keyspace.AppendUint(nil, n), storage.Put, nil
}

// markWriter sets (set) or removes the override a live rule counter
// carries; a counter that does not exist is left so.
type markWriter struct {
	set   bool
	limit int64
}

func (m *markWriter) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	if !found {
		return nil, storage.Keep, nil
	}
	_, had, inner, err := keyspace.SplitMarked(old)
	switch {
	case err != nil:
		return nil, storage.Keep, err
	case m.set:
		return keyspace.AppendMarked(nil, m.limit, inner), storage.Put, nil
	case had:
		return bytes.Clone(inner), storage.Put, nil
	}
	return nil, storage.Keep, nil
}
