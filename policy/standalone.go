package policy

import "slices"

// Standalone prepares rules that a front end chooses itself rather than by
// Policy.Match (Envoy's descriptor tree, package rls): it numbers them
// (Pos), names their file, and gives each its counter identity as a rule
// file's rules get theirs, so that Rule.AppendCounterID and the store keys
// built on it work the same. The identity also hashes file, the front
// end's name, from a start no rule file's rule hashes from: no rule file
// can reach a front end's counters, nor two front ends each other's. It does none of a rule file's checks of
// order, reachability or default rule; the caller validates the rules'
// own fields. The rules are copied; the result is read-only.
func Standalone(file string, rules []Rule) []*Rule {
	rs := slices.Clone(rules)
	ids := make(map[string]int)
	out := make([]*Rule, len(rs))
	for i := range rs {
		r := &rs[i]
		r.Pos, r.File, r.standalone = i+1, file, true
		r.conds = compile(r.Operation)
		r.id = identity(r, ids, file)
		out[i] = r
	}
	return out
}
