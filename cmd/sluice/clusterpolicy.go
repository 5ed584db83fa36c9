package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/rls"
)

// sluice cluster send and check-policy: each node of a cluster keeps its
// own dials (POLICY LIMIT, POLICY ENFORCE) and per-actor overrides
// (POLICY OVERRIDE, RLS.OVERRIDE), so a change is sent to every node, and
// a node that missed one (down, unreachable) decides its counters under
// what it has. send reports every node that did not take a change;
// check-policy finds every node that differs.

// checkSend refuses args that are not a change of the dials or
// overrides, before any node is asked: send is not a general remote
// shell, and a read sent to every node would only be printed.
func checkSend(args []string) error {
	switch {
	case len(args) >= 2 && strings.EqualFold(args[0], "POLICY") &&
		slices.ContainsFunc([]string{"LIMIT", "ENFORCE", "OVERRIDE"}, func(s string) bool { return strings.EqualFold(args[1], s) }):
		return nil
	case len(args) >= 2 && strings.EqualFold(args[0], "RLS.OVERRIDE"):
		return nil
	}
	return fmt.Errorf("sluice cluster send %s: want a change of the dials or overrides after the flags: POLICY LIMIT <label> <creditLimit> [<resetSeconds>]|RESET, "+
		"POLICY ENFORCE on|shadow|off, POLICY OVERRIDE <label> <actor> <limit>|RESET or RLS.OVERRIDE <domain> <key>=<value> ... <requests_per_unit>|RESET", strings.Join(args, " "))
}

// send sends the command args to every node of addrs, in order, and
// prints each node's reply; it fails naming each node that answered an
// error or could not be asked. A change sent twice is the same change,
// so the caller sends it again once those nodes answer.
func (ct *clusterTool) send(ctx context.Context, addrs, args []string) error {
	cmd := make([]any, len(args))
	for i, a := range args {
		cmd[i] = a
	}
	var missed []string
	for _, addr := range addrs {
		v, err := ct.client(addr).Do(ctx, cmd...).Result()
		var rerr redis.Error
		switch {
		case errors.Is(err, redis.Nil):
			fmt.Fprintf(ct.out, "node %s: (nil)\n", addr)
		case errors.As(err, &rerr):
			fmt.Fprintf(ct.out, "node %s: error: %v\n", addr, err)
			missed = append(missed, fmt.Sprintf("%s (answered %v)", addr, err))
		case err != nil:
			fmt.Fprintf(ct.out, "node %s: not reached: %v\n", addr, err)
			missed = append(missed, fmt.Sprintf("%s (not reached: %v)", addr, err))
		default:
			fmt.Fprintf(ct.out, "node %s: %s\n", addr, formatReply(v))
		}
	}
	if len(missed) > 0 {
		return fmt.Errorf("sluice cluster send: %d of %d nodes did not take %s: %s; send it again once they answer (a change sent twice is the same change), and compare the nodes with sluice cluster check-policy",
			len(missed), len(addrs), strings.Join(args, " "), strings.Join(missed, ", "))
	}
	return nil
}

// formatReply writes a reply as redis-cli does on one line: a status or
// string as is, an integer as (integer) n.
func formatReply(v any) string {
	switch v := v.(type) {
	case int64:
		return "(integer) " + strconv.FormatInt(v, 10)
	case string:
		return v
	}
	return fmt.Sprint(v)
}

// checkPolicy compares the dials and overrides of every node of addrs:
// the enforcement mode, each rule of POLICY SHOW with its runtime limit,
// and every override of every label that a node's INFO policy counts,
// listed page by page. It prints each difference, one line each, and
// fails naming how many there were and each node it could not ask.
func (ct *clusterTool) checkPolicy(ctx context.Context, addrs []string) error {
	var reached, unreached []string
	dials := make([]map[string]string, 0, len(addrs))
	rules := 0        // of the first node reached
	var keys []string // the dials' names, of every node
	seen := map[string]bool{}
	labels := map[string][]int{}
	for _, addr := range addrs {
		d, ls, n, err := ct.dials(ctx, addr)
		if err != nil {
			fmt.Fprintf(ct.out, "node %s: not reached: %v\n", addr, err)
			unreached = append(unreached, addr)
			continue
		}
		for k := range d {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
		for _, l := range ls {
			labels[l] = append(labels[l], len(reached))
		}
		if len(reached) == 0 {
			rules = n
		}
		reached = append(reached, addr)
		dials = append(dials, d)
	}
	slices.Sort(keys) // enforce first, then orphaned limits and rules by name
	diffs := 0
	for _, k := range keys {
		vals := make([]string, len(reached))
		for i, d := range dials {
			v, ok := d[k]
			switch {
			case !ok:
				v = "none" // no such rule on the node
			case v == "":
				v = `""`
			}
			vals[i] = v
		}
		if diffLine(ct, k, reached, vals) {
			diffs++
		}
	}
	total := 0
	for _, label := range slices.Sorted(maps.Keys(labels)) {
		n, d, err := ct.compareOverrides(ctx, label, reached, labels[label])
		if err != nil {
			return err
		}
		total += n
		diffs += d
	}
	if diffs == 0 && len(unreached) == 0 {
		fmt.Fprintf(ct.out, "%d nodes agree: enforce %s, %d rules and runtime limits, %d overrides in %d labels\n",
			len(reached), dials[0]["enforce"], rules, total, len(labels))
		return nil
	}
	msg := fmt.Sprintf("sluice cluster check-policy: %d differences between the nodes' dials and overrides (lines above)", diffs)
	if len(unreached) > 0 {
		msg += "; not compared, not reached: " + strings.Join(unreached, ", ")
	}
	return errors.New(msg + "; send each change to every node with sluice cluster send")
}

// diffLine prints the line of a difference of what, when the nodes'
// values differ, and reports whether they did.
func diffLine(ct *clusterTool, what string, addrs, vals []string) bool {
	if !slices.ContainsFunc(vals, func(v string) bool { return v != vals[0] }) {
		return false
	}
	parts := make([]string, len(addrs))
	for i, a := range addrs {
		parts[i] = a + " " + vals[i]
	}
	fmt.Fprintf(ct.out, "%s: %s\n", what, strings.Join(parts, ", "))
	return true
}

// dials reads addr's dials as names and values, "enforce" first, then
// "rule <label> <field>" for each field of each rule of POLICY SHOW but
// its count of overrides (compared one by one instead), and the labels of
// its overrides (POLICY OVERRIDES without a label), and how many
// rules and orphaned limits it named. An error reply is a value, compared
// as the others; a node that cannot be asked is an error.
func (ct *clusterTool) dials(ctx context.Context, addr string) (d map[string]string, labels []string, rules int, err error) {
	d = map[string]string{}
	v, err := ct.answer(ctx, addr, "POLICY", "ENFORCE")
	if err != nil {
		return nil, nil, 0, err
	}
	d["enforce"] = fmt.Sprint(v)
	if v, err = ct.answer(ctx, addr, "POLICY", "SHOW"); err != nil {
		return nil, nil, 0, err
	}
	shown, ok := v.([]any)
	if !ok {
		d["rules"] = fmt.Sprint(v) // no rules in use: the error, as the others'
	}
	for i, r := range shown {
		fields, _ := r.([]any)
		m := map[string]string{}
		for j := 0; j+1 < len(fields); j += 2 {
			m[fmt.Sprint(fields[j])] = fmt.Sprint(fields[j+1])
		}
		if _, ok := m["orphanedOverrides"]; ok {
			continue
		}
		rules++
		name := "rule " + m["label"]
		switch {
		case m["limitSource"] == "orphaned":
			name = "orphaned limit " + m["label"]
		case m["label"] == "":
			name = "rule at position " + m["position"]
			if m["position"] == "" {
				name = "rule " + strconv.Itoa(i)
			}
		}
		for j := 0; j+1 < len(fields); j += 2 {
			if f := fmt.Sprint(fields[j]); f != "overrides" && f != "label" {
				d[name+" "+f] = fmt.Sprint(fields[j+1])
			}
		}
	}
	v, err = ct.do(ctx, addr, "POLICY", "OVERRIDES")
	var rerr redis.Error
	switch {
	case err == nil:
		list, _ := v.([]any)
		for i := 0; i+1 < len(list); i += 2 {
			labels = append(labels, fmt.Sprint(list[i]))
		}
		return d, labels, rules, nil
	case !errors.As(err, &rerr):
		return nil, nil, 0, err
	}
	// A node of a version before POLICY OVERRIDES without a label.
	info, err := ct.do(ctx, addr, "INFO", "policy")
	if err != nil {
		return nil, nil, 0, err
	}
	text, _ := info.(string)
	for _, line := range strings.Split(text, "\n") {
		list, ok := strings.CutPrefix(strings.TrimSpace(line), "policy_override_labels:")
		if !ok || list == "" {
			continue
		}
		labels = append(labels, overrideLabels(list)...)
	}
	return d, labels, rules, nil
}

// overrideLabels reads the labels of INFO's policy_override_labels,
// label=count,..., as a node before POLICY OVERRIDES without a label
// gives them: a piece that does not end in =<count> belongs to the next,
// as an Envoy domain's label (rls:<domain>) may hold commas (one whose
// own text has "=<digits>," stays ambiguous there).
func overrideLabels(list string) []string {
	var labels []string
	start := 0
	for i := 0; i <= len(list); i++ {
		if i < len(list) && list[i] != ',' {
			continue
		}
		piece := list[start:i]
		eq := strings.LastIndexByte(piece, '=')
		if eq <= 0 {
			continue
		}
		if _, err := strconv.ParseUint(piece[eq+1:], 10, 63); err != nil {
			continue
		}
		labels = append(labels, piece[:eq])
		start = i + 1
	}
	return labels
}

// answer is do, but an error reply (or nil) is a reply: only a node that
// cannot be asked is an error.
func (ct *clusterTool) answer(ctx context.Context, addr string, args ...any) (any, error) {
	v, err := ct.do(ctx, addr, args...)
	var rerr redis.Error
	if errors.Is(err, redis.Nil) {
		return "(nil)", nil
	}
	if errors.As(err, &rerr) {
		return "(error) " + rerr.Error(), nil
	}
	return v, err
}

// override is one override of a listing: its key in the listing's order
// (the actor, or a descriptor's encoding), how it is shown, its limit.
type override struct {
	key   []byte
	name  string
	limit int64
}

// overridePager lists one node's overrides of a label page by page
// (--cluster-page at a time), in the listing's order, which it checks:
// the comparison streams the nodes' listings side by side, holding one
// page of each.
type overridePager struct {
	ct     *clusterTool
	addr   string
	label  string
	cursor string
	page   []override
	last   []byte
	done   bool
}

// head returns the pager's next override, or nil after the last.
func (p *overridePager) head(ctx context.Context) (*override, error) {
	for len(p.page) == 0 && !p.done {
		if err := p.fetch(ctx); err != nil {
			return nil, err
		}
	}
	if len(p.page) == 0 {
		return nil, nil
	}
	return &p.page[0], nil
}

func (p *overridePager) pop() { p.page = p.page[1:] }

// fetch reads the next page: POLICY OVERRIDES, or RLS.OVERRIDES for an
// Envoy domain's label (rls:<domain>), whose descriptors are ordered by
// their encoding (rls.AppendDescriptor), as their cursors are.
func (p *overridePager) fetch(ctx context.Context) error {
	domain, isRLS := strings.CutPrefix(p.label, rls.OverrideLabelPrefix)
	args := []any{"POLICY", "OVERRIDES", p.label, "CURSOR", p.cursor, "COUNT", p.ct.page}
	if isRLS {
		args = []any{"RLS.OVERRIDES", domain, "CURSOR", p.cursor, "COUNT", p.ct.page}
	}
	v, err := p.ct.do(ctx, p.addr, args...)
	if err != nil {
		return err
	}
	a, _ := v.([]any)
	var items []any
	if len(a) == 2 {
		p.cursor, _ = a[0].(string)
		items, _ = a[1].([]any)
	}
	if len(a) != 2 || p.cursor == "" || len(items)%2 != 0 {
		return fmt.Errorf("node %s: %v %s: a reply of another form than [cursor, [name, limit, ...]]: %v", p.addr, args[0], p.label, v)
	}
	p.done = p.cursor == "0"
	p.page = p.page[:0]
	for i := 0; i < len(items); i += 2 {
		var o override
		o.limit, _ = items[i+1].(int64)
		if isRLS {
			entries, _ := items[i].([]any)
			es := make([]rls.Entry, len(entries))
			names := make([]string, len(entries))
			for j, e := range entries {
				s := fmt.Sprint(e)
				k, v, _ := strings.Cut(s, "=")
				es[j] = rls.Entry{Key: k, Value: v}
				names[j] = strconv.Quote(s)
			}
			o.key, o.name = rls.AppendDescriptor(nil, es), strings.Join(names, " ")
		} else {
			s := fmt.Sprint(items[i])
			o.key, o.name = []byte(s), strconv.Quote(s)
		}
		if p.last != nil && bytes.Compare(o.key, p.last) <= 0 {
			return fmt.Errorf("node %s: %v %s lists %s after %q: not in order, so the listings cannot be compared side by side", p.addr, args[0], p.label, o.name, p.last)
		}
		p.last = o.key
		p.page = append(p.page, o)
	}
	return nil
}

// compareOverrides compares label's overrides on the nodes addrs, those
// at the indexes in have holding some (the others hold none), by
// streaming their listings side by side in order: it prints a line for
// each actor whose override is not the same on every node, and returns
// how many actors it saw and how many differed.
func (ct *clusterTool) compareOverrides(ctx context.Context, label string, addrs []string, have []int) (seen, diffs int, err error) {
	pagers := make([]*overridePager, len(addrs))
	for _, i := range have {
		pagers[i] = &overridePager{ct: ct, addr: addrs[i], label: label, cursor: "0"}
	}
	vals := make([]string, len(addrs))
	for {
		var low *override
		for _, p := range pagers {
			if p == nil {
				continue
			}
			h, err := p.head(ctx)
			if err != nil {
				return seen, diffs, err
			}
			if h != nil && (low == nil || bytes.Compare(h.key, low.key) < 0) {
				low = h
			}
		}
		if low == nil {
			return seen, diffs, nil
		}
		cur := *low // the pagers' pops move past it
		for i, p := range pagers {
			vals[i] = "none"
			if p == nil {
				continue
			}
			if h, _ := p.head(ctx); h != nil && bytes.Equal(h.key, cur.key) {
				vals[i] = strconv.FormatInt(h.limit, 10)
				p.pop()
			}
		}
		seen++
		if diffLine(ct, "override "+label+" "+cur.name, addrs, vals) {
			diffs++
		}
	}
}
