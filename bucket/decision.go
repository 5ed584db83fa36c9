package bucket

import (
	"fmt"
	"math"
)

// Unit is the unit of a command's durations and AT: the plain forms
// (CL.THROTTLE, FW.INCR, FW.GET) take and answer seconds, the P forms
// milliseconds. The zero Unit is Second.
type Unit uint8

const (
	// Second is the unit of the plain forms; it is the zero Unit.
	Second Unit = iota
	// Millisecond is the unit of the P forms.
	Millisecond
)

func (u Unit) valid() bool { return u <= Millisecond }

// millis is the number of milliseconds in one u.
func (u Unit) millis() int64 {
	if u == Millisecond {
		return 1
	}
	return 1000
}

// Nanos converts an AT given in u to unix nanoseconds, the time of GCRA.
func (u Unit) Nanos(at int64) (int64, error) {
	if !u.valid() {
		return 0, &ArgError{Arg: "unit", Msg: fmt.Sprintf("unknown unit %d", u)}
	}
	ns, ok := mulOK(at, u.millis()*1e6)
	if !ok {
		return 0, &ArgError{Arg: "AT", Msg: fmt.Sprintf("%d is out of range: want %d to %d", at, math.MinInt64/(u.millis()*1e6), math.MaxInt64/(u.millis()*1e6))}
	}
	return ns, nil
}

// Millis converts an AT given in u to unix milliseconds, the time of fixed
// windows.
func (u Unit) Millis(at int64) (int64, error) {
	if !u.valid() {
		return 0, &ArgError{Arg: "unit", Msg: fmt.Sprintf("unknown unit %d", u)}
	}
	ms, ok := mulOK(at, u.millis())
	if !ok {
		return 0, &ArgError{Arg: "AT", Msg: fmt.Sprintf("%d is out of range: want %d to %d", at, math.MinInt64/u.millis(), math.MaxInt64/u.millis())}
	}
	return ms, nil
}

// Decision is the answer of one GCRA or fixed-window call: everything a RESP
// reply or an X-RateLimit-* header needs, already rounded, so that no later
// layer redoes the arithmetic.
//
// RetryAfter, ResetAfter and ResetAt are in the Unit of the call (whole
// seconds for the plain forms, milliseconds for the P forms), rounded up as
// the spec says for each kind. RetryAfter is -1 when waiting cannot help
// (the request asks for more than the limit) or the call was allowed.
type Decision struct {
	Limited    bool
	Limit      int64 // requests per window, or GCRA's burst (max_burst + 1)
	Remaining  int64 // 0 <= Remaining <= Limit
	RetryAfter int64 // until this request would be allowed; -1 for none
	ResetAfter int64 // until the limit is whole again; >= 0
	// Used is the window's count after the call; for GCRA, Limit-Remaining.
	Used int64
	// ResetAt is when the limit is whole again, in unix Unit: the window's
	// end, or for GCRA the TAT after the call (neither CL reply carries it).
	ResetAt int64
}

// Reply is the seven-element reply of FW.* in order; CL.THROTTLE replies
// with the first five.
func (d Decision) Reply() [7]int64 {
	var limited int64
	if d.Limited {
		limited = 1
	}
	return [7]int64{limited, d.Limit, d.Remaining, d.RetryAfter, d.ResetAfter, d.Used, d.ResetAt}
}

// ArgError is a command argument out of its range, or a set of arguments
// whose arithmetic would overflow int64. Arg names the argument as the
// spec's grammar does ("max_burst", "period", "COST", "AT", ...).
type ArgError struct {
	Arg string
	Msg string // what was wrong and what is expected
}

func (e *ArgError) Error() string { return "bucket: " + e.Arg + ": " + e.Msg }

// addOK, subOK and mulOK are int64 arithmetic that reports overflow instead
// of wrapping: the spec refuses what it cannot compute exactly.
func addOK(a, b int64) (int64, bool) {
	s := a + b
	return s, (b >= 0) == (s >= a)
}

func subOK(a, b int64) (int64, bool) {
	d := a - b
	return d, (b >= 0) == (d <= a)
}

// mulOK multiplies any a by b >= 0.
func mulOK(a, b int64) (int64, bool) {
	if b == 0 {
		return 0, true
	}
	if a > math.MaxInt64/b || a < math.MinInt64/b {
		return 0, false
	}
	return a * b, true
}

// floorDiv and ceilDiv divide by b > 0, rounding toward minus and plus
// infinity; neither can overflow.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a > 0 {
		q++
	}
	return q
}

// fromMillis converts a duration or an instant in ms to u, rounded up.
func (u Unit) fromMillis(ms int64) int64 { return ceilDiv(ms, u.millis()) }
