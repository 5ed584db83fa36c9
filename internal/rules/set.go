// Package rules executes hits of policy rules (divvy's model), the engine
// every rule front end shares: HIT over RESP, the divvy line protocol,
// GET /check and Envoy's rate limit service. A hit evaluates a request's
// fields against a rule Set, applies each counted rule's hit to its stored
// counter through a storage.Batch (or, in a cluster, has the counter's
// owner apply it, through the Engine's Forward hook), and keeps what the
// metrics count until the caller knows the writes were committed.
//
// A File is the rule file (--policy) in use and its reloads. An Engine and
// a File are safe for concurrent use; a Hitter belongs to one connection
// or goroutine. Envoy's rule set, the front ends and the forwarder are
// server's.
package rules

import (
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/policy"
)

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
