package policy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Window is the stored state of one counter: a fixed window that opened at
// the counter's first hit. It records its end rather than its start so that
// a sweep can drop ended windows without the rule, which a reload may have
// removed.
type Window struct {
	End  int64 // when the window ends, in unix milliseconds
	Left int64 // credits left
}

// Expired reports whether w has ended at now (unix ms). An ended window is
// the same as none: the next hit opens a new one, and a sweep may delete it.
func (w Window) Expired(now int64) bool { return now >= w.End }

// Outcome is the reply to one hit on one rule.
type Outcome struct {
	Allowed     bool
	CreditsLeft int64
	// SecondsUntilReset is the time until the window ends, rounded up, so
	// that a live window never reports 0; -1 for always-deny rules and 0 for
	// always-allow rules.
	SecondsUntilReset int64
}

// AppendReply appends the line protocol's reply, e.g. "OK true 2 3600\n".
func (o Outcome) AppendReply(dst []byte) []byte {
	dst = append(dst, "OK "...)
	dst = strconv.AppendBool(dst, o.Allowed)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, o.CreditsLeft, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, o.SecondsUntilReset, 10)
	return append(dst, '\n')
}

const msPerSecond = 1000

// Hit applies one hit at now (unix ms) to r's counter, whose stored window
// is w when found. It returns the window to store when write is true;
// otherwise the store is left as it is.
//
// The first hit, or the first after the window ended, opens a window of
// ResetSeconds with CreditLimit-1 credits left. Each allowed hit takes one
// credit; a hit with none left is denied and changes nothing. Rules that are
// not Counted never write: CreditLimit 0 answers false 0 -1, ResetSeconds 0
// answers true CreditLimit 0.
func (r *Rule) Hit(w Window, found bool, now int64) (next Window, write bool, out Outcome) {
	switch {
	case r.CreditLimit <= 0:
		return w, false, Outcome{Allowed: false, CreditsLeft: 0, SecondsUntilReset: -1}
	case r.ResetSeconds <= 0:
		return w, false, Outcome{Allowed: true, CreditsLeft: r.CreditLimit, SecondsUntilReset: 0}
	}
	if !found || w.Expired(now) {
		w = Window{End: satAdd(now, satMul(r.ResetSeconds, msPerSecond)), Left: r.CreditLimit - 1}
		return w, true, Outcome{Allowed: true, CreditsLeft: w.Left, SecondsUntilReset: r.secondsUntil(w.End, now)}
	}
	// A window written under other limits cannot reach here (the limits are
	// part of the counter key), but a damaged one is clamped all the same.
	left := min(w.Left, r.CreditLimit-1)
	secs := r.secondsUntil(w.End, now)
	if left <= 0 {
		return w, false, Outcome{Allowed: false, CreditsLeft: 0, SecondsUntilReset: secs}
	}
	w.Left = left - 1
	return w, true, Outcome{Allowed: true, CreditsLeft: w.Left, SecondsUntilReset: secs}
}

// secondsUntil is ceil((end-now)/1000) for end > now, clamped to
// ResetSeconds in case the clock went back.
func (r *Rule) secondsUntil(end, now int64) int64 {
	d := uint64(end) - uint64(now) // exact: end > now
	s := d / msPerSecond
	if d%msPerSecond != 0 {
		s++
	}
	return int64(min(s, uint64(r.ResetSeconds)))
}

// satAdd adds b >= 0 to a, saturating at MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// satMul multiplies two non-negative numbers, saturating at MaxInt64.
func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// windowVersion1 is the only stored format so far; the byte lets a later
// format coexist with stored ones.
const windowVersion1 = 1

// WindowLen is the length of every encoded Window.
const WindowLen = 1 + 8 + 8

// AppendWindow appends the encoding of w: a version byte, then End and Left
// as big-endian 64-bit integers.
func AppendWindow(dst []byte, w Window) []byte {
	dst = append(dst, windowVersion1)
	dst = binary.BigEndian.AppendUint64(dst, uint64(w.End))
	return binary.BigEndian.AppendUint64(dst, uint64(w.Left))
}

// ErrCorrupt is returned for a stored window that cannot be decoded.
var ErrCorrupt = errors.New("policy: stored window is corrupt")

// DecodeWindow decodes a value made by AppendWindow.
func DecodeWindow(b []byte) (Window, error) {
	if len(b) != WindowLen {
		return Window{}, fmt.Errorf("%w: %d bytes, want %d", ErrCorrupt, len(b), WindowLen)
	}
	if b[0] != windowVersion1 {
		return Window{}, fmt.Errorf("%w: format version %d, this build reads version %d", ErrCorrupt, b[0], windowVersion1)
	}
	w := Window{End: int64(binary.BigEndian.Uint64(b[1:])), Left: int64(binary.BigEndian.Uint64(b[9:]))}
	if w.Left < 0 {
		return Window{}, fmt.Errorf("%w: %d credits left", ErrCorrupt, w.Left)
	}
	return w, nil
}
