package clusternode

import (
	"strconv"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
)

// The owner's side of a forwarded counter hit (SLUICE.COUNTERHIT,
// forward.go) finds the rule by the counter identity the key starts with.
// A rule counted on this node is a divvy rule (--policy) or a limit of
// Envoy's rate limit service (--rls-config, package rls); both number
// their rules from 1, so the position the sender sends does not say which
// rule set it means. Their identities do (policy.Standalone hashes the
// front end's name into them), so each loaded rule set keeps an index of
// its rules by identity (rules.Index), built when it is (re)loaded.

// RuleSet is a rule set whose rules a forwarded counter hit may name
// besides the divvy rules: the rate limit service's (envoy.Server).
type RuleSet interface {
	// Rule returns the rule of identity id, or nil, the number of rules
	// in its set, and whether a set is loaded.
	Rule(id rules.ID) (r *policy.Rule, n int, loaded bool)
}

// routeErr is Route's refusal of slot as the error a command returns: a
// MOVED to the node that owns it, which the client asks instead.
func routeErr(slot uint16, moved string, err error) error {
	if err != nil {
		return err
	}
	return &errs.Error{Kind: errs.Request, Code: "MOVED", Msg: strconv.Itoa(int(slot)) + " " + moved}
}

// counterRule returns the rule of a forwarded counter hit: the rule, of
// the divvy policy pol or of the RLS configuration rls in use, whose identity
// starts id (a counter ID, at least policy.CounterIDLen bytes), which
// must be at position pos of its rule set, as on the sender: the nodes
// must load the same --policy and --rls-config. It allocates nothing.
func counterRule(id []byte, pos int64, pol *rules.File, rls RuleSet, eng *engine.Engine) (*policy.Rule, error) {
	k := rules.ID(id[:policy.CounterIDLen])
	lp := pol.Current()
	var (
		r     *policy.Rule
		n     int    // rules in r's set
		where string // r's set, for the messages
	)
	if lp != nil {
		if r = lp.ByID[k]; r != nil {
			n, where = len(lp.Counts), "rule file (--policy)"
		}
	}
	rr, rn, rlsLoaded := rls.Rule(k)
	if r == nil && rr != nil {
		r, n, where = rr, rn, "--rls-config"
	}
	p := strconv.FormatInt(pos, 10)
	switch {
	case r == nil && lp == nil && !rlsLoaded:
		return nil, rules.ErrNoPolicy
	case r == nil:
		return nil, refuse("cluster: this node has no rule with the counter identity of the sender's rule " + p +
			" (in its --policy or --rls-config): every node must run the same rules")
	case int64(r.Pos) == pos && where == "rule file (--policy)":
		return eng.Effective(r), nil // this node's runtime limit, for its period
	case int64(r.Pos) == pos:
		return r, nil
	case pos < 1 || pos > int64(n):
		return nil, refuse("cluster: this node's " + where + " has no rule " + p + ": every node must run the same rules")
	}
	return nil, refuse("cluster: rule " + p + " of this node's " + where + " is not the sender's: every node must run the same rules")
}
