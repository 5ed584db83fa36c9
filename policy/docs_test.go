package policy

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docBlock is a fenced code block of docs/policy.md in a given language.
var docBlock = regexp.MustCompile("(?s)```(ini|json)\n(.*?)```")

// TestDocExample loads the example rule file of docs/policy.md, in INI and
// in JSON, and replays what its comments promise: the status and cookie
// limits decide, and the canary counts the special cookie's requests
// without deciding them. A canary placed after the stop rule that matches
// its requests would never be counted.
func TestDocExample(t *testing.T) {
	raw, err := os.ReadFile("../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string]string{}
	for _, m := range docBlock.FindAllStringSubmatch(string(raw), -1) {
		if _, seen := blocks[m[1]]; !seen {
			blocks[m[1]] = m[2] // the first of each: the example of "Rule files"
		}
	}
	for _, lang := range []string{"ini", "json"} {
		t.Run(lang, func(t *testing.T) {
			src, ok := blocks[lang]
			if !ok {
				t.Fatalf("docs/policy.md has no %s example", lang)
			}
			parse := ParseINI
			if lang == "json" {
				parse = ParseJSON
			}
			p, err := parse("policy.md", []byte(src))
			if err != nil {
				t.Fatalf("the %s example does not load: %v", lang, err)
			}
			s := memStore{}
			const t0 = int64(1_700_000_000_000)
			for i, st := range []struct {
				at       int64
				line     string
				want     string
				canaries []string
			}{
				{t0, "HIT method=GET path=/status", "OK true 999 60", nil},
				{t0, "HIT method=GET path=/pantry/cookies/oatmeal ip=1.2.3.4", "OK true 2 3600", nil},
				{t0, "HIT method=GET path=/pantry/cookies/special-cookie ip=1.2.3.4", "OK true 1 3600", []string{"special-cookie-canary:true"}},
				{t0 + sec, "HIT method=GET path=/pantry/cookies/special-cookie ip=5.6.7.8", "OK true 2 3600", []string{"special-cookie-canary:false"}},
				{t0, "HIT method=DELETE path=/status", "OK false 0 -1", nil},
			} {
				got, canaries := s.hit(t, p, st.line, st.at)
				if got != st.want || !slices.Equal(canaries, st.canaries) {
					t.Errorf("step %d %q: got %q canaries %q, want %q canaries %q", i, st.line, got, canaries, st.want, st.canaries)
				}
			}
		})
	}
}

// TestDocBlocksLoad: every INI and JSON block of docs/policy.md loads, and
// the quota example's requests get the limits the text gives them.
func TestDocBlocksLoad(t *testing.T) {
	raw, err := os.ReadFile("../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	quotas := 0
	for i, m := range docBlock.FindAllStringSubmatch(string(raw), -1) {
		parse := ParseINI
		if m[1] == "json" {
			parse = ParseJSON
		}
		p, err := parse("policy.md", []byte(m[2]))
		if err != nil {
			t.Errorf("block %d (%s) does not load: %v", i+1, m[1], err)
			continue
		}
		r := p.Rules()[0]
		if r.QuotaField == "" {
			continue
		}
		quotas++
		for _, tt := range []struct {
			line  string
			limit int64
		}{
			{"HIT path=/api/orders tenant=acme quota=5000", 5000},
			{"HIT path=/api/orders tenant=acme quota=50000", 10000},
			{"HIT path=/api/orders tenant=acme", 100},
			{"HIT path=/api/orders tenant=acme quota=lots", 100},
			{"HIT path=/api/orders tenant=acme quota=0", 0},
		} {
			_, q, err := ParseLine([]byte(tt.line), nil)
			if err != nil {
				t.Fatal(err)
			}
			d, _ := p.Match(q, nil)
			if got, _ := d.Limit(q); d != r || got != tt.limit || !strings.Contains(string(raw), tt.line) {
				t.Errorf("%q: rule %d limit %d, want rule 1 limit %d, as docs/policy.md says", tt.line, d.Pos, got, tt.limit)
			}
		}
	}
	if quotas != 1 {
		t.Errorf("docs/policy.md has %d quota examples, want 1", quotas)
	}
}
