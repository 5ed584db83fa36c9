package policycmd

import (
	"encoding/hex"
	"maps"
	"slices"
	"strconv"

	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
)

// POLICY OVERRIDE and POLICY OVERRIDES: per-actor overrides
// (engine.SetOverride).

// DefaultOverridesCount is how many overrides POLICY OVERRIDES lists
// without COUNT.
const DefaultOverridesCount = 10

// override is POLICY OVERRIDE <label> <actor> <limit>, which replies OK;
// POLICY OVERRIDE <label> <actor> RESET, which replies 1 when the actor
// had an override, else 0; and POLICY OVERRIDE <label> <actor>, which
// replies the actor's override, or nil for none.
func (c *Commands) override(x *dispatch.Ctx, who Who, args [][]byte) error {
	if err := CheckLabel(args[0]); err != nil {
		return err
	}
	label, actor := string(args[0]), args[1]
	var op []byte
	if len(args) == 3 {
		op = args[2]
	}
	return runOverride(x, op, "limit", func() (int64, error) {
		if err := c.Engine.CheckKeySize("actor", len(actor)); err != nil {
			return 0, err
		}
		if err := c.Engine.CheckOverrideLabel(c.Rules.Current(), label); err != nil {
			return 0, err
		}
		return c.Engine.Override(label, actor)
	}, func() (bool, error) {
		return c.ResetOverride(who, label, actor)
	}, func(limit int64) error {
		return c.SetOverride(who, label, actor, limit)
	})
}

// runOverride runs an override command by its last argument, op: nil
// replies the override get returns (nil for -1), RESET reset's 1 or 0,
// a number (the limit, named name in errors) set's OK.
func runOverride(x *dispatch.Ctx, op []byte, name string, get func() (int64, error), reset func() (bool, error), set func(limit int64) error) error {
	switch {
	case op == nil:
		n, err := get()
		if err != nil {
			return err
		}
		if n < 0 {
			x.Out = resp.AppendNull(x.Out, false)
		} else {
			x.Out = resp.AppendInt(x.Out, n)
		}
		return nil
	case resp.EqualFold(op, "reset"):
		had, err := reset()
		if err != nil {
			return err
		}
		x.Out = resp.AppendInt(x.Out, int64(b2i(had)))
		return nil
	}
	limit, err := count(name, op)
	if err != nil {
		return err
	}
	if err := set(limit); err != nil {
		return err
	}
	x.Out = resp.AppendSimple(x.Out, "OK")
	return nil
}

// SetOverride gives actor its own limit in label's rule for who
// (engine.SetOverride), audited.
func (c *Commands) SetOverride(who Who, label string, actor []byte, limit int64) error {
	if err := c.Engine.SetOverride(c.Rules.Current(), label, actor, limit); err != nil {
		return err
	}
	c.audit(who, changeOverride, "label", label, "actor", string(actor), "limit", limit)
	return nil
}

// ResetOverride removes actor's override in label's rule for who
// (engine.ResetOverride), audited when it had one.
func (c *Commands) ResetOverride(who Who, label string, actor []byte) (bool, error) {
	had, err := c.Engine.ResetOverride(c.Rules.Current(), label, actor)
	if had {
		c.audit(who, changeOverrideReset, "label", label, "actor", string(actor))
	}
	return had, err
}

// overrides is POLICY OVERRIDES <label> [CURSOR <cursor>] [COUNT <count>]:
// as HSCAN, the cursor to continue from ("0" when the list is done) and a
// flat array of actors and their limits, in actor order.
func (c *Commands) overrides(x *dispatch.Ctx, args [][]byte) error {
	if err := CheckLabel(args[0]); err != nil {
		return err
	}
	if len(args)%2 != 1 {
		return usage
	}
	after, n, err := page(args[1:])
	if err != nil {
		return err
	}
	list, next, err := c.Engine.Overrides(c.Rules.Current(), string(args[0]), after, n)
	if err != nil {
		return err
	}
	x.Out = appendPageHead(x.Out, next, len(list))
	for _, o := range list {
		x.Out = resp.AppendBulk(x.Out, o.Actor)
		x.Out = resp.AppendInt(x.Out, o.Limit)
	}
	return nil
}

// overrideLabels is POLICY OVERRIDES without a label: as HGETALL, a flat
// array of each label that has overrides on this server and how many, in
// label order. INFO's policy_override_labels says the same in one line,
// where an Envoy domain's label (rls:<domain>) holding "=" and "," cannot
// be told from two; this reply can, for tools that compare servers.
func (c *Commands) overrideLabels(x *dispatch.Ctx) error {
	counts, _ := c.Engine.OverrideCounts()
	labels := slices.Sorted(maps.Keys(counts))
	x.Out = resp.AppendArray(x.Out, 2*len(labels))
	for _, l := range labels {
		x.Out = resp.AppendBulkString(x.Out, l)
		x.Out = resp.AppendInt(x.Out, counts[l])
	}
	return nil
}

// appendPageHead appends what a listing's reply starts with, as HSCAN's:
// an array of the cursor to continue after next and the array of the n
// listed, each two elements.
func appendPageHead(out, next []byte, n int) []byte {
	out = resp.AppendArray(out, 2)
	out = resp.AppendBulkString(out, FormatCursor(next))
	return resp.AppendArray(out, 2*n)
}

// page reads a listing's [CURSOR <cursor>] [COUNT <count>], in pairs:
// the actor to continue after (nil: from the first) and how many.
func page(args [][]byte) (after []byte, n int, err error) {
	n = DefaultOverridesCount
	for rest := args; len(rest) >= 2; rest = rest[2:] {
		switch {
		case resp.EqualFold(rest[0], "cursor"):
			if after, err = ParseCursor(string(rest[1])); err != nil {
				return nil, 0, err
			}
		case resp.EqualFold(rest[0], "count"):
			v, ok := resp.ParseInt(rest[1])
			if !ok || v < 1 || v > engine.MaxOverridesPage {
				return nil, 0, errs.New(errs.Request, "COUNT "+strconv.Quote(truncate(rest[1]))+" is not one; expected an integer from 1 to "+strconv.Itoa(engine.MaxOverridesPage))
			}
			n = int(v)
		default:
			return nil, 0, errs.New(errs.Request, "option "+strconv.Quote(truncate(rest[0]))+" is not one; expected CURSOR <cursor> or COUNT <count>")
		}
	}
	return after, n, nil
}

// FormatCursor is the cursor of POLICY OVERRIDES and /v1/policy/ that
// continues after the actor after: "0" for nil (the list is done),
// otherwise "a" and the actor in hex.
func FormatCursor(after []byte) string {
	if after == nil {
		return "0"
	}
	return "a" + hex.EncodeToString(after)
}

// ParseCursor reads a cursor of FormatCursor's: nil for "0" (the start).
func ParseCursor(s string) ([]byte, error) {
	if s == "0" {
		return nil, nil
	}
	if len(s) > 0 && s[0] == 'a' {
		if b, err := hex.DecodeString(s[1:]); err == nil {
			return b, nil
		}
	}
	return nil, errs.New(errs.Request, "cursor "+strconv.Quote(truncate([]byte(s)))+" is not one; expected 0 to start, or the cursor of the last reply")
}
