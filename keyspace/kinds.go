package keyspace

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/policy"
)

// The kinds' key splitting, idleness and descriptions. Token buckets and
// divvy counters keep milliseconds, GCRA nanoseconds, windows milliseconds,
// logs microseconds.

const nsPerMs = int64(1e6)

// uvarints reads n positive int64 uvarints from the start of b and returns
// them with the number of bytes they take.
func uvarints(b []byte, vals []int64) (int, bool) {
	off := 0
	for i := range vals {
		u, n := binary.Uvarint(b[off:])
		if n <= 0 || u < 1 || u > math.MaxInt64 {
			return 0, false
		}
		vals[i] = int64(u)
		off += n
	}
	return off, true
}

func bucketParams(params []byte) (bucket.Params, bool) {
	var v [3]int64
	if _, ok := uvarints(params, v[:]); !ok {
		return bucket.Params{}, false
	}
	return bucket.Params{Max: v[0], RefillAmount: v[1], RefillMs: v[2]}, true
}

func splitBucket(rest []byte) (int, bool) {
	var v [3]int64
	return uvarints(rest, v[:])
}

func idleBucket(params, val []byte, now int64) (bool, error) {
	p, ok := bucketParams(params)
	if !ok {
		return false, ErrBadKey
	}
	st, err := bucket.DecodeState(val)
	if err != nil {
		return false, err
	}
	return p.Idle(st, floorMs(now)), nil
}

func describeBucket(params, val []byte, now int64) (Description, error) {
	p, ok := bucketParams(params)
	if !ok {
		return Description{}, ErrBadKey
	}
	st, err := bucket.DecodeState(val)
	if err != nil {
		return Description{}, err
	}
	ms := floorMs(now)
	tokens, _ := p.Available(st, true, ms)
	d := Description{
		Params: fmt.Sprintf("max=%d refill=%d refill_ms=%d", p.Max, p.RefillAmount, p.RefillMs),
		State:  fmt.Sprintf("tokens=%d last_write=%s", tokens, fmtMs(st.LastReduce)),
		Idle:   p.Idle(st, ms),
		Fields: []Field{
			{"max", p.Max}, {"refill", p.RefillAmount}, {"refill_ms", p.RefillMs},
			{"tokens", tokens}, {"stored_tokens", st.Amount}, {"anchor_ms", st.Anchor},
			{"last_write_ms", st.LastReduce},
		},
	}
	if st.HasSession {
		d.State += " session_start=" + fmtMs(st.SessionStart)
		d.Fields = append(d.Fields, Field{"session_start_ms", st.SessionStart})
	}
	return d, nil
}

func splitCounter(rest []byte) (int, bool) {
	return policy.CounterIDLen, len(rest) >= policy.CounterIDLen
}

func idleCounter(_, val []byte, now int64) (bool, error) {
	w, err := policy.DecodeWindow(val)
	if err != nil {
		return false, err
	}
	return w.Expired(floorMs(now)), nil
}

func describeCounter(params, val []byte, now int64) (Description, error) {
	w, err := policy.DecodeWindow(val)
	if err != nil {
		return Description{}, err
	}
	idle := w.Expired(floorMs(now))
	return Description{
		Params: fmt.Sprintf("rule=%x", params),
		State:  fmt.Sprintf("credits_left=%d window_end=%s", w.Left, fmtMs(w.End)),
		Idle:   idle,
		Fields: []Field{{"rule", fmt.Sprintf("%x", params)}, {"credits_left", w.Left}, {"window_end_ms", w.End}},
	}, nil
}

func idleGCRA(_, val []byte, now int64) (bool, error) {
	s, err := bucket.DecodeGCRAState(val)
	if err != nil {
		return false, err
	}
	return s.Idle(now), nil
}

func describeGCRA(_, val []byte, now int64) (Description, error) {
	s, err := bucket.DecodeGCRAState(val)
	if err != nil {
		return Description{}, err
	}
	d := Description{
		State:  "tat=" + time.Unix(0, s.TAT).UTC().Format("2006-01-02T15:04:05.000000000Z"),
		Idle:   s.Idle(now),
		Fields: []Field{{"tat_ns", s.TAT}},
	}
	if !d.Idle {
		// tat > now: as unsigned the difference cannot wrap.
		full := uint64(s.TAT) - uint64(now)
		d.State += fmt.Sprintf(" full_in=%s", time.Duration(min(full, math.MaxInt64)))
		d.Fields = append(d.Fields, Field{"full_in_ns", full})
	}
	return d, nil
}

func splitWindow(rest []byte) (int, bool) {
	var v [1]int64
	n, ok := uvarints(rest, v[:])
	if !ok || len(rest) <= n || rest[n] > 1 {
		return 0, false
	}
	return n + 1, true
}

func idleWindow(_, val []byte, now int64) (bool, error) {
	s, err := bucket.DecodeWindowState(val)
	if err != nil {
		return false, err
	}
	return s.Idle(floorMs(now)), nil
}

func describeWindow(params, val []byte, now int64) (Description, error) {
	var v [1]int64
	n, ok := uvarints(params, v[:])
	if !ok || len(params) != n+1 {
		return Description{}, ErrBadKey
	}
	s, err := bucket.DecodeWindowState(val)
	if err != nil {
		return Description{}, err
	}
	stagger := params[n] == 1
	p := fmt.Sprintf("window_ms=%d", v[0])
	if stagger {
		p += " stagger"
	}
	return Description{
		Params: p,
		State:  fmt.Sprintf("count=%d window_end=%s", s.Count, fmtMs(s.End)),
		Idle:   s.Idle(floorMs(now)),
		Fields: []Field{{"window_ms", v[0]}, {"stagger", stagger}, {"count", s.Count}, {"window_end_ms", s.End}},
	}, nil
}

func idleLog(_, val []byte, now int64) (bool, error) {
	// Judged on the encoded value: a log may hold up to
	// bucket.MaxLogEntries entries, and the sweep need not copy them.
	return bucket.LogValueIdle(val, floorUs(now))
}

func describeLog(_, val []byte, now int64) (Description, error) {
	s, err := bucket.DecodeLogState(nil, val)
	if err != nil {
		return Description{}, err
	}
	us := floorUs(now)
	live := s.Live(us)
	first, last := s.Entries[0], s.Entries[len(s.Entries)-1]
	return Description{
		State: fmt.Sprintf("interval_ms=%d entries=%d live=%d oldest=%s newest=%s", s.Interval, len(s.Entries), live, fmtUs(first), fmtUs(last)),
		Idle:  s.Idle(us),
		Fields: []Field{{"interval_ms", s.Interval}, {"entries", len(s.Entries)}, {"live", live},
			{"oldest_us", first}, {"newest_us", last}},
	}, nil
}

// floorUs converts unix ns to unix µs, rounding down.
func floorUs(ns int64) int64 {
	us := ns / 1000
	if ns%1000 < 0 {
		us--
	}
	return us
}

func fmtUs(us int64) string {
	return time.UnixMicro(us).UTC().Format("2006-01-02T15:04:05.000000Z")
}

// floorMs converts unix ns to unix ms, rounding down.
func floorMs(ns int64) int64 {
	ms := ns / nsPerMs
	if ns%nsPerMs < 0 {
		ms--
	}
	return ms
}

func fmtMs(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
}
