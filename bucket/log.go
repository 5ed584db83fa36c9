package bucket

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"
)

// MaxLogMax is the largest max of a sliding log (ROLL.*): the spec's range.
const MaxLogMax = 100_000

// LogParams are the arguments of one ROLL.LIMIT or ROLL.WOULDLIMIT, in the
// npm rolling-rate-limiter's units: "no more than Max actions per Interval
// ms, and none closer than MinDiff ms to the previous one".
//
// A log is identified by its key alone, as the npm package keeps one sorted
// set per id: the parameters are per call, and a call with other parameters
// reinterprets the stored timestamps.
type LogParams struct {
	Interval       int64 // ms; >= 1
	Max            int64 // 1 to MaxLogMax
	MinDiff        int64 // ms; >= 0, 0 disables the gap check
	NoCountBlocked bool  // LIMIT: a blocked attempt is not recorded
}

// Log is a validated LogParams, with its durations in µs. Build it with
// NewLog.
type Log struct {
	intervalMs     int64
	interval       int64 // µs
	minDiff        int64 // µs
	max            int
	noCountBlocked bool
}

// NewLog validates p. It refuses, with an *ArgError naming the argument,
// values out of range and durations whose microseconds overflow int64.
func NewLog(p LogParams) (Log, error) {
	switch {
	case p.Interval < 1:
		return Log{}, &ArgError{Arg: "interval_ms", Msg: fmt.Sprintf("%d: want 1 or more", p.Interval)}
	case p.Max < 1 || p.Max > MaxLogMax:
		return Log{}, &ArgError{Arg: "max", Msg: fmt.Sprintf("%d: want 1 to %d", p.Max, MaxLogMax)}
	case p.MinDiff < 0:
		return Log{}, &ArgError{Arg: "MINDIFF", Msg: fmt.Sprintf("%d: want 0 or more", p.MinDiff)}
	}
	i, ok := mulOK(p.Interval, 1000)
	if !ok {
		return Log{}, &ArgError{Arg: "interval_ms", Msg: fmt.Sprintf("%d: too long, its microseconds overflow int64: want at most %d", p.Interval, math.MaxInt64/1000)}
	}
	d, ok := mulOK(p.MinDiff, 1000)
	if !ok {
		return Log{}, &ArgError{Arg: "MINDIFF", Msg: fmt.Sprintf("%d: too long, its microseconds overflow int64: want at most %d", p.MinDiff, math.MaxInt64/1000)}
	}
	return Log{intervalMs: p.Interval, interval: i, minDiff: d, max: int(p.Max), noCountBlocked: p.NoCountBlocked}, nil
}

// LogState is what is stored for a log: the interval of the last call that
// wrote it, which lets the sweep judge it without parameters, and the action
// timestamps in unix µs, in insertion order, newest last, at most
// MaxLogMax+1 of them.
type LogState struct {
	Interval int64 // ms; >= 1
	Entries  []int64
}

// LogResult is the answer of one ROLL.LIMIT or ROLL.WOULDLIMIT: the five
// elements of the reply, and what a Decision needs besides.
type LogResult struct {
	Blocked          bool
	BlockedByCount   bool
	BlockedByMinDiff bool
	MsUntilAllowed   int64 // >= 0
	ActionsRemaining int64 // 0 <= ActionsRemaining < max

	Max int64
	// Used is how many actions of the log are in the interval after the
	// call, this one included when it was recorded.
	Used int64
	// ResetAfter is the ms, rounded up, until every action of the log is
	// out of the interval, and ResetAt that instant in unix ms.
	ResetAfter, ResetAt int64
}

// Reply is the five-element reply of ROLL.LIMIT and ROLL.WOULDLIMIT.
func (r LogResult) Reply() [5]int64 {
	return [5]int64{b2i(r.Blocked), b2i(r.BlockedByCount), b2i(r.BlockedByMinDiff), r.MsUntilAllowed, r.ActionsRemaining}
}

// Decision describes the call as the other kinds do, for X-RateLimit-*
// headers: limit max, remaining actions_remaining, retry after
// ms_until_allowed when blocked. Its durations are in ms.
func (r LogResult) Decision() Decision {
	d := Decision{
		Limited:    r.Blocked,
		Limit:      r.Max,
		Remaining:  r.ActionsRemaining,
		RetryAfter: -1,
		ResetAfter: r.ResetAfter,
		Used:       r.Used,
		ResetAt:    r.ResetAt,
	}
	if r.Blocked {
		d.RetryAfter = r.MsUntilAllowed
	}
	return d
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// IntervalMillis is the interval in ms, as stored with the log.
func (l Log) IntervalMillis() int64 { return l.intervalMs }

// Limit is ROLL.LIMIT at now (unix µs: AT, or the server clock) on the
// stored log s (no entries for a new key). It returns the state to store
// when write is true.
//
// Limit works in place: it filters s.Entries and appends to it, so the
// returned state shares s.Entries' array and s must not be used after.
// Only the last max+1 entries are kept: while timestamps arrive in order,
// older ones cannot change any reply.
//
// It fails only for a Log not built by NewLog.
func (l Log) Limit(s LogState, now int64) (next LogState, write bool, r LogResult, err error) {
	if l.max < 1 {
		return s, false, LogResult{}, errLogZero
	}
	live, dropped := l.filter(s.Entries, now)
	r = l.evaluate(live, now)
	next.Interval = l.intervalMs
	if r.Blocked && l.noCountBlocked {
		next.Entries = keepLast(live, l.max+1)
		r.Used--
		write = dropped || len(next.Entries) != len(live) || s.Interval != l.intervalMs
	} else {
		next.Entries = keepLast(append(live, now), l.max+1)
		write = true
	}
	l.resetTimes(&r, next.Entries, now)
	return next, write, r, nil
}

// WouldLimit is ROLL.WOULDLIMIT: Limit's reply without recording this
// call. Like the package's wouldLimit it drops the entries an interval old
// or older, which a later call with a longer interval or an earlier AT
// would otherwise see: it returns the state to store when it dropped any
// (with no entries, the log is to be deleted). Like Limit it filters
// s.Entries in place.
func (l Log) WouldLimit(s LogState, now int64) (next LogState, write bool, r LogResult, err error) {
	if l.max < 1 {
		return s, false, LogResult{}, errLogZero
	}
	live, dropped := l.filter(s.Entries, now)
	r = l.evaluate(live, now)
	r.Used--
	l.resetTimes(&r, live, now)
	if !dropped {
		return LogState{Interval: s.Interval, Entries: live}, false, r, nil
	}
	return LogState{Interval: l.intervalMs, Entries: live}, true, r, nil
}

var errLogZero = &ArgError{Arg: "params", Msg: "Log not built by NewLog"}

// filter keeps, in place and in order, the entries still in the interval at
// now: t > now - interval, so an entry exactly an interval old is dropped.
func (l Log) filter(entries []int64, now int64) (live []int64, dropped bool) {
	thr, ok := subOK(now, l.interval)
	if !ok {
		return entries, false // now - interval is below every int64
	}
	live = entries[:0]
	for _, t := range entries {
		if t > thr {
			live = append(live, t)
		}
	}
	return live, len(live) != len(entries)
}

// evaluate is the spec's evaluate(live + [now]), without appending.
func (l Log) evaluate(live []int64, now int64) LogResult {
	n := len(live) + 1
	r := LogResult{Max: int64(l.max), Used: int64(n)}
	r.BlockedByCount = n > l.max
	if n > 1 && l.minDiff > 0 {
		prev := live[n-2]
		if d, ok := subOK(now, prev); ok {
			r.BlockedByMinDiff = d < l.minDiff
		} else {
			r.BlockedByMinDiff = prev > now
		}
	}
	r.Blocked = r.BlockedByCount || r.BlockedByMinDiff
	var until int64
	if n >= l.max {
		// The max-th newest action, counting this one, must leave the
		// interval first.
		j := n - l.max
		e := now
		if j < len(live) {
			e = live[j]
		}
		until = clampAdd(clampSub(e, now), l.interval)
	}
	r.MsUntilAllowed = ceilDiv(max(l.minDiff, until), 1000)
	r.ActionsRemaining = int64(max(l.max-n, 0))
	return r
}

// resetTimes sets r's reset times from the log as it stands after the call.
func (l Log) resetTimes(r *LogResult, entries []int64, now int64) {
	if len(entries) == 0 {
		r.ResetAfter, r.ResetAt = 0, ceilDiv(now, 1000)
		return
	}
	newest := entries[0]
	for _, t := range entries[1:] {
		newest = max(newest, t)
	}
	end := clampAdd(newest, l.interval)
	r.ResetAfter = ceilDiv(max(clampSub(end, now), 0), 1000)
	r.ResetAt = ceilDiv(end, 1000)
}

func keepLast(entries []int64, n int) []int64 {
	if len(entries) > n {
		return entries[len(entries)-n:]
	}
	return entries
}

// clampAdd and clampSub saturate at the int64 limits: stored timestamps and AT
// may be anywhere in int64, and a reply beyond its range is still ordered
// right.
func clampAdd(a, b int64) int64 {
	if s, ok := addOK(a, b); ok {
		return s
	}
	if b > 0 {
		return math.MaxInt64
	}
	return math.MinInt64
}

func clampSub(a, b int64) int64 {
	if d, ok := subOK(a, b); ok {
		return d
	}
	if b < 0 {
		return math.MaxInt64
	}
	return math.MinInt64
}

// Idle reports whether every entry of s is an interval old or older at now
// (unix µs on the server clock): the next call sees an empty log, so the
// sweep may delete it.
func (s LogState) Idle(now int64) bool {
	thr, ok := subOK(now, satMul1000(s.Interval))
	if !ok {
		return false
	}
	for _, t := range s.Entries {
		if t > thr {
			return false
		}
	}
	return true
}

func satMul1000(ms int64) int64 {
	if us, ok := mulOK(ms, 1000); ok {
		return us
	}
	return math.MaxInt64
}

// Live is how many entries of s are in its interval at now (unix µs).
func (s LogState) Live(now int64) int {
	thr, ok := subOK(now, satMul1000(s.Interval))
	if !ok {
		return len(s.Entries)
	}
	n := 0
	for _, t := range s.Entries {
		if t > thr {
			n++
		}
	}
	return n
}

// Describe is a one-line summary of s at now (unix µs) for sluice inspect.
func (s LogState) Describe(now int64) string {
	d := fmt.Sprintf("log interval_ms=%d entries=%d live=%d", s.Interval, len(s.Entries), s.Live(now))
	if len(s.Entries) > 0 {
		d += " newest=" + time.UnixMicro(s.Entries[len(s.Entries)-1]).UTC().Format("2006-01-02T15:04:05.000000Z")
	}
	if s.Idle(now) {
		d += " idle"
	}
	return d
}

// logVersion1 is the only log value format so far.
const logVersion1 = 1

// MaxLogEntries is the most entries a stored log holds: max+1 for the
// largest max.
const MaxLogEntries = MaxLogMax + 1

// AppendLogState appends the encoding of s: a version byte, the interval
// in ms and the number of entries as unsigned varints, the first entry as a
// signed varint, then each next entry as a signed varint of its difference
// from the one before (wrapping, so that any int64 timestamps round-trip).
// Entries a few ms apart take two or three bytes each.
func AppendLogState(dst []byte, s LogState) []byte {
	dst = append(dst, logVersion1)
	dst = binary.AppendUvarint(dst, uint64(s.Interval))
	dst = binary.AppendUvarint(dst, uint64(len(s.Entries)))
	var prev int64
	for _, t := range s.Entries {
		dst = binary.AppendVarint(dst, int64(uint64(t)-uint64(prev)))
		prev = t
	}
	return dst
}

// LogStateLen is the most bytes AppendLogState appends for a log of n
// entries.
func LogStateLen(n int) int { return 1 + 2*binary.MaxVarintLen64 + n*binary.MaxVarintLen64 }

// DecodeLogState decodes a value made by AppendLogState. The entries are
// appended to dst[:0], so that a caller can reuse one array.
func DecodeLogState(dst []int64, b []byte) (LogState, error) {
	it, err := newLogIter(b)
	if err != nil {
		return LogState{}, err
	}
	// The loop of logIter.next, inline: decoding is most of a command's
	// work on a large log.
	entries := slices.Grow(dst[:0], it.n)[:it.n]
	rest, prev := it.rest, int64(0)
	for i := range entries {
		var d int64
		if len(rest) > 0 && rest[0] < 0x80 {
			// One byte, a gap under 64 µs: zigzag-decode it here.
			c := int64(rest[0])
			d, rest = c>>1^-(c&1), rest[1:]
		} else {
			var k int
			if d, k = binary.Varint(rest); k <= 0 {
				return LogState{}, fmt.Errorf("%w: log entry %d truncated or too long", ErrCorrupt, i)
			}
			rest = rest[k:]
		}
		prev = int64(uint64(prev) + uint64(d))
		entries[i] = prev
	}
	if len(rest) != 0 {
		return LogState{}, fmt.Errorf("%w: %d trailing bytes after the log entries", ErrCorrupt, len(rest))
	}
	return LogState{Interval: it.interval, Entries: entries}, nil
}

// LogValueIdle is LogState.Idle on an encoded log, without decoding it into
// memory: the sweep judges logs of up to MaxLogEntries entries.
func LogValueIdle(b []byte, now int64) (bool, error) {
	it, err := newLogIter(b)
	if err != nil {
		return false, err
	}
	thr, ok := subOK(now, satMul1000(it.interval))
	idle := ok
	for it.n > 0 {
		t, err := it.next()
		if err != nil {
			return false, err
		}
		if t > thr {
			idle = false
		}
	}
	if err := it.end(); err != nil {
		return false, err
	}
	return idle, nil
}

// logIter reads the entries of an encoded log one at a time.
type logIter struct {
	interval int64
	n        int // entries left
	i        int // entries read
	prev     int64
	rest     []byte
}

func newLogIter(b []byte) (logIter, error) {
	if len(b) < 3 {
		return logIter{}, fmt.Errorf("%w: log value of %d bytes, want at least 3", ErrCorrupt, len(b))
	}
	if b[0] != logVersion1 {
		return logIter{}, fmt.Errorf("%w: log format version %d, this build reads version %d", ErrCorrupt, b[0], logVersion1)
	}
	rest := b[1:]
	iv, k := binary.Uvarint(rest)
	if k <= 0 || iv < 1 || iv > math.MaxInt64/1000 {
		return logIter{}, fmt.Errorf("%w: log interval truncated or out of range", ErrCorrupt)
	}
	rest = rest[k:]
	n, k := binary.Uvarint(rest)
	if k <= 0 || n < 1 || n > MaxLogEntries {
		return logIter{}, fmt.Errorf("%w: log of %d entries, want 1 to %d", ErrCorrupt, n, MaxLogEntries)
	}
	rest = rest[k:]
	if n > uint64(len(rest)) {
		// Each entry takes a byte at least: refuse before allocating.
		return logIter{}, fmt.Errorf("%w: log of %d entries in %d bytes", ErrCorrupt, n, len(rest))
	}
	return logIter{interval: int64(iv), n: int(n), rest: rest}, nil
}

func (it *logIter) next() (int64, error) {
	d, k := binary.Varint(it.rest)
	if k <= 0 {
		return 0, fmt.Errorf("%w: log entry %d truncated or too long", ErrCorrupt, it.i)
	}
	it.rest = it.rest[k:]
	it.prev = int64(uint64(it.prev) + uint64(d))
	it.n--
	it.i++
	return it.prev, nil
}

func (it *logIter) end() error {
	if len(it.rest) != 0 {
		return fmt.Errorf("%w: %d trailing bytes after the log entries", ErrCorrupt, len(it.rest))
	}
	return nil
}
