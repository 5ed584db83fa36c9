package peakstats

import (
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

func TestBuckets(t *testing.T) {
	prevHi := int64(-1)
	for i := range Buckets {
		lo, hi := bucketBounds(i)
		if lo != prevHi+1 || hi < lo {
			t.Fatalf("bucket %d is [%d, %d] after %d: not contiguous", i, lo, hi, prevHi)
		}
		if i >= exactBelow && float64(hi-lo) > RelativeWidth*float64(lo) {
			t.Fatalf("bucket %d [%d, %d] is wider than %v of its low", i, lo, hi, RelativeWidth)
		}
		for _, v := range []int64{lo, hi, lo + (hi-lo)/2} {
			if b := bucketOf(v); b != i {
				t.Fatalf("bucketOf(%d) = %d; want %d", v, b, i)
			}
		}
		prevHi = hi
	}
	if prevHi != math.MaxInt64 {
		t.Fatalf("the last bucket ends at %d; want MaxInt64", prevHi)
	}
}

// TestExactSmall: with fewer actors than the sample holds and peaks below
// 64, every answer is exact.
func TestExactSmall(t *testing.T) {
	d := NewDay()
	// Actor i has windows peaking at 1..i+1 (i from 0 to 9), refused when
	// the peak reaches 10.
	for i := range 10 {
		h := Hash([]byte("actor" + strconv.Itoa(i)))
		for p := int64(1); p <= int64(i+1); p++ {
			d.Add(h, p, p == 10)
		}
	}
	if d.Windows != 55 || d.Refused != 1 {
		t.Fatalf("windows %d refused %d; want 55 and 1", d.Windows, d.Refused)
	}
	if n, exact := d.Actors(); n != 10 || !exact {
		t.Fatalf("actors %v (exact %v); want 10, exact", n, exact)
	}
	if n, exact := d.RefusedActors(); n != 1 || !exact {
		t.Fatalf("refused actors %v (exact %v); want 1, exact", n, exact)
	}
	// Peaks: value p occurs 11-p times (10, 9, 8, 7, ...): the median window,
	// rank 28, peaked at 4.
	if v, exact := d.Quantile(0.5); v != 4 || !exact {
		t.Fatalf("median %d (exact %v); want 4", v, exact)
	}
	if v, _ := d.Quantile(1); v != 10 {
		t.Fatalf("max %d; want 10", v)
	}
	// Limit 7 refuses the windows peaking at 8, 9, 10 (3+2+1) and the
	// actors reaching 8 or more (3 of 10).
	w := d.WhatIf(7)
	if w.Windows != 6.0/55 || w.WindowsErr != 0 || w.Actors != 0.3 || w.ActorsStdErr != 0 {
		t.Fatalf("WhatIf(7) = %+v; want windows 6/55, actors 0.3, exact", w)
	}
}

// TestMergeIsWhole: a day merged from parts answers as the day of all
// their windows.
func TestMergeIsWhole(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	whole, parts := NewDay(), []*Day{NewDay(), NewDay(), NewDay()}
	for range 20000 {
		h := Hash([]byte(strconv.Itoa(rng.IntN(5000))))
		p := rng.Int64N(1000)
		whole.Add(h, p, p > 900)
		parts[rng.IntN(3)].Add(h, p, p > 900)
	}
	m := NewDay()
	for _, p := range parts {
		m.Merge(p)
	}
	if string(m.Append(nil)) != string(whole.Append(nil)) {
		t.Fatal("the merged parts differ from the whole")
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	d := NewDay()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 5000 {
		d.Add(rng.Uint64(), rng.Int64N(math.MaxInt64), rng.IntN(2) == 0)
	}
	b := d.Append(nil)
	if len(b) > MaxEncodedLen {
		t.Fatalf("encoded %d bytes; MaxEncodedLen is %d", len(b), MaxEncodedLen)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Append(nil)) != string(b) {
		t.Fatal("decode then encode changed the day")
	}
	for _, bad := range [][]byte{nil, {2}, b[:len(b)-1], append(b[:len(b):len(b)], 0)} {
		if _, err := Decode(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Decode of %d bytes: %v; want ErrCorrupt", len(bad), err)
		}
	}
}

// TestActorsEstimate: past the sample, the distinct counts are within
// three standard errors.
func TestActorsEstimate(t *testing.T) {
	for _, n := range []int{5000, 100000} {
		d := NewDay()
		for i := range n {
			h := Hash([]byte("user:" + strconv.Itoa(i)))
			d.Add(h, 1, i%4 == 0)
			d.Add(h, 2, false)
		}
		got, exact := d.Actors()
		if exact || math.Abs(got-float64(n)) > 3*ActorsStdErr*float64(n) {
			t.Errorf("%d actors: estimate %v (exact %v)", n, got, exact)
		}
		got, _ = d.RefusedActors()
		if want := float64(n / 4); math.Abs(got-want) > 3*ActorsStdErr*want {
			t.Errorf("%d refused actors: estimate %v", n/4, got)
		}
	}
}

func TestAddAllocates(t *testing.T) {
	d := NewDay()
	i := 0
	if n := testing.AllocsPerRun(10000, func() {
		i++
		d.Add(uint64(i)*0x9e3779b97f4a7c15, int64(i), false)
	}); n != 0 {
		t.Fatalf("Add allocates %v times", n)
	}
}
