package policy

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

// algoRule is a rule of algorithm a, 10 per 60 s, as the loader builds it.
func algoRule(tb testing.TB, a Algorithm, extra string) *Rule {
	tb.Helper()
	return mustINI(tb, "[a=1]\nalgorithm = "+a.String()+"\n"+extra+"creditLimit = 10\nresetSeconds = 60\n"+iniDefault).Rules()[0]
}

// TestCounterAllocatesNothing: once its scratch space has grown, a hit of
// any algorithm allocates nothing.
func TestCounterAllocatesNothing(t *testing.T) {
	for a := Divvy; a <= SlidingLog; a++ {
		var c Counter
		c.Rule, c.Limit, c.Hits, c.ID = algoRule(t, a, ""), 10, 1, []byte("id")
		var stored []byte
		now := int64(1_700_000_000_000_000_000)
		hit := func() {
			c.Now = now
			now += 1e9
			val, write, err := c.Apply(stored, stored != nil)
			if err != nil {
				t.Fatal(err)
			}
			if write {
				stored = append(stored[:0], val...)
			}
		}
		for range 20 {
			hit()
		}
		if n := testing.AllocsPerRun(100, hit); n != 0 {
			t.Errorf("%s: %v allocations per hit", a, n)
		}
	}
}

// TestCheckWritesNothing: a check (hits 0) of any algorithm stores
// nothing, on a new counter and on one whose hits have all passed, though
// CL.THROTTLE's and ROLL.WOULDLIMIT's looks store what they change (the
// TAT moved to now, entries an interval old dropped): rules run on the
// server clock, where those changes alter no later reply.
func TestCheckWritesNothing(t *testing.T) {
	for a := Divvy; a <= SlidingLog; a++ {
		c := Counter{Rule: algoRule(t, a, ""), Limit: 10, Hits: 1, ID: []byte("id")}
		now := int64(1_700_000_000_000_000_000)
		c.Now = now
		stored, write, err := c.Apply(nil, false)
		if err != nil || !write {
			t.Fatalf("%s: a hit on a new counter: write %v, %v", a, write, err)
		}
		stored = append([]byte(nil), stored...)
		c.Hits = 0
		for _, tc := range []struct {
			name  string
			at    int64
			found bool
		}{{"a new counter", now, false}, {"a counter whose hits have passed", now + 3600e9, true}} {
			c.Now = tc.at
			old := stored
			if !tc.found {
				old = nil
			}
			if _, write, err := c.Apply(old, tc.found); err != nil || write {
				t.Errorf("%s: a check on %s: write %v, %v", a, tc.name, write, err)
			}
		}
	}
}

// TestCounterRefusesCorruptState: a stored value that does not decode is
// the kind's ErrCorrupt, never a panic or a guess.
func TestCounterRefusesCorruptState(t *testing.T) {
	for a := Divvy; a <= SlidingLog; a++ {
		c := Counter{Rule: algoRule(t, a, ""), Limit: 10, Hits: 1, Now: 1e18, ID: []byte("id")}
		_, _, err := c.Apply([]byte{9, 9}, true)
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, bucket.ErrCorrupt) {
			t.Errorf("%s: %v, want a corrupt-state error", a, err)
		}
	}
}

// FuzzCounter applies hits of every algorithm to arbitrary stored values,
// limits, counts and times: an error or an answer within range, never a
// panic, and a written value the next hit reads.
func FuzzCounter(f *testing.F) {
	f.Add(uint8(0), int64(10), int64(1), int64(1e18), []byte{})
	f.Add(uint8(1), int64(0), int64(0), int64(-1), []byte{1, 2, 3})
	f.Add(uint8(2), int64(1<<40), int64(1<<40), int64(1<<62), []byte{1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint8(3), int64(3), int64(5), int64(0), []byte{1, 0x80})
	f.Add(uint8(4), int64(100000), int64(1), int64(1e15), []byte{1, 2, 1, 4})
	f.Fuzz(func(t *testing.T, alg uint8, limit, hits, now int64, old []byte) {
		a := Algorithm(alg % uint8(SlidingLog+1))
		if limit < 0 || limit > bucket.MaxLogMax || now > 1<<62 || now < -1<<62 {
			return // Limit never returns these; clocks are nowhere near the int64 ends
		}
		c := Counter{Rule: algoRule(t, a, ""), Limit: limit, Hits: hits, Now: now, ID: []byte("id")}
		val, write, err := c.Apply(old, len(old) > 0)
		if err != nil {
			return
		}
		o := c.Out
		if o.CreditsLeft < 0 || o.Rule != c.Rule || (o.Allowed && o.RetryAfterMs != -1) || o.SecondsUntilReset < -1 {
			t.Fatalf("%s: outcome %+v", a, o)
		}
		if write {
			c.Now = now
			if _, _, err := c.Apply(append([]byte(nil), val...), true); err != nil && !errors.Is(err, ErrHits) {
				var ae *bucket.ArgError
				if !errors.As(err, &ae) {
					t.Fatalf("%s: the written value % x does not read back: %v", a, val, err)
				}
			}
		}
	})
}

// TestTokenBucketEmptyDenialWritesNothing: once a tokenBucket rule's
// bucket is empty, a denied hit writes nothing (it would change only the
// last write time), and the stored state is still judged idle only when
// the bucket has refilled.
func TestTokenBucketEmptyDenialWritesNothing(t *testing.T) {
	r := algoRule(t, TokenBucket, "") // 10 per 60 s: a token every 6 s
	c := Counter{Rule: r, Limit: 10, Hits: 1, ID: []byte("id")}
	var stored []byte
	start := int64(1_700_000_000_000_000_000)
	deniedWrites := 0
	for i := range 30 {
		c.Now = start + int64(i)*1e6 // 1 ms apart: the last 20 are denied
		val, write, err := c.Apply(stored, stored != nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.Out.Allowed != (i < 10) {
			t.Fatalf("hit %d: allowed %v", i, c.Out.Allowed)
		}
		if write {
			stored = append(stored[:0], val...)
			if i >= 10 {
				deniedWrites++
			}
		}
	}
	if deniedWrites != 0 {
		t.Errorf("%d of the 20 denied hits on an empty bucket wrote to the store, want 0", deniedWrites)
	}
	s, err := bucket.DecodeState(stored)
	if err != nil {
		t.Fatal(err)
	}
	p := r.BucketParams(10)
	startMs := start / 1e6
	if p.Idle(s, startMs+59_999) {
		t.Errorf("idle before the bucket can have refilled")
	}
	if !p.Idle(s, startMs+60_000+10) {
		t.Errorf("not idle a period after the last hit")
	}
	if tokens, _ := p.Available(s, true, startMs+60_010); tokens != p.Max {
		t.Errorf("a bucket judged idle has %d tokens, want %d (a missing one's)", tokens, p.Max)
	}
}
