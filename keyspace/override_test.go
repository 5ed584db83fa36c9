package keyspace

import (
	"bytes"
	"testing"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/policy"
)

// TestOverrideKeys: an override key parses back to its label and actor,
// in the label's slot, after every key of the label's prefix; neither
// overrides nor their counts are ever idle or a client key's.
func TestOverrideKeys(t *testing.T) {
	k := AppendOverrideKey(nil, "api", []byte("10.0.0.1"))
	r, err := Parse(k)
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind.ID != KindOverride || r.Slot != Slot([]byte("api")) || string(r.Key) != "10.0.0.1" || !bytes.HasPrefix(k, AppendOverridePrefix(nil, "api")) {
		t.Fatalf("Parse(% x) = %+v", k, r)
	}
	d, err := r.Describe(AppendUint(nil, 7), t0)
	if err != nil || d.State != "limit=7" || d.Params != "label=api" {
		t.Fatalf("Describe = %+v, %v", d, err)
	}
	if Idle(k, AppendUint(nil, 7), t0+1e18) || ClientKey(k, []byte("10.0.0.1")) {
		t.Error("an override is idle or a client key's")
	}
	ck := AppendOverrideCountKey(nil, "api")
	lo, hi := OverrideCountRange()
	if bytes.Compare(ck, lo) < 0 || bytes.Compare(ck, hi) >= 0 || OverrideCountLabel(ck) != "api" || Idle(ck, AppendUint(nil, 1), t0+1e18) {
		t.Fatalf("count key % x out of [% x, % x) or idle", ck, lo, hi)
	}
	// An empty actor (a request without the actor field) is an actor too.
	if r, err := Parse(AppendOverrideKey(nil, "api", nil)); err != nil || len(r.Key) != 0 {
		t.Fatalf("empty actor: %+v, %v", r, err)
	}
	for _, bad := range [][]byte{{0, 0, KindOverride}, {0, 0, KindOverride, 5, 'a'}} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(% x) accepted a malformed override key", bad)
		}
	}
	if _, err := DecodeUint([]byte{0x80}); err == nil {
		t.Error("DecodeUint accepted a truncated value")
	}
}

// TestMarkedCounterValues: a rule counter's value with an override mark
// is judged idle and described as the same value without it, and
// SplitMarked returns the override; values without a mark read as before.
func TestMarkedCounterValues(t *testing.T) {
	ms := t0 / 1e6
	id := []byte("12345678actor")
	win := policy.AppendWindow(nil, policy.Window{End: ms + 5000, Left: 2})
	gcra := bucket.AppendGCRAState(nil, bucket.GCRAState{TAT: t0 + 5e9})
	for _, c := range []struct {
		key, val []byte
	}{
		{append([]byte{0, 0, KindCounter}, id...), win},
		{append([]byte{0, 0, KindRuleGCRA}, id...), gcra},
	} {
		m := AppendMarked(nil, 42, c.val)
		limit, ok, inner, err := SplitMarked(m)
		if err != nil || !ok || limit != 42 || !bytes.Equal(inner, c.val) {
			t.Fatalf("SplitMarked = %d %v % x %v", limit, ok, inner, err)
		}
		if _, ok, inner, _ := SplitMarked(c.val); ok || !bytes.Equal(inner, c.val) {
			t.Fatal("an unmarked value read as marked")
		}
		r, _ := Parse(c.key)
		for _, now := range []int64{t0, t0 + 3600e9} {
			if Idle(c.key, m, now) != Idle(c.key, c.val, now) {
				t.Errorf("kind %q: marked value idle %v at %d", r.Kind.ID, Idle(c.key, m, now), now)
			}
		}
		d, err := r.Describe(m, t0)
		if err != nil || !bytes.Contains([]byte(d.State), []byte("override=42")) {
			t.Errorf("kind %q: Describe = %+v, %v", r.Kind.ID, d, err)
		}
	}
	if _, _, _, err := SplitMarked([]byte{OverrideMark}); err == nil {
		t.Error("SplitMarked accepted a truncated mark")
	}
}
