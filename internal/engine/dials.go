package engine

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
)

// The dials (issue 30): a rule file's limits changed at runtime, by rule
// label (POLICY LIMIT), and the enforcement mode of every rule front end
// (POLICY ENFORCE). They are the node's own, kept among the store's own
// values (keyspace.DialsMeta), and read by every hit in hitRule, the one
// place a rule's limit is read: HIT, the line protocol, GET /check and
// Envoy's rate limit service see a change at once, and none has its own
// copy. A change is stored, synced, before it is in use, under one lock:
// of two concurrent changes the later to take the lock wins, in memory
// and in the store alike.

// Mode is how the limits are enforced (POLICY ENFORCE).
type Mode uint8

const (
	// Enforce: a hit the limit refuses is refused. The default.
	Enforce Mode = iota
	// Shadow: every hit is counted and its outcome reported (metrics,
	// headers), but a hit the limit refuses is let through
	// (policy.Outcome.Shadowed).
	Shadow
	// Off: every hit is allowed, and none is counted.
	Off
)

var modeNames = [...]string{Enforce: "on", Shadow: "shadow", Off: "off"}

// String is the mode's name in POLICY ENFORCE, INFO and the metrics.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// ParseMode reads a mode's name, in any letter case.
func ParseMode(s string) (Mode, bool) {
	for m, name := range modeNames {
		if len(s) == len(name) && equalFold(s, name) {
			return Mode(m), true
		}
	}
	return Enforce, false
}

func equalFold(a, b string) bool {
	for i := 0; i < len(a); i++ {
		x, y := a[i]|0x20, b[i]|0x20
		if x != y {
			return false
		}
	}
	return true
}

// Limit is a label's limit set at runtime.
type Limit struct {
	CreditLimit int64
	// ResetSeconds is the window; FileReset when not given, which keeps
	// the rule file's, whatever a reload makes it.
	ResetSeconds int64
}

// FileReset is Limit.ResetSeconds when the rule file's applies.
const FileReset = -1

// labelLimit is a runtime limit with the rule it makes of the rule file's
// rule with its label, built at the first hit after a change or a reload.
type labelLimit struct {
	Limit
	eff atomic.Pointer[effRule]
}

type effRule struct {
	file, rule *policy.Rule // rule is file when the limit does not fit it
	problem    string       // why it does not
}

// dialSet is the dials in use; a change replaces it whole.
type dialSet struct {
	mode   Mode
	limits map[string]*labelLimit
}

// dials is an Engine's dials.
type dials struct {
	cur atomic.Pointer[dialSet]
	mu  sync.Mutex // one change at a time, stored before it is in use
}

func (d *dials) load() *dialSet {
	if s := d.cur.Load(); s != nil {
		return s
	}
	return &noDials
}

var noDials dialSet

// effective returns the rule a hit of the rule file's rule r uses under
// the label limit l: r with l's limit, or r when l does not fit r (a
// reload changed its algorithm), built once per rule file.
func (l *labelLimit) effective(r *policy.Rule) *effRule {
	if e := l.eff.Load(); e != nil && e.file == r {
		return e
	}
	reset := l.ResetSeconds
	if reset == FileReset {
		reset = r.ResetSeconds
	}
	e := &effRule{file: r, rule: r}
	if eff, err := r.WithLimit(l.CreditLimit, reset); err != nil {
		e.problem = err.Error()
	} else {
		e.rule = eff
	}
	l.eff.Store(e)
	return e
}

// ruleOf is the rule a hit of r, a rule of lp, uses under the dials.
func (s *dialSet) ruleOf(lp *rules.Set, r *policy.Rule) *policy.Rule {
	if len(s.limits) == 0 || lp.Policy == nil || r.Label == "" {
		return r
	}
	if l := s.limits[r.Label]; l != nil {
		return l.effective(r).rule
	}
	return r
}

// Effective returns the rule a hit of r, a rule of the rule file in use,
// uses under the runtime limits: the owner of a forwarded counter hit
// counts it in the period its own dials give.
func (e *Engine) Effective(r *policy.Rule) *policy.Rule {
	s := e.dials.load()
	if l := s.limits[r.Label]; l != nil && r.Label != "" {
		return l.effective(r).rule
	}
	return r
}

// Enforcement is the mode in use.
func (e *Engine) Enforcement() Mode { return e.dials.load().mode }

// LabelLimit is a runtime limit as POLICY SHOW lists it.
type LabelLimit struct {
	Label string
	Limit
	// Rule is the rule file's rule with the label, nil when the rules in
	// use have none (the limit is orphaned, kept until reset); Effective
	// the rule its hits use.
	Rule, Effective *policy.Rule
	// Problem says why the limit does not apply to Rule ("" when it does).
	Problem string
}

// Limits returns the runtime limits, by label, matched with lp's rules
// (lp may be nil: no rule file).
func (e *Engine) Limits(lp *rules.Set) []LabelLimit {
	s := e.dials.load()
	byLabel := make(map[string]*policy.Rule)
	if lp != nil && lp.Policy != nil {
		for _, r := range lp.Policy.Rules() {
			if r.Label != "" {
				byLabel[r.Label] = r
			}
		}
	}
	out := make([]LabelLimit, 0, len(s.limits))
	for _, label := range slices.Sorted(maps.Keys(s.limits)) {
		l := s.limits[label]
		ll := LabelLimit{Label: label, Limit: l.Limit}
		if r := byLabel[label]; r != nil {
			eff := l.effective(r)
			ll.Rule, ll.Effective, ll.Problem = r, eff.rule, eff.problem
		}
		out = append(out, ll)
	}
	return out
}

// SetLimit sets the runtime limit of the rule of lp labelled label, and
// stores it. The label must be one of lp's, and the rule must take the
// limit (policy.Rule.WithLimit); an error names what was wrong.
func (e *Engine) SetLimit(lp *rules.Set, label string, l Limit) error {
	r := ruleByLabel(lp, label)
	if r == nil {
		return unknownLabel(lp, label)
	}
	reset := l.ResetSeconds
	if reset == FileReset {
		reset = r.ResetSeconds
	}
	if _, err := r.WithLimit(l.CreditLimit, reset); err != nil {
		le := err.(*policy.LimitError)
		return &errs.Error{Kind: errs.Request, Msg: "label " + label + ": " + le.Problem, Err: err}
	}
	return e.changeDials(func(s *dialSet) { s.limits[label] = &labelLimit{Limit: l} })
}

// ResetLimit removes label's runtime limit, so that its rule's hits use
// the rule file's limit again, and reports whether it had one. A label
// with no runtime limit is an error unless lp has it.
func (e *Engine) ResetLimit(lp *rules.Set, label string) (bool, error) {
	if e.dials.load().limits[label] == nil {
		if ruleByLabel(lp, label) == nil {
			return false, unknownLabel(lp, label)
		}
		return false, nil
	}
	err := e.changeDials(func(s *dialSet) { delete(s.limits, label) })
	return err == nil, err
}

// SetEnforcement sets and stores the mode of every rule front end.
func (e *Engine) SetEnforcement(m Mode) error {
	return e.changeDials(func(s *dialSet) { s.mode = m })
}

func ruleByLabel(lp *rules.Set, label string) *policy.Rule {
	if lp == nil || lp.Policy == nil || label == "" {
		return nil
	}
	for _, r := range lp.Policy.Rules() {
		if r.Label == label {
			return r
		}
	}
	return nil
}

func unknownLabel(lp *rules.Set, label string) error {
	if lp == nil || lp.Policy == nil {
		return rules.ErrNoPolicy
	}
	return errs.New(errs.Request, fmt.Sprintf("label %q is not a label of the rules in use (%s); expected the label of a rule, as POLICY SHOW lists them", label, lp.Policy.File()))
}

// changeDials applies change to a copy of the dials in use, stores the
// copy, then puts it in use.
func (e *Engine) changeDials(change func(*dialSet)) error {
	d := &e.dials
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.load()
	next := &dialSet{mode: old.mode, limits: maps.Clone(old.limits)}
	if next.limits == nil {
		next.limits = make(map[string]*labelLimit)
	}
	change(next)
	if err := e.store.SetMeta(keyspace.DialsMeta, encodeDials(next)); err != nil {
		return Typed(err)
	}
	d.cur.Store(next)
	return nil
}

// storedDials is the stored form of the dials, versioned JSON: small, and
// readable in a store dump.
type storedDials struct {
	Version int                    `json:"version"`
	Enforce string                 `json:"enforce"`
	Limits  map[string]storedLimit `json:"limits,omitempty"`
}

type storedLimit struct {
	CreditLimit  int64  `json:"creditLimit"`
	ResetSeconds *int64 `json:"resetSeconds,omitempty"`
}

func encodeDials(s *dialSet) []byte {
	sd := storedDials{Version: 1, Enforce: s.mode.String(), Limits: make(map[string]storedLimit, len(s.limits))}
	for label, l := range s.limits {
		sl := storedLimit{CreditLimit: l.CreditLimit}
		if l.ResetSeconds != FileReset {
			sl.ResetSeconds = &l.ResetSeconds
		}
		sd.Limits[label] = sl
	}
	b, _ := json.Marshal(sd) // of plain values: cannot fail
	return b
}

// LoadDials puts the dials the store holds in use; a store without any
// has none (every limit the file's, enforcement on). A stored value that
// does not decode is an error: the operator's dials are never dropped
// silently.
func (e *Engine) LoadDials() error {
	v, err := e.store.Meta(keyspace.DialsMeta)
	if err != nil || v == nil {
		return err
	}
	var sd storedDials
	if err := json.Unmarshal(v, &sd); err != nil || sd.Version != 1 {
		return fmt.Errorf("engine: the policy dials stored in %s do not decode (version %d, %v); expected version 1", keyspace.DialsMeta, sd.Version, err)
	}
	m, ok := ParseMode(sd.Enforce)
	if !ok {
		return fmt.Errorf("engine: the stored enforcement mode is %q; expected on, shadow or off", sd.Enforce)
	}
	s := &dialSet{mode: m, limits: make(map[string]*labelLimit, len(sd.Limits))}
	for label, sl := range sd.Limits {
		l := Limit{CreditLimit: sl.CreditLimit, ResetSeconds: FileReset}
		if sl.ResetSeconds != nil {
			l.ResetSeconds = *sl.ResetSeconds
		}
		if l.CreditLimit < 0 || l.ResetSeconds < FileReset {
			return fmt.Errorf("engine: the stored limit of label %q is %d per %d s; expected non-negative integers", label, l.CreditLimit, l.ResetSeconds)
		}
		s.limits[label] = &labelLimit{Limit: l}
	}
	e.dials.cur.Store(s)
	return nil
}
