package server

import (
	"errors"
	"strconv"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// The CL.* commands: redis-cell's GCRA limiter (CL.THROTTLE and its
// millisecond form CL.PTHROTTLE), by the spec's arithmetic in bucket.GCRA.

// clRequest is a parsed CL.THROTTLE or CL.PTHROTTLE.
type clRequest struct {
	key      []byte // aliases the command's arguments
	gcra     bucket.GCRA
	quantity int64
	at       int64 // in the command's unit; valid when hasAt
	hasAt    bool
}

// parseCL parses the arguments after the command name:
//
//	key max_burst count period [quantity] [AT unix]
//
// quantity is positional, as in redis-cell: only directly after period.
// Then AT may come any number of times; the last one wins. Every integer is
// parsed before any range is checked, so a client sees the syntax error of
// a malformed call before the range error of a well-formed one.
func parseCL(unit bucket.Unit, name string, args [][]byte, r *clRequest) error {
	if len(args) < 4 {
		return resp.WrongArgs(name)
	}
	*r = clRequest{key: args[0], quantity: 1}
	var p bucket.GCRAParams
	p.Unit = unit
	var err error
	if p.MaxBurst, err = intArg("max_burst", args[1]); err != nil {
		return err
	}
	if p.Count, err = intArg("count", args[2]); err != nil {
		return err
	}
	period := "period"
	if unit == bucket.Millisecond {
		period = "period_ms"
	}
	if p.Period, err = intArg(period, args[3]); err != nil {
		return err
	}
	i := 4
	if i < len(args) && !resp.EqualFold(args[i], "at") {
		if r.quantity, err = intArg("quantity", args[i]); err != nil {
			return err
		}
		i++
	}
	for ; i < len(args); i++ {
		if !resp.EqualFold(args[i], "at") {
			return unexpectedArg(args[i], "AT")
		}
		if i == len(args)-1 {
			return missingValue("AT", unitName(unit))
		}
		i++
		if r.at, err = intArg("AT", args[i]); err != nil {
			return err
		}
		r.hasAt = true
	}
	if r.gcra, err = bucket.NewGCRA(p); err != nil {
		return argErrIn(err, unit)
	}
	if r.quantity < 0 {
		return resp.Error("ERR quantity: " + strconv.FormatInt(r.quantity, 10) + ": want 0 or more")
	}
	return nil
}

// clMutator applies one parsed CL.* request to a stored GCRA state. One
// lives in each client and is reused, so a command allocates nothing.
type clMutator struct {
	req clRequest
	now int64 // unix ns

	d   bucket.Decision // the result
	val [bucket.MaxGCRAStateLen]byte
}

// Mutate implements storage.Mutator.
func (m *clMutator) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	var s bucket.GCRAState
	if found {
		var err error
		if s, err = bucket.DecodeGCRAState(old); err != nil {
			return nil, storage.Keep, err
		}
	}
	next, write, d, err := m.req.gcra.Throttle(s, found, m.now, m.req.quantity)
	if err != nil {
		return nil, storage.Keep, argErr(err)
	}
	m.d = d
	if !write {
		return nil, storage.Keep, nil
	}
	return bucket.AppendGCRAState(m.val[:0], next), storage.Put, nil
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
	if err := parseCL(unit, name, args[1:], &m.req); err != nil {
		s.replyErr(c, err)
		return
	}
	if err := s.checkKeySize("key", len(m.req.key)); err != nil {
		s.replyErr(c, err)
		return
	}
	if m.req.hasAt {
		var err error
		if m.now, err = unit.Nanos(m.req.at); err != nil {
			s.replyErr(c, argErr(err))
			return
		}
	} else {
		m.now = s.clock().UnixNano()
	}
	c.key = keyspace.AppendGCRAKey(c.key[:0], m.req.key)
	if err := s.modify(c.batch, c.key, m); err != nil {
		s.replyErr(c, err)
		return
	}
	d := &m.d
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

// Argument errors shared by the CL.* and FW.* commands. Each names the
// argument and says what was expected; they are built only on the error
// path, so a well-formed command allocates nothing.

// intArg parses the integer argument named name, as parseInt does for
// RL.*.
func intArg(name string, b []byte) (int64, error) {
	v, ok := resp.ParseInt(b)
	if !ok {
		return 0, resp.Error("ERR " + name + ": " + strconv.Quote(resp.Preview(b)) + " is not an integer: want a decimal int64")
	}
	return v, nil
}

// argErr turns a *bucket.ArgError into its reply, "ERR <argument>: <what
// was wrong and what is expected>". Other errors pass unchanged.
func argErr(err error) error {
	var ae *bucket.ArgError
	if errors.As(err, &ae) {
		return resp.Error("ERR " + ae.Arg + ": " + ae.Msg)
	}
	return err
}

// argErrIn is argErr for a command in unit: the P forms name their
// durations period_ms and window_ms, as in their grammar.
func argErrIn(err error, unit bucket.Unit) error {
	var ae *bucket.ArgError
	if unit == bucket.Millisecond && errors.As(err, &ae) && (ae.Arg == "period" || ae.Arg == "window") {
		return resp.Error("ERR " + ae.Arg + "_ms: " + ae.Msg)
	}
	return argErr(err)
}

// unexpectedArg refuses an argument where only the keywords want may come.
func unexpectedArg(b []byte, want string) error {
	return resp.Error("ERR syntax error at " + strconv.Quote(resp.Preview(b)) + ": want " + want)
}

func missingValue(keyword, what string) error {
	return resp.Error("ERR syntax error: " + keyword + " needs a value: want " + keyword + " " + what)
}

func unitName(u bucket.Unit) string {
	if u == bucket.Millisecond {
		return "unix_ms"
	}
	return "unix_s"
}

var (
	clThrottleDoc  = clDoc("Rate limits key by GCRA, as redis-cell: count requests per period seconds, bursts of max_burst + 1. Replies [limited, limit, remaining, retry_after, reset_after] in seconds.", "period", "unix_s")
	clPThrottleDoc = clDoc("CL.THROTTLE with the period, AT and the reply's durations in milliseconds.", "period_ms", "unix_ms")
)

func clDoc(summary, period, at string) *cmdDoc {
	return &cmdDoc{summary: summary, group: "rate-limit", args: []docArg{
		{name: "key", typ: "key"},
		{name: "max_burst", typ: "integer"},
		{name: "count", typ: "integer"},
		{name: period, typ: "integer"},
		{name: "quantity", typ: "integer", optional: true},
		{name: at, typ: "unix-time", token: "AT", optional: true},
	}}
}
