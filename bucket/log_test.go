package bucket

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

// logStep is one ROLL.* call on a log whose state carries over from the
// previous step of the same table.
type logStep struct {
	p     LogParams
	would bool
	at    int64 // unix µs
	want  [5]int64
	// stored, when not nil, is the log expected after the step.
	stored []int64
}

func runLog(t *testing.T, steps []logStep) LogState {
	t.Helper()
	var s LogState
	for i, st := range steps {
		l, err := NewLog(st.p)
		if err != nil {
			t.Fatalf("step %d: NewLog(%+v): %v", i, st.p, err)
		}
		before := LogState{Interval: s.Interval, Entries: slices.Clone(s.Entries)}
		var (
			r     LogResult
			next  LogState
			write bool
		)
		call := l.Limit
		if st.would {
			call = l.WouldLimit
		}
		next, write, r, err = call(LogState{Interval: s.Interval, Entries: slices.Clone(s.Entries)}, st.at)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if write {
			s = LogState{Interval: next.Interval, Entries: slices.Clone(next.Entries)}
		}
		if got := r.Reply(); got != st.want {
			t.Fatalf("step %d (%+v): got %v, want %v (log before %v)", i, st, got, st.want, before.Entries)
		}
		if st.stored != nil && !slices.Equal(s.Entries, st.stored) {
			t.Fatalf("step %d: stored %v, want %v", i, s.Entries, st.stored)
		}
	}
	return s
}

func roll(interval, max, minDiff int64) LogParams {
	return LogParams{Interval: interval, Max: max, MinDiff: minDiff}
}

func TestLogSpecExample(t *testing.T) {
	// Spec: "Example (interval 10 ms, max 3, MINDIFF 2 ms, AT in µs): LIMIT
	// at 0 → [0,0,0,2,2]; at 4000 → [0,0,0,2,1]; at 5000 → [1,0,1,5,0]; at
	// 8000 → [1,1,0,6,0]; WOULDLIMIT at 11000 → [1,1,0,4,0]; at 17000 →
	// [0,0,0,2,1]."
	p := roll(10, 3, 2)
	runLog(t, []logStep{
		{p: p, at: 0, want: [5]int64{0, 0, 0, 2, 2}, stored: []int64{0}},
		{p: p, at: 4000, want: [5]int64{0, 0, 0, 2, 1}, stored: []int64{0, 4000}},
		{p: p, at: 5000, want: [5]int64{1, 0, 1, 5, 0}, stored: []int64{0, 4000, 5000}},
		{p: p, at: 8000, want: [5]int64{1, 1, 0, 6, 0}, stored: []int64{0, 4000, 5000, 8000}},
		// A look drops the entries an interval old, as the package's
		// wouldLimit (its recorded stored_after_us: [4000, 5000, 8000], then
		// [8000]).
		{p: p, would: true, at: 11000, want: [5]int64{1, 1, 0, 4, 0}, stored: []int64{4000, 5000, 8000}},
		{p: p, would: true, at: 17000, want: [5]int64{0, 0, 0, 2, 1}, stored: []int64{8000}},
	})
}

// A look (WOULDLIMIT) stores the log without the entries an interval old,
// as the package's wouldLimit does, so that neither a longer interval nor
// an earlier AT brings them back (issue 25); one that drops nothing writes
// nothing.
func TestLogLookDropsOldEntries(t *testing.T) {
	l10, l20 := roll(10, 3, 0), roll(20, 3, 0)
	t.Run("longer interval", func(t *testing.T) {
		runLog(t, []logStep{
			{p: l10, at: 0, want: [5]int64{0, 0, 0, 0, 2}, stored: []int64{0}},
			{p: l10, would: true, at: 9_999, want: [5]int64{0, 0, 0, 0, 1}, stored: []int64{0}},
			{p: l10, would: true, at: 10_000, want: [5]int64{0, 0, 0, 0, 2}, stored: []int64{}},
			// With the entry at 0 still stored this would be [0 0 0 0 1].
			{p: l20, at: 10_000, want: [5]int64{0, 0, 0, 0, 2}, stored: []int64{10_000}},
		})
	})
	t.Run("earlier AT", func(t *testing.T) {
		runLog(t, []logStep{
			{p: l10, at: 0, want: [5]int64{0, 0, 0, 0, 2}},
			{p: l10, at: 5_000, want: [5]int64{0, 0, 0, 0, 1}},
			{p: l10, would: true, at: 12_000, want: [5]int64{0, 0, 0, 0, 1}, stored: []int64{5_000}},
			// With the entry at 0 still stored this would be [0 0 0 6 0].
			{p: l10, at: 4_000, want: [5]int64{0, 0, 0, 0, 1}, stored: []int64{5_000, 4_000}},
		})
	})
	l, err := NewLog(l20)
	if err != nil {
		t.Fatal(err)
	}
	next, write, _, err := l.WouldLimit(LogState{Interval: 10, Entries: []int64{0, 5_000}}, 12_000)
	if err != nil || write || next.Interval != 10 || !slices.Equal(next.Entries, []int64{0, 5_000}) {
		t.Fatalf("a look that drops nothing: %+v, write %v, %v; want the log as it was, no write", next, write, err)
	}
	next, write, _, err = l.WouldLimit(LogState{Interval: 10, Entries: []int64{0, 5_000}}, 20_000)
	if err != nil || !write || next.Interval != 20 || !slices.Equal(next.Entries, []int64{5_000}) {
		t.Fatalf("a look that drops an entry: %+v, write %v, %v; want [5000] stored with interval 20", next, write, err)
	}
}

func TestLogEdges(t *testing.T) {
	t.Run("an entry exactly an interval old is dropped", func(t *testing.T) {
		runLog(t, []logStep{
			{p: roll(10, 1, 0), at: 0, want: [5]int64{0, 0, 0, 10, 0}},
			{p: roll(10, 1, 0), would: true, at: 9999, want: [5]int64{1, 1, 0, 10, 0}},
			{p: roll(10, 1, 0), at: 10000, want: [5]int64{0, 0, 0, 10, 0}, stored: []int64{10000}},
		})
	})
	t.Run("several actions in the same µs all count", func(t *testing.T) {
		p := roll(1000, 3, 0)
		runLog(t, []logStep{
			{p: p, at: 5, want: [5]int64{0, 0, 0, 0, 2}},
			{p: p, at: 5, want: [5]int64{0, 0, 0, 0, 1}},
			{p: p, at: 5, want: [5]int64{0, 0, 0, 1000, 0}},
			{p: p, at: 5, want: [5]int64{1, 1, 0, 1000, 0}, stored: []int64{5, 5, 5, 5}},
			// At most max+1 entries are kept.
			{p: p, at: 6, want: [5]int64{1, 1, 0, 1000, 0}, stored: []int64{5, 5, 5, 6}},
		})
	})
	t.Run("ms_until_allowed rounds µs up", func(t *testing.T) {
		p := roll(10, 2, 0)
		runLog(t, []logStep{
			{p: p, at: 1, want: [5]int64{0, 0, 0, 0, 1}},
			{p: p, at: 2, want: [5]int64{0, 0, 0, 10, 0}},                 // 9999 µs
			{p: p, would: true, at: 1000, want: [5]int64{1, 1, 0, 10, 0}}, // 9002 µs
			{p: p, would: true, at: 1001, want: [5]int64{1, 1, 0, 10, 0}}, // 9001 µs
			{p: p, would: true, at: 1002, want: [5]int64{1, 1, 0, 9, 0}},
			// With max 1 the action itself must leave the interval.
			{p: roll(10, 1, 0), would: true, at: 9999, want: [5]int64{1, 1, 0, 10, 0}},
		})
	})
	t.Run("MINDIFF only against the previous entry in the interval", func(t *testing.T) {
		runLog(t, []logStep{
			{p: roll(5, 10, 20), at: 0, want: [5]int64{0, 0, 0, 20, 9}},
			// The previous entry left the interval: no gap to check.
			{p: roll(5, 10, 20), at: 5000, want: [5]int64{0, 0, 0, 20, 9}},
			{p: roll(5, 10, 20), at: 6000, want: [5]int64{1, 0, 1, 20, 8}},
		})
	})
	t.Run("parameters per call", func(t *testing.T) {
		// A call with other parameters reinterprets the stored entries: one
		// dropped under the shorter interval is gone for good, live ones
		// count under the longer one and the larger max.
		runLog(t, []logStep{
			{p: roll(10, 2, 0), at: 0, want: [5]int64{0, 0, 0, 0, 1}},
			{p: roll(10, 2, 0), at: 9000, want: [5]int64{0, 0, 0, 1, 0}},
			{p: roll(10, 2, 0), at: 12000, want: [5]int64{0, 0, 0, 7, 0}, stored: []int64{9000, 12000}},
			{p: roll(100, 2, 0), at: 13000, want: [5]int64{1, 1, 0, 99, 0}, stored: []int64{9000, 12000, 13000}},
			{p: roll(100, 5, 0), at: 14000, want: [5]int64{0, 0, 0, 0, 1}},
		})
	})
	t.Run("AT going backwards", func(t *testing.T) {
		// The log stays in insertion order; the gap is to the last one
		// inserted, negative here, so MINDIFF blocks.
		runLog(t, []logStep{
			{p: roll(10, 5, 1), at: 8000, want: [5]int64{0, 0, 0, 1, 4}},
			{p: roll(10, 5, 1), at: 3000, want: [5]int64{1, 0, 1, 1, 3}, stored: []int64{8000, 3000}},
		})
	})
}

// "a client that retries once per second against "2 per 4 s" gets through
// every 2 s instead of never"
func TestLogNoCountBlocked(t *testing.T) {
	const sec = 1_000_000
	for _, ncb := range []bool{false, true} {
		l, err := NewLog(LogParams{Interval: 4000, Max: 2, NoCountBlocked: ncb})
		if err != nil {
			t.Fatal(err)
		}
		var s LogState
		var allowed []int64
		for i := range int64(60) {
			now := t0*sec + i*sec
			next, write, r, _ := l.Limit(LogState{Interval: s.Interval, Entries: slices.Clone(s.Entries)}, now)
			if write {
				s = LogState{Interval: next.Interval, Entries: slices.Clone(next.Entries)}
			}
			if ncb && r.Blocked && write {
				t.Fatalf("second %d: a blocked NOCOUNTBLOCKED attempt wrote %v", i, next.Entries)
			}
			if !r.Blocked {
				allowed = append(allowed, i)
			}
		}
		if !ncb {
			if !slices.Equal(allowed, []int64{0, 1}) {
				t.Fatalf("without NOCOUNTBLOCKED allowed at seconds %v, want only 0 and 1 (the npm behaviour)", allowed)
			}
			continue
		}
		if len(allowed) != 30 {
			t.Fatalf("NOCOUNTBLOCKED allowed %d of 60 attempts at seconds %v, want 30", len(allowed), allowed)
		}
		for i := 2; i < len(allowed); i++ {
			if allowed[i]-allowed[i-2] < 4 {
				t.Fatalf("3 actions within 4 s: seconds %v", allowed[i-2:i+1])
			}
		}
	}
}

func TestLogDecision(t *testing.T) {
	l, _ := NewLog(roll(10, 2, 0))
	s, _, r, _ := l.Limit(LogState{}, 1_000_000)
	if d := r.Decision(); d != (Decision{Limit: 2, Remaining: 1, RetryAfter: -1, ResetAfter: 10, Used: 1, ResetAt: 1010}) {
		t.Fatalf("first: %+v", d)
	}
	s, _, _, _ = l.Limit(s, 1_004_000)
	_, _, r, _ = l.Limit(s, 1_005_500)
	if d := r.Decision(); d != (Decision{Limited: true, Limit: 2, Remaining: 0, RetryAfter: 9, ResetAfter: 10, Used: 3, ResetAt: 1016}) {
		t.Fatalf("blocked: %+v (%+v)", d, r)
	}
	ncb, _ := NewLog(LogParams{Interval: 10, Max: 2, NoCountBlocked: true})
	_, write, r, _ := ncb.Limit(LogState{Interval: 10, Entries: []int64{1_000_000, 1_004_000}}, 1_005_500)
	if d := r.Decision(); write || d != (Decision{Limited: true, Limit: 2, Remaining: 0, RetryAfter: 9, ResetAfter: 9, Used: 2, ResetAt: 1014}) {
		t.Fatalf("blocked, not counted: %+v, write %v", d, write)
	}
}

func TestLogRefuses(t *testing.T) {
	for _, c := range []struct {
		p   LogParams
		arg string
	}{
		{roll(0, 1, 0), "interval_ms"},
		{roll(-5, 1, 0), "interval_ms"},
		{roll(math.MaxInt64/1000+1, 1, 0), "interval_ms"},
		{roll(10, 0, 0), "max"},
		{roll(10, -1, 0), "max"},
		{roll(10, MaxLogMax+1, 0), "max"},
		{roll(10, 1, -1), "MINDIFF"},
		{roll(10, 1, math.MaxInt64/1000+1), "MINDIFF"},
	} {
		_, err := NewLog(c.p)
		wantArgErr(t, err, c.arg)
	}
	if _, err := NewLog(roll(math.MaxInt64/1000, MaxLogMax, math.MaxInt64/1000)); err != nil {
		t.Fatalf("largest values refused: %v", err)
	}
	_, _, _, err := Log{}.Limit(LogState{}, 0)
	wantArgErr(t, err, "params")
	_, _, _, err = Log{}.WouldLimit(LogState{}, 0)
	wantArgErr(t, err, "params")
}

func TestLogExtremeInstants(t *testing.T) {
	// No overflow wraps a reply: the stored entries and AT may be anywhere
	// in int64.
	l, _ := NewLog(roll(math.MaxInt64/1000, 2, math.MaxInt64/1000))
	for _, c := range []struct {
		entries []int64
		now     int64
	}{
		{[]int64{math.MaxInt64}, math.MinInt64},
		{[]int64{math.MinInt64, math.MaxInt64}, math.MinInt64},
		{[]int64{math.MinInt64}, math.MaxInt64},
		{nil, math.MaxInt64},
	} {
		_, _, r, _ := l.Limit(LogState{Interval: 1, Entries: slices.Clone(c.entries)}, c.now)
		if r.MsUntilAllowed < 0 || r.ActionsRemaining < 0 || r.ResetAfter < 0 {
			t.Errorf("%v at %d: %+v", c.entries, c.now, r)
		}
	}
}

func TestLogIdleAndDescribe(t *testing.T) {
	s := LogState{Interval: 10, Entries: []int64{1_000, 30_000, 20_000}}
	for _, c := range []struct {
		now  int64
		want bool
	}{{0, false}, {39_999, false}, {40_000, true}, {math.MaxInt64, true}, {math.MinInt64, false}} {
		if got := s.Idle(c.now); got != c.want {
			t.Errorf("Idle at %d = %v, want %v", c.now, got, c.want)
		}
	}
	for _, now := range []int64{0, 39_999, 40_000, math.MaxInt64, math.MinInt64} {
		if got, err := LogValueIdle(AppendLogState(nil, s), now); err != nil || got != s.Idle(now) {
			t.Errorf("LogValueIdle at %d = %v, %v; Idle says %v", now, got, err, s.Idle(now))
		}
	}
	if _, err := LogValueIdle([]byte{logVersion1, 10, 2, 0}, 0); !errors.Is(err, ErrCorrupt) {
		t.Errorf("LogValueIdle of a truncated log: %v", err)
	}
	if got := s.Live(25_000); got != 2 {
		t.Errorf("Live = %d, want 2", got)
	}
	if got, want := s.Describe(25_000), "log interval_ms=10 entries=3 live=2 newest=1970-01-01T00:00:00.020000Z"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
	if got := s.Describe(40_000); !strings.HasSuffix(got, " idle") {
		t.Errorf("Describe of an idle log = %q", got)
	}
}

func TestLogStateCodec(t *testing.T) {
	big := make([]int64, MaxLogEntries)
	for i := range big {
		big[i] = t0*1e6 + int64(i)*1500
	}
	for _, s := range []LogState{
		{Interval: 10, Entries: []int64{0}},
		{Interval: 60_000, Entries: []int64{t0 * 1e6, t0*1e6 + 2500, t0*1e6 + 1000}},
		{Interval: math.MaxInt64 / 1000, Entries: []int64{math.MinInt64, math.MaxInt64, math.MinInt64, 0}},
		{Interval: 1, Entries: big},
	} {
		b := AppendLogState(nil, s)
		if len(b) > LogStateLen(len(s.Entries)) {
			t.Fatalf("%d entries take %d bytes, more than LogStateLen", len(s.Entries), len(b))
		}
		got, err := DecodeLogState(make([]int64, 0, 1), b)
		if err != nil || got.Interval != s.Interval || !slices.Equal(got.Entries, s.Entries) {
			t.Fatalf("round trip of %d entries: %v", len(s.Entries), err)
		}
	}
	// Entries 1.5 ms apart take 3 bytes each.
	if n := len(AppendLogState(nil, LogState{Interval: 1, Entries: big})); n > 3*len(big)+16 {
		t.Errorf("%d entries 1.5 ms apart take %d bytes", len(big), n)
	}
	good := AppendLogState(nil, LogState{Interval: 10, Entries: []int64{t0 * 1e6, t0*1e6 + 4000}})
	tooMany := binary.AppendUvarint([]byte{logVersion1, 10}, MaxLogEntries+1)
	tooMany = append(tooMany, make([]byte, MaxLogEntries+1)...)
	for name, b := range map[string][]byte{
		"empty":       nil,
		"short":       {logVersion1, 10},
		"version":     append([]byte{2}, good[1:]...),
		"interval 0":  append([]byte{logVersion1, 0}, good[2:]...),
		"no entries":  {logVersion1, 10, 0},
		"truncated":   good[:len(good)-1],
		"trailing":    append(append([]byte{}, good...), 0),
		"count lies":  {logVersion1, 10, 0xff, 0xff, 0x03, 0, 0},
		"too many":    tooMany,
		"long varint": {logVersion1, 10, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	} {
		if _, err := DecodeLogState(nil, b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: decoding % x gave %v, want ErrCorrupt", name, b[:min(len(b), 16)], err)
		}
	}
}

// specLog is the spec's algorithm, literally, on the whole log: the
// reference FuzzLog compares Limit and WouldLimit with. A look keeps the
// entries still in the interval, as the package's wouldLimit does.
func specLog(p LogParams, list []int64, now int64, would bool) ([5]int64, []int64) {
	I, M, D := p.Interval*1000, int(p.Max), p.MinDiff*1000
	var l []int64
	for _, t := range list {
		if now-I < t {
			l = append(l, t)
		}
	}
	kept := slices.Clone(l)
	l = append(l, now)
	n := len(l)
	cur := l[n-1]
	byCount := n > M
	byGap := n > 1 && D > 0 && cur-l[n-2] < D
	var until int64
	if n >= M {
		until = l[max(0, n-M)] - cur + I
	}
	r := [5]int64{b2i(byCount || byGap), b2i(byCount), b2i(byGap), ceilDiv(max(D, until), 1000), int64(max(M-n, 0))}
	if would || ((byCount || byGap) && p.NoCountBlocked) {
		return r, kept
	}
	return r, l
}

func FuzzLog(f *testing.F) {
	f.Add(int64(10), int64(3), int64(2), false, false, int64(8000), []byte{0, 8, 2, 8})
	f.Add(int64(4000), int64(2), int64(0), true, false, int64(4_000_000), []byte{1, 2, 3})
	f.Add(int64(math.MaxInt64), int64(MaxLogMax), int64(math.MaxInt64), true, true, int64(math.MinInt64), []byte{0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, interval, maxN, minDiff int64, ncb, would bool, now int64, raw []byte) {
		folded := interval%5 != 0
		if folded {
			// Most inputs in everyday ranges, where the spec's arithmetic
			// does not overflow and the reference applies.
			interval, maxN, minDiff = 1+abs(interval%50), 1+abs(maxN%8), abs(minDiff%6)
			now = abs(now % 100_000)
		}
		p := LogParams{Interval: interval, Max: maxN, MinDiff: minDiff, NoCountBlocked: ncb}
		l, err := NewLog(p)
		if err != nil {
			var ae *ArgError
			if !errors.As(err, &ae) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// The stored log: from raw, as timestamps a few ms apart, mostly in
		// order, or as any int64 values.
		var entries []int64
		if folded {
			var at int64
			for _, c := range raw {
				at += int64(int8(c)) * 500
				entries = append(entries, at)
			}
		} else {
			for len(raw) >= 8 {
				entries = append(entries, int64(binary.LittleEndian.Uint64(raw)))
				raw = raw[8:]
			}
		}
		s := LogState{Interval: 7, Entries: slices.Clone(entries)}
		var (
			r     LogResult
			next  LogState
			write bool
		)
		call := l.Limit
		if would {
			call = l.WouldLimit
		}
		next, write, r, err = call(s, now)
		if err != nil {
			t.Fatal(err)
		}
		if r.MsUntilAllowed < 0 || r.ActionsRemaining < 0 || r.ActionsRemaining >= maxN || r.Blocked != (r.BlockedByCount || r.BlockedByMinDiff) {
			t.Fatalf("reply %+v", r)
		}
		if r.Used < 0 || r.ResetAfter < 0 || r.Max != maxN {
			t.Fatalf("result %+v", r)
		}
		if !would {
			if len(next.Entries) > int(maxN)+1 || next.Interval != interval || (!write && !(ncb && r.Blocked)) {
				t.Fatalf("stored %d entries, interval %d, write %v, for %+v", len(next.Entries), next.Interval, write, r)
			}
			// Insertion order: what is stored is a subsequence of the old
			// log, then now if it was recorded.
			rest := next.Entries
			if !(ncb && r.Blocked) {
				if len(rest) == 0 || rest[len(rest)-1] != now {
					t.Fatalf("now %d not stored last: %v", now, rest)
				}
				rest = rest[:len(rest)-1]
			}
			i := 0
			for _, e := range rest {
				for i < len(entries) && entries[i] != e {
					i++
				}
				if i == len(entries) {
					t.Fatalf("stored %v is not a subsequence of %v", next.Entries, entries)
				}
				i++
			}
			b := AppendLogState(nil, next)
			got, err := DecodeLogState(nil, b)
			if err != nil || got.Interval != next.Interval || !slices.Equal(got.Entries, next.Entries) {
				t.Fatalf("round trip of %+v: %+v, %v", next, got, err)
			}
		}
		if folded {
			want, wantStored := specLog(p, entries, now, would)
			if r.Reply() != want {
				t.Fatalf("%+v on %v at %d: got %v, the spec says %v", p, entries, now, r.Reply(), want)
			}
			if would && write != (len(wantStored) != len(entries)) {
				t.Fatalf("%+v on %v at %d: a look wrote %v, the spec keeps %v", p, entries, now, write, wantStored)
			}
			if !would && !slices.Equal(next.Entries, wantStored[max(0, len(wantStored)-int(maxN)-1):]) ||
				would && !slices.Equal(next.Entries, wantStored) {
				t.Fatalf("%+v on %v at %d: stored %v, the spec stores %v", p, entries, now, next.Entries, wantStored)
			}
		}
	})
}

func FuzzDecodeLog(f *testing.F) {
	f.Add(AppendLogState(nil, LogState{Interval: 10, Entries: []int64{t0 * 1e6, t0*1e6 + 4000}}))
	f.Add([]byte{logVersion1, 10, 1, 0x80, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeLogState(nil, b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			if _, err := LogValueIdle(b, 0); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("LogValueIdle accepted %x: %v", b, err)
			}
			return
		}
		if s.Interval < 1 || len(s.Entries) < 1 || len(s.Entries) > MaxLogEntries {
			t.Fatalf("decoded interval %d, %d entries", s.Interval, len(s.Entries))
		}
		for _, now := range []int64{0, s.Entries[0], math.MaxInt64} {
			if idle, err := LogValueIdle(b, now); err != nil || idle != s.Idle(now) {
				t.Fatalf("LogValueIdle(%x, %d) = %v, %v; Idle says %v", b, now, idle, err, s.Idle(now))
			}
		}
		if got := AppendLogState(nil, s); !bytes.Equal(got, b) {
			s2, err := DecodeLogState(nil, got)
			if err != nil || s2.Interval != s.Interval || !slices.Equal(s2.Entries, s.Entries) {
				t.Fatalf("re-encoding %x gave %x", b, got)
			}
		}
	})
}

// BenchmarkLog is the per-command log work of ROLL.LIMIT with max 10:
// validate, decode the stored log into a reused array, limit, encode.
func BenchmarkLog(b *testing.B) {
	p := roll(60_000, 10, 0)
	entries := make([]int64, 11)
	for i := range entries {
		entries[i] = t0*1e6 + int64(i)*1000
	}
	stored := AppendLogState(nil, LogState{Interval: 60_000, Entries: entries})
	buf := make([]int64, 0, 16)
	vbuf := make([]byte, 0, LogStateLen(11))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		l, err := NewLog(p)
		if err != nil {
			b.Fatal(err)
		}
		s, err := DecodeLogState(buf, stored)
		if err != nil {
			b.Fatal(err)
		}
		next, _, r, err := l.Limit(s, t0*1e6+20_000+int64(i%1000))
		if err != nil {
			b.Fatal(err)
		}
		sinkLog = r
		vbuf = AppendLogState(vbuf[:0], next)
	}
}

var sinkLog LogResult
