// Package rules holds the rule sets every rule front end evaluates hits
// against (HIT over RESP, the divvy line protocol, GET /check, Envoy's rate
// limit service): a Set in use with the metric counters of its rules, the
// rule file (--policy) in use and its reloads (File), and the index of a
// set's rules by counter identity that the owner of a forwarded hit finds
// a rule by. The hits themselves are run by package engine.
//
// A File is safe for concurrent use; a Set is not changed once in use.
package rules

import (
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/policy"
)

// ErrNoPolicy is the answer of every rule front end when no rule file is
// in use.
var ErrNoPolicy = errs.New(errs.Request, "no policy loaded: start sluice with --policy FILE (a divvy .ini or .json rule file)")

// Set is a rule set in use, with the metric counters of its rules. It is
// replaced as a whole on reload: a hit reads the pointer once, so it never
// sees a mix of two files.
type Set struct {
	Policy *policy.Policy // nil for a set of rules that are not a rule file's (Envoy's)
	Counts []*Counts      // by rule position - 1
	At     time.Time      // when it was loaded
	ByID   map[ID]*policy.Rule
}

// Counts are the hits of the rules with one label, since the start.
type Counts struct {
	Label                                              string
	Accepted, Rejected, CanaryAccepted, CanaryRejected atomic.Int64
	// Shadowed counts the hits of Rejected and CanaryRejected that shadow
	// mode let through.
	Shadowed atomic.Int64
}

// ID is a rule's counter identity, the first policy.CounterIDLen bytes of
// its counters' IDs: the owner of a forwarded counter hit finds the rule
// by it.
type ID [policy.CounterIDLen]byte

// Index returns rules by their counter identity. Identities are unique
// within one rule set (identical rules get distinct ones).
func Index(rules []*policy.Rule) map[ID]*policy.Rule {
	m := make(map[ID]*policy.Rule, len(rules))
	var buf []byte
	for _, r := range rules {
		buf = r.AppendCounterID(buf[:0], nil) // the identity alone: no actor
		m[ID(buf)] = r
	}
	return m
}
