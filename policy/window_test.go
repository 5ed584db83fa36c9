package policy

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// TestHit runs step tables: each step hits the same counter at an instant
// (ms), carrying the stored window over when the step says to write.
func TestHit(t *testing.T) {
	type step struct {
		at    int64
		want  Outcome
		write bool
	}
	ok := func(left, secs int64) Outcome {
		return Outcome{Allowed: true, CreditsLeft: left, SecondsUntilReset: secs}
	}
	no := func(secs int64) Outcome { return Outcome{Allowed: false, CreditsLeft: 0, SecondsUntilReset: secs} }
	tests := []struct {
		name         string
		limit, reset int64
		steps        []step
	}{
		{"three an hour", 3, 3600, []step{
			{0, ok(2, 3600), true},
			{1, ok(1, 3600), true}, // 3599.999 s rounds up
			{1000, ok(0, 3599), true},
			{1001, no(3599), false},
			{3_599_000, no(1), false},
			{3_599_999, no(1), false},
			{3_600_000, ok(2, 3600), true}, // the window ended: a new one
			{3_600_500, ok(1, 3600), true},
		}},
		{"one a minute", 1, 60, []step{
			{10_000, ok(0, 60), true},
			{10_000, no(60), false},
			{69_999, no(1), false},
			{70_000, ok(0, 60), true},
		}},
		{"clock goes back", 2, 10, []step{
			{100_000, ok(1, 10), true},
			{50_000, ok(0, 10), true}, // clamped to resetSeconds
			{50_000, no(10), false},
			{110_000, ok(1, 10), true},
		}},
		{"always deny", 0, 60, []step{{0, no(-1), false}, {1, no(-1), false}}},
		{"always deny without window", 0, 0, []step{{0, no(-1), false}}},
		{"always allow", 7, 0, []step{{0, ok(7, 0), false}, {1, ok(7, 0), false}}},
		{"huge window saturates", 2, math.MaxInt64, []step{
			{0, ok(1, math.MaxInt64/1000+1), true},
			{1 << 40, ok(0, (math.MaxInt64-1<<40)/1000+1), true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Rule{CreditLimit: tt.limit, ResetSeconds: tt.reset}
			var w Window
			found := false
			for i, st := range tt.steps {
				next, write, out := r.Hit(w, found, st.at)
				if triple(out) != triple(st.want) || write != st.write {
					t.Fatalf("step %d at %d: got %+v write %v, want %+v write %v (window %+v found %v)", i, st.at, out, write, st.want, st.write, w, found)
				}
				if write {
					w, found = next, true
				}
			}
		})
	}
}

// triple is the part of an Outcome that HIT replies.
func triple(o Outcome) Outcome {
	return Outcome{Allowed: o.Allowed, CreditsLeft: o.CreditsLeft, SecondsUntilReset: o.SecondsUntilReset}
}

func TestHitDamagedWindow(t *testing.T) {
	r := &Rule{CreditLimit: 3, ResetSeconds: 60}
	if next, write, out := r.Hit(Window{End: 60_000, Left: 100}, true, 0); !write || next.Left != 1 || out.CreditsLeft != 1 {
		t.Errorf("too many credits: %+v %v %+v", next, write, out)
	}
	if _, write, out := r.Hit(Window{End: 60_000, Left: -5}, true, 0); write || out.Allowed {
		t.Errorf("negative credits: %v %+v", write, out)
	}
}

func TestExpired(t *testing.T) {
	w := Window{End: 1000}
	if w.Expired(999) || !w.Expired(1000) || !w.Expired(1001) {
		t.Error("Expired is not now >= End")
	}
}

func TestWindowEncoding(t *testing.T) {
	for _, w := range []Window{{}, {End: 1_700_000_000_000, Left: 3}, {End: -1, Left: math.MaxInt64}, {End: math.MinInt64}} {
		b := AppendWindow([]byte("x"), w)
		if len(b) != 1+WindowLen || b[0] != 'x' || b[1] != windowVersion1 {
			t.Fatalf("%+v: %x", w, b)
		}
		got, err := DecodeWindow(b[1:])
		if err != nil || got != w {
			t.Fatalf("%+v: decoded %+v, %v", w, got, err)
		}
	}
	good := AppendWindow(nil, Window{End: 5, Left: 1})
	for name, b := range map[string][]byte{
		"empty":    nil,
		"short":    good[:WindowLen-1],
		"long":     append(bytes.Clone(good), 0),
		"version":  append([]byte{2}, good[1:]...),
		"negative": AppendWindow(nil, Window{Left: -1}),
	} {
		if _, err := DecodeWindow(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestOutcomeReply(t *testing.T) {
	for _, tt := range []struct {
		o    Outcome
		want string
	}{
		{Outcome{Allowed: true, CreditsLeft: 2, SecondsUntilReset: 3600}, "OK true 2 3600\n"},
		{Outcome{Allowed: false, CreditsLeft: 0, SecondsUntilReset: -1}, "OK false 0 -1\n"},
		{Outcome{Allowed: true, CreditsLeft: 1000, SecondsUntilReset: 0}, "OK true 1000 0\n"},
	} {
		if got := string(tt.o.AppendReply(nil)); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}

func FuzzHit(f *testing.F) {
	f.Add(int64(3), int64(3600), int64(3_600_000), int64(2), true, int64(1000))
	f.Add(int64(0), int64(0), int64(0), int64(0), false, int64(0))
	f.Add(int64(1), int64(math.MaxInt64), int64(math.MaxInt64), int64(0), true, int64(-1))
	f.Fuzz(func(t *testing.T, limit, reset, end, left int64, found bool, now int64) {
		if limit < 0 || reset < 0 || now > 1<<62 || now < -1<<62 {
			return // loaders reject negative limits; clocks are nowhere near the int64 ends
		}
		r := &Rule{CreditLimit: limit, ResetSeconds: reset}
		w := Window{End: end, Left: left}
		next, write, out := r.Hit(w, found, now)
		switch {
		case limit == 0:
			if write || out.Allowed || out.CreditsLeft != 0 || out.SecondsUntilReset != -1 {
				t.Fatalf("always deny: %v %+v", write, out)
			}
			return
		case reset == 0:
			if write || !out.Allowed || out.CreditsLeft != limit || out.SecondsUntilReset != 0 {
				t.Fatalf("always allow: %v %+v", write, out)
			}
			return
		}
		if out.CreditsLeft < 0 || out.CreditsLeft > limit-1 || out.SecondsUntilReset < 1 || out.SecondsUntilReset > reset {
			t.Fatalf("outcome out of range: %+v", out)
		}
		if write != out.Allowed || (!out.Allowed && out.CreditsLeft != 0) {
			t.Fatalf("write %v with %+v", write, out)
		}
		if write && (next.Left != out.CreditsLeft || next.Expired(now)) {
			t.Fatalf("wrote %+v at %d for %+v", next, now, out)
		}
		if !found || w.Expired(now) {
			if !out.Allowed || next.End != satAdd(now, satMul(reset, 1000)) {
				t.Fatalf("new window: %+v %+v", next, out)
			}
		}
		b := AppendWindow(nil, next)
		if got, err := DecodeWindow(b); next.Left >= 0 && (err != nil || got != next) {
			t.Fatalf("round trip %+v: %+v %v", next, got, err)
		}
	})
}

func FuzzDecodeWindow(f *testing.F) {
	f.Add(AppendWindow(nil, Window{End: 1, Left: 2}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := DecodeWindow(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatal(err)
			}
			return
		}
		if !bytes.Equal(AppendWindow(nil, w), b) {
			t.Fatalf("%x decodes to %+v, which encodes differently", b, w)
		}
	})
}
