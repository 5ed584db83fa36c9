package bucket

import (
	"bytes"
	"errors"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"testing"
)

// fwStep is one FW.* call on a counter whose state carries over from the
// previous step of the same table.
type fwStep struct {
	p    WindowParams
	get  bool
	at   int64 // in p.Unit
	want [7]int64
}

func runWindow(t *testing.T, key string, steps []fwStep) WindowState {
	t.Helper()
	var s WindowState
	found := false
	for i, st := range steps {
		w, err := NewWindow(st.p, []byte(key))
		if err != nil {
			t.Fatalf("step %d: NewWindow(%+v): %v", i, st.p, err)
		}
		now, err := st.p.Unit.Millis(st.at)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		var d Decision
		next, write := s, false
		if st.get {
			d, err = w.Get(s, found, now)
		} else {
			next, write, d, err = w.Incr(s, found, now)
		}
		if err != nil {
			t.Fatalf("step %d (%+v): %v", i, st, err)
		}
		if got := d.Reply(); got != st.want {
			t.Fatalf("step %d (%+v): got %v, want %v (state before %+v, found %v)", i, st, got, st.want, s, found)
		}
		if !write && next != s {
			t.Fatalf("step %d: no write but state changed", i)
		}
		if write {
			s, found = next, true
		}
	}
	return s
}

// fw is FW.INCR key limit window [COST cost] (in seconds).
func fw(limit, window, cost int64) WindowParams {
	return WindowParams{Limit: limit, Window: window, Cost: cost}
}

func TestWindowSpecExample(t *testing.T) {
	const end = 1_700_000_100 // 1700000000 is 200 s into a 300 s window
	p := fw(5, 300, 1)
	runWindow(t, "user:42", []fwStep{
		// Spec: "`FW.INCR user:42 5 300 AT 1700000000` →
		// `[0, 5, 4, -1, 100, 1, 1700000100]`"
		{p: p, at: t0, want: [7]int64{0, 5, 4, -1, 100, 1, end}},
		{p: p, at: t0 + 1, want: [7]int64{0, 5, 3, -1, 99, 2, end}},
		{p: p, at: t0 + 2, want: [7]int64{0, 5, 2, -1, 98, 3, end}},
		{p: p, at: t0 + 3, want: [7]int64{0, 5, 1, -1, 97, 4, end}},
		{p: p, at: t0 + 4, want: [7]int64{0, 5, 0, -1, 96, 5, end}},
		// "the sixth call in that window gets
		// `[1, 5, 0, 95, 95, 6, 1700000100]` at `AT 1700000005`"
		{p: p, at: t0 + 5, want: [7]int64{1, 5, 0, 95, 95, 6, end}},
		{p: p, get: true, at: t0 + 5, want: [7]int64{1, 5, 0, 95, 95, 6, end}},
	})
	// The same in the P form.
	pm := WindowParams{Limit: 5, Window: 300_000, Cost: 1, Unit: Millisecond}
	runWindow(t, "user:42", []fwStep{{p: pm, at: t0 * 1000, want: [7]int64{0, 5, 4, -1, 100_000, 1, end * 1000}}})
}

// "`FW.INCR k 5 300` and `FW.PINCR k 5 300000` share it."
func TestWindowSharedBetweenForms(t *testing.T) {
	const end = 1_700_000_100
	s := fw(5, 300, 1)
	ms := WindowParams{Limit: 5, Window: 300_000, Cost: 1, Unit: Millisecond}
	for _, stagger := range []bool{false, true} {
		s.Stagger, ms.Stagger = stagger, stagger
		ws, _ := NewWindow(s, []byte("k"))
		wm, _ := NewWindow(ms, []byte("k"))
		if ws.Millis() != wm.Millis() || ws.Offset() != wm.Offset() || ws.Staggered() != wm.Staggered() {
			t.Fatalf("stagger %v: identities differ: %+v %+v", stagger, ws, wm)
		}
	}
	s.Stagger, ms.Stagger = false, false
	runWindow(t, "k", []fwStep{
		{p: s, at: t0, want: [7]int64{0, 5, 4, -1, 100, 1, end}},
		{p: ms, at: t0*1000 + 500, want: [7]int64{0, 5, 3, -1, 99_500, 2, end * 1000}},
		{p: s, at: t0 + 1, want: [7]int64{0, 5, 2, -1, 99, 3, end}},
		{p: ms, get: true, at: t0*1000 + 1500, want: [7]int64{0, 5, 2, -1, 98_500, 3, end * 1000}},
		{p: fw(5, 300, 0), at: t0 + 1, want: [7]int64{0, 5, 2, -1, 99, 3, end}},
	})
}

func TestWindowEdges(t *testing.T) {
	const start, end = 1_699_999_800, 1_700_000_100
	t.Run("boundary", func(t *testing.T) {
		runWindow(t, "k", []fwStep{
			{p: fw(1, 300, 1), at: start, want: [7]int64{0, 1, 0, -1, 300, 1, end}},
			{p: fw(1, 300, 1), at: end - 1, want: [7]int64{1, 1, 0, 1, 1, 2, end}},
			// The first instant of the next window counts from 0.
			{p: fw(1, 300, 1), at: end, want: [7]int64{0, 1, 0, -1, 300, 1, end + 300}},
		})
		pm := WindowParams{Limit: 1, Window: 1000, Cost: 1, Unit: Millisecond}
		runWindow(t, "k", []fwStep{
			{p: pm, at: 1_999, want: [7]int64{0, 1, 0, -1, 1, 1, 2_000}},
			{p: pm, at: 2_000, want: [7]int64{0, 1, 0, -1, 1000, 1, 3_000}},
			{p: pm, at: 1_999, want: [7]int64{0, 1, 0, -1, 1, 1, 2_000}}, // AT backwards: the earlier window again, from 0
		})
	})
	t.Run("limit changed", func(t *testing.T) {
		// "The limit is not part of the identity, so it can change between
		// calls (a runtime threshold change keeps the count)."
		runWindow(t, "k", []fwStep{
			{p: fw(5, 300, 3), at: t0, want: [7]int64{0, 5, 2, -1, 100, 3, end}},
			{p: fw(3, 300, 1), at: t0, want: [7]int64{1, 3, 0, 100, 100, 4, end}},
			{p: fw(10, 300, 1), at: t0, want: [7]int64{0, 10, 5, -1, 100, 5, end}},
			{p: fw(0, 300, 0), get: true, at: t0, want: [7]int64{1, 0, 0, 100, 100, 5, end}},
		})
	})
	t.Run("NOCOUNTBLOCKED and COST", func(t *testing.T) {
		ncb := fw(5, 300, 2)
		ncb.NoCountBlocked = true
		runWindow(t, "k", []fwStep{
			{p: ncb, at: t0, want: [7]int64{0, 5, 3, -1, 100, 2, end}},
			{p: ncb, at: t0, want: [7]int64{0, 5, 1, -1, 100, 4, end}},
			{p: ncb, at: t0, want: [7]int64{1, 5, 1, 100, 100, 4, end}}, // blocked: not counted
			{p: fw(5, 300, 1), at: t0, want: [7]int64{0, 5, 0, -1, 100, 5, end}},
			{p: ncb, at: t0, want: [7]int64{1, 5, 0, 100, 100, 5, end}}, // "keeps used at the limit"
			// "retry_after = limited and COST <= limit ? reset_after : -1"
			{p: fw(5, 300, 6), at: t0 + 1, want: [7]int64{1, 5, 0, -1, 99, 11, end}},
			{p: fw(5, 300, 0), at: t0 + 1, want: [7]int64{1, 5, 0, 100 - 1, 99, 11, end}},
		})
		big := fw(5, 300, 6)
		big.NoCountBlocked = true
		runWindow(t, "k", []fwStep{
			{p: big, at: t0, want: [7]int64{1, 5, 5, -1, 100, 0, end}},
			{p: fw(0, 300, 0), at: t0, want: [7]int64{0, 0, 0, -1, 100, 0, end}}, // 0 + 0 <= 0
			{p: fw(0, 300, 1), at: t0, want: [7]int64{1, 0, 0, -1, 100, 1, end}},
		})
	})
	t.Run("negative AT", func(t *testing.T) {
		// Windows are aligned by floor division: -1 s is in [-300, 0).
		runWindow(t, "k", []fwStep{{p: fw(5, 300, 1), at: -1, want: [7]int64{0, 5, 4, -1, 1, 1, 0}}})
	})
}

// A call that counts nothing (COST 0) in another window stores nothing, so
// the stored window keeps its count, as an INCR + EXPIRE client's key per
// window would; storing the same count would replace it (docs/protocol.md,
// "What a look stores").
func TestWindowLookKeepsOtherWindow(t *testing.T) {
	runWindow(t, "k", []fwStep{
		{p: fw(5, 300, 1), at: t0, want: [7]int64{0, 5, 4, -1, 100, 1, t0 + 100}},
		{p: fw(5, 300, 0), at: t0 + 100, want: [7]int64{0, 5, 5, -1, 300, 0, t0 + 400}},
		{p: fw(5, 300, 1), get: true, at: t0 + 99, want: [7]int64{0, 5, 4, -1, 1, 1, t0 + 100}},
	})
}

func TestWindowWritesOnlyChanges(t *testing.T) {
	w, _ := NewWindow(fw(5, 300, 0), []byte("k"))
	if _, write, _, _ := w.Incr(WindowState{}, false, t0*1000); write {
		t.Error("COST 0 on a new counter wrote a record")
	}
	ncb := fw(0, 300, 1)
	ncb.NoCountBlocked = true
	w, _ = NewWindow(ncb, []byte("k"))
	if _, write, _, _ := w.Incr(WindowState{}, false, t0*1000); write {
		t.Error("a blocked NOCOUNTBLOCKED call wrote a record")
	}
}

func TestWindowStagger(t *testing.T) {
	for _, key := range []string{"", "user:42", "\xff\x00binary"} {
		h := fnv.New64a()
		h.Write([]byte(key))
		if got, want := fnv1a64([]byte(key)), h.Sum64(); got != want {
			t.Fatalf("fnv1a64(%q) = %x, hash/fnv says %x", key, got, want)
		}
	}
	w, _ := NewWindow(WindowParams{Limit: 5, Window: 300, Cost: 1, Stagger: true}, []byte("user:42"))
	if want := int64(fnv1a64([]byte("user:42")) % 300_000); w.Offset() != want {
		t.Fatalf("offset %d, want %d", w.Offset(), want)
	}
	start, end, err := w.Bounds(t0 * 1000)
	if err != nil || start > t0*1000 || end <= t0*1000 || end-start != 300_000 || (start-w.Offset())%300_000 != 0 {
		t.Fatalf("bounds %d..%d around %d, offset %d: %v", start, end, t0*1000, w.Offset(), err)
	}

	// The plain forms round a staggered window's fractional seconds up:
	// "reset_at rounded up to a whole second too".
	d, err := w.Get(WindowState{}, false, t0*1000)
	if err != nil || d.ResetAt != ceilDiv(end, 1000) || d.ResetAfter != ceilDiv(end-t0*1000, 1000) || end%1000 == 0 {
		t.Fatalf("end %d ms: reply %+v, %v", end, d, err)
	}

	// 10k keys' resets spread over a one-minute window: without STAGGER
	// they all reset at the same instant; with it, every tenth of the
	// window gets about a tenth of them.
	const keys, bins, window = 10_000, 10, 60_000
	var hist [bins]int
	resets := map[int64]bool{}
	for i := range keys {
		key := []byte("user:" + strconv.Itoa(i))
		plain, _ := NewWindow(WindowParams{Limit: 1, Window: window, Cost: 1, Unit: Millisecond}, key)
		if _, end, _ := plain.Bounds(t0 * 1000); end != (t0*1000/window+1)*window {
			t.Fatalf("unstaggered end %d", end)
		}
		sw, _ := NewWindow(WindowParams{Limit: 1, Window: window, Cost: 1, Unit: Millisecond, Stagger: true}, key)
		_, end, _ := sw.Bounds(t0 * 1000)
		resets[end] = true
		hist[sw.Offset()*bins/window]++
	}
	for i, n := range hist {
		if n < keys/bins*8/10 || n > keys/bins*12/10 {
			t.Errorf("tenth %d of the window has %d of %d resets: %v", i, n, keys, hist)
		}
	}
	if len(resets) < keys*9/10 {
		t.Errorf("only %d distinct reset instants for %d keys", len(resets), keys)
	}
}

func TestWindowRefuses(t *testing.T) {
	for _, c := range []struct {
		p   WindowParams
		arg string
	}{
		{fw(-1, 300, 1), "limit"},
		{fw(5, 0, 1), "window"},
		{fw(5, -300, 1), "window"},
		{fw(5, math.MaxInt64/1000+1, 1), "window"},
		{fw(5, 300, -1), "COST"},
		{WindowParams{Limit: 5, Window: 300, Cost: 1, Unit: 9}, "unit"},
	} {
		_, err := NewWindow(c.p, []byte("k"))
		wantArgErr(t, err, c.arg)
	}
	if _, err := NewWindow(WindowParams{Limit: math.MaxInt64, Window: math.MaxInt64, Cost: math.MaxInt64, Unit: Millisecond, Stagger: true}, []byte("k")); err != nil {
		t.Fatalf("largest values refused: %v", err)
	}
	_, err := Second.Millis(math.MaxInt64/1000 + 1)
	wantArgErr(t, err, "AT")
	w, _ := NewWindow(WindowParams{Limit: 5, Window: 300_000, Cost: 1, Unit: Millisecond}, []byte("k"))
	_, _, _, err = w.Incr(WindowState{}, false, math.MaxInt64) // the window's end overflows
	wantArgErr(t, err, "AT")
	_, _, _, err = w.Incr(WindowState{}, false, math.MinInt64+1) // its start underflows
	wantArgErr(t, err, "AT")
	_, err = w.Get(WindowState{}, false, math.MaxInt64)
	wantArgErr(t, err, "AT")
	// A refused request that would take the count past MaxInt64 leaves it
	// there, limited, neither wrapped nor an error.
	_, end, _ := w.Bounds(0)
	next, _, d, err := w.Incr(WindowState{End: end, Count: math.MaxInt64 - 1}, true, 0)
	if err != nil || !d.Limited || d.Used != math.MaxInt64 || next.Count != math.MaxInt64 || d.Remaining != 0 {
		t.Errorf("count near MaxInt64: %+v, %+v, %v; want limited, saturated at MaxInt64", next, d, err)
	}
	big, _ := NewWindow(WindowParams{Limit: 5, Window: 300_000, Cost: math.MaxInt64, Unit: Millisecond}, []byte("k"))
	next, _, d, err = big.Incr(WindowState{End: end, Count: 3}, true, 0)
	if err != nil || !d.Limited || next.Count != math.MaxInt64 || d.RetryAfter != -1 {
		t.Errorf("COST MaxInt64: %+v, %+v, %v; want limited, saturated, no retry", next, d, err)
	}
	next, _, d, err = w.Incr(next, true, 0)
	if err != nil || !d.Limited || next.Count != math.MaxInt64 {
		t.Errorf("the next call after a saturated count: %+v, %+v, %v; want limited", next, d, err)
	}
	_, _, _, err = Window{}.Incr(WindowState{}, false, 0)
	wantArgErr(t, err, "params")
}

func TestWindowIdleAndDescribe(t *testing.T) {
	s := WindowState{End: 1_700_000_100_000, Count: 6}
	for _, c := range []struct {
		now  int64
		want bool
	}{{0, false}, {s.End - 1, false}, {s.End, true}, {math.MaxInt64, true}} {
		if got := s.Idle(c.now); got != c.want {
			t.Errorf("Idle at %d = %v, want %v", c.now, got, c.want)
		}
	}
	if got, want := s.Describe(s.End-1), "fw count=6 end=2023-11-14T22:15:00.000Z"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
	if got := s.Describe(s.End); !strings.HasSuffix(got, " idle") {
		t.Errorf("Describe of an idle state = %q", got)
	}
}

func TestWindowStateCodec(t *testing.T) {
	for _, s := range []WindowState{{}, {End: 1_700_000_100_000, Count: 6}, {End: math.MinInt64, Count: math.MaxInt64}, {End: math.MaxInt64}} {
		b := AppendWindowState(nil, s)
		if len(b) > MaxWindowStateLen {
			t.Fatalf("%+v takes %d bytes", s, len(b))
		}
		got, err := DecodeWindowState(b)
		if err != nil || got != s {
			t.Fatalf("round trip of %+v: %+v, %v", s, got, err)
		}
	}
	good := AppendWindowState(nil, WindowState{End: 1_700_000_100_000, Count: 6})
	for name, b := range map[string][]byte{
		"empty":     nil,
		"short":     {windowVersion1, 0},
		"version":   append([]byte{0}, good[1:]...),
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0),
		"count":     {windowVersion1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	} {
		if _, err := DecodeWindowState(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: decoding %x gave %v, want ErrCorrupt", name, b, err)
		}
	}
}

func FuzzWindow(f *testing.F) {
	f.Add(int64(5), int64(300), int64(1), false, false, false, int64(t0), []byte("user:42"), int64(1_700_000_100_000), int64(5), true, false)
	f.Add(int64(0), int64(1), int64(0), true, true, true, int64(math.MaxInt64), []byte{0xff}, int64(math.MinInt64), int64(math.MaxInt64), true, true)
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), true, true, false, int64(math.MinInt64), []byte(""), int64(0), int64(0), false, false)
	f.Fuzz(func(t *testing.T, limit, window, cost int64, ms, stagger, ncb bool, at int64, key []byte, end, count int64, found, get bool) {
		folded := window%7 == 0
		if folded {
			// As in FuzzGCRA: a share of the inputs in everyday ranges.
			limit, window, cost = abs(limit%20), 1+abs(window/7%1000), abs(cost%7)
			at, count = t0+at%2000, abs(count%30)
			if ms {
				at *= 1000
			}
			end = t0*1000 + end%(2000*1000)
		}
		p := WindowParams{Limit: limit, Window: window, Cost: cost, Stagger: stagger, NoCountBlocked: ncb}
		if ms {
			p.Unit = Millisecond
		}
		w, err := NewWindow(p, key)
		if err != nil {
			var ae *ArgError
			if !errors.As(err, &ae) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if w.Offset() < 0 || w.Offset() >= w.Millis() {
			t.Fatalf("offset %d outside [0, %d)", w.Offset(), w.Millis())
		}
		now, err := p.Unit.Millis(at)
		if err != nil {
			return
		}
		if folded && end%2 == 0 {
			// Mostly a stored count of the current window.
			if _, e, err := w.Bounds(now); err == nil {
				end = e
			}
		}
		s := WindowState{End: end, Count: max(count, 0)}
		var (
			next  = s
			write bool
			d     Decision
		)
		if get {
			d, err = w.Get(s, found, now)
		} else {
			next, write, d, err = w.Incr(s, found, now)
		}
		if err != nil {
			var ae *ArgError
			if !errors.As(err, &ae) || write || next != s {
				t.Fatalf("error %v with write %v, state %+v -> %+v", err, write, s, next)
			}
			return
		}
		start, wend, err := w.Bounds(now)
		if err != nil || start > now || wend <= now || wend-start != w.Millis() {
			t.Fatalf("bounds %d..%d around %d: %v", start, wend, now, err)
		}
		if d.Remaining < 0 || d.Remaining > d.Limit || d.Limit != limit || d.Used < 0 {
			t.Fatalf("decision %+v", d)
		}
		if d.ResetAfter < 0 || d.RetryAfter < -1 || (!d.Limited && d.RetryAfter != -1) {
			t.Fatalf("decision %+v", d)
		}
		if d.Limited && d.RetryAfter == -1 && cost <= limit {
			t.Fatalf("limited call within the limit got no retry: %+v", d)
		}
		if ms && (d.ResetAt != wend || d.ResetAfter != wend-now || d.ResetAfter > w.Millis()) {
			t.Fatalf("reset %d at %d for window %d..%d at %d", d.ResetAfter, d.ResetAt, start, wend, now)
		}
		if write {
			if next.End != wend || next.Count != d.Used || next.Count < cost {
				t.Fatalf("stored %+v for %+v in window ending %d", next, d, wend)
			}
			if found && s.End == wend && next.Count < s.Count {
				t.Fatalf("count went down: %d -> %d", s.Count, next.Count)
			}
			var before int64
			if found && s.End == wend {
				before = s.Count
			}
			if sum, ok := addOK(before, cost); d.Used != sum && !(!ok && d.Limited && d.Used == math.MaxInt64) {
				t.Fatalf("used %d after cost %d on %+v", d.Used, cost, s)
			}
		} else if next != s {
			t.Fatalf("state changed without a write")
		}
		got, err := DecodeWindowState(AppendWindowState(nil, next))
		if err != nil || got != next {
			t.Fatalf("round trip of %+v: %+v, %v", next, got, err)
		}
	})
}

func FuzzDecodeWindow(f *testing.F) {
	f.Add(AppendWindowState(nil, WindowState{End: 1_700_000_100_000, Count: 6}))
	f.Add([]byte{windowVersion1, 0x80, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeWindowState(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if s.Count < 0 {
			t.Fatalf("decoded a negative count %d", s.Count)
		}
		if got := AppendWindowState(nil, s); !bytes.Equal(got, b) {
			if s2, err := DecodeWindowState(got); err != nil || s2 != s {
				t.Fatalf("re-encoding %x gave %x", b, got)
			}
		}
	})
}

// BenchmarkWindow is the per-command window work of FW.INCR with STAGGER:
// validate the parameters and hash the key, decode the stored counter,
// count, encode it.
func BenchmarkWindow(b *testing.B) {
	key := []byte("ratelimit/user:1234567")
	p := WindowParams{Limit: 100, Window: 60, Cost: 1, Stagger: true}
	w0, _ := NewWindow(p, key)
	_, end, _ := w0.Bounds(t0 * 1000)
	stored := AppendWindowState(nil, WindowState{End: end, Count: 10})
	vbuf := make([]byte, 0, MaxWindowStateLen)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		w, err := NewWindow(p, key)
		if err != nil {
			b.Fatal(err)
		}
		s, err := DecodeWindowState(stored)
		if err != nil {
			b.Fatal(err)
		}
		next, _, d, err := w.Incr(s, true, t0*1000+int64(i%1000))
		if err != nil {
			b.Fatal(err)
		}
		sinkDecision = d
		vbuf = AppendWindowState(vbuf[:0], next)
	}
}
