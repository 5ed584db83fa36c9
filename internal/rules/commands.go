package rules

import (
	"errors"

	"github.com/sluicehq/sluice/internal/cmddoc"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/policy"
)

// ErrNoPolicy is the reply of every rule front end when no rule file is
// in use.
var ErrNoPolicy = errs.New(errs.Request, "no policy loaded: start sluice with --policy FILE (a divvy .ini or .json rule file)")

// Register adds HIT to t: a hit of the rules f has in use, executed by e.
// e and f are read when a HIT runs, so the server may fill them after.
func Register(t *dispatch.Table, e *Engine, f *File) {
	st := dispatch.NewState(t, dispatch.Hooks[Hitter]{
		Trim:      (*Hitter).Trim,
		Footprint: (*Hitter).Footprint,
		Committed: (*Hitter).CountHits,
	})
	t.Add(dispatch.Command{Name: "hit", Arity: -1, Flags: []string{"write", "fast"}, Doc: hitDoc,
		Run: func(x *dispatch.Ctx, args [][]byte) { runHit(x, st.Of(x), e, f, args) }})
}

var hitDoc = &cmddoc.Doc{Summary: "Counts a request under the --policy rules; replies [allowed, credits left, seconds until reset].", Group: "rate-limit",
	Args: []cmddoc.Arg{{Name: "field=value", Type: "string", Optional: true, Multiple: true}}}

// runHit is HIT key=value [key=value ...]: the reply is [allowed (1 or 0),
// credits left, seconds until the window resets].
func runHit(x *dispatch.Ctx, h *Hitter, e *Engine, f *File, args [][]byte) {
	lp := f.Current()
	if lp == nil {
		x.ReplyErr(ErrNoPolicy)
		return
	}
	req, err := policy.ParseArgs(args[1:], h.Req)
	h.Req = req
	if err != nil {
		var pe *policy.ProtocolError
		if errors.As(err, &pe) {
			err = &errs.Error{Kind: errs.Request, Msg: "HIT " + pe.Reason + "; expected HIT key=value [key=value ...]", Err: err}
		}
		x.ReplyErr(err)
		return
	}
	out, err := e.Hit(h, lp, h.Req, 1, x.Batch, x.Now().UnixNano())
	if err != nil {
		x.ReplyErr(err)
		return
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
}
