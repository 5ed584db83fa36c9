package policycmd

import (
	"bytes"
	"math"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/rls"
)

// RLS.OVERRIDE and RLS.OVERRIDES: per-descriptor overrides of Envoy's
// limits, in the RLS configuration's terms (a domain, a descriptor's
// entries, requests_per_unit). They are POLICY OVERRIDE's records, bound,
// audit and metrics: the label is the domain's (rls.OverrideLabel), the
// actor the descriptor's entries (rls.AppendDescriptor), which is what the
// limit's counter is keyed by.

// rlsUsage is the error of RLS.OVERRIDE with the wrong arguments.
var rlsUsage = errs.New(errs.Request, "wrong arguments for RLS.OVERRIDE; expected RLS.OVERRIDE <domain> <key>=<value> [<key>=<value> ...] [<requests_per_unit>|RESET]")

// RLSOverrideCmd is RLS.OVERRIDE <domain> <key>=<value> [<key>=<value>
// ...] [<requests_per_unit>|RESET] (args without the command's name):
// with a limit it replies OK; with RESET 1 when the descriptor had an
// override, else 0; with neither the override, or nil for none. An
// argument with a '=' is an entry, split at its first '=', as HIT's
// fields.
func (c *Commands) RLSOverrideCmd(x *dispatch.Ctx, who Who, args [][]byte) error {
	if len(args) < 2 {
		return rlsUsage
	}
	domain, rest := string(args[0]), args[1:]
	var op []byte
	if last := rest[len(rest)-1]; bytes.IndexByte(last, '=') < 0 {
		op, rest = last, rest[:len(rest)-1]
	}
	if len(rest) == 0 {
		return rlsUsage
	}
	entries := make([]rls.Entry, len(rest))
	for i, a := range rest {
		k, v, ok := bytes.Cut(a, []byte{'='})
		if !ok || len(k) == 0 {
			return errs.New(errs.Request, "entry "+strconv.Quote(truncate(a))+" is not one; expected <key>=<value>, a descriptor entry with a key")
		}
		entries[i] = rls.Entry{Key: string(k), Value: string(v)}
	}
	return runOverride(x, op, "requests_per_unit", func() (int64, error) {
		return c.RLSOverride(domain, entries)
	}, func() (bool, error) {
		return c.ResetRLSOverride(who, domain, entries)
	}, func(limit int64) error {
		return c.SetRLSOverride(who, domain, entries, limit)
	})
}

// RLSOverridesCmd is RLS.OVERRIDES <domain> [CURSOR <cursor>] [COUNT
// <count>] (args without the command's name): as POLICY OVERRIDES, the
// cursor to continue from ("0" when the list is done), then a flat array
// of descriptors, each an array of its entries as <key>=<value>, and
// their limits, in the order of the entries' encoding.
func (c *Commands) RLSOverridesCmd(x *dispatch.Ctx, args [][]byte) error {
	if len(args) < 1 || len(args)%2 != 1 {
		return errs.New(errs.Request, "wrong arguments for RLS.OVERRIDES; expected RLS.OVERRIDES <domain> [CURSOR <cursor>] [COUNT <count>]")
	}
	after, n, err := page(args[1:])
	if err != nil {
		return err
	}
	list, next, err := c.RLSOverrides(string(args[0]), after, n)
	if err != nil {
		return err
	}
	x.Out = appendPageHead(x.Out, next, len(list))
	for _, o := range list {
		x.Out = resp.AppendArray(x.Out, len(o.Entries))
		for _, e := range o.Entries {
			x.Out = resp.AppendBulkString(x.Out, e.Key+"="+e.Value)
		}
		x.Out = resp.AppendInt(x.Out, o.Limit)
	}
	return nil
}

// RLSOverride is one descriptor's override, as RLSOverrides lists them.
type RLSOverride struct {
	Entries []rls.Entry
	Limit   int64
}

// SetRLSOverride gives the descriptor entries of domain its own
// requests_per_unit, limit, for who (engine.SetRuleOverride), audited.
// The descriptor must reach a limit that counts it apart from others of
// its path and under a limit alone: not unlimited, without
// max_requests_per_unit (Envoy's request sets that limit), not a
// token_bucket (its buckets are keyed by their limit), and not of 0.
func (c *Commands) SetRLSOverride(who Who, domain string, entries []rls.Entry, limit int64) error {
	l, err := c.rlsLimit(domain, entries)
	if err != nil {
		return err
	}
	if l == nil {
		return errNoLimit(domain, entries)
	}
	why := ""
	switch {
	case l.Unlimited:
		why = "is unlimited"
	case l.MaxOverride > 0:
		why = "has max_requests_per_unit: each request's limit override sets its limit"
	case l.Rule.Algorithm == policy.TokenBucket:
		why = "is a token_bucket, whose buckets are keyed by their limit"
	case l.RequestsPerUnit == 0:
		why = "has requests_per_unit 0: it counts nothing"
	}
	if why != "" {
		return errs.New(errs.Request, descriptorText(domain, entries)+": its limit "+l.Key+" "+why+"; expected a fixed_window, gcra or sliding_log limit of requests_per_unit above 0, without max_requests_per_unit")
	}
	switch {
	case limit > math.MaxUint32:
		return errs.New(errs.Request, "requests_per_unit is "+strconv.FormatInt(limit, 10)+"; expected at most 4294967295, as in the RLS configuration")
	case l.Rule.Algorithm == policy.SlidingLog && limit > bucket.MaxLogMax:
		return errs.New(errs.Request, "requests_per_unit is "+strconv.FormatInt(limit, 10)+"; a sliding_log keeps every request of its unit, expected at most "+strconv.Itoa(bucket.MaxLogMax))
	}
	actor := rls.AppendDescriptor(nil, entries)
	if err := c.Engine.SetRuleOverride(l.Rule, actor, limit); err != nil {
		return err
	}
	c.audit(who, changeOverride, "domain", domain, "descriptor", formatEntries(entries), "requests_per_unit", limit)
	return nil
}

// ResetRLSOverride removes the override of the descriptor entries of
// domain for who (engine.ResetRuleOverride), audited when it had one. A
// domain or descriptor a reload dropped may be reset while its overrides
// are kept.
func (c *Commands) ResetRLSOverride(who Who, domain string, entries []rls.Entry) (bool, error) {
	if err := c.Engine.CheckKeySize("the descriptor", rls.DescriptorLen(entries)); err != nil {
		return false, err
	}
	label := rls.OverrideLabel(domain)
	l, err := c.rlsLimit(domain, entries)
	var r *policy.Rule
	switch {
	case err == nil && l != nil:
		r = l.Rule // nil when unlimited
	case !c.Engine.HasOverrides(label) && err == nil:
		return false, errNoLimit(domain, entries)
	case !c.Engine.HasOverrides(label):
		return false, err
	}
	had, err := c.Engine.ResetRuleOverride(label, r, rls.AppendDescriptor(nil, entries))
	if had {
		c.audit(who, changeOverrideReset, "domain", domain, "descriptor", formatEntries(entries))
	}
	return had, err
}

// RLSOverride returns the override of the descriptor entries of domain,
// or -1 for none. The domain must be configured or have overrides.
func (c *Commands) RLSOverride(domain string, entries []rls.Entry) (int64, error) {
	if err := c.checkRLSDomain(domain); err != nil {
		return 0, err
	}
	if err := c.Engine.CheckKeySize("the descriptor", rls.DescriptorLen(entries)); err != nil {
		return 0, err
	}
	return c.Engine.Override(rls.OverrideLabel(domain), rls.AppendDescriptor(nil, entries))
}

// RLSOverrides lists domain's overrides as engine.Overrides does: at most
// count after the descriptor after (its entries' encoding, as a cursor
// holds it; nil: from the first), and the one to continue after.
func (c *Commands) RLSOverrides(domain string, after []byte, count int) ([]RLSOverride, []byte, error) {
	if err := c.checkRLSDomain(domain); err != nil {
		return nil, nil, err
	}
	list, next, err := c.Engine.ListOverrides(rls.OverrideLabel(domain), after, count)
	if err != nil {
		return nil, nil, err
	}
	out := make([]RLSOverride, len(list))
	for i, o := range list {
		es, ok := rls.ParseDescriptor(o.Actor)
		if !ok {
			return nil, nil, errs.New(errs.Internal, "the override of domain "+strconv.Quote(domain)+" with the actor "+strconv.Quote(truncate(o.Actor))+" is not a descriptor's")
		}
		out[i] = RLSOverride{Entries: es, Limit: o.Limit}
	}
	return out, next, nil
}

// rlsLimit returns the limit the descriptor entries of domain reach in
// the configuration in use (nil for none), or says why it cannot be
// looked up.
func (c *Commands) rlsLimit(domain string, entries []rls.Entry) (*rls.Limit, error) {
	cfg := c.rlsConfig()
	switch {
	case cfg == nil:
		return nil, errNoRLS
	case !cfg.HasDomain(domain):
		return nil, errs.New(errs.Request, "domain "+strconv.Quote(truncate([]byte(domain)))+" is not configured; expected a domain of the --rls-config files")
	}
	if err := c.Engine.CheckKeySize("the descriptor", rls.DescriptorLen(entries)); err != nil {
		return nil, err
	}
	return cfg.Find(domain, entries), nil
}

// checkRLSDomain refuses a domain that is neither configured nor has
// overrides, for a command that reads them.
func (c *Commands) checkRLSDomain(domain string) error {
	if c.Engine.HasOverrides(rls.OverrideLabel(domain)) {
		return nil
	}
	_, err := c.rlsLimit(domain, nil)
	return err
}

func (c *Commands) rlsConfig() *rls.Config {
	if c.RLS == nil {
		return nil
	}
	return c.RLS()
}

var errNoRLS = errs.New(errs.Request, "Envoy's rate limit service has no configuration; expected a server started with --rls-config")

func errNoLimit(domain string, entries []rls.Entry) error {
	return errs.New(errs.Request, descriptorText(domain, entries)+" reaches no rate_limit; expected the entries of a descriptor with a limit, as Envoy sends them (every level of its path)")
}

// descriptorText names a descriptor in messages, quoted.
func descriptorText(domain string, entries []rls.Entry) string {
	return "descriptor " + strconv.Quote(truncate([]byte(formatEntries(entries)))) + " of domain " + strconv.Quote(truncate([]byte(domain)))
}

// formatEntries writes entries as RLS.OVERRIDE takes them, joined with
// commas.
func formatEntries(entries []rls.Entry) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key + "=" + e.Value)
	}
	return b.String()
}
