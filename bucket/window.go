package bucket

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// WindowParams are the arguments of one FW.INCR or FW.GET (Unit Second) or
// FW.PINCR or FW.PGET (Unit Millisecond).
//
// A counter is identified by the key, the window length in milliseconds and
// Stagger; Limit, Cost and NoCountBlocked are per call, so the limit can
// change between calls and keep the count.
type WindowParams struct {
	Limit          int64 // >= 0
	Window         int64 // in Unit; >= 1
	Cost           int64 // >= 0; the commands' default is 1
	Unit           Unit
	Stagger        bool // shift the windows by a per-key offset
	NoCountBlocked bool // INCR: a blocked call does not count
}

// Window is a validated WindowParams for one key, with the window's length
// and offset in milliseconds. Build it with NewWindow.
type Window struct {
	limit, cost    int64
	ms, offset     int64
	unit           Unit
	stagger        bool
	noCountBlocked bool
}

// NewWindow validates p for key and computes the window's offset: 0, or
// with Stagger the 64-bit FNV-1a hash of key mod the window length in ms.
// It refuses with an *ArgError naming the argument.
func NewWindow(p WindowParams, key []byte) (Window, error) {
	switch {
	case !p.Unit.valid():
		return Window{}, &ArgError{Arg: "unit", Msg: fmt.Sprintf("unknown unit %d", p.Unit)}
	case p.Limit < 0:
		return Window{}, &ArgError{Arg: "limit", Msg: fmt.Sprintf("%d: want 0 or more", p.Limit)}
	case p.Window < 1:
		return Window{}, &ArgError{Arg: "window", Msg: fmt.Sprintf("%d: want 1 or more", p.Window)}
	case p.Cost < 0:
		return Window{}, &ArgError{Arg: "COST", Msg: fmt.Sprintf("%d: want 0 or more", p.Cost)}
	}
	ms, ok := mulOK(p.Window, p.Unit.millis())
	if !ok {
		return Window{}, &ArgError{Arg: "window", Msg: fmt.Sprintf("%d: too long, its milliseconds overflow int64: want at most %d", p.Window, math.MaxInt64/p.Unit.millis())}
	}
	w := Window{limit: p.Limit, cost: p.Cost, ms: ms, unit: p.Unit, stagger: p.Stagger, noCountBlocked: p.NoCountBlocked}
	if p.Stagger {
		w.offset = int64(fnv1a64(key) % uint64(ms))
	}
	return w, nil
}

// fnv1a64 is the 64-bit FNV-1a hash. hash/fnv computes the same through an
// interface, which costs an allocation per call.
func fnv1a64(b []byte) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for _, c := range b {
		h ^= uint64(c)
		h *= prime64
	}
	return h
}

// Millis is the window length in milliseconds, part of the counter's
// identity.
func (w Window) Millis() int64 { return w.ms }

// Offset is the shift of the windows from the Unix epoch, in ms: 0 unless
// staggered.
func (w Window) Offset() int64 { return w.offset }

// Staggered reports whether the windows are staggered, part of the
// counter's identity.
func (w Window) Staggered() bool { return w.stagger }

// Bounds returns the window that contains now (unix ms): start <= now < end.
// It fails only when end does not fit in int64.
func (w Window) Bounds(now int64) (start, end int64, err error) {
	if w.ms < 1 {
		return 0, 0, &ArgError{Arg: "params", Msg: "Window not built by NewWindow"}
	}
	x, ok := subOK(now, w.offset)
	if ok {
		mod := x % w.ms
		if mod < 0 {
			mod += w.ms
		}
		// x - mod is floor(x / ms) * ms, which can be below MinInt64 when
		// computed as a product.
		start, ok = subOK(x, mod)
		start += w.offset // <= now: cannot overflow
	}
	if ok {
		end, ok = addOK(start, w.ms)
	}
	if !ok {
		return 0, 0, &ArgError{Arg: "AT", Msg: fmt.Sprintf("%d ms: the window around it does not fit in int64 milliseconds", now)}
	}
	return start, end, nil
}

// WindowState is what is stored for a counter: the end of the window it
// counts (which identifies the window, and lets the sweep judge it without
// parameters) and its count.
type WindowState struct {
	End   int64 // unix ms
	Count int64 // >= 0
}

// Incr is FW.INCR at now (unix ms: AT converted with Unit.Millis, or the
// server clock) on a counter whose stored state is s when found. It returns
// the state to store when write is true. A call that leaves the count as it
// was (COST 0, or blocked with NoCountBlocked) does not write.
func (w Window) Incr(s WindowState, found bool, now int64) (next WindowState, write bool, d Decision, err error) {
	return w.decide(s, found, now, true)
}

// Get is FW.GET: Incr's decision without counting.
func (w Window) Get(s WindowState, found bool, now int64) (Decision, error) {
	_, _, d, err := w.decide(s, found, now, false)
	return d, err
}

func (w Window) decide(s WindowState, found bool, now int64, incr bool) (next WindowState, write bool, d Decision, err error) {
	_, end, err := w.Bounds(now)
	if err != nil {
		return s, false, Decision{}, err
	}
	var count int64
	if found && s.End == end {
		count = max(s.Count, 0)
	}
	// limit >= 0 and count >= 0, so limit-count cannot overflow.
	allowed := w.cost <= w.limit-count
	used := count
	if incr && (allowed || !w.noCountBlocked) {
		// Only a refused request can overflow (an allowed one stays within
		// the limit): its count saturates, so that one huge COST cannot
		// turn every later call of the window into an error.
		var ok bool
		if used, ok = addOK(count, w.cost); !ok {
			used = math.MaxInt64
		}
	}
	if used != count {
		next, write = WindowState{End: end, Count: used}, true
	} else {
		next = s
	}
	resetAfter := end - now // in (0, ms]: cannot overflow
	d = Decision{
		Limited:    !allowed,
		Limit:      w.limit,
		Remaining:  max(w.limit-used, 0),
		RetryAfter: -1,
		ResetAfter: ceilDiv(resetAfter, w.unit.millis()),
		Used:       used,
		ResetAt:    ceilDiv(end, w.unit.millis()),
	}
	if !allowed && w.cost <= w.limit {
		d.RetryAfter = d.ResetAfter
	}
	return next, write, d, nil
}

// Idle reports whether s's window has ended at now (unix ms on the server
// clock): the next call on the server clock counts from 0, so the sweep may
// delete it.
func (s WindowState) Idle(now int64) bool { return now >= s.End }

// Describe is a one-line summary of s at now (unix ms) for sluice inspect.
func (s WindowState) Describe(now int64) string {
	idle := ""
	if s.Idle(now) {
		idle = " idle"
	}
	return fmt.Sprintf("fw count=%d end=%s%s", s.Count, time.UnixMilli(s.End).UTC().Format("2006-01-02T15:04:05.000Z"), idle)
}

// windowVersion1 is the only window value format so far.
const windowVersion1 = 1

// MaxWindowStateLen is the most bytes AppendWindowState appends.
const MaxWindowStateLen = 1 + 2*binary.MaxVarintLen64

// AppendWindowState appends the encoding of s: a version byte, the end as a
// signed varint, the count as an unsigned varint.
func AppendWindowState(dst []byte, s WindowState) []byte {
	dst = append(dst, windowVersion1)
	dst = binary.AppendVarint(dst, s.End)
	return binary.AppendUvarint(dst, uint64(s.Count))
}

// DecodeWindowState decodes a value made by AppendWindowState.
func DecodeWindowState(b []byte) (WindowState, error) {
	if len(b) < 3 {
		return WindowState{}, fmt.Errorf("%w: window value of %d bytes, want at least 3", ErrCorrupt, len(b))
	}
	if b[0] != windowVersion1 {
		return WindowState{}, fmt.Errorf("%w: window format version %d, this build reads version %d", ErrCorrupt, b[0], windowVersion1)
	}
	end, n := binary.Varint(b[1:])
	if n <= 0 {
		return WindowState{}, fmt.Errorf("%w: window end truncated or too long", ErrCorrupt)
	}
	rest := b[1+n:]
	count, m := binary.Uvarint(rest)
	if m <= 0 {
		return WindowState{}, fmt.Errorf("%w: window count truncated or too long", ErrCorrupt)
	}
	if count > math.MaxInt64 {
		return WindowState{}, fmt.Errorf("%w: window count %d out of range", ErrCorrupt, count)
	}
	if m != len(rest) {
		return WindowState{}, fmt.Errorf("%w: %d trailing bytes after the window count", ErrCorrupt, len(rest)-m)
	}
	return WindowState{End: end, Count: int64(count)}, nil
}
