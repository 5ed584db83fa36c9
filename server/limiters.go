package server

import (
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/cmddoc"
	"github.com/sluicehq/sluice/internal/limitcmd"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
)

// The glue of the bucket-backed limiter commands (RL.*, CL.*, FW.*,
// ROLL.*): their requests and store mutations are in internal/limitcmd;
// here each is checked against the server's limits, timed by its clock,
// applied through the client's batch and answered.

func rlRunner(spec limitcmd.RLSpec) func(*Server, *client, [][]byte) {
	return func(s *Server, c *client, args [][]byte) {
		s.runRL(c, spec, args)
	}
}

func (s *Server) runRL(c *client, spec limitcmd.RLSpec, args [][]byte) {
	m := &c.rl
	if err := limitcmd.ParseRL(spec, rlName(spec), args[1:], &m.Req); err != nil {
		s.replyErr(c, err)
		return
	}
	if err := s.checkKeySize("key", len(m.Req.Key)); err != nil {
		s.replyErr(c, err)
		return
	}
	m.Spec = spec
	m.Server = s.clock().UnixMilli()
	m.Now = m.Server
	if m.Req.HasAt {
		m.Now = m.Req.At
	}
	c.key = limitcmd.AppendBucketKey(c.key[:0], m.Req)
	if err := s.modify(c.batch, c.key, m); err != nil {
		s.replyErr(c, err)
		return
	}
	if spec.Kind != limitcmd.RLGet {
		if m.Before >= m.Req.Take {
			c.result = rlAllowed
		} else {
			c.result = rlDenied
		}
	}
	if spec.Kind == limitcmd.RLSessionize {
		c.out = resp.AppendArray(c.out, 2)
		c.out = resp.AppendInt(c.out, m.Before)
		c.out = resp.AppendInt(c.out, m.Session)
		return
	}
	c.out = resp.AppendInt(c.out, m.Before)
}

func rlName(spec limitcmd.RLSpec) string {
	switch {
	case spec.Kind == limitcmd.RLReduce && !spec.MS:
		return "rl.reduce"
	case spec.Kind == limitcmd.RLReduce:
		return "rl.preduce"
	case spec.Kind == limitcmd.RLGet && !spec.MS:
		return "rl.get"
	case spec.Kind == limitcmd.RLGet:
		return "rl.pget"
	case !spec.MS:
		return "rl.sessionize"
	}
	return "rl.psessionize"
}

func clRunner(unit bucket.Unit) func(*Server, *client, [][]byte) {
	name := "cl.throttle"
	if unit == bucket.Millisecond {
		name = "cl.pthrottle"
	}
	return func(s *Server, c *client, args [][]byte) {
		s.runCL(c, unit, name, args)
	}
}

func (s *Server) runCL(c *client, unit bucket.Unit, name string, args [][]byte) {
	m := &c.cl
	if err := limitcmd.ParseCL(unit, name, args[1:], &m.Req); err != nil {
		s.replyErr(c, err)
		return
	}
	if err := s.checkKeySize("key", len(m.Req.Key)); err != nil {
		s.replyErr(c, err)
		return
	}
	if m.Req.HasAt {
		var err error
		if m.Now, err = unit.Nanos(m.Req.At); err != nil {
			s.replyErr(c, limitcmd.ArgErr(err))
			return
		}
	} else {
		m.Now = s.clock().UnixNano()
	}
	c.key = keyspace.AppendGCRAKey(c.key[:0], m.Req.Key)
	if err := s.modify(c.batch, c.key, m); err != nil {
		s.replyErr(c, err)
		return
	}
	d := &m.D
	if d.Limited {
		c.result = rlDenied
	} else {
		c.result = rlAllowed
	}
	limited := int64(0)
	if d.Limited {
		limited = 1
	}
	c.out = resp.AppendArray(c.out, 5)
	c.out = resp.AppendInt(c.out, limited)
	c.out = resp.AppendInt(c.out, d.Limit)
	c.out = resp.AppendInt(c.out, d.Remaining)
	c.out = resp.AppendInt(c.out, d.RetryAfter)
	c.out = resp.AppendInt(c.out, d.ResetAfter)
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

func fwRunner(spec limitcmd.FWSpec) func(*Server, *client, [][]byte) {
	return func(s *Server, c *client, args [][]byte) {
		s.runFW(c, spec, args)
	}
}

func (s *Server) runFW(c *client, spec limitcmd.FWSpec, args [][]byte) {
	m := &c.fw
	req := &c.fwReq
	if err := limitcmd.ParseFW(spec, args[1:], req); err != nil {
		s.replyErr(c, err)
		return
	}
	var err error
	if m.W, err = bucket.NewWindow(req.Params, req.Key); err != nil {
		s.replyErr(c, limitcmd.ArgErrIn(err, spec.Unit))
		return
	}
	if err := s.checkKeySize("key", len(req.Key)); err != nil {
		s.replyErr(c, err)
		return
	}
	if req.HasAt {
		if m.Now, err = spec.Unit.Millis(req.At); err != nil {
			s.replyErr(c, limitcmd.ArgErr(err))
			return
		}
	} else {
		m.Now = s.clock().UnixMilli()
	}
	m.Get = spec.Get
	c.key = keyspace.AppendWindowKey(c.key[:0], m.W.Millis(), m.W.Staggered(), req.Key)
	if err := s.modify(c.batch, c.key, m); err != nil {
		s.replyErr(c, err)
		return
	}
	d := &m.D
	if !spec.Get {
		if d.Limited {
			c.result = rlDenied
		} else {
			c.result = rlAllowed
		}
	}
	r := d.Reply()
	c.out = resp.AppendArray(c.out, len(r))
	for _, v := range r {
		c.out = resp.AppendInt(c.out, v)
	}
}

var (
	fwIncrDoc  = fwDoc("Counts a request in key's fixed window of window seconds, aligned to the Unix epoch. Replies [limited, limit, remaining, retry_after, reset_after, used, reset_at] in seconds.", limitcmd.FWSpec{})
	fwPIncrDoc = fwDoc("FW.INCR with the window, AT and the reply's times in milliseconds.", limitcmd.FWSpec{Unit: bucket.Millisecond})
	fwGetDoc   = fwDoc("FW.INCR's reply without counting: would a request of COST pass now.", limitcmd.FWSpec{Get: true})
	fwPGetDoc  = fwDoc("FW.GET with the window, AT and the reply's times in milliseconds.", limitcmd.FWSpec{Get: true, Unit: bucket.Millisecond})
)

func fwDoc(summary string, spec limitcmd.FWSpec) *cmddoc.Doc {
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

func rollRunner(would bool) func(*Server, *client, [][]byte) {
	return func(s *Server, c *client, args [][]byte) {
		s.runRoll(c, would, args)
	}
}

func (s *Server) runRoll(c *client, would bool, args [][]byte) {
	m := &c.roll
	req := &c.rollReq
	if err := limitcmd.ParseRoll(would, args[1:], req); err != nil {
		s.replyErr(c, err)
		return
	}
	var err error
	if m.L, err = bucket.NewLog(req.Params); err != nil {
		s.replyErr(c, limitcmd.ArgErr(err))
		return
	}
	if err := s.checkKeySize("key", len(req.Key)); err != nil {
		s.replyErr(c, err)
		return
	}
	if req.HasAt {
		m.Now = req.At
	} else {
		m.Now = s.clock().UnixMicro()
	}
	m.Would = would
	c.key = keyspace.AppendLogKey(c.key[:0], req.Key)
	if err := s.modify(c.batch, c.key, m); err != nil {
		s.replyErr(c, err)
		return
	}
	if !would {
		if m.R.Blocked {
			c.result = rlDenied
		} else {
			c.result = rlAllowed
		}
	}
	r := m.R.Reply()
	c.out = resp.AppendArray(c.out, len(r))
	for _, v := range r {
		c.out = resp.AppendInt(c.out, v)
	}
}

// cmdRollClear is ROLL.CLEAR key: it deletes key's log, and only its log
// (DEL removes every kind), and answers 1 if there was one, else 0.
func cmdRollClear(s *Server, c *client, args [][]byte) {
	key := args[1]
	if err := s.checkKeySize("key", len(key)); err != nil {
		s.replyErr(c, err)
		return
	}
	c.key = keyspace.AppendLogKey(c.key[:0], key)
	c.clear = delMutator{}
	if err := c.batch.Modify(c.key, &c.clear); err != nil {
		s.replyErr(c, wrapStoreErr(err))
		return
	}
	var n int64
	if c.clear.deleted {
		n = 1
	}
	c.out = resp.AppendInt(c.out, n)
}

var (
	rollLimitDoc = rollDoc("Records an action in key's sliding log, as the npm rolling-rate-limiter's limitWithInfo: at most max actions per interval_ms, none closer than MINDIFF ms to the previous one. Replies [blocked, blocked_by_count, blocked_by_min_difference, ms_until_allowed, actions_remaining].", false)
	rollWouldDoc = rollDoc("ROLL.LIMIT's reply without recording anything, as wouldLimitWithInfo.", true)
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
