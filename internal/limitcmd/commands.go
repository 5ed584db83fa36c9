package limitcmd

import (
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/cmddoc"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// The commands of the bucket-backed limiters (RL.*, CL.*, FW.*, ROLL.*):
// each request is parsed and its mutation built by the pure code of this
// package, then checked against the server's limits, timed by its clock
// and run by the connection's engine.Round, and answered; an error is
// returned, for the dispatcher to answer.

// Register adds the RL.*, CL.*, FW.* and ROLL.* commands to t.
func Register(t *dispatch.Table) {
	st := dispatch.NewState(t, dispatch.Hooks[scratch]{Trim: (*scratch).trim, Footprint: (*scratch).footprint})
	rlFlags := []string{"write", "fast"}
	rlRead := []string{"readonly", "fast"}
	cmd := func(name string, arity int, flags []string, run func(*dispatch.Ctx, [][]byte) error, doc *cmddoc.Doc) dispatch.Command {
		return dispatch.Command{Name: name, Arity: arity, Flags: flags, First: 1, Last: 1, Step: 1, Run: run, Doc: doc}
	}
	t.Add(
		cmd("rl.reduce", -4, rlFlags, rlRunner(st, "rl.reduce", RLSpec{Kind: RLReduce}), rlReduceDoc),
		cmd("rl.preduce", -4, rlFlags, rlRunner(st, "rl.preduce", RLSpec{Kind: RLReduce, MS: true}), rlPReduceDoc),
		cmd("rl.get", -4, rlRead, rlRunner(st, "rl.get", RLSpec{Kind: RLGet}), rlGetDoc),
		cmd("rl.pget", -4, rlRead, rlRunner(st, "rl.pget", RLSpec{Kind: RLGet, MS: true}), rlPGetDoc),
		cmd("rl.sessionize", -4, rlFlags, rlRunner(st, "rl.sessionize", RLSpec{Kind: RLSessionize}), rlSessionizeDoc),
		cmd("rl.psessionize", -4, rlFlags, rlRunner(st, "rl.psessionize", RLSpec{Kind: RLSessionize, MS: true}), rlPSessionizeDoc),
		cmd("cl.throttle", -5, rlFlags, clRunner(st, bucket.Second), clThrottleDoc),
		cmd("cl.pthrottle", -5, rlFlags, clRunner(st, bucket.Millisecond), clPThrottleDoc),
		cmd("fw.incr", -4, rlFlags, fwRunner(st, FWSpec{Unit: bucket.Second}), fwIncrDoc),
		cmd("fw.pincr", -4, rlFlags, fwRunner(st, FWSpec{Unit: bucket.Millisecond}), fwPIncrDoc),
		cmd("fw.get", -4, rlRead, fwRunner(st, FWSpec{Get: true, Unit: bucket.Second}), fwGetDoc),
		cmd("fw.pget", -4, rlRead, fwRunner(st, FWSpec{Get: true, Unit: bucket.Millisecond}), fwPGetDoc),
		cmd("roll.limit", -4, rlFlags, rollRunner(st, false), rollLimitDoc),
		// A write: it drops the entries that have left the interval.
		cmd("roll.wouldlimit", -4, rlFlags, rollRunner(st, true), rollWouldDoc),
		cmd("roll.clear", 2, rlFlags, func(x *dispatch.Ctx, args [][]byte) error { return runRollClear(x, st.Of(x), args) }, rollClearDoc),
	)
}

// scratch is a connection's requests and mutators, kept across commands:
// a mutator handed to the store escapes, so a new one per command would
// be an allocation per command.
type scratch struct {
	rl      RLMutator
	cl      CLMutator
	fw      FWMutator
	fwReq   FWRequest
	roll    RollMutator
	rollReq RollRequest
	clear   clearMutator // ROLL.CLEAR's
}

// trim lets go of a sliding log's arrays larger than keep bytes.
func (sc *scratch) trim(keep int) { sc.roll.Resize(keep) }

func (sc *scratch) footprint() int { return sc.roll.Footprint() }

// rlRunner runs the RL command name, of spec.
func rlRunner(st dispatch.State[scratch], name string, spec RLSpec) func(*dispatch.Ctx, [][]byte) error {
	return func(x *dispatch.Ctx, args [][]byte) error {
		return runRL(x, st.Of(x), name, spec, args)
	}
}

func runRL(x *dispatch.Ctx, sc *scratch, name string, spec RLSpec, args [][]byte) error {
	m := &sc.rl
	if err := ParseRL(spec, name, args[1:], &m.Req); err != nil {
		return err
	}
	if err := x.Round.CheckKeySize("key", len(m.Req.Key)); err != nil {
		return err
	}
	m.Spec = spec
	m.Server = x.Round.Now().UnixMilli()
	m.Now = m.Server
	if m.Req.HasAt {
		m.Now = m.Req.At
	}
	x.Key = AppendBucketKey(x.Key[:0], m.Req)
	if err := x.Round.Limit(x.Key, m); err != nil {
		return err
	}
	if spec.Kind != RLGet {
		if m.Before >= m.Req.Take {
			x.Result = dispatch.Allowed
		} else {
			x.Result = dispatch.Denied
		}
	}
	if spec.Kind == RLSessionize {
		x.Out = resp.AppendArray(x.Out, 2)
		x.Out = resp.AppendInt(x.Out, m.Before)
		x.Out = resp.AppendInt(x.Out, m.Session)
		return nil
	}
	x.Out = resp.AppendInt(x.Out, m.Before)
	return nil
}

var (
	rlReduceDoc      = rlDoc("Takes TAKE tokens (default 1) from the token bucket of key, which holds max tokens and gets REFILL (default max) back every refill_s seconds. Replies the tokens before the take.", "refill_s", "unix_s", true)
	rlPReduceDoc     = rlDoc("RL.REDUCE with the refill period and AT in milliseconds.", "refill_ms", "unix_ms", true)
	rlGetDoc         = rlDoc("Replies the tokens available in the token bucket of key, without taking any.", "refill_s", "unix_s", false)
	rlPGetDoc        = rlDoc("RL.GET with the refill period and AT in milliseconds.", "refill_ms", "unix_ms", false)
	rlSessionizeDoc  = rlDoc("RL.REDUCE, always strict; replies [tokens before the take, session start in ms].", "refill_s", "unix_s", true)
	rlPSessionizeDoc = rlDoc("RL.SESSIONIZE with the refill period and AT in milliseconds.", "refill_ms", "unix_ms", true)
)

// rlDoc is the record of an RL.* command; take says whether it has TAKE.
func rlDoc(summary, period, at string, take bool) *cmddoc.Doc {
	args := []cmddoc.Arg{
		{Name: "key", Type: "key"},
		{Name: "max", Type: "integer"},
		{Name: period, Type: "integer"},
		{Name: "refill", Type: "integer", Token: "REFILL", Optional: true},
	}
	if take {
		args = append(args, cmddoc.Arg{Name: "take", Type: "integer", Token: "TAKE", Optional: true})
	}
	args = append(args,
		cmddoc.Arg{Name: at, Type: "unix-time", Token: "AT", Optional: true},
		cmddoc.Arg{Name: "strict", Type: "pure-token", Token: "STRICT", Optional: true})
	return &cmddoc.Doc{Summary: summary, Group: "rate-limit", Args: args}
}

func clRunner(st dispatch.State[scratch], unit bucket.Unit) func(*dispatch.Ctx, [][]byte) error {
	name := "cl.throttle"
	if unit == bucket.Millisecond {
		name = "cl.pthrottle"
	}
	return func(x *dispatch.Ctx, args [][]byte) error {
		return runCL(x, st.Of(x), unit, name, args)
	}
}

func runCL(x *dispatch.Ctx, sc *scratch, unit bucket.Unit, name string, args [][]byte) error {
	m := &sc.cl
	if err := ParseCL(unit, name, args[1:], &m.Req); err != nil {
		return err
	}
	if err := x.Round.CheckKeySize("key", len(m.Req.Key)); err != nil {
		return err
	}
	if m.Req.HasAt {
		var err error
		if m.Now, err = unit.Nanos(m.Req.At); err != nil {
			return ArgErr(err)
		}
	} else {
		m.Now = x.Round.Now().UnixNano()
	}
	x.Key = keyspace.AppendGCRAKey(x.Key[:0], m.Req.Key)
	if err := x.Round.Limit(x.Key, m); err != nil {
		return err
	}
	d := &m.D
	if d.Limited {
		x.Result = dispatch.Denied
	} else {
		x.Result = dispatch.Allowed
	}
	limited := int64(0)
	if d.Limited {
		limited = 1
	}
	x.Out = resp.AppendArray(x.Out, 5)
	x.Out = resp.AppendInt(x.Out, limited)
	x.Out = resp.AppendInt(x.Out, d.Limit)
	x.Out = resp.AppendInt(x.Out, d.Remaining)
	x.Out = resp.AppendInt(x.Out, d.RetryAfter)
	x.Out = resp.AppendInt(x.Out, d.ResetAfter)
	return nil
}

var (
	clThrottleDoc  = clDoc("Rate limits key by GCRA, as redis-cell: count requests per period seconds, bursts of max_burst + 1. Replies [limited, limit, remaining, retry_after, reset_after] in seconds.", "period", "unix_s")
	clPThrottleDoc = clDoc("CL.THROTTLE with the period, AT and the reply's durations in milliseconds.", "period_ms", "unix_ms")
)

func clDoc(summary, period, at string) *cmddoc.Doc {
	return &cmddoc.Doc{Summary: summary, Group: "rate-limit", Args: []cmddoc.Arg{
		{Name: "key", Type: "key"},
		{Name: "max_burst", Type: "integer"},
		{Name: "count", Type: "integer"},
		{Name: period, Type: "integer"},
		{Name: "quantity", Type: "integer", Optional: true},
		{Name: at, Type: "unix-time", Token: "AT", Optional: true},
	}}
}

func fwRunner(st dispatch.State[scratch], spec FWSpec) func(*dispatch.Ctx, [][]byte) error {
	return func(x *dispatch.Ctx, args [][]byte) error {
		return runFW(x, st.Of(x), spec, args)
	}
}

func runFW(x *dispatch.Ctx, sc *scratch, spec FWSpec, args [][]byte) error {
	m := &sc.fw
	req := &sc.fwReq
	if err := ParseFW(spec, args[1:], req); err != nil {
		return err
	}
	var err error
	if m.W, err = bucket.NewWindow(req.Params, req.Key); err != nil {
		return ArgErrIn(err, spec.Unit)
	}
	if err := x.Round.CheckKeySize("key", len(req.Key)); err != nil {
		return err
	}
	if req.HasAt {
		if m.Now, err = spec.Unit.Millis(req.At); err != nil {
			return ArgErr(err)
		}
	} else {
		m.Now = x.Round.Now().UnixMilli()
	}
	m.Get = spec.Get
	x.Key = keyspace.AppendWindowKey(x.Key[:0], m.W.Millis(), m.W.Staggered(), req.Key)
	if err := x.Round.Limit(x.Key, m); err != nil {
		return err
	}
	d := &m.D
	if !spec.Get {
		if d.Limited {
			x.Result = dispatch.Denied
		} else {
			x.Result = dispatch.Allowed
		}
	}
	r := d.Reply()
	x.Out = resp.AppendArray(x.Out, len(r))
	for _, v := range r {
		x.Out = resp.AppendInt(x.Out, v)
	}
	return nil
}

var (
	fwIncrDoc  = fwDoc("Counts a request in key's fixed window of window seconds, aligned to the Unix epoch. Replies [limited, limit, remaining, retry_after, reset_after, used, reset_at] in seconds.", FWSpec{})
	fwPIncrDoc = fwDoc("FW.INCR with the window, AT and the reply's times in milliseconds.", FWSpec{Unit: bucket.Millisecond})
	fwGetDoc   = fwDoc("FW.INCR's reply without counting: would a request of COST pass now.", FWSpec{Get: true})
	fwPGetDoc  = fwDoc("FW.GET with the window, AT and the reply's times in milliseconds.", FWSpec{Get: true, Unit: bucket.Millisecond})
)

func fwDoc(summary string, spec FWSpec) *cmddoc.Doc {
	window, at := "window", "unix_s"
	if spec.Unit == bucket.Millisecond {
		window, at = "window_ms", "unix_ms"
	}
	args := []cmddoc.Arg{
		{Name: "key", Type: "key"},
		{Name: "limit", Type: "integer"},
		{Name: window, Type: "integer"},
		{Name: "n", Type: "integer", Token: "COST", Optional: true},
		{Name: at, Type: "unix-time", Token: "AT", Optional: true},
	}
	if !spec.Get {
		args = append(args, cmddoc.Arg{Name: "nocountblocked", Type: "pure-token", Token: "NOCOUNTBLOCKED", Optional: true})
	}
	args = append(args, cmddoc.Arg{Name: "stagger", Type: "pure-token", Token: "STAGGER", Optional: true})
	return &cmddoc.Doc{Summary: summary, Group: "rate-limit", Args: args}
}

func rollRunner(st dispatch.State[scratch], would bool) func(*dispatch.Ctx, [][]byte) error {
	return func(x *dispatch.Ctx, args [][]byte) error {
		return runRoll(x, st.Of(x), would, args)
	}
}

func runRoll(x *dispatch.Ctx, sc *scratch, would bool, args [][]byte) error {
	m := &sc.roll
	req := &sc.rollReq
	if err := ParseRoll(would, args[1:], req); err != nil {
		return err
	}
	var err error
	if m.L, err = bucket.NewLog(req.Params); err != nil {
		return ArgErr(err)
	}
	if err := x.Round.CheckKeySize("key", len(req.Key)); err != nil {
		return err
	}
	if req.HasAt {
		m.Now = req.At
	} else {
		m.Now = x.Round.Now().UnixMicro()
	}
	m.Would = would
	x.Key = keyspace.AppendLogKey(x.Key[:0], req.Key)
	if err := x.Round.Limit(x.Key, m); err != nil {
		return err
	}
	if !would {
		if m.R.Blocked {
			x.Result = dispatch.Denied
		} else {
			x.Result = dispatch.Allowed
		}
	}
	r := m.R.Reply()
	x.Out = resp.AppendArray(x.Out, len(r))
	for _, v := range r {
		x.Out = resp.AppendInt(x.Out, v)
	}
	return nil
}

// runRollClear is ROLL.CLEAR key: it deletes key's log, and only its log
// (DEL removes every kind), and answers 1 if there was one, else 0.
func runRollClear(x *dispatch.Ctx, sc *scratch, args [][]byte) error {
	key := args[1]
	if err := x.Round.CheckKeySize("key", len(key)); err != nil {
		return err
	}
	x.Key = keyspace.AppendLogKey(x.Key[:0], key)
	sc.clear = clearMutator{}
	if err := x.Round.Apply(x.Key, &sc.clear); err != nil {
		return err
	}
	var n int64
	if sc.clear.deleted {
		n = 1
	}
	x.Out = resp.AppendInt(x.Out, n)
	return nil
}

// clearMutator deletes a record that exists, and notes that it did.
type clearMutator struct{ deleted bool }

func (m *clearMutator) Mutate(_ []byte, found bool) ([]byte, storage.Op, error) {
	if !found {
		return nil, storage.Keep, nil
	}
	m.deleted = true
	return nil, storage.Delete, nil
}

var (
	rollLimitDoc = rollDoc("Records an action in key's sliding log, as the npm rolling-rate-limiter's limitWithInfo: at most max actions per interval_ms, none closer than MINDIFF ms to the previous one. Replies [blocked, blocked_by_count, blocked_by_min_difference, ms_until_allowed, actions_remaining].", false)
	rollWouldDoc = rollDoc("ROLL.LIMIT's reply without recording the action, as wouldLimitWithInfo, which drops the actions that have left the interval.", true)
	rollClearDoc = &cmddoc.Doc{
		Summary: "Deletes key's sliding log, as the npm rolling-rate-limiter's clear; returns 1 if there was one, else 0.",
		Group:   "rate-limit",
		Args:    []cmddoc.Arg{{Name: "key", Type: "key"}},
	}
)

func rollDoc(summary string, would bool) *cmddoc.Doc {
	args := []cmddoc.Arg{
		{Name: "key", Type: "key"},
		{Name: "interval_ms", Type: "integer"},
		{Name: "max", Type: "integer"},
		{Name: "ms", Type: "integer", Token: "MINDIFF", Optional: true},
		{Name: "unix_us", Type: "unix-time", Token: "AT", Optional: true},
	}
	if !would {
		args = append(args, cmddoc.Arg{Name: "nocountblocked", Type: "pure-token", Token: "NOCOUNTBLOCKED", Optional: true})
	}
	return &cmddoc.Doc{Summary: summary, Group: "rate-limit", Args: args}
}
