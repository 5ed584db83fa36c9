package policy

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

func req(kv ...string) Request {
	var q Request
	for i := 0; i+1 < len(kv); i += 2 {
		q = append(q, Field{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
	}
	return q
}

func condOf(value string) cond { return compile([]Pair{{Key: "k", Value: value}})[0] }

func TestGlob(t *testing.T) {
	tests := []struct {
		pattern, value string
		want           bool
	}{
		{"abc", "abc", true},
		{"abc", "abcd", false},
		{"abc", "", false},
		{"", "", true},
		{"", "x", false},
		{"*", "", true},
		{"*", "anything/at/all", true},
		{"**", "", true},
		{"/v1/billing/*", "/v1/billing/", true},
		{"/v1/billing/*", "/v1/billing/x/y", true},
		{"/v1/billing/*", "/v1/billing", false},
		{"/v1/billing/*", "/v1/billingx", false},
		{"/v1/*/billing", "/v1/a/b/billing", true},
		{"/v1/*/billing", "/v1//billing", true},
		{"/v1/*/billing", "/v1/billing", false},     // prefix and suffix may not overlap
		{"/v1/*/billing", "/v1/x/billing/y", false}, // the whole value, unlike divvy
		{"/account*", "/accounts/1", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "acb", false},
		{"a*b*c", "abcbc", true},
		{"*a*a*", "aa", true},
		{"*a*a*", "a", false},
		{"*.txt", "a.txt", true},
		{"*.txt", "atxt", false}, // `.` is literal
		{"a*", "a*", true},       // a request value may hold a `*`
		{"*x*", "ab", false},
		{"ab*ba", "aba", false},
		{"ab*ba", "abba", true},
	}
	for _, tt := range tests {
		c := condOf(tt.pattern)
		if got := c.matchValue([]byte(tt.value)); got != tt.want {
			t.Errorf("%q ~ %q: got %v, want %v", tt.pattern, tt.value, got, tt.want)
		}
		if got := refGlob(tt.pattern).MatchString(tt.value); got != tt.want {
			t.Errorf("reference %q ~ %q: got %v, want %v", tt.pattern, tt.value, got, tt.want)
		}
	}
}

// refGlob is the glob as a regular expression: the literal runs quoted,
// each `*` turned into `.*` that also matches newlines.
func refGlob(pattern string) *regexp.Regexp {
	parts := strings.Split(pattern, "*")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`(?s)\A` + strings.Join(parts, ".*") + `\z`)
}

func TestRequestGet(t *testing.T) {
	q := req("a", "1", "b", "2", "a", "3", "", "")
	for _, tt := range []struct {
		key, want string
		ok        bool
	}{{"a", "3", true}, {"b", "2", true}, {"", "", true}, {"c", "", false}} {
		v, ok := q.Get(tt.key)
		if string(v) != tt.want || ok != tt.ok {
			t.Errorf("Get(%q) = %q, %v; want %q, %v", tt.key, v, ok, tt.want, tt.ok)
		}
	}
}

func TestMatch(t *testing.T) {
	p := mustINI(t, `
[method=GET path=/v1/*]
matchPolicy = canary
label = c1
`+iniBody+`
[method=GET path=/v1/*/billing ip=*]
label = s1
`+iniBody+`
[path=*]
matchPolicy = canary
label = c2
`+iniBody+`
[method=GET path=/v1/*]
label = s2
`+iniBody+`
[empty=]
label = s3
`+iniBody+`
[default]
label = d
`+iniBody)
	tests := []struct {
		req      Request
		decider  string
		canaries string
	}{
		{req("method", "GET", "path", "/v1/x/billing", "ip", "1"), "s1", "c1"},
		{req("method", "GET", "path", "/v1/x/billing", "ip", ""), "s1", "c1"},    // `*` takes the empty value
		{req("method", "GET", "path", "/v1/x/billing"), "s2", "c1 c2"},           // ip missing
		{req("method", "GET", "path", "/v2", "ip", "1"), "d", "c2"},              // keys the rule lacks are ignored
		{req("method", "get", "path", "/v1/x"), "d", "c2"},                       // values are not normalised
		{req("method", "POST", "method", "GET", "path", "/v1/x"), "s2", "c1 c2"}, // the last value counts
		{req("method", "GET", "method", "POST", "path", "/v1/x"), "d", "c2"},     // the last value counts
		{req("empty", ""), "s3", ""},                                             // an empty value is a value
		{req("empty", "x"), "d", ""},
		{req(), "d", ""},
		{req("METHOD", "GET", "path", "/v1/x/billing", "ip", "1"), "d", "c2"}, // keys are case-sensitive
		{req("method", "GET", "path", "/v1/x/billing", "ip", "1", "x", "y"), "s1", "c1"},
	}
	buf := make([]*Rule, 0, 4)
	for i, tt := range tests {
		d, cs := p.Match(tt.req, buf[:0])
		var labels []string
		for _, c := range cs {
			labels = append(labels, c.Label)
		}
		if d.Label != tt.decider || strings.Join(labels, " ") != tt.canaries {
			t.Errorf("case %d: got %s [%s], want %s [%s]", i, d.Label, strings.Join(labels, " "), tt.decider, tt.canaries)
		}
	}
}

func TestCounterID(t *testing.T) {
	base := `
[a=1 b=*]
actorField = b
label = one
comment = first
creditLimit = 5
resetSeconds = 60
[default]
` + iniBody
	key := func(p *Policy, pos int, q Request) string {
		return string(p.Rules()[pos-1].AppendCounterID(nil, q))
	}
	p := mustINI(t, base)
	q := req("a", "1", "b", "x y")
	k := key(p, 1, q)
	if len(k) != idLen+3 || !strings.HasSuffix(k, "x y") {
		t.Fatalf("key %q", k)
	}
	if key(p, 1, req("a", "1", "b", "z")) == k {
		t.Error("other actor, same key")
	}
	if k2 := key(p, 2, q); k2 == k || len(k2) != idLen {
		t.Errorf("default key %q", k2)
	}
	// Same counter: keys reordered, rule moved, label, comment and
	// matchPolicy edited.
	same := mustINI(t, "[other=1]\n"+iniBody+strings.NewReplacer("[a=1 b=*]", "[b=* a=1]", "label = one", "label = two", "comment = first", "matchPolicy = canary").Replace(base))
	if key(same, 2, q) != k {
		t.Error("cosmetic edits changed the counter key")
	}
	// Fresh counter: limits, actor field or operation changed.
	for _, edit := range [][2]string{{"creditLimit = 5", "creditLimit = 6"}, {"resetSeconds = 60", "resetSeconds = 61"}, {"actorField = b", "actorField = a"}, {"[a=1 b=*]", "[a=1 b=* c=*]"}} {
		if key(mustINI(t, strings.Replace(base, edit[0], edit[1], 1)), 1, req("a", "1", "b", "x y", "c", "")) == k {
			t.Errorf("%s -> %s kept the counter key", edit[0], edit[1])
		}
	}
	// Identical canaries do not share a counter; no actor field: no actor.
	twins := mustINI(t, "[a=1]\nmatchPolicy=canary\n"+iniBody+"[a=1]\nmatchPolicy=canary\n"+iniBody+iniDefault)
	if k1, k2 := key(twins, 1, q), key(twins, 2, q); k1 == k2 || len(k1) != idLen {
		t.Errorf("twin keys %q %q", k1, k2)
	}
	// A missing actor is the empty string.
	if key(p, 1, req("a", "1")) != key(p, 1, req("a", "1", "b", "")) {
		t.Error("missing actor differs from empty actor")
	}
}

func FuzzGlob(f *testing.F) {
	f.Add("/v1/*/billing", "/v1/*", "/v1/a/billing")
	f.Add("a*b*c", "*", "abc")
	f.Add("*a*a*", "a*a", "aaa")
	f.Add("**", "*", "")
	f.Fuzz(func(t *testing.T, pattern, later, value string) {
		if !utf8.ValidString(pattern) || !utf8.ValidString(value) {
			return // regexp works on runes
		}
		c := condOf(pattern)
		if got, want := c.matchValue([]byte(value)), refGlob(pattern).MatchString(value); got != want {
			t.Fatalf("%q ~ %q: got %v, reference %v", pattern, value, got, want)
		}
		// covers is sound: if pattern covers later, it matches every value
		// later matches.
		l := condOf(later)
		if c.matchValue([]byte(later)) && l.matchValue([]byte(value)) && !c.matchValue([]byte(value)) {
			t.Fatalf("%q covers %q, which matches %q, but %q does not", pattern, later, value, pattern)
		}
	})
}

// refMatch is Match written plainly, on a map and the regexp glob.
func refMatch(p *Policy, q Request) (decider *Rule, canaries []*Rule) {
	m := map[string]string{}
	for _, f := range q {
		m[string(f.Key)] = string(f.Value)
	}
	for _, r := range p.Rules() {
		ok := true
		for _, kv := range r.Operation {
			v, present := m[kv.Key]
			ok = ok && present && refGlob(kv.Value).MatchString(v)
		}
		if !ok {
			continue
		}
		if r.MatchPolicy == Stop {
			return r, canaries
		}
		canaries = append(canaries, r)
	}
	return nil, canaries
}

func FuzzMatch(f *testing.F) {
	f.Add([]byte(mustRead(f, "testdata/algorithms.ini")), []byte("HIT path=/quota user=a quota=4"))
	f.Add([]byte(mustRead(f, "testdata/algorithms.ini")), []byte("HIT path=/gcra-quota user=a quota=99999999999999999999999"))
	f.Add([]byte(mustRead(f, "testdata/algorithms.ini")), []byte("HIT path=/quota user=a quota=-1"))
	for _, file := range []string{"testdata/test-config.ini", "testdata/example-config.ini"} {
		f.Add([]byte(mustRead(f, file)), []byte("HIT method=GET path=/ping local=true ip=1"))
		f.Add([]byte(mustRead(f, file)), []byte(`HIT method=POST path="/account/x y" isAuthenticated=true ip=`))
	}
	f.Fuzz(func(t *testing.T, ini, line []byte) {
		p, err := ParseINI("f.ini", ini)
		if err != nil || !allValidUTF8(p) || !utf8.Valid(line) {
			return
		}
		cmd, q, err := ParseLine(line, nil)
		if err != nil || cmd != CmdHit {
			return
		}
		d, cs := p.Match(q, nil)
		rd, rcs := refMatch(p, q)
		if d != rd || len(cs) != len(rcs) {
			t.Fatalf("Match: %v %v, reference %v %v", d, cs, rd, rcs)
		}
		for i := range cs {
			if cs[i] != rcs[i] || cs[i].Pos >= d.Pos {
				t.Fatalf("canary %d: %v, reference %v", i, cs[i], rcs[i])
			}
		}
		if k := d.AppendCounterID(nil, q); len(k) < idLen {
			t.Fatalf("counter key %q", k)
		}
		// The limit is creditLimit, or a quota within [0, maxQuota].
		limit, st := d.Limit(q)
		switch {
		case d.QuotaField == "" && (st != QuotaNone || limit != d.CreditLimit),
			(st == QuotaMissing || st == QuotaMalformed) && limit != d.CreditLimit,
			st == QuotaClamped && limit != d.MaxQuota,
			st == QuotaUsed && (limit < 0 || limit > d.MaxQuota):
			t.Fatalf("Limit of rule %d for %q: %d %v", d.Pos, line, limit, st)
		}
	})
}

func benchPolicy(b *testing.B) (*Policy, Request) {
	p := mustLoad(b, "testdata/test-config.ini")
	// Falls through four rules, one of them a glob, to the fifth.
	return p, req("method", "POST", "path", "/accounts/settings", "isAuthenticated", "false", "ip", "10.1.2.3")
}

func BenchmarkMatchCounterID(b *testing.B) {
	p, q := benchPolicy(b)
	canaries := make([]*Rule, 0, 8)
	key := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		d, cs := p.Match(q, canaries[:0])
		for _, c := range cs {
			key = c.AppendCounterID(key[:0], q)
		}
		key = d.AppendCounterID(key[:0], q)
	}
	if d, _ := p.Match(q, nil); d.Label != "post-by-ip" {
		b.Fatal(d.Label)
	}
}

// BenchmarkLineHit is the whole per-request work of the line protocol
// outside the store: parse, match, key, count, encode, reply.
func BenchmarkLineHit(b *testing.B) {
	p, _ := benchPolicy(b)
	line := []byte("HIT method=POST path=\"/accounts/settings\" isAuthenticated=false ip=10.1.2.3\r\n")
	var (
		q        Request
		canaries = make([]*Rule, 0, 8)
		key      = make([]byte, 0, 64)
		val      = make([]byte, 0, WindowLen)
		reply    = make([]byte, 0, 64)
		w        = Window{End: 1 << 62, Left: 1 << 40}
	)
	b.ReportAllocs()
	for b.Loop() {
		_, q, _ = ParseLine(line, q)
		d, _ := p.Match(q, canaries[:0])
		key = d.AppendCounterID(key[:0], q)
		next, _, out := d.Hit(w, true, 1_000_000)
		val = AppendWindow(val[:0], next)
		w, _ = DecodeWindow(val)
		reply = out.AppendReply(reply[:0])
	}
}
