// Package policycmd is POLICY's subcommands that show the rules and
// change their dials (issue 30) over RESP: POLICY SHOW, POLICY LIMIT,
// POLICY ENFORCE, POLICY OVERRIDE and POLICY OVERRIDES, and the rules'
// threshold data, POLICY STATS; and RLS.OVERRIDE and RLS.OVERRIDES, the
// same overrides for Envoy's descriptors (rls.go). The dials
// themselves are the engine's (engine.SetLimit, engine.SetEnforcement,
// engine.SetOverride), kept in the store and read by every rule front
// end's hits; this package parses, answers and logs each change, and
// puts the stored dials in use at start (Commands.Load). Config is the
// rules' configuration (--policy and the dials' bounds). POLICY RELOAD
// is the server's, one of its reloads: this package reads the rule file
// again for it (Commands.ReloadFile).
//
// A Commands is safe for concurrent use: it holds no state of its own but
// the count of changes. Every change is audited: logged at info with the
// client that asked for it, and counted (Changes). Package policyhttp
// makes the same changes over HTTP through it.
package policycmd

import (
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/rls"
)

// Commands runs POLICY's subcommands but RELOAD.
type Commands struct {
	Engine *engine.Engine
	Rules  *rules.File
	// RLS returns the configuration of Envoy's rate limit service in
	// use, for RLS.OVERRIDE; nil (or a nil RLS) for none.
	RLS func() *rls.Config
	Log *slog.Logger // default: discard
	// Changes counts the changes of the dials, over RESP and HTTP.
	Changes Changes
}

// Who is the client that asks for a change, for the audit log line.
type Who struct {
	Via  string // "resp" or "http"
	Addr string // the client's address
	User string // the user it authenticated as; "" for none
}

// Changes counts the dials' changes by what changed and through which
// front end, for sluice_policy_changes_total.
type Changes struct {
	// N is by Via (0 resp, 1 http) and change (ChangeNames' index).
	N [2][len(ChangeNames)]atomic.Int64
}

// The changes, as Changes.N's second index and the metric's label.
const (
	changeLimit = iota
	changeReset
	changeEnforce
	changeOverride
	changeOverrideReset
)

// ChangeNames name the changes, by index.
var ChangeNames = [...]string{"limit", "reset", "enforce", "override", "override_reset"}

// ViaNames name the front ends, by index.
var ViaNames = [2]string{"resp", "http"}

// audit logs a change at info, with who asked, and counts it.
func (c *Commands) audit(who Who, change int, attrs ...any) {
	v := 0
	if who.Via == ViaNames[1] {
		v = 1
	}
	c.Changes.N[v][change].Add(1)
	c.log().Info("policy changed", append([]any{"change", ChangeNames[change], "via", ViaNames[v], "client", who.Addr, "user", who.User}, attrs...)...)
}

// maxLabel is a rule label's longest (policy's ^[a-zA-Z0-9_-]{1,255}$):
// a longer argument is refused before it is quoted in a message.
const maxLabel = 255

// usage is the error of a subcommand that is none of these.
var usage = errs.New(errs.Request, "unknown POLICY subcommand or wrong number of arguments; expected POLICY RELOAD, POLICY SHOW, POLICY LIMIT <label> <creditLimit> [<resetSeconds>], POLICY LIMIT <label> RESET, POLICY ENFORCE [on|shadow|off], POLICY OVERRIDE <label> <actor> [<limit>|RESET], POLICY OVERRIDES [<label> [CURSOR <cursor>] [COUNT <count>]] or POLICY STATS <label> [WHATIF <limit>]")

// Run runs POLICY args[1] with args[2:] (args[0] is POLICY) for who and
// appends its reply to x.Out, or returns the error to answer.
func (c *Commands) Run(x *dispatch.Ctx, who Who, args [][]byte) error {
	switch {
	case len(args) == 2 && resp.EqualFold(args[1], "show"):
		return c.show(x)
	case (len(args) == 4 || len(args) == 5) && resp.EqualFold(args[1], "limit"):
		return c.limit(x, who, args[2:])
	case (len(args) == 2 || len(args) == 3) && resp.EqualFold(args[1], "enforce"):
		return c.enforce(x, who, args[2:])
	case (len(args) == 4 || len(args) == 5) && resp.EqualFold(args[1], "override"):
		return c.override(x, who, args[2:])
	case len(args) == 2 && resp.EqualFold(args[1], "overrides"):
		return c.overrideLabels(x)
	case len(args) >= 3 && len(args) <= 7 && resp.EqualFold(args[1], "overrides"):
		return c.overrides(x, args[2:])
	case len(args) >= 3 && resp.EqualFold(args[1], "stats"):
		return c.stats(x, args[2:])
	}
	return usage
}

func (c *Commands) log() *slog.Logger {
	if c.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Log
}

// limit is POLICY LIMIT <label> <creditLimit> [<resetSeconds>], or
// POLICY LIMIT <label> RESET, which replies 1 when the label had a
// runtime limit, else 0.
func (c *Commands) limit(x *dispatch.Ctx, who Who, args [][]byte) error {
	if err := CheckLabel(args[0]); err != nil {
		return err
	}
	label := string(args[0])
	if len(args) == 2 && resp.EqualFold(args[1], "reset") {
		had, err := c.ResetLimit(who, label)
		if err != nil {
			return err
		}
		x.Out = resp.AppendInt(x.Out, int64(b2i(had)))
		return nil
	}
	l := engine.Limit{ResetSeconds: engine.FileReset}
	var err error
	if l.CreditLimit, err = count("creditLimit", args[1]); err != nil {
		return err
	}
	if len(args) == 3 {
		if l.ResetSeconds, err = count("resetSeconds", args[2]); err != nil {
			return err
		}
	}
	if err := c.SetLimit(who, label, l); err != nil {
		return err
	}
	x.Out = resp.AppendSimple(x.Out, "OK")
	return nil
}

// CheckLabel refuses a label longer than a rule's can be, before it is
// quoted in a message.
func CheckLabel(label []byte) error {
	if len(label) > maxLabel {
		return errs.New(errs.Request, "label is "+strconv.Itoa(len(label))+" bytes; expected a rule's label, at most 255 bytes (^[a-zA-Z0-9_-]{1,255}$)")
	}
	return nil
}

// SetLimit sets label's runtime limit for who (engine.SetLimit), audited.
func (c *Commands) SetLimit(who Who, label string, l engine.Limit) error {
	if err := c.Engine.SetLimit(c.Rules.Current(), label, l); err != nil {
		return err
	}
	c.audit(who, changeLimit, "label", label, "creditLimit", l.CreditLimit, "resetSeconds", l.ResetSeconds)
	return nil
}

// ResetLimit returns label's rule to the file's limit for who
// (engine.ResetLimit), audited when it had a runtime limit.
func (c *Commands) ResetLimit(who Who, label string) (bool, error) {
	had, err := c.Engine.ResetLimit(c.Rules.Current(), label)
	if had {
		c.audit(who, changeReset, "label", label)
	}
	return had, err
}

// SetEnforcement sets the enforcement mode for who, audited, and logged
// at warn unless on.
func (c *Commands) SetEnforcement(who Who, m engine.Mode) error {
	if err := c.Engine.SetEnforcement(m); err != nil {
		return err
	}
	c.audit(who, changeEnforce, "enforce", m.String())
	LogMode(c.log(), m)
	return nil
}

// count reads a non-negative integer argument.
func count(name string, b []byte) (int64, error) {
	n, ok := resp.ParseInt(b)
	switch {
	case !ok:
		return 0, errs.New(errs.Request, name+" "+strconv.Quote(truncate(b))+" is not an integer or out of range; expected a non-negative integer of at most 9223372036854775807")
	case n < 0:
		return 0, errs.New(errs.Request, name+" is "+strconv.FormatInt(n, 10)+"; expected a non-negative integer")
	}
	return n, nil
}

// enforce is POLICY ENFORCE [on|shadow|off]: without a mode it replies
// the mode in use.
func (c *Commands) enforce(x *dispatch.Ctx, who Who, args [][]byte) error {
	if len(args) == 0 {
		x.Out = resp.AppendBulkString(x.Out, c.Engine.Enforcement().String())
		return nil
	}
	m, err := ParseMode(args[0])
	if err != nil {
		return err
	}
	if err := c.SetEnforcement(who, m); err != nil {
		return err
	}
	x.Out = resp.AppendSimple(x.Out, "OK")
	return nil
}

// ParseMode reads an enforcement mode, or says what was expected.
func ParseMode(b []byte) (engine.Mode, error) {
	m, ok := engine.ParseMode(string(b))
	if !ok {
		return m, errs.New(errs.Request, "mode "+strconv.Quote(truncate(b))+" is not one; expected on, shadow or off")
	}
	return m, nil
}

// LogMode logs the enforcement mode m: at warn unless on, as limits are
// then not enforced.
func LogMode(log *slog.Logger, m engine.Mode) {
	if m == engine.Enforce {
		log.Info("policy enforcement on")
		return
	}
	log.Warn("policy enforcement is not on: hits over a limit are let through", "enforce", m.String())
}

func truncate(b []byte) string {
	if len(b) > 32 {
		return string(b[:32]) + "..."
	}
	return string(b)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// show is POLICY SHOW: each rule in use as a flat array of names and
// values, then each orphaned runtime limit (its label no longer in the
// rules, kept until reset) as a shorter one.
func (c *Commands) show(x *dispatch.Ctx) error {
	lp := c.Rules.Current()
	if lp == nil {
		return rules.ErrNoPolicy
	}
	limits := c.Engine.Limits(lp)
	byLabel := make(map[string]*engine.LabelLimit, len(limits))
	orphans := 0
	for i := range limits {
		if limits[i].Rule == nil {
			orphans++
		} else {
			byLabel[limits[i].Label] = &limits[i]
		}
	}
	rs := lp.Policy.Rules()
	ovs, _ := c.Engine.OverrideCounts()
	orphanOvs := maps.Clone(ovs)
	for _, r := range rs {
		delete(orphanOvs, r.Label)
	}
	for label := range orphanOvs {
		if strings.HasPrefix(label, rls.OverrideLabelPrefix) { // RLS.OVERRIDE's, not a rule's
			delete(orphanOvs, label)
		}
	}
	x.Out = resp.AppendArray(x.Out, len(rs)+orphans+len(orphanOvs))
	for _, r := range rs {
		var ll *engine.LabelLimit
		if r.Label != "" {
			ll = byLabel[r.Label]
		}
		x.Out = appendRule(x.Out, r, ll, ovs[r.Label])
	}
	for i := range limits {
		if ll := &limits[i]; ll.Rule == nil {
			x.Out = resp.AppendArray(x.Out, 8)
			x.Out = str(x.Out, "label", ll.Label)
			x.Out = str(x.Out, "limitSource", "orphaned")
			x.Out = num(x.Out, "runtimeCreditLimit", ll.CreditLimit)
			x.Out = num(x.Out, "runtimeResetSeconds", ll.ResetSeconds)
		}
	}
	for _, label := range slices.Sorted(maps.Keys(orphanOvs)) {
		x.Out = resp.AppendArray(x.Out, 4)
		x.Out = str(x.Out, "label", label)
		x.Out = num(x.Out, "orphanedOverrides", orphanOvs[label])
	}
	return nil
}

// appendRule appends one rule of POLICY SHOW as a flat array of names and
// values: its fields in a rule file's order (every field, those of other
// algorithms with their zero value: burst 0 is the limit), then the
// limit its hits use: the file's, or a runtime limit (ll) and why it does
// not apply when it does not fit the rule; then the number of its
// label's per-actor overrides.
func appendRule(out []byte, r *policy.Rule, ll *engine.LabelLimit, overrides int64) []byte {
	out = resp.AppendArray(out, 40)
	out = num(out, "position", int64(r.Pos))
	out = str(out, "operation", r.String())
	out = num(out, "creditLimit", r.CreditLimit)
	out = num(out, "resetSeconds", r.ResetSeconds)
	out = str(out, "algorithm", r.Algorithm.String())
	out = str(out, "stagger", strconv.FormatBool(r.Stagger))
	out = num(out, "burst", r.Burst)
	out = num(out, "minGapMillis", r.MinGapMillis)
	out = str(out, "quotaField", r.QuotaField)
	out = num(out, "maxQuota", r.MaxQuota)
	out = str(out, "actorField", r.ActorField)
	out = str(out, "matchPolicy", r.MatchPolicy.String())
	out = str(out, "shadow", strconv.FormatBool(r.Shadow))
	out = str(out, "label", r.Label)
	out = str(out, "comment", r.Comment)
	eff, source, problem := r, "file", ""
	if ll != nil {
		eff, source, problem = ll.Effective, "runtime", ll.Problem
		if problem != "" {
			source = "refused"
		}
	}
	out = str(out, "limitSource", source)
	out = num(out, "effectiveCreditLimit", eff.CreditLimit)
	out = num(out, "effectiveResetSeconds", eff.ResetSeconds)
	out = str(out, "limitProblem", problem)
	return num(out, "overrides", overrides)
}

// str and num append a name and its value, a pair of a flat array.
func str(out []byte, name, v string) []byte {
	return resp.AppendBulkString(resp.AppendBulkString(out, name), v)
}

func num(out []byte, name string, v int64) []byte {
	return resp.AppendInt(resp.AppendBulkString(out, name), v)
}

// LimitCounts are the runtime limits by state.
type LimitCounts struct {
	Applied, Orphaned, Refused int
	// OrphanedLabels are the labels of the orphaned ones, sorted.
	OrphanedLabels []string
}

// CountLimits counts ls (engine.Limits') by state.
func CountLimits(ls []engine.LabelLimit) LimitCounts {
	var n LimitCounts
	for _, l := range ls {
		switch {
		case l.Rule == nil:
			n.Orphaned++
			n.OrphanedLabels = append(n.OrphanedLabels, l.Label)
		case l.Problem != "":
			n.Refused++
		default:
			n.Applied++
		}
	}
	return n
}

// Info gives INFO's lines of the dials: the enforcement mode, and the
// runtime limits by state with the labels of the orphaned ones.
func (c *Commands) Info(kv func(k, v string)) {
	kv("policy_enforce", c.Engine.Enforcement().String())
	n := CountLimits(c.Engine.Limits(c.Rules.Current()))
	kv("policy_runtime_limits", strconv.Itoa(n.Applied))
	kv("policy_runtime_limits_refused", strconv.Itoa(n.Refused))
	kv("policy_runtime_limits_orphaned", strconv.Itoa(n.Orphaned))
	kv("policy_orphaned_labels", strings.Join(n.OrphanedLabels, ","))
	ovs, total := c.Engine.OverrideCounts()
	kv("policy_overrides", strconv.FormatInt(total, 10))
	kv("policy_overrides_max", strconv.FormatInt(c.Engine.MaxOverrides(), 10))
	labels := make([]string, 0, len(ovs))
	for _, l := range slices.Sorted(maps.Keys(ovs)) {
		labels = append(labels, l+"="+strconv.FormatInt(ovs[l], 10))
	}
	kv("policy_override_labels", strings.Join(labels, ","))
}
