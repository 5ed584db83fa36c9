package keyspace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/policy"
)

const t0 = int64(1_700_000_000) * 1e9 // unix ns

func TestLayout(t *testing.T) {
	key := []byte("user:42")
	slot := Slot(key)
	p := bucket.Params{Max: 10, RefillAmount: 5, RefillMs: 60000}
	for _, c := range []struct {
		name   string
		k      []byte
		kind   byte
		params []byte
	}{
		{"bucket", AppendBucketKey(nil, p, key), KindBucket, []byte{10, 5, 0xe0, 0xd4, 0x03}},
		{"gcra", AppendGCRAKey(nil, key), KindGCRA, nil},
		{"log", AppendLogKey(nil, key), KindLog, nil},
		{"window", AppendWindowKey(nil, 300000, false, key), KindWindow, []byte{0xe0, 0xa7, 0x12, 0}},
		{"window stagger", AppendWindowKey(nil, 300000, true, key), KindWindow, []byte{0xe0, 0xa7, 0x12, 1}},
	} {
		if got := uint16(c.k[0])<<8 | uint16(c.k[1]); got != slot || c.k[2] != c.kind {
			t.Errorf("%s: header % x, want slot %d kind %q", c.name, c.k[:3], slot, c.kind)
		}
		r, err := Parse(c.k)
		if err != nil {
			t.Fatalf("%s: Parse: %v", c.name, err)
		}
		if r.Slot != slot || r.Kind.ID != c.kind || !bytes.Equal(r.Params, c.params) || string(r.Key) != "user:42" {
			t.Errorf("%s: Parse = slot %d kind %s params % x key %q", c.name, r.Slot, r.Kind.Name, r.Params, r.Key)
		}
		if !ClientKey(c.k, key) || ClientKey(c.k, []byte("user:4")) {
			t.Errorf("%s: ClientKey does not match exactly its own key", c.name)
		}
		if Class(c.k) != r.Kind.Class || Class(c.k) < 1 || Class(c.k) > MaxClass {
			t.Errorf("%s: Class = %d, kind's %d", c.name, Class(c.k), r.Kind.Class)
		}
		lo, hi := SlotRange(slot)
		if bytes.Compare(c.k, lo[:]) < 0 || bytes.Compare(c.k, hi[:]) >= 0 {
			t.Errorf("%s: key % x outside its slot range [% x, % x)", c.name, c.k, lo, hi)
		}
	}
	// Windows of other lengths or stagger are other counters; one parameter
	// set's keys share a prefix.
	a, b := AppendWindowKey(nil, 300000, false, key), AppendWindowKey(nil, 300, false, key)
	if bytes.Equal(a, b) || bytes.Equal(a, AppendWindowKey(nil, 300000, true, key)) {
		t.Error("window identity ignores the window length or stagger")
	}
	// Keys that share a hash tag share a slot.
	if Slot([]byte("{user:42}:a")) != Slot([]byte("{user:42}:b")) {
		t.Error("hash tags do not share a slot")
	}
}

func TestCounterKey(t *testing.T) {
	pol, err := policy.ParseINI("t.ini", []byte("[default]\nactorField = ip\ncreditLimit = 3\nresetSeconds = 60\n"))
	if err != nil {
		t.Fatal(err)
	}
	req, err := policy.ParseArgs([][]byte{[]byte("method=GET"), []byte("ip=1.2.3.4")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rule, _ := pol.Match(req, nil)
	k := AppendCounterKey([]byte("prefix"), rule, req)[len("prefix"):]
	own := append([]byte{KindCounter}, rule.AppendCounterID(nil, req)...)
	if !bytes.Equal(k[2:], own) || uint16(k[0])<<8|uint16(k[1]) != Slot(own[1:]) {
		t.Fatalf("counter key % x: want slot of % x, then the counter key", k, own)
	}
	r, err := Parse(k)
	if err != nil || r.Kind.ID != KindCounter || string(r.Key) != "1.2.3.4" || len(r.Params) != policy.CounterIDLen {
		t.Fatalf("Parse = %+v, %v", r, err)
	}
	if ClientKey(k, []byte("1.2.3.4")) {
		t.Error("DEL would remove a divvy counter")
	}
}

// TestRuleKey: each algorithm's counter is a record of its kind, whose
// client key is the rule identity and actor and whose slot is theirs; a
// divvy rule's is the divvy counter key. Records of every kind are idle
// and described as their kind's.
func TestRuleKey(t *testing.T) {
	pol, err := policy.ParseINI("t.ini", []byte(`[a=divvy]
creditLimit = 3
resetSeconds = 60
actorField = ip
[a=fw]
algorithm = fixedWindow
stagger = true
creditLimit = 3
resetSeconds = 60
actorField = ip
[a=tb]
algorithm = tokenBucket
quotaField = q
maxQuota = 100
creditLimit = 3
resetSeconds = 60
actorField = ip
[a=gcra]
algorithm = gcra
creditLimit = 3
resetSeconds = 60
actorField = ip
[a=log]
algorithm = slidingLog
creditLimit = 3
resetSeconds = 60
actorField = ip
[default]
creditLimit = 0
resetSeconds = 0
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		a      string
		kind   byte
		params string
	}{
		{"divvy", KindCounter, ""}, {"fw", KindRuleWindow, "\xe0\xd4\x03\x01"}, {"tb", KindRuleBucket, "\x07\x07\xe0\xd4\x03"}, // the quota, 7 per 60 s,
		{"gcra", KindRuleGCRA, ""}, {"log", KindRuleLog, ""},
	} {
		req, _ := policy.ParseArgs([][]byte{[]byte("a=" + tt.a), []byte("ip=1.2.3.4"), []byte("q=7")}, nil)
		rule, _ := pol.Match(req, nil)
		limit, _ := rule.Limit(req)
		id := rule.AppendCounterID(nil, req)
		k := AppendRuleKey([]byte("prefix"), rule, limit, id)[len("prefix"):]
		r, err := Parse(k)
		if err != nil || r.Kind.ID != tt.kind || r.Slot != Slot(id) {
			t.Fatalf("%s: Parse(% x) = %+v, %v; want kind %c in the slot of % x", tt.a, k, r, err, tt.kind, id)
		}
		if !bytes.Equal(r.ID(), id) {
			t.Errorf("%s: ID % x, want the counter identity % x", tt.a, r.ID(), id)
		}
		if tt.kind == KindCounter {
			if !bytes.Equal(k, AppendCounterKey(nil, rule, req)) {
				t.Errorf("divvy: % x is not the divvy counter key", k)
			}
			continue
		}
		if string(r.Params) != tt.params || !bytes.Equal(r.Key, id) {
			t.Errorf("%s: params % x key % x, want % x and % x", tt.a, r.Params, r.Key, tt.params, id)
		}
		// No command reaches a rule counter: DEL does not match it, and
		// no command kind's key of the same bytes is it.
		if r.Kind.HasClientKey || ClientKey(k, id) {
			t.Errorf("%s: DEL of the counter's identity would delete it", tt.a)
		}
		p := rule.BucketParams(limit)
		for _, cmdKey := range [][]byte{AppendBucketKey(nil, p, id), AppendGCRAKey(nil, id), AppendLogKey(nil, id),
			AppendWindowKey(nil, rule.PeriodMillis(), rule.Stagger, id), AppendWindowKey(nil, 60000, false, id)} {
			if bytes.Equal(cmdKey, k) {
				t.Errorf("%s: the rule counter % x is a command's key", tt.a, k)
			}
		}
		// The sweep and sluice inspect read it with its command kind's
		// codec.
		if want := Lookup(tt.kind + 'a' - 'A'); r.Kind.Class == want.Class || r.Kind.Name != "rule_"+want.Name {
			t.Errorf("%s: kind %s class %d, want its own class and the name rule_%s", tt.a, r.Kind.Name, r.Kind.Class, want.Name)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for _, k := range [][]byte{
		nil, {0}, {0, 0}, {0x40, 0, 'g'}, {0, 0, 'z', 'k'}, {0xff, 0xff, 'g'},
		{0, 0, 'b', 0, 1, 1}, // max 0
		{0, 0, 'b', 1, 1},    // truncated
		{0, 0, 'b', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 1, 1}, // > MaxInt64
		{0, 0, 'w', 5},       // no stagger byte
		{0, 0, 'w', 5, 2},    // stagger 2
		{0, 0, 'd', 1, 2, 3}, // short rule identity
	} {
		if _, err := Parse(k); !errors.Is(err, ErrBadKey) {
			t.Errorf("Parse(% x) = %v, want ErrBadKey", k, err)
		}
		if Idle(k, nil, t0) || Class(k) != 0 && len(k) >= 3 && Lookup(k[2]) == nil {
			t.Errorf("% x: idle or classed", k)
		}
	}
}

func TestIdle(t *testing.T) {
	key := []byte("k")
	p := bucket.Params{Max: 10, RefillAmount: 10, RefillMs: 1000}
	nowMs := t0 / 1e6
	full := bucket.AppendState(nil, bucket.State{Amount: 10, Anchor: nowMs - 5000, LastReduce: nowMs - 5000})
	used := bucket.AppendState(nil, bucket.State{Amount: 3, Anchor: nowMs, LastReduce: nowMs})
	for _, c := range []struct {
		name string
		k, v []byte
		idle bool
	}{
		{"bucket full", AppendBucketKey(nil, p, key), full, true},
		{"bucket used", AppendBucketKey(nil, p, key), used, false},
		{"bucket corrupt", AppendBucketKey(nil, p, key), []byte{9}, false},
		{"gcra past", AppendGCRAKey(nil, key), bucket.AppendGCRAState(nil, bucket.GCRAState{TAT: t0}), true},
		{"gcra future", AppendGCRAKey(nil, key), bucket.AppendGCRAState(nil, bucket.GCRAState{TAT: t0 + 1}), false},
		{"window ended", AppendWindowKey(nil, 1000, false, key), bucket.AppendWindowState(nil, bucket.WindowState{End: nowMs, Count: 3}), true},
		{"window live", AppendWindowKey(nil, 1000, false, key), bucket.AppendWindowState(nil, bucket.WindowState{End: nowMs + 1, Count: 3}), false},
		{"log idle", AppendLogKey(nil, key), bucket.AppendLogState(nil, bucket.LogState{Interval: 1000, Entries: []int64{t0/1e3 - 5e6, t0/1e3 - 1e6}}), true},
		{"log live", AppendLogKey(nil, key), bucket.AppendLogState(nil, bucket.LogState{Interval: 1000, Entries: []int64{t0/1e3 - 1e6 + 1, t0/1e3 - 5e6}}), false},
		{"log corrupt", AppendLogKey(nil, key), []byte{1, 10, 5, 0}, false},
		{"counter ended", append([]byte{0, 0, 'd'}, "12345678ip"...), policy.AppendWindow(nil, policy.Window{End: nowMs, Left: 1}), true},
		{"counter live", append([]byte{0, 0, 'd'}, "12345678ip"...), policy.AppendWindow(nil, policy.Window{End: nowMs + 1, Left: 1}), false},
	} {
		if got := Idle(c.k, c.v, t0); got != c.idle {
			t.Errorf("%s: Idle = %v, want %v", c.name, got, c.idle)
		}
		r, err := Parse(c.k)
		if err != nil {
			t.Fatal(err)
		}
		d, err := r.Describe(c.v, t0)
		if strings.HasSuffix(c.name, "corrupt") {
			if err == nil {
				t.Errorf("%s: described a corrupt value", c.name)
			}
			continue
		}
		if err != nil || d.Idle != c.idle || d.State == "" || len(d.Fields) == 0 {
			t.Errorf("%s: Describe = %+v, %v", c.name, d, err)
		}
	}
}

func TestUpgradeKey(t *testing.T) {
	p := bucket.Params{Max: 3, RefillAmount: 1, RefillMs: 1000}
	for _, key := range []string{"user:42", "", "{tag}x", "\xff\x00bin"} {
		old := AppendBucketKey(nil, p, []byte(key))[2:] // format 1: no slot
		nk, moved, err := UpgradeKey(nil, old)
		if err != nil || !moved || !bytes.Equal(nk, AppendBucketKey(nil, p, []byte(key))) {
			t.Errorf("bucket %q: UpgradeKey = % x, %v, %v", key, nk, moved, err)
		}
		again, moved, err := UpgradeKey(nil, nk)
		if err != nil || moved || again != nil {
			t.Errorf("bucket %q: a second UpgradeKey = % x, %v, %v", key, again, moved, err)
		}
	}
	oldCounter := append([]byte{'d'}, "12345678actor"...)
	nk, moved, err := UpgradeKey(nil, oldCounter)
	if err != nil || !moved || Slot(nk[3:]) != uint16(nk[0])<<8|uint16(nk[1]) || !bytes.Equal(nk[2:], oldCounter) {
		t.Errorf("counter: UpgradeKey = % x, %v, %v", nk, moved, err)
	}
	for _, k := range [][]byte{nil, {'b'}, {'b', 0, 1, 1}, {'d', 1}, {'x', 1, 2}, {0, 0, 'z'}} {
		if _, _, err := UpgradeKey(nil, k); err == nil {
			t.Errorf("UpgradeKey(% x) accepted a key of no layout", k)
		}
	}
}

func TestKinds(t *testing.T) {
	seen := map[int]bool{}
	for _, k := range Kinds() {
		if Lookup(k.ID) != k || k.Class < 1 || k.Class > MaxClass || seen[k.Class] || k.Name == "" {
			t.Errorf("kind %q: bad registry entry %+v", k.ID, k)
		}
		seen[k.Class] = true
	}
}

// FuzzParse: any key parses or is refused, and what parses is consistent.
func FuzzParse(f *testing.F) {
	f.Add(AppendBucketKey(nil, bucket.Params{Max: 1, RefillAmount: 1, RefillMs: 1}, []byte("k")), []byte{1, 0, 2, 0})
	f.Add(AppendWindowKey(nil, math.MaxInt64, true, []byte("k")), bucket.AppendWindowState(nil, bucket.WindowState{End: 5}))
	f.Add(AppendGCRAKey(nil, []byte("\xff")), bucket.AppendGCRAState(nil, bucket.GCRAState{TAT: math.MinInt64}))
	f.Add(AppendLogKey(nil, []byte("k")), bucket.AppendLogState(nil, bucket.LogState{Interval: 1, Entries: []int64{math.MinInt64, math.MaxInt64}}))
	f.Fuzz(func(t *testing.T, k, v []byte) {
		Idle(k, v, t0)
		Class(k)
		UpgradeKey(nil, k)
		r, err := Parse(k)
		if err != nil {
			return
		}
		if r.Slot >= Slots || len(r.Params)+len(r.Key) != len(k)-HeaderLen {
			t.Fatalf("Parse(% x) = %+v", k, r)
		}
		r.Describe(v, t0)
	})
}

// TestRuleCounterKindsUseTheirCommandCodecs: a rule counter's record is
// split, judged idle and described as the command kind's record of the
// same parameters and value, so the sweep and sluice inspect treat both
// alike, but it is counted in a class of its own.
func TestRuleCounterKindsUseTheirCommandCodecs(t *testing.T) {
	id := []byte("12345678actor")
	ms := t0 / 1e6
	p := bucket.Params{Max: 10, RefillAmount: 1, RefillMs: 6000}
	ruleKey := func(kind byte, cmdKey []byte) []byte {
		k := append([]byte(nil), cmdKey...)
		k[2] = kind
		return k
	}
	for _, c := range []struct {
		name   string
		kind   byte
		cmdKey []byte
		val    []byte
	}{
		{"bucket", KindRuleBucket, AppendBucketKey(nil, p, id), bucket.AppendState(nil, bucket.State{Amount: 3, Anchor: ms, LastReduce: ms})},
		{"gcra", KindRuleGCRA, AppendGCRAKey(nil, id), bucket.AppendGCRAState(nil, bucket.GCRAState{TAT: t0 + 5e9})},
		{"window", KindRuleWindow, AppendWindowKey(nil, 60000, true, id), bucket.AppendWindowState(nil, bucket.WindowState{End: ms + 30000, Count: 4})},
		{"log", KindRuleLog, AppendLogKey(nil, id), bucket.AppendLogState(nil, bucket.LogState{Interval: 60000, Entries: []int64{ms * 1000, ms*1000 + 7}})},
	} {
		k := ruleKey(c.kind, c.cmdKey)
		r, err := Parse(k)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		cr, _ := Parse(c.cmdKey)
		if !bytes.Equal(r.Params, cr.Params) || !bytes.Equal(r.Key, id) || r.Kind.HasClientKey || Class(k) == Class(c.cmdKey) {
			t.Errorf("%s: rule counter %+v, command record %+v", c.name, r, cr)
		}
		for _, now := range []int64{t0, t0 + 3600e9} {
			if Idle(k, c.val, now) != Idle(c.cmdKey, c.val, now) {
				t.Errorf("%s at %d: idle %v, the command kind's %v", c.name, now, Idle(k, c.val, now), Idle(c.cmdKey, c.val, now))
			}
			d, err1 := r.Describe(c.val, now)
			cd, err2 := cr.Describe(c.val, now)
			if err1 != nil || err2 != nil || d.Params != cd.Params || d.State != cd.State || d.Idle != cd.Idle {
				t.Errorf("%s: described %+v, %v; the command kind's %+v, %v", c.name, d, err1, cd, err2)
			}
		}
	}
}

// TestBucketKeyHeader: the buckets of one parameter set in a slot share a
// header that no other set's keys start with, whatever the client key.
func TestBucketKeyHeader(t *testing.T) {
	p := bucket.Params{Max: 10, RefillAmount: 3, RefillMs: 5000}
	// Both keys hash to the slot of the tag.
	k1 := AppendBucketKey(nil, p, []byte("{t}user:1"))
	k2 := AppendBucketKey(nil, p, []byte("{t}"))
	k2 = k2[:len(k2)-len("{t}")]
	if !bytes.HasPrefix(k1, k2) || len(k2) > HeaderLen+3*binary.MaxVarintLen64 {
		t.Fatalf("keys of one parameter set do not share a header: %x %x", k1, k2)
	}
	if len(k2) != HeaderLen+4 {
		t.Errorf("header of small parameters takes %d bytes, want %d", len(k2), HeaderLen+4)
	}
	// The parameters are a prefix-free code.
	for _, q := range []bucket.Params{{Max: 10, RefillAmount: 3, RefillMs: 50}, {Max: 10, RefillAmount: 3, RefillMs: 500000}, {Max: 1, RefillAmount: 1, RefillMs: 1}, {Max: math.MaxInt64, RefillAmount: math.MaxInt64, RefillMs: math.MaxInt64}} {
		if bytes.HasPrefix(AppendBucketKey(nil, q, k1[len(k2):]), k2) {
			t.Errorf("key of %+v starts with the header of %+v", q, p)
		}
	}
	for _, q := range []bucket.Params{p, {Max: 1, RefillAmount: 1, RefillMs: 1}, {Max: math.MaxInt64, RefillAmount: math.MaxInt64, RefillMs: math.MaxInt64}} {
		r, err := Parse(AppendBucketKey(nil, q, []byte("user:1")))
		if err != nil || string(r.Key) != "user:1" {
			t.Fatalf("Parse of the key of %+v: %+v %v", q, r, err)
		}
		if got, ok := bucketParams(r.Params); !ok || got != q {
			t.Fatalf("parameters of the key of %+v: %+v", q, got)
		}
	}
	for _, bad := range [][]byte{{0, 0, KindBucket, 0, 1, 1}, {0, 0, KindBucket, 0xff, 0xff}} {
		if _, err := Parse(bad); err == nil {
			t.Fatalf("Parse accepted % x", bad)
		}
	}
}

// BenchmarkReduceEncoded is the whole per-command bucket work of RL.REDUCE:
// build the store key, decode the stored value, reduce, encode the result.
func BenchmarkReduceEncoded(b *testing.B) {
	p := bucket.Params{Max: 100, RefillAmount: 100, RefillMs: 60_000}
	key := []byte("user:1234567")
	stored := bucket.AppendState(nil, bucket.State{Amount: 50, Anchor: 1_700_000_000_000, LastReduce: 1_700_000_000_000})
	kbuf := make([]byte, 0, 64)
	vbuf := make([]byte, 0, bucket.MaxStateLen)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		kbuf = AppendBucketKey(kbuf[:0], p, key)
		s, err := bucket.DecodeState(stored)
		if err != nil {
			b.Fatal(err)
		}
		_, next, _ := p.Reduce(s, true, bucket.Request{Now: s.Anchor + int64(i), Server: s.Anchor, Take: 1})
		vbuf = bucket.AppendState(vbuf[:0], next)
	}
}

// TestRecordSlotKindAndID: the parts of a record key others ask for, read
// where Parse reads them, and the store's partition of a key.
func TestRecordSlotKindAndID(t *testing.T) {
	key := []byte("user:42")
	k := AppendGCRAKey(nil, key)
	if s, ok := RecordSlot(k); !ok || s != Slot(key) {
		t.Errorf("RecordSlot = %d, %v; want %d", s, ok, Slot(key))
	}
	for _, bad := range [][]byte{nil, {0}, {0x40, 0}, {0xff, 's'}} {
		if s, ok := RecordSlot(bad); ok || s != 0 {
			t.Errorf("RecordSlot(% x) = %d, %v", bad, s, ok)
		}
	}
	// The store's partition is the slot; any key has one.
	if Partition(k) != int(Slot(key)) || Partition(nil) != 0 || Partition([]byte{0x40, 1}) != 1 || Partition([]byte{0xff, 0xff}) >= Partitions {
		t.Errorf("Partition(% x) = %d, want slot %d", k, Partition(k), Slot(key))
	}
	if KindOf(k) != Lookup(KindGCRA) || KindOf(k[:2]) != nil || KindOf([]byte{0, 0, 'x'}) != nil {
		t.Error("KindOf does not read the kind byte")
	}
	r, _ := Parse(k)
	if string(r.ID()) != "user:42" {
		t.Errorf("GCRA record ID %q", r.ID())
	}
}
