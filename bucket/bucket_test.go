package bucket

import (
	"bytes"
	"math"
	"testing"
)

// step is one request against a bucket whose state carries over from the
// previous step of the same table.
type step struct {
	op     string // "reduce", "get" or "sess"
	at     int64  // ms
	take   int64
	strict bool
	want   int64 // tokens before the take
	// wantSess is the reported session start, for "sess" steps.
	wantSess int64
}

func runSteps(t *testing.T, p Params, steps []step) {
	t.Helper()
	var s State
	found := false
	for i, st := range steps {
		r := Request{Now: st.at, Server: 1_000_000, Take: st.take, Strict: st.strict}
		var got, sess int64
		var next State
		var write bool
		switch st.op {
		case "reduce":
			got, next, write = p.Reduce(s, found, r)
		case "get":
			got, _ = p.Available(s, found, st.at)
		case "sess":
			got, sess, next, write = p.Sessionize(s, found, r)
			if sess != st.wantSess {
				t.Fatalf("step %d (%+v): session start %d, want %d", i, st, sess, st.wantSess)
			}
		default:
			t.Fatalf("bad op %q", st.op)
		}
		if got != st.want {
			t.Fatalf("step %d (%+v): got %d tokens, want %d (state before %+v, found %v)", i, st, got, st.want, s, found)
		}
		if write {
			s, found = next, true
		}
	}
}

// The upstream GetReduceCommands case at the arithmetic level: max 10,
// refill 3 tokens every 5 s.
func TestReduceUpstreamSequence(t *testing.T) {
	runSteps(t, Params{Max: 10, RefillAmount: 3, RefillMs: 5000}, []step{
		{op: "reduce", at: 2000, take: 1, want: 10},
		{op: "reduce", at: 2000, take: 1, want: 9},
		{op: "get", at: 2000, want: 8},
		{op: "reduce", at: 2000, take: 5, want: 8},
		{op: "reduce", at: 2000, take: 5, want: 3}, // denied: drains to 0
		{op: "get", at: 2000, want: 0},
		{op: "get", at: 8000, want: 3}, // one refill since the anchor at 2000
		{op: "reduce", at: 8000, take: 2, want: 3},
		{op: "reduce", at: 8000, take: 1, want: 1},
		{op: "reduce", at: 9000, take: 1, want: 0}, // anchor 7000: no refill yet
		{op: "get", at: 13000, want: 3},
		{op: "reduce", at: 14000, take: 4, strict: true, want: 3},  // emptied: anchor moves to 14000
		{op: "reduce", at: 16000, take: 4, strict: true, want: 0},  // anchor 16000
		{op: "reduce", at: 18000, take: 1, strict: true, want: 0},  // anchor 18000
		{op: "reduce", at: 23000, take: 2, strict: true, want: 3},  // a full period after 18000
		{op: "reduce", at: 23000, take: 0, strict: true, want: 1},  // take 0 reads only
		{op: "reduce", at: 23000, take: 0, strict: false, want: 1}, // still 1: nothing was written
	})
}

func TestRefillEdges(t *testing.T) {
	p := Params{Max: 5, RefillAmount: 2, RefillMs: 1000}
	runSteps(t, p, []step{
		{op: "reduce", at: 10_000, take: 5, want: 5},
		{op: "get", at: 10_999, want: 0}, // one ms short of a period
		{op: "get", at: 11_000, want: 2},
		{op: "get", at: 12_500, want: 4},
		{op: "get", at: 13_000, want: 5}, // capped at max
		{op: "get", at: 99_000, want: 5},
		{op: "get", at: 5_000, want: 0}, // time before the anchor: no refill
		{op: "reduce", at: 5_000, take: 1, want: 0},
		{op: "get", at: 11_000, want: 2}, // anchor did not move backwards
	})
}

// The anchor keeps its phase on the refill grid even while the bucket is
// full, so a full bucket that is reduced refills at the next grid point, not
// a whole period after the reduce.
func TestAnchorKeepsPhase(t *testing.T) {
	runSteps(t, Params{Max: 2, RefillAmount: 1, RefillMs: 1000}, []step{
		{op: "reduce", at: 0, take: 1, want: 2},     // anchor 0
		{op: "reduce", at: 5_700, take: 2, want: 2}, // full again; anchor 5000
		{op: "get", at: 5_999, want: 0},
		{op: "get", at: 6_000, want: 1}, // grid point, 300 ms after the reduce
	})
}

func TestStrictDoesNotMoveAnchorBackwards(t *testing.T) {
	p := Params{Max: 1, RefillAmount: 1, RefillMs: 1000}
	_, s, _ := p.Reduce(State{}, false, Request{Now: 10_000, Take: 1, Strict: true})
	if s.Anchor != 10_000 {
		t.Fatalf("anchor %d, want 10000", s.Anchor)
	}
	_, s2, _ := p.Reduce(s, true, Request{Now: 3_000, Take: 1, Strict: true})
	if s2.Anchor != 10_000 {
		t.Fatalf("anchor moved backwards to %d", s2.Anchor)
	}
}

// The upstream SessionizeCommands case: max 1, refill 1 per hour.
func TestSessionizeUpstreamSequence(t *testing.T) {
	runSteps(t, Params{Max: 1, RefillAmount: 1, RefillMs: 3_600_000}, []step{
		{op: "sess", at: 0, take: 1, want: 1, wantSess: 0},
		{op: "sess", at: 1000, take: 1, want: 0, wantSess: 0},
		{op: "sess", at: 1_000_000, take: 1, want: 0, wantSess: 0},
		{op: "sess", at: 3_605_000, take: 1, want: 0, wantSess: 0},
		{op: "sess", at: 7_205_000, take: 1, want: 1, wantSess: 7_205_000},
	})
}

// SESSIONIZE with TAKE 0 writes nothing and reports the session the bucket
// is in, as the Smyte server does: the stored start, not the request time.
// On a bucket written by REDUCE, which has no stored start (upstream
// aborted there), it reports the refill mark, as a denied request does.
func TestSessionizeTakeZero(t *testing.T) {
	p := Params{Max: 2, RefillAmount: 2, RefillMs: 10_000}
	runSteps(t, p, []step{
		{op: "sess", at: 1_000, take: 0, want: 2, wantSess: 1_000}, // a new bucket: its request time
		{op: "sess", at: 1_000, take: 1, want: 2, wantSess: 1_000},
		{op: "sess", at: 3_000, take: 0, want: 1, wantSess: 1_000},
		{op: "sess", at: 4_000, take: 1, want: 1, wantSess: 4_000}, // takes the last token
		{op: "sess", at: 5_000, take: 0, want: 0, wantSess: 4_000},
		{op: "sess", at: 14_000, take: 0, want: 2, wantSess: 4_000}, // refilled: the session still stands
		{op: "sess", at: 14_000, take: 1, want: 2, wantSess: 14_000},
	})
	_, s, _ := p.Reduce(State{}, false, Request{Now: 1_000, Take: 1})
	before, sess, _, write := p.Sessionize(s, true, Request{Now: 13_000, Take: 0})
	if before != 2 || sess != 11_000 || write {
		t.Fatalf("TAKE 0 after REDUCE: before %d, session start %d, write %v; want 2, 11000 (the refill mark), no write", before, sess, write)
	}
}

// A bucket first written by REDUCE has no session field; upstream aborted
// here. A denied SESSIONIZE reports the anchor and stores it.
func TestSessionizeAfterReduce(t *testing.T) {
	p := Params{Max: 2, RefillAmount: 1, RefillMs: 10_000}
	_, s, _ := p.Reduce(State{}, false, Request{Now: 4_000, Take: 2})
	if s.HasSession {
		t.Fatal("REDUCE stored a session start")
	}
	before, sess, next, write := p.Sessionize(s, true, Request{Now: 5_000, Take: 1})
	if before != 0 || sess != 4_000 || !write || !next.HasSession || next.SessionStart != 4_000 {
		t.Fatalf("got before=%d sess=%d write=%v next=%+v", before, sess, write, next)
	}
	// A later REDUCE keeps the session start.
	_, next2, _ := p.Reduce(next, true, Request{Now: 6_000, Take: 1})
	if !next2.HasSession || next2.SessionStart != 4_000 {
		t.Fatalf("REDUCE dropped the session start: %+v", next2)
	}
}

func TestOverflowSaturates(t *testing.T) {
	p := Params{Max: math.MaxInt64, RefillAmount: math.MaxInt64, RefillMs: 1}
	s := State{Amount: 1, Anchor: 0}
	got, _ := p.Available(s, true, math.MaxInt64)
	if got != math.MaxInt64 {
		t.Fatalf("got %d, want MaxInt64", got)
	}
	before, next, _ := p.Reduce(s, true, Request{Now: math.MaxInt64, Take: math.MaxInt64})
	if before != math.MaxInt64 || next.Amount != 0 {
		t.Fatalf("before %d amount %d", before, next.Amount)
	}
}

func TestIdle(t *testing.T) {
	p := Params{Max: 10, RefillAmount: 3, RefillMs: 1000}
	s := State{Amount: 0, Anchor: 0, LastReduce: 5_000}
	for _, c := range []struct {
		now  int64
		want bool
	}{{5_000, false}, {8_999, false}, {9_000, true}, {1 << 60, true}, {0, false}} {
		if got := p.Idle(s, c.now); got != c.want {
			t.Errorf("Idle at %d = %v, want %v", c.now, got, c.want)
		}
	}
}

func TestStateRoundTrip(t *testing.T) {
	for _, s := range []State{
		{},
		{Amount: 9, Anchor: 1_700_000_000_000, LastReduce: 1_700_000_000_500},
		{Amount: 0, Anchor: 5, LastReduce: 1, SessionStart: 3, HasSession: true},
		{Amount: math.MaxInt64, Anchor: math.MaxInt64, LastReduce: 0, SessionStart: math.MaxInt64, HasSession: true},
	} {
		b := AppendState(nil, s)
		got, err := DecodeState(b)
		if err != nil || got != s {
			t.Fatalf("round trip of %+v: got %+v, %v", s, got, err)
		}
	}
	typical := AppendState(nil, State{Amount: 99, Anchor: 1_700_000_000_000, LastReduce: 1_700_000_000_000})
	if len(typical) > 12 {
		t.Errorf("typical state takes %d bytes, want <= 12", len(typical))
	}
}

func TestDecodeStateRejectsCorrupt(t *testing.T) {
	good := AppendState(nil, State{Amount: 3, Anchor: 7, HasSession: true, SessionStart: 9})
	for name, b := range map[string][]byte{
		"empty":     nil,
		"short":     {1},
		"version":   append([]byte{2}, good[1:]...),
		"flags":     append([]byte{1, 0x80}, good[2:]...),
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0),
	} {
		if _, err := DecodeState(b); err == nil {
			t.Errorf("%s: decoded %x without error", name, b)
		}
	}
}

func FuzzReduce(f *testing.F) {
	f.Add(int64(10), int64(3), int64(5000), int64(4), int64(2000), int64(7), int64(2000), int64(1), false, true)
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(1), int64(math.MaxInt64), int64(0), int64(math.MaxInt64), int64(0), int64(math.MaxInt64), true, true)
	f.Add(int64(1), int64(1), int64(1), int64(-5), int64(100), int64(0), int64(math.MaxInt64), int64(0), true, false)
	f.Fuzz(func(t *testing.T, max, refill, refillMs, amount, anchor, now, server, take int64, strict, found bool) {
		p := Params{Max: max, RefillAmount: refill, RefillMs: refillMs}
		if !p.Valid() || now < 0 || anchor < 0 || server < 0 || take < 0 {
			t.Skip()
		}
		s := State{Amount: amount, Anchor: anchor, LastReduce: server}
		avail, a := p.Available(s, found, now)
		if avail < 0 || avail > p.Max {
			t.Fatalf("available %d outside [0, %d]", avail, p.Max)
		}
		if found && (a < anchor || (now >= anchor && a > now)) {
			t.Fatalf("anchor %d -> %d at now %d", anchor, a, now)
		}
		before, next, write := p.Reduce(s, found, Request{Now: now, Server: server, Take: take, Strict: strict})
		if before != avail {
			t.Fatalf("Reduce saw %d, Available %d", before, avail)
		}
		if write != (take > 0) {
			t.Fatalf("write=%v for take %d", write, take)
		}
		if write {
			if next.Amount < 0 || next.Amount > p.Max {
				t.Fatalf("amount %d outside [0, %d]", next.Amount, p.Max)
			}
			if next.Amount != max64(before-take, 0) {
				t.Fatalf("amount %d after taking %d from %d", next.Amount, take, before)
			}
			if found && next.Anchor < anchor {
				t.Fatalf("anchor moved backwards: %d -> %d", anchor, next.Anchor)
			}
			got, err := DecodeState(AppendState(nil, next))
			if err != nil || got != next {
				t.Fatalf("state round trip: %+v -> %+v, %v", next, got, err)
			}
			// Reading right after the write never shows more than was left.
			if again, _ := p.Available(next, true, now); again > max64(next.Amount, 0) && now <= next.Anchor {
				t.Fatalf("read back %d, left %d", again, next.Amount)
			}
		}
		dn := next
		if !write {
			dn = State{Amount: before, Anchor: a}
		}
		for _, u := range []Unit{Second, Millisecond} {
			d := p.Decision(before, take, dn, now, u)
			if d.Limited != (before < take) || d.Limit != p.Max || d.Remaining < 0 || d.Remaining > d.Limit || d.Used != d.Limit-d.Remaining ||
				d.ResetAfter < 0 || (d.RetryAfter < 0 && d.RetryAfter != -1) || (d.Remaining == d.Limit) != (d.ResetAfter == 0) ||
				(d.RetryAfter >= 0) != (d.Limited && take <= p.Max) || (d.RetryAfter > d.ResetAfter && d.ResetAfter < math.MaxInt64/1000) {
				t.Fatalf("unit %d: decision %+v for before %d take %d next %+v now %d", u, d, before, take, dn, now)
			}
		}
		b2, sess, n2, w2 := p.Sessionize(s, found, Request{Now: now, Server: server, Take: take})
		if b2 != avail || w2 != write || (w2 && (!n2.HasSession || n2.SessionStart != sess)) {
			t.Fatalf("sessionize: before %d sess %d next %+v write %v", b2, sess, n2, w2)
		}
	})
}

// TestDecision checks the token bucket's Decision on fixed instants.
func TestDecision(t *testing.T) {
	p := Params{Max: 10, RefillAmount: 2, RefillMs: 1000}
	const now = int64(1_000_000)
	for _, c := range []struct {
		name  string
		s     State
		found bool
		take  int64
		u     Unit
		want  Decision
	}{
		// A new bucket, 3 taken: full again after two refills of 2.
		{"new", State{}, false, 3, Millisecond, Decision{Remaining: 7, Used: 3, RetryAfter: -1, ResetAfter: 2000, ResetAt: now + 2000}},
		{"new, seconds", State{}, false, 3, Second, Decision{Remaining: 7, Used: 3, RetryAfter: -1, ResetAfter: 2, ResetAt: now/1000 + 2}},
		// 1 token, anchored 500 ms ago; 4 asked: denied and drained. 4
		// tokens after 2 refills (at anchor + 2 s), full after 5.
		{"denied", State{Amount: 1, Anchor: now - 500}, true, 4, Millisecond, Decision{Limited: true, Remaining: 0, Used: 10, RetryAfter: 1500, ResetAfter: 4500, ResetAt: now + 4500}},
		{"denied, seconds", State{Amount: 1, Anchor: now - 500}, true, 4, Second, Decision{Limited: true, Remaining: 0, Used: 10, RetryAfter: 2, ResetAfter: 5, ResetAt: now/1000 + 5}},
		// More than the bucket holds: waiting cannot help (and, as
		// always, the denied take drains it).
		{"take > max", State{}, false, 11, Millisecond, Decision{Limited: true, Remaining: 0, Used: 10, RetryAfter: -1, ResetAfter: 5000, ResetAt: now + 5000}},
		// A read of a full bucket.
		{"read", State{}, false, 0, Millisecond, Decision{Remaining: 10, RetryAfter: -1, ResetAt: now}},
		// AT before the anchor: no refill yet, and the refills count from
		// the anchor.
		{"before anchor", State{Amount: 9, Anchor: now + 3000}, true, 1, Millisecond, Decision{Remaining: 8, Used: 2, RetryAfter: -1, ResetAfter: 4000, ResetAt: now + 4000}},
	} {
		before, next, write := p.Reduce(c.s, c.found, Request{Now: now, Server: now, Take: c.take})
		if !write {
			var anchor int64
			before, anchor = p.Available(c.s, c.found, now)
			next = State{Amount: before, Anchor: anchor}
		}
		c.want.Limit = 10
		if got := p.Decision(before, c.take, next, now, c.u); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func FuzzDecodeState(f *testing.F) {
	f.Add(AppendState(nil, State{Amount: 3, Anchor: 7, LastReduce: 9}))
	f.Add([]byte{1, 1, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeState(b)
		if err != nil {
			return
		}
		if got := AppendState(nil, s); !bytes.Equal(got, b) {
			// Varints have one canonical form per value except overlong
			// encodings; accept those only if they decode the same.
			if s2, err := DecodeState(got); err != nil || s2 != s {
				t.Fatalf("re-encoding %x gave %x", b, got)
			}
		}
	})
}

func max64(a, b int64) int64 { return max(a, b) }

var sinkState State

func BenchmarkReduce(b *testing.B) {
	p := Params{Max: 100, RefillAmount: 100, RefillMs: 60_000}
	s := State{Amount: 50, Anchor: 1_700_000_000_000, LastReduce: 1_700_000_000_000}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_, sinkState, _ = p.Reduce(s, true, Request{Now: s.Anchor + int64(i), Server: s.Anchor, Take: 1})
	}
}
