package policy

import (
	"bytes"
	"strings"
)

// Field is one key=value pair of a request.
type Field struct {
	Key, Value []byte
}

// Request is the key/value pairs of one HIT, in the order the client sent
// them. When a key repeats, the last one counts. Keys and values are bytes,
// compared exactly: nothing is normalised.
type Request []Field

// Get returns the value of key: the last one when the key repeats.
func (q Request) Get(key string) (value []byte, ok bool) {
	for i := len(q) - 1; i >= 0; i-- {
		if string(q[i].Key) == key {
			return q[i].Value, true
		}
	}
	return nil, false
}

// cond is one compiled key of an operation.
type cond struct {
	key   string
	value string
	// segs is nil for an exact value; for a glob it is the value split at
	// each `*`, as bytes so that matching a request allocates nothing.
	segs [][]byte
	any  bool // the glob is only stars: presence of the key is enough
}

func compile(op []Pair) []cond {
	cs := make([]cond, len(op))
	for i, p := range op {
		c := cond{key: p.Key, value: p.Value}
		if strings.Contains(p.Value, "*") {
			parts := strings.Split(p.Value, "*")
			c.any = true
			c.segs = make([][]byte, len(parts))
			for j, s := range parts {
				c.segs[j] = []byte(s)
				c.any = c.any && s == ""
			}
		}
		cs[i] = c
	}
	return cs
}

func (c *cond) matchValue(v []byte) bool {
	switch {
	case c.segs == nil:
		return string(v) == c.value
	case c.any:
		return true
	}
	return globMatch(c.segs, v)
}

// globMatch reports whether v matches the glob whose literal runs, between
// its stars, are segs (at least two). With `*` the only wildcard, placing
// each middle run at its leftmost occurrence is optimal, so no backtracking
// is needed.
func globMatch(segs [][]byte, v []byte) bool {
	first, last := segs[0], segs[len(segs)-1]
	if len(v) < len(first)+len(last) || !bytes.HasPrefix(v, first) || !bytes.HasSuffix(v, last) {
		return false
	}
	v = v[len(first) : len(v)-len(last)]
	for _, s := range segs[1 : len(segs)-1] {
		i := bytes.Index(v, s)
		if i < 0 {
			return false
		}
		v = v[i+len(s):]
	}
	return true
}

func (r *Rule) matches(req Request) bool {
	for i := range r.conds {
		c := &r.conds[i]
		v, ok := req.Get(c.key)
		if !ok || !c.matchValue(v) {
			return false
		}
	}
	return true
}

// Match returns the stop rule that decides req, and appends to canaries the
// canary rules that match req before it, in file order. There is always a
// deciding rule: the default matches every request. Match allocates nothing
// when canaries has room.
func (p *Policy) Match(req Request, canaries []*Rule) (decider *Rule, matched []*Rule) {
	for i := range p.rules {
		r := &p.rules[i]
		if !r.matches(req) {
			continue
		}
		if r.MatchPolicy == Stop {
			return r, canaries
		}
		canaries = append(canaries, r)
	}
	panic("policy: no default rule") // newPolicy guarantees a stop default
}

// AppendCounterID appends the identity of r's counter for req: 8 bytes
// identifying the rule, then the actor, the value of r.ActorField in req
// (empty when the rule has no actor field or req lacks it). The store keys
// its counter by it (package keyspace lays the keys out).
//
// The rule's 8 bytes are a hash of its operation as a set, CreditLimit,
// ResetSeconds and ActorField (and, for rules that have them, the
// algorithm and its fields). A reload that changes none of them, even if
// it moves the rule or edits its label, comment or matchPolicy, keeps the
// counters; a reload that changes one starts fresh counters, and the old
// ones expire by themselves. Identical rules in one file get distinct
// identities.
func (r *Rule) AppendCounterID(dst []byte, req Request) []byte {
	dst = append(dst, r.id[:]...)
	if r.ActorField != "" {
		if v, ok := req.Get(r.ActorField); ok {
			dst = append(dst, v...)
		}
	}
	return dst
}
