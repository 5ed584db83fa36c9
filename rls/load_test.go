package rls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

// The configurations of envoyproxy/ratelimit's README examples, written
// for these tests.
var readmeExamples = map[string]string{
	"example1.yaml": `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`,
	"example2.yaml": `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`,
	"example3.yaml": `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`,
	"example4.yml": `
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
`,
	"example5.yaml": `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`,
	"example6.yaml": `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`,
	"example7.yaml": `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`,
	"example8.yaml": `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
`,
	"example9.yaml": `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 21
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: WEEK
      requests_per_unit: 22
      algorithm: gcra
      burst: 3
`,
}

func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func entries(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func TestLoadReadmeExamples(t *testing.T) {
	files := map[string]string{"notes.txt": "not a config", "sub.yaml/x": ""}
	delete(files, "sub.yaml/x")
	for k, v := range readmeExamples {
		files[k] = v
	}
	c, err := Load(writeDir(t, files), 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.Domains() != 9 || len(c.Files()) != 9 {
		t.Fatalf("domains %d files %d; want 9 and 9 (notes.txt is not read)", c.Domains(), len(c.Files()))
	}
	type want struct {
		key    string // Limit.Key; "" for no limit
		rpu    uint32
		unit   Unit
		shadow bool
	}
	for _, tc := range []struct {
		domain string
		desc   []Entry
		want   want
	}{
		{"mongo_cps", entries("database", "users"), want{"database_users", 500, Second, false}},
		{"mongo_cps", entries("database", "default"), want{"database_default", 500, Second, false}},
		{"mongo_cps", entries("database", "other"), want{}},
		{"mongo_cps", entries("database", ""), want{}},
		{"messaging", entries("message_type", "marketing", "to_number", "2061111111"), want{"message_type_marketing.to_number", 5, Day, false}},
		{"messaging", entries("to_number", "2061111111"), want{"to_number", 100, Day, false}},
		{"messaging", entries("message_type", "marketing"), want{}},                       // a placeholder level
		{"messaging", entries("message_type", "transactional", "to_number", "1"), want{}}, // no such path
		{"edge_proxy_per_ip", entries("remote_address", "50.0.0.1"), want{"remote_address", 10, Second, false}},
		{"edge_proxy_per_ip", entries("remote_address", "50.0.0.5"), want{"remote_address_50.0.0.5", 0, Second, false}}, // key and value first
		{"example4", entries("key", "value"), want{}},
		{"example4", entries("key", "value", "subkey", "subvalue"), want{"key_value.subkey", 300, Second, false}},
		{"example4", entries("key", "value", "subkey", "subvalue", "more", "x"), want{}}, // deeper than the config
		{"example6", entries("service", "auth-service", "user", "user-a"), want{"service.user_user-a", 10, Second, true}},
		{"example6", entries("service", "auth-service", "user", "user-b"), want{"service.user_user-b", 20, Second, false}},
		{"example6", entries("service", "auth-service", "user", "user-c"), want{}},
		{"example7", entries("key_1", "value_1", "user", "bkthomps"), want{"key_1_value_1.user_bkthomps", 5, Second, false}},
		{"example8", entries("key1", "unspecified"), want{"key1", 10, Minute, false}},
		{"example8", entries("key1", "value1"), want{"key1_value1", 20, Minute, false}},
		{"example9", entries("key1", "value"), want{"key1_value*", 20, Minute, false}},
		{"example9", entries("key1", "valueXYZ"), want{"key1_value*", 20, Minute, false}},
		{"example9", entries("key1", "valu"), want{}},
		{"example9", entries("path", "/api/123/action"), want{"path_/api/*/action", 21, Minute, false}},
		{"example9", entries("path", "/api/123/other"), want{}},
		{"example9", entries("route", "/api/v1/resource/123/action"), want{"route_/api/*/resource/*/action", 22, Week, false}},
		{"example9", entries("route", "/api/v1/resource/action"), want{}},
		{"unknown", entries("database", "users"), want{}},
	} {
		l := c.Find(tc.domain, tc.desc)
		var got want
		if l != nil {
			got = want{l.Key, l.RequestsPerUnit, l.Unit, l.ShadowMode}
		}
		if got != tc.want {
			t.Errorf("Find(%s, %v) = %+v; want %+v", tc.domain, tc.desc, got, tc.want)
		}
	}
	ldap := c.Find("internal", entries("ldap", "x"))
	if ldap == nil || !ldap.Unlimited || ldap.Rule != nil {
		t.Errorf("ldap: %+v; want an unlimited limit without a rule", ldap)
	}
	azure := c.Find("internal", entries("azure", "x"))
	if azure == nil || azure.Rule == nil || azure.Rule.Algorithm != policy.FixedWindow || azure.Rule.CreditLimit != 100 || azure.Rule.ResetSeconds != 60 || azure.Rule.ActorField != DescriptorField {
		t.Errorf("azure: %+v; want a fixedWindow rule of 100 per 60 s counted by descriptor", azure)
	}
	r7 := c.Find("example7", entries("key_2", "value_2", "user", "bkthomps"))
	if r7 == nil || len(r7.Replaces) != 1 || r7.Replaces[0] != "specific_limit" {
		t.Errorf("example7 replaces: %+v", r7)
	}
	if l := c.Find("example8", entries("key1", "x")); l == nil || !l.DetailedMetric {
		t.Errorf("example8 detailed_metric: %+v", l)
	}
	g := c.Find("example9", entries("route", "/api/a/resource/b/action"))
	if g.Rule.Algorithm != policy.GCRA || g.Rule.Burst != 3 || g.Rule.ResetSeconds != 7*86400 {
		t.Errorf("example9 gcra: %+v", g.Rule)
	}
	// Every rule has its own counter identity, and overrides exist per
	// configured domain and unit only.
	seen := map[string]bool{}
	for _, r := range c.Rules() {
		id := string(r.AppendCounterID(nil, nil))
		if seen[id] {
			t.Errorf("rule %d %s shares its counter identity", r.Pos, r)
		}
		seen[id] = true
	}
	if o := c.Override("messaging", Hour); o == nil || o.ResetSeconds != 3600 || o.QuotaField != OverrideField {
		t.Errorf("override: %+v", o)
	}
	if c.Override("unknown", Hour) != nil {
		t.Error("an override in an unknown domain")
	}
}

func TestLoadRejects(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		line       int
		problem    string
	}{
		{"empty domain", "domain: \"\"\ndescriptors: []\n", 1, "domain is empty"},
		{"no domain", "descriptors: []\n", 1, "no domain"},
		{"unknown root key", "domain: d\nfoo: 1\n", 2, `unknown key "foo"`},
		{"unknown descriptor key", "domain: d\ndescriptors:\n  - key: a\n    unit: second\n", 4, `unknown key "unit" in a descriptor`},
		{"empty key", "domain: d\ndescriptors:\n  - key: \"\"\n", 3, "descriptor has empty key"},
		{"missing key", "domain: d\ndescriptors:\n  - value: x\n", 3, "has no key"},
		{"duplicate composite key", "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b\n", 5, "duplicate descriptor composite key 'd.a_b'"},
		{"duplicate key only", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n", 6, "duplicate descriptor composite key 'd.a.b'"},
		{"duplicate wildcard", "domain: d\ndescriptors:\n  - key: a\n    value: b*\n  - key: a\n    value: b*\n", 5, "duplicate descriptor composite key 'd.a_b*'"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", 5, "invalid rate limit unit 'fortnight'"},
		{"no unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 1\n", 5, "invalid rate limit unit ''"},
		{"unit with unlimited", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n", 6, "should not specify rate limit unit when unlimited"},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: \"\"\n", 8, "should not have an empty replaces entry"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: n\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: n\n", 9, "replaces should not contain name of same descriptor"},
		{"negative rpu", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", 6, `requests_per_unit is "-1"; expected an integer from 0 to 4294967295`},
		{"rpu too big", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 4294967296\n", 6, "expected an integer from 0 to 4294967295"},
		{"rpu text", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: ten\n", 6, `requests_per_unit is "ten"`},
		{"bool", "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n", 4, `shadow_mode is "maybe"; expected true or false`},
		{"repeated field", "domain: d\ndescriptors:\n  - key: a\n    key: b\n", 4, "key is given twice in a descriptor (first on line 3)"},
		{"descriptors not a list", "domain: d\ndescriptors:\n  key: a\n", 3, "descriptors is a mapping; expected a list"},
		{"quota_mode", "domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n", 4, "quota_mode is not supported by sluice"},
		{"share_threshold", "domain: d\ndescriptors:\n  - key: a\n    value: b*\n    share_threshold: true\n", 5, "share_threshold is not supported"},
		{"syntax", "domain: d\ndescriptors: [\n", 0, "YAML: "},
		{"two documents", "domain: d\n---\ndomain: e\n", 2, "a second YAML document"},
		{"empty file", "", 0, "the file is empty"},
		{"not a mapping", "- a\n- b\n", 1, "the file is a list; expected a mapping"},
		{"unknown algorithm", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: leaky\n", 7, `algorithm is "leaky"; expected fixed_window, token_bucket, gcra or sliding_log`},
		{"burst with fixed_window", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      burst: 5\n", 7, "burst applies only to algorithms token_bucket and gcra"},
		{"burst 0", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: gcra\n      burst: 0\n", 8, "burst is 0"},
		{"sliding_log too big", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: day\n      requests_per_unit: 4000000000\n      algorithm: sliding_log\n", 6, "a sliding_log keeps every request of its unit"},
		{"max_requests_per_unit 0", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      max_requests_per_unit: 0\n", 7, "max_requests_per_unit is 0"},
		{"max_requests_per_unit unlimited", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      max_requests_per_unit: 5\n", 6, "max_requests_per_unit does not apply to an unlimited rate_limit"},
		{"max_requests_per_unit sliding_log", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: sliding_log\n      max_requests_per_unit: 200000\n", 8, "a sliding_log keeps every request of its unit"},
		{"merge key", "domain: d\ndescriptors:\n  - <<: {key: a}\n", 3, "merge keys (<<) are not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]File{{Name: "x.yaml", Data: []byte(tc.yaml)}})
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v; want a *ConfigError", err)
			}
			if ce.File != "x.yaml" || ce.Line != tc.line || !strings.Contains(ce.Problem, tc.problem) {
				t.Fatalf("err = %v (line %d); want x.yaml line %d with %q", err, ce.Line, tc.line, tc.problem)
			}
			if !strings.HasPrefix(err.Error(), "rls: x.yaml") {
				t.Fatalf("err = %q; want it to start with rls: x.yaml", err)
			}
		})
	}
}

func TestLoadRejectsAcrossFiles(t *testing.T) {
	dir := writeDir(t, map[string]string{"a.yaml": "domain: d\n", "b.yml": "\ndomain: d\n"})
	_, err := Load(dir, 0)
	if err == nil || !strings.Contains(err.Error(), "b.yml:2: domain \"d\" is already configured in "+filepath.Join(dir, "a.yaml")) {
		t.Fatalf("err = %v; want the duplicate domain in b.yml line 2", err)
	}
	_, err = Load(writeDir(t, map[string]string{"README": "x"}), 0)
	if err == nil || !strings.Contains(err.Error(), "holds no *.yaml or *.yml file") {
		t.Fatalf("err = %v; want no files", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing"), 0); err == nil {
		t.Fatal("a missing directory loaded")
	}
}

func TestAliasesAreBounded(t *testing.T) {
	// Each level lists ten descriptors whose children are the level
	// before: 10^7 descriptors once the aliases are followed.
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	prev := "[]"
	for i := 0; i < 7; i++ {
		fmt.Fprintf(&b, "  - key: level%d\n    descriptors: &l%d [", i, i)
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "{key: k%d, descriptors: %s}", j, prev)
		}
		b.WriteString("]\n")
		prev = fmt.Sprintf("*l%d", i)
	}
	_, err := Parse([]File{{Name: "bomb.yaml", Data: []byte(b.String())}})
	if err == nil || !strings.Contains(err.Error(), "expands to more than") {
		t.Fatalf("err = %v; want the node bound", err)
	}
}

func TestWildMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, v string
		want       bool
	}{
		{"a*", "a", true}, {"a*", "abc", true}, {"a*", "b", false},
		{"*", "", true}, {"*b", "ab", true}, {"*b", "ba", false},
		{"a*b*c", "abc", true}, {"a*b*c", "axxbyyc", true}, {"a*b*c", "acb", false},
		{"ab*ba", "aba", false}, {"ab*ba", "abba", true},
	} {
		if got := wildMatch(strings.Split(tc.pattern, "*"), tc.v); got != tc.want {
			t.Errorf("wildMatch(%q, %q) = %v; want %v", tc.pattern, tc.v, got, tc.want)
		}
	}
}

func TestFindAllocatesNothing(t *testing.T) {
	c, err := Parse([]File{{Name: "a.yaml", Data: []byte(readmeExamples["example2.yaml"])}})
	if err != nil {
		t.Fatal(err)
	}
	e := entries("message_type", "marketing", "to_number", "2061111111")
	if n := testing.AllocsPerRun(100, func() { _ = c.Find("messaging", e) }); n != 0 {
		t.Fatalf("Find allocates %v times", n)
	}
}

func FuzzParse(f *testing.F) {
	for _, y := range readmeExamples {
		f.Add([]byte(y))
	}
	f.Add([]byte("domain: d\ndescriptors:\n  - key: a\n    value: b*\n    descriptors: [{key: c, rate_limit: {unit: day, requests_per_unit: 3, algorithm: token_bucket, burst: 2}}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse([]File{{Name: "f.yaml", Data: data}})
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *ConfigError", err)
			}
			return
		}
		// Every limit is found by a descriptor built from its own path
		// when the path has no wildcard.
		for _, l := range c.Limits() {
			if l.Unlimited != (l.Rule == nil) {
				t.Fatalf("limit %s: unlimited %v with rule %v", l.Key, l.Unlimited, l.Rule)
			}
			if l.Rule != nil && (l.Rule.ResetSeconds <= 0 || l.Rule.CreditLimit != int64(l.RequestsPerUnit)) {
				t.Fatalf("limit %s: rule %+v", l.Key, l.Rule)
			}
		}
	})
}

func FuzzFind(f *testing.F) {
	var files []File
	for name, y := range readmeExamples {
		files = append(files, File{Name: name, Data: []byte(y)})
	}
	c, err := Parse(files)
	if err != nil {
		f.Fatal(err)
	}
	f.Add("messaging", "message_type", "marketing", "to_number", "1", 2)
	f.Add("example9", "route", "/api/a/resource/b/action", "", "", 1)
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string, n int) {
		e := []Entry{{k1, v1}, {k2, v2}}[:min(max(n, 0), 2)]
		l := c.Find(domain, e)
		if l == nil {
			return
		}
		if l.Domain != domain || len(e) == 0 {
			t.Fatalf("Find(%q, %v) = %+v", domain, e, l)
		}
		// The limit's path has as many levels as the descriptor.
		if l.Depth != len(e) {
			t.Fatalf("Find(%q, %v) = %s: %d levels for %d entries", domain, e, l.Key, l.Depth, len(e))
		}
	})
}

// ParseDescriptor reads back what AppendDescriptor wrote, empty keys and
// values and bytes of every value included, and refuses a truncated
// encoding: RLS.OVERRIDES lists descriptors from their stored form.
func TestParseDescriptor(t *testing.T) {
	entries := []Entry{{"to_number", "5551234"}, {"", ""}, {"k", strings.Repeat("\xff,=", 100)}}
	b := AppendDescriptor(nil, entries)
	got, ok := ParseDescriptor(b)
	if !ok || !slices.Equal(got, entries) {
		t.Fatalf("ParseDescriptor: %q %v; want %q", got, ok, entries)
	}
	if _, ok := ParseDescriptor(b[:len(b)-1]); ok {
		t.Fatal("a truncated descriptor was read")
	}
}
