package limitcmd

import (
	"errors"

	"github.com/sluicehq/sluice/internal/cmddoc"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
)

// RegisterHit adds HIT to t: a hit of the rules f has in use. f is read
// when a HIT runs, so the server may load it after.
func RegisterHit(t *dispatch.Table, f *rules.File) {
	t.Add(dispatch.Command{Name: "hit", Arity: -1, Flags: []string{"write", "fast"}, Doc: hitDoc,
		Run: func(x *dispatch.Ctx, args [][]byte) error { return runHit(x, f, args) }})
}

var hitDoc = &cmddoc.Doc{Summary: "Counts a request under the --policy rules; replies [allowed, credits left, seconds until reset].", Group: "rate-limit",
	Args: []cmddoc.Arg{{Name: "field=value", Type: "string", Optional: true, Multiple: true}}}

// runHit is HIT key=value [key=value ...]: the reply is [allowed (1 or 0),
// credits left, seconds until the window resets].
func runHit(x *dispatch.Ctx, f *rules.File, args [][]byte) error {
	lp := f.Current()
	if lp == nil {
		return rules.ErrNoPolicy
	}
	r := x.Round
	req, err := policy.ParseArgs(args[1:], r.Req)
	r.Req = req
	if err != nil {
		var pe *policy.ProtocolError
		if errors.As(err, &pe) {
			err = &errs.Error{Kind: errs.Request, Msg: "HIT " + pe.Reason + "; expected HIT key=value [key=value ...]", Err: err}
		}
		return err
	}
	out, err := r.Hit(lp, r.Req, 1, r.Now().UnixNano())
	if err != nil {
		return err
	}
	allowed := int64(0)
	x.Result = dispatch.Denied
	if out.Allowed {
		allowed = 1
		x.Result = dispatch.Allowed
	}
	x.Out = resp.AppendArray(x.Out, 3)
	x.Out = resp.AppendInt(x.Out, allowed)
	x.Out = resp.AppendInt(x.Out, out.CreditsLeft)
	x.Out = resp.AppendInt(x.Out, out.SecondsUntilReset)
	return nil
}
