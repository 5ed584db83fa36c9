package limitcmd

import (
	"errors"
	"strconv"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/storage"
)

// The CL.* commands: redis-cell's GCRA limiter (CL.THROTTLE and its
// millisecond form CL.PTHROTTLE), by the spec's arithmetic in bucket.GCRA.

// CLRequest is a parsed CL.THROTTLE or CL.PTHROTTLE.
type CLRequest struct {
	Key      []byte // aliases the command's arguments
	GCRA     bucket.GCRA
	Quantity int64
	At       int64 // in the command's unit; valid when hasAt
	HasAt    bool
}

// ParseCL parses the arguments after the command name:
//
//	key max_burst count period [quantity] [AT unix]
//
// quantity is positional, as in redis-cell: only directly after period.
// Then AT may come any number of times; the last one wins. Every integer is
// parsed before any range is checked, so a client sees the syntax error of
// a malformed call before the range error of a well-formed one.
func ParseCL(unit bucket.Unit, name string, args [][]byte, r *CLRequest) error {
	if len(args) < 4 {
		return errs.WrongArgs(name)
	}
	*r = CLRequest{Key: args[0], Quantity: 1}
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
		if r.Quantity, err = intArg("quantity", args[i]); err != nil {
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
		if r.At, err = intArg("AT", args[i]); err != nil {
			return err
		}
		r.HasAt = true
	}
	if r.GCRA, err = bucket.NewGCRA(p); err != nil {
		return ArgErrIn(err, unit)
	}
	if r.Quantity < 0 {
		return errs.Arg("quantity", strconv.FormatInt(r.Quantity, 10)+": want 0 or more")
	}
	return nil
}

// CLMutator applies one parsed CL.* request to a stored GCRA state. One
// lives in each client and is reused, so a command allocates nothing.
type CLMutator struct {
	Req CLRequest
	Now int64 // unix ns

	D   bucket.Decision // the result
	val [bucket.MaxGCRAStateLen]byte
}

// Mutate implements storage.Mutator.
func (m *CLMutator) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	var s bucket.GCRAState
	if found {
		var err error
		if s, err = bucket.DecodeGCRAState(old); err != nil {
			return nil, storage.Keep, err
		}
	}
	next, write, d, err := m.Req.GCRA.Throttle(s, found, m.Now, m.Req.Quantity)
	if err != nil {
		return nil, storage.Keep, ArgErr(err)
	}
	m.D = d
	if !write {
		return nil, storage.Keep, nil
	}
	return bucket.AppendGCRAState(m.val[:0], next), storage.Put, nil
}

// Argument errors shared by the CL.* and FW.* commands. Each names the
// argument and says what was expected; they are built only on the error
// path, so a well-formed command allocates nothing.

// intArg parses the integer argument named name, as resp.ParseInt does for
// RL.*.
func intArg(name string, b []byte) (int64, error) {
	v, ok := resp.ParseInt(b)
	if !ok {
		return 0, errs.Arg(name, strconv.Quote(resp.Preview(b))+" is not an integer: want a decimal int64")
	}
	return v, nil
}

// ArgErr turns a *bucket.ArgError into the request's error in its
// argument, "<argument>: <what was wrong and what is expected>". Other
// errors pass unchanged.
func ArgErr(err error) error {
	var ae *bucket.ArgError
	if errors.As(err, &ae) {
		return &errs.Error{Kind: errs.Request, Arg: ae.Arg, Msg: ae.Msg, Err: err}
	}
	return err
}

// ArgErrIn is ArgErr for a command in unit: the P forms name their
// durations period_ms and window_ms, as in their grammar.
func ArgErrIn(err error, unit bucket.Unit) error {
	var ae *bucket.ArgError
	if unit == bucket.Millisecond && errors.As(err, &ae) && (ae.Arg == "period" || ae.Arg == "window") {
		return &errs.Error{Kind: errs.Request, Arg: ae.Arg + "_ms", Msg: ae.Msg, Err: err}
	}
	return ArgErr(err)
}

// unexpectedArg refuses an argument where only the keywords want may come.
func unexpectedArg(b []byte, want string) error {
	return errs.New(errs.Request, "syntax error at "+strconv.Quote(resp.Preview(b))+": want "+want)
}

func missingValue(keyword, what string) error {
	return errs.New(errs.Request, "syntax error: "+keyword+" needs a value: want "+keyword+" "+what)
}

func unitName(u bucket.Unit) string {
	if u == bucket.Millisecond {
		return "unix_ms"
	}
	return "unix_s"
}
