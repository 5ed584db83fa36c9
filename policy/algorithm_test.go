package policy

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

// algoFields is what a rule says about its algorithm and quota.
type algoFields struct {
	Algorithm    Algorithm
	Stagger      bool
	Burst        int64
	MinGapMillis int64
	QuotaField   string
	MaxQuota     int64
}

func fieldsOf(r *Rule) algoFields {
	return algoFields{r.Algorithm, r.Stagger, r.Burst, r.MinGapMillis, r.QuotaField, r.MaxQuota}
}

// parseEither loads text as INI or JSON, by the file name's extension.
func parseEither(file, text string) (*Policy, error) {
	if strings.HasSuffix(file, ".json") {
		return ParseJSON(file, []byte(text))
	}
	return ParseINI(file, []byte(text))
}

// TestAlgorithmFields loads each algorithm field, in both formats, into
// the first rule.
func TestAlgorithmFields(t *testing.T) {
	tests := []struct {
		name, ini, json string
		want            algoFields
	}{
		{"default is divvy", "", ``, algoFields{}},
		{"divvy", "algorithm = divvy\n", `"algorithm": "divvy",`, algoFields{}},
		{"empty algorithm is divvy", "algorithm =\n", `"algorithm": "",`, algoFields{}},
		{"null algorithm is divvy", "algorithm = null\n", `"algorithm": null,`, algoFields{}},
		{"fixedWindow", "algorithm = fixedWindow\n", `"algorithm": "fixedWindow",`, algoFields{Algorithm: FixedWindow}},
		{"fixedWindow stagger", "algorithm = fixedWindow\nstagger = true\n", `"algorithm": "fixedWindow", "stagger": true,`,
			algoFields{Algorithm: FixedWindow, Stagger: true}},
		{"fixedWindow stagger false", "algorithm = fixedWindow\nstagger = 'false'\n", `"algorithm": "fixedWindow", "stagger": false,`,
			algoFields{Algorithm: FixedWindow}},
		{"tokenBucket", "algorithm = tokenBucket\n", `"algorithm": "tokenBucket",`, algoFields{Algorithm: TokenBucket}},
		{"tokenBucket burst", "algorithm = tokenBucket\nburst = 50\n", `"algorithm": "tokenBucket", "burst": 50,`,
			algoFields{Algorithm: TokenBucket, Burst: 50}},
		{"gcra", "algorithm = gcra\n", `"algorithm": "gcra",`, algoFields{Algorithm: GCRA}},
		{"gcra burst", "algorithm = gcra\nburst = 10\n", `"algorithm": "gcra", "burst": 10,`, algoFields{Algorithm: GCRA, Burst: 10}},
		{"slidingLog", "algorithm = slidingLog\n", `"algorithm": "slidingLog",`, algoFields{Algorithm: SlidingLog}},
		{"slidingLog gap", "algorithm = slidingLog\nminGapMillis = 250\n", `"algorithm": "slidingLog", "minGapMillis": 250,`,
			algoFields{Algorithm: SlidingLog, MinGapMillis: 250}},
		{"slidingLog gap 0", "algorithm = slidingLog\nminGapMillis = 0\n", `"algorithm": "slidingLog", "minGapMillis": 0,`,
			algoFields{Algorithm: SlidingLog}},
		{"quota divvy", "quotaField = quota\nmaxQuota = 1000\n", `"quotaField": "quota", "maxQuota": 1000,`,
			algoFields{QuotaField: "quota", MaxQuota: 1000}},
		{"quota gcra", "algorithm = gcra\nquotaField = 'x-quota'\nmaxQuota = 5\n", `"algorithm": "gcra", "quotaField": "x-quota", "maxQuota": 5,`,
			algoFields{Algorithm: GCRA, QuotaField: "x-quota", MaxQuota: 5}},
		{"slidingLog quota at the bound", "algorithm = slidingLog\nquotaField = q\nmaxQuota = 100000\n",
			`"algorithm": "slidingLog", "quotaField": "q", "maxQuota": 100000,`, algoFields{Algorithm: SlidingLog, QuotaField: "q", MaxQuota: 100000}},
		{"huge divvy period loads as before", "resetSeconds = 9223372036854775807\n", `"resetSeconds": 9223372036854775807,`, algoFields{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := "creditLimit = 5\nresetSeconds = 60\n"
			jbody := `"creditLimit": 5, "resetSeconds": 60`
			if strings.Contains(tt.ini, "resetSeconds") {
				body = "creditLimit = 5\n"
				jbody = `"creditLimit": 5`
			}
			ini := "[a=1]\n" + tt.ini + body + "[default]\ncreditLimit = 0\nresetSeconds = 0\n"
			js := `{"overrides": [{"operation": {"a": "1"}, ` + tt.json + jbody + `}], "default": {"creditLimit": 0, "resetSeconds": 0}}`
			for _, f := range []struct{ name, text string }{{"t.ini", ini}, {"t.json", js}} {
				p, err := parseEither(f.name, f.text)
				if err != nil {
					t.Fatalf("%s: %v\n%s", f.name, err, f.text)
				}
				if got := fieldsOf(p.Rules()[0]); got != tt.want {
					t.Errorf("%s: got %+v, want %+v", f.name, got, tt.want)
				}
				if got := fieldsOf(p.Rules()[1]); got != (algoFields{}) {
					t.Errorf("%s: default rule got %+v", f.name, got)
				}
			}
		})
	}
}

// TestAlgorithmFilesAgree: testdata/algorithms.{ini,json} say the same,
// with one rule of each algorithm.
func TestAlgorithmFilesAgree(t *testing.T) {
	p := mustLoad(t, "testdata/algorithms.ini")
	seen := map[Algorithm]bool{}
	for _, r := range p.Rules() {
		seen[r.Algorithm] = true
	}
	if len(seen) != len(algorithmNames) {
		t.Errorf("algorithms.ini uses %v; want every algorithm", seen)
	}
	if d := sameRules(p, mustLoad(t, "testdata/algorithms.json")); d != "" {
		t.Error(d)
	}
}

// TestAlgorithmValidationErrors: each problem of the new fields, with the
// file, line and rule, in both formats. want is the message after
// "policy: ".
func TestAlgorithmValidationErrors(t *testing.T) {
	const jd = `"default": {"creditLimit": 0, "resetSeconds": 0}`
	tests := []struct {
		name, file, text, want string
	}{
		{"unknown algorithm", "t.ini", "[default]\nalgorithm = leakyBucket\n" + iniBody,
			`t.ini:2: rule 1 [default]: algorithm is "leakyBucket"; expected divvy, fixedWindow, tokenBucket, gcra or slidingLog`},
		{"algorithm letter case", "t.ini", "[default]\nalgorithm = GCRA\n" + iniBody,
			`t.ini:2: rule 1 [default]: algorithm is "GCRA"; expected divvy, fixedWindow, tokenBucket, gcra or slidingLog`},
		{"json unknown algorithm", "t.json", `{"default": {"algorithm": "fixed_window", "creditLimit": 1, "resetSeconds": 1}}`,
			`t.json:1: rule 1 [default]: algorithm is "fixed_window"; expected divvy, fixedWindow, tokenBucket, gcra or slidingLog`},
		{"json algorithm number", "t.json", `{"default": {"algorithm": 2, "creditLimit": 1, "resetSeconds": 1}}`,
			`t.json:1: rule 1 [default]: algorithm is 2; expected a string`},
		{"repeated algorithm", "t.ini", "[default]\nalgorithm = gcra\nalgorithm = gcra\n" + iniBody,
			`t.ini:3: rule 1 [default]: algorithm is given twice (first on line 2)`},

		{"stagger not a bool", "t.ini", "[default]\nalgorithm = fixedWindow\nstagger = yes\n" + iniBody,
			`t.ini:3: rule 1 [default]: stagger is yes; expected true or false`},
		{"stagger empty", "t.ini", "[default]\nalgorithm = fixedWindow\nstagger =\n" + iniBody,
			`t.ini:3: rule 1 [default]: stagger is empty; expected true or false`},
		{"json stagger string", "t.json", `{"default": {"algorithm": "fixedWindow", "stagger": "true", "creditLimit": 1, "resetSeconds": 1}}`,
			`t.json:1: rule 1 [default]: stagger is "true"; expected true or false`},
		{"stagger on gcra", "t.ini", "[a=1]\nalgorithm = gcra\ncreditLimit = 1\nresetSeconds = 1\nstagger = true\n" + iniDefault,
			`t.ini:5: rule 1 [a=1]: stagger applies only to algorithm fixedWindow; this rule's algorithm is gcra`},
		{"stagger on divvy", "t.ini", "[default]\nstagger = false\n" + iniBody,
			`t.ini:2: rule 1 [default]: stagger applies only to algorithm fixedWindow; this rule's algorithm is divvy`},
		{"json stagger on slidingLog", "t.json", "{\"overrides\": [{\"operation\": {\"a\": \"1\"},\n \"algorithm\": \"slidingLog\", \"creditLimit\": 1, \"resetSeconds\": 1,\n \"stagger\": true}], " + jd + "}",
			`t.json:3: rule 1 [a=1]: stagger applies only to algorithm fixedWindow; this rule's algorithm is slidingLog`},

		{"burst on fixedWindow", "t.ini", "[default]\nalgorithm = fixedWindow\nburst = 5\n" + iniBody,
			`t.ini:3: rule 1 [default]: burst applies only to algorithms gcra and tokenBucket; this rule's algorithm is fixedWindow`},
		{"burst on divvy", "t.ini", "[default]\nburst = 5\n" + iniBody,
			`t.ini:2: rule 1 [default]: burst applies only to algorithms gcra and tokenBucket; this rule's algorithm is divvy`},
		{"burst 0", "t.ini", "[default]\nalgorithm = gcra\nburst = 0\n" + iniBody,
			`t.ini:3: rule 1 [default]: burst is 0; expected a positive integer (leave it out for a burst of the limit)`},
		{"burst negative", "t.ini", "[default]\nalgorithm = tokenBucket\nburst = -2\n" + iniBody,
			`t.ini:3: rule 1 [default]: burst is -2; expected a non-negative integer`},
		{"json burst fraction", "t.json", `{"default": {"algorithm": "gcra", "burst": 2.5, "creditLimit": 1, "resetSeconds": 1}}`,
			`t.json:1: rule 1 [default]: burst is 2.5; expected a non-negative integer`},
		{"gcra burst overflows", "t.ini", "[default]\nalgorithm = gcra\nburst = 9223372036854775807\ncreditLimit = 1\nresetSeconds = 60\n",
			`t.ini:3: rule 1 [default]: gcra with limit 1 per 60 s cannot be computed in int64 time: max_burst: 9223372036854775806: (max_burst + 1) × emission interval (60000000000 ns) overflows int64: want at most 153722866 for this rate`},
		{"gcra rate too high", "t.ini", "[default]\nalgorithm = gcra\ncreditLimit = 2000000000\nresetSeconds = 1\n",
			`t.ini:3: rule 1 [default]: gcra with limit 2000000000 per 1 s cannot be computed in int64 time: count: 2000000000: rate too high, more than one request per nanosecond: want at most 1000000000 for this period`},
		{"gcra period overflows", "t.ini", "[default]\nalgorithm = gcra\ncreditLimit = 1\nresetSeconds = 9223372036854775\n",
			`t.ini:4: rule 1 [default]: gcra with limit 1 per 9223372036854775 s cannot be computed in int64 time: period: 9223372036854775000: too long, its nanoseconds overflow int64: want at most 9223372036854`},

		{"minGapMillis on gcra", "t.ini", "[default]\nalgorithm = gcra\nminGapMillis = 10\n" + iniBody,
			`t.ini:3: rule 1 [default]: minGapMillis applies only to algorithm slidingLog; this rule's algorithm is gcra`},
		{"minGapMillis negative", "t.ini", "[default]\nalgorithm = slidingLog\nminGapMillis = -1\n" + iniBody,
			`t.ini:3: rule 1 [default]: minGapMillis is -1; expected a non-negative integer`},
		{"json minGapMillis string", "t.json", `{"default": {"algorithm": "slidingLog", "minGapMillis": "5", "creditLimit": 1, "resetSeconds": 1}}`,
			`t.json:1: rule 1 [default]: minGapMillis is "5"; expected a non-negative integer`},
		{"minGapMillis overflows", "t.ini", "[default]\nalgorithm = slidingLog\nminGapMillis = 9223372036854775807\n" + iniBody,
			`t.ini:3: rule 1 [default]: slidingLog with limit 1 per 60 s cannot be computed in int64 time: MINDIFF: 9223372036854775807: too long, its microseconds overflow int64: want at most 9223372036854775`},
		{"slidingLog too many", "t.ini", "[default]\nalgorithm = slidingLog\ncreditLimit = 100001\nresetSeconds = 1\n",
			`t.ini:3: rule 1 [default]: creditLimit is 100001; a slidingLog keeps every hit of its interval: expected at most 100000`},
		{"slidingLog period overflows", "t.ini", "[default]\nalgorithm = slidingLog\ncreditLimit = 1\nresetSeconds = 9223372036854775\n",
			`t.ini:4: rule 1 [default]: slidingLog with limit 1 per 9223372036854775 s cannot be computed in int64 time: interval_ms: 9223372036854775000: too long, its microseconds overflow int64: want at most 9223372036854775`},
		{"fixedWindow period overflows", "t.ini", "[default]\nalgorithm = fixedWindow\ncreditLimit = 1\nresetSeconds = 9223372036854776\n",
			`t.ini:4: rule 1 [default]: resetSeconds is 9223372036854776; expected at most 9223372036854775 for algorithm fixedWindow, so that the period fits in int64 milliseconds`},

		{"quotaField without maxQuota", "t.ini", "[default]\nquotaField = quota\n" + iniBody,
			`t.ini:2: rule 1 [default]: quotaField needs maxQuota, the largest quota a request may ask for`},
		{"maxQuota without quotaField", "t.ini", "[default]\n" + iniBody + "maxQuota = 5\n",
			`t.ini:4: rule 1 [default]: maxQuota applies only with quotaField, the request field that holds the quota`},
		{"maxQuota with empty quotaField", "t.ini", "[default]\nquotaField =\nmaxQuota = 5\n" + iniBody,
			`t.ini:3: rule 1 [default]: maxQuota applies only with quotaField, the request field that holds the quota`},
		{"maxQuota negative", "t.ini", "[default]\nquotaField = q\nmaxQuota = -5\n" + iniBody,
			`t.ini:3: rule 1 [default]: maxQuota is -5; expected a non-negative integer`},
		{"json maxQuota string", "t.json", `{"default": {"quotaField": "q", "maxQuota": "5", "creditLimit": 1, "resetSeconds": 1}}`,
			`t.json:1: rule 1 [default]: maxQuota is "5"; expected a non-negative integer`},
		{"json quotaField number", "t.json", `{"default": {"quotaField": 5, "maxQuota": 5, "creditLimit": 1, "resetSeconds": 1}}`,
			`t.json:1: rule 1 [default]: quotaField is 5; expected a string`},
		{"json quotaField without maxQuota", "t.json", "{\"default\": {\"creditLimit\": 1, \"resetSeconds\": 1,\n\"quotaField\": \"q\"}}",
			`t.json:2: rule 1 [default]: quotaField needs maxQuota, the largest quota a request may ask for`},
		{"slidingLog maxQuota too large", "t.ini", "[default]\nalgorithm = slidingLog\nquotaField = q\nmaxQuota = 100001\n" + iniBody,
			`t.ini:4: rule 1 [default]: maxQuota is 100001; a slidingLog keeps every hit of its interval: expected at most 100000`},
		{"gcra maxQuota rate too high", "t.ini", "[default]\nalgorithm = gcra\nquotaField = q\nmaxQuota = 2000000000\ncreditLimit = 1\nresetSeconds = 1\n",
			`t.ini:4: rule 1 [default]: gcra with limit 2000000000 per 1 s cannot be computed in int64 time: count: 2000000000: rate too high, more than one request per nanosecond: want at most 1000000000 for this period`},
		{"gcra burst with the smallest quota overflows", "t.ini", "[default]\nalgorithm = gcra\nburst = 200000000\nquotaField = q\nmaxQuota = 1000\ncreditLimit = 1000\nresetSeconds = 60\n",
			`t.ini:3: rule 1 [default]: gcra with limit 1 per 60 s cannot be computed in int64 time: max_burst: 199999999: (max_burst + 1) × emission interval (60000000000 ns) overflows int64: want at most 153722866 for this rate`},

		{"maxQuota below creditLimit", "t.ini", "[default]\nalgorithm = gcra\ncreditLimit = 1000\nresetSeconds = 60\nquotaField = q\nmaxQuota = 10\n",
			`t.ini:6: rule 1 [default]: maxQuota is 10, less than creditLimit 1000, which a request without a valid quota gets; expected maxQuota of at least creditLimit, so that no request gets more than a valid quota could ask for`},
		{"json maxQuota below creditLimit", "t.json", "{\"default\": {\"creditLimit\": 5, \"resetSeconds\": 1,\n\"quotaField\": \"q\", \"maxQuota\": 4}}",
			`t.json:2: rule 1 [default]: maxQuota is 4, less than creditLimit 5, which a request without a valid quota gets; expected maxQuota of at least creditLimit, so that no request gets more than a valid quota could ask for`},

		{"unknown field lists the new ones", "t.ini", "[default]\nalgo = gcra\n" + iniBody,
			`t.ini:2: rule 1 [default]: unknown field "algo"; the fields are creditLimit, resetSeconds, algorithm, stagger, burst, minGapMillis, quotaField, maxQuota, actorField, matchPolicy, shadow, label and comment`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseEither(tt.file, tt.text)
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v, want a *ValidationError", err)
			}
			if got := strings.TrimPrefix(err.Error(), "policy: "); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestRuleLimit: a quota within the bound is the limit; over it, the
// bound; missing or malformed, creditLimit.
func TestRuleLimit(t *testing.T) {
	p := mustINI(t, "[q=*]\nquotaField = quota\nmaxQuota = 100\ncreditLimit = 10\nresetSeconds = 60\n[default]\ncreditLimit = 7\nresetSeconds = 60\n")
	quota, plain := p.Rules()[0], p.Rules()[1]
	tests := []struct {
		req   Request
		limit int64
		st    QuotaStatus
	}{
		{req("quota", "50"), 50, QuotaUsed},
		{req("quota", "100"), 100, QuotaUsed},
		{req("quota", "0"), 0, QuotaUsed},
		{req("quota", "007"), 7, QuotaUsed},
		{req("quota", "101"), 100, QuotaClamped},
		{req("quota", "9223372036854775807"), 100, QuotaClamped},
		{req("quota", "99999999999999999999999999"), 100, QuotaClamped},
		{req(), 10, QuotaMissing},
		{req("Quota", "50"), 10, QuotaMissing},
		{req("quota", ""), 10, QuotaMalformed},
		{req("quota", "-5"), 10, QuotaMalformed},
		{req("quota", "+5"), 10, QuotaMalformed},
		{req("quota", "5.0"), 10, QuotaMalformed},
		{req("quota", " 5"), 10, QuotaMalformed},
		{req("quota", "1e3"), 10, QuotaMalformed},
		{req("quota", "ten"), 10, QuotaMalformed},
		{req("quota", "1", "quota", "500"), 100, QuotaClamped}, // the last value counts
	}
	for _, tt := range tests {
		limit, st := quota.Limit(tt.req)
		if limit != tt.limit || st != tt.st {
			t.Errorf("Limit(%s) = %d %v, want %d %v", fields(tt.req), limit, st, tt.limit, tt.st)
		}
	}
	if limit, st := plain.Limit(req("quota", "50")); limit != 7 || st != QuotaNone {
		t.Errorf("a rule without quotaField: %d %v, want 7 none", limit, st)
	}
	if n := testing.AllocsPerRun(100, func() { quota.Limit(tests[0].req) }); n != 0 {
		t.Errorf("Limit allocates %v times", n)
	}
}

// TestCounterIdentity: divvy rules keep the identity they had before
// algorithms existed (their counters survive an upgrade); any algorithm
// field or quota changes it.
func TestCounterIdentity(t *testing.T) {
	base := "[a=1]\ncreditLimit = 5\nresetSeconds = 60\n"
	id := func(extra string) [idLen]byte { return mustINI(t, base+extra+iniDefault).Rules()[0].id }
	// The identity of this rule before algorithms existed, from the code then.
	if got := id(""); fmt.Sprintf("%x", got) != oldDivvyID || id("algorithm = divvy\n") != got {
		t.Errorf("divvy rule identity %x (with algorithm = divvy: %x), want %s as before", got, id("algorithm = divvy\n"), oldDivvyID)
	}
	seen := map[[idLen]byte]string{id(""): "divvy"}
	for _, extra := range []string{
		"algorithm = fixedWindow\n", "algorithm = fixedWindow\nstagger = true\n", "algorithm = tokenBucket\n",
		"algorithm = tokenBucket\nburst = 9\n", "algorithm = gcra\n", "algorithm = gcra\nburst = 9\n", "algorithm = slidingLog\n",
		"algorithm = slidingLog\nminGapMillis = 1\n", "quotaField = q\nmaxQuota = 5\n", "quotaField = q\nmaxQuota = 6\n",
		"quotaField = r\nmaxQuota = 5\n",
	} {
		k := id(extra)
		if prev, dup := seen[k]; dup {
			t.Errorf("%q has the identity of %q", extra, prev)
		}
		seen[k] = extra
	}
}

// TestPeriodAndParams: the kinds' parameters a rule derives.
func TestPeriodAndParams(t *testing.T) {
	r := &Rule{CreditLimit: 100, ResetSeconds: 60}
	if p := r.BucketParams(100); p.Max != 100 || p.RefillAmount != 1 || p.RefillMs != 600 {
		t.Errorf("BucketParams(100) = %+v, want one token every 600 ms up to 100", p)
	}
	if p := r.BucketParams(7); p.Max != 7 || p.RefillAmount != 7 || p.RefillMs != 60000 {
		t.Errorf("BucketParams(7) = %+v, want 7 every 60000 ms", p)
	}
	r.Burst = 3
	if p := r.GCRAParams(100); p.MaxBurst != 2 || p.Count != 100 || p.Period != 60000 {
		t.Errorf("GCRAParams = %+v", p)
	}
	if got := (&Rule{ResetSeconds: math.MaxInt64}).PeriodMillis(); got != math.MaxInt64 {
		t.Errorf("PeriodMillis saturates: %d", got)
	}
}

// oldDivvyID is the identity of TestCounterIdentity's rule as the code
// before algorithms computed it.
const oldDivvyID = "d359ea5f3d042446"

// TestTokenBucketRateWithSmallBurst: a tokenBucket rule lets its limit
// through per period over a long stretch whatever its burst, also when the
// smallest exact refill step (limit/gcd(limit, period ms) tokens) is more
// than the burst: counted over ten periods of a hit every 10 ms, under the
// rule's own limit and under per-request quotas.
func TestTokenBucketRateWithSmallBurst(t *testing.T) {
	for _, tc := range []struct {
		limit, reset, burst int64
		quota               string
	}{
		{7, 60, 1, ""}, {3, 1, 1, ""}, {100, 60, 20, ""}, {7, 60, 7, ""}, {7, 60, 3, ""},
		{100, 60, 20, "101"}, {100, 60, 20, "999"}, {100, 60, 20, "100"},
	} {
		text := fmt.Sprintf("[a=1]\nalgorithm = tokenBucket\ncreditLimit = %d\nresetSeconds = %d\nburst = %d\nquotaField = q\nmaxQuota = 1000\n%s", tc.limit, tc.reset, tc.burst, iniDefault)
		r := mustINI(t, text).Rules()[0]
		req := Request{{Key: []byte("q"), Value: []byte(tc.quota)}}
		if tc.quota == "" {
			req = nil
		}
		limit, _ := r.Limit(req)
		var c Counter
		c.Rule, c.Limit, c.Hits, c.ID = r, limit, 1, []byte("id")
		var stored []byte
		var allowed int64
		const periods = 10
		start := int64(1_700_000_000_000) * 1e6
		for ms := int64(0); ms < periods*tc.reset*1000; ms += 10 {
			c.Now = start + ms*1e6
			val, write, err := c.Apply(stored, stored != nil)
			if err != nil {
				t.Fatal(err)
			}
			if write {
				stored = append(stored[:0], val...)
			}
			if c.Out.Allowed {
				allowed++
			}
		}
		// The first burst comes on top of the rate; the last refill may
		// not have come yet; the refill interval is rounded to whole
		// milliseconds, under 1% off.
		want := limit * periods
		if allowed < want-want/100 || allowed > want+tc.burst+want/100 {
			t.Errorf("limit %d per %d s, burst %d, quota %q: %d allowed in %d periods (params %+v), want %d to %d",
				tc.limit, tc.reset, tc.burst, tc.quota, allowed, periods, r.BucketParams(limit), want-want/100, want+tc.burst+want/100)
		}
	}
}

// TestBucketParamsStepOverBurst: the refill when the exact step does not
// fit in the bucket, and its rounding.
func TestBucketParamsStepOverBurst(t *testing.T) {
	for _, tc := range []struct {
		limit, reset, burst int64
		want                bucket.Params
	}{
		{7, 60, 1, bucket.Params{Max: 1, RefillAmount: 1, RefillMs: 8571}},         // 60000/7 = 8571.4
		{101, 60, 20, bucket.Params{Max: 20, RefillAmount: 1, RefillMs: 594}},      // 594.06
		{3, 2, 1, bucket.Params{Max: 1, RefillAmount: 1, RefillMs: 667}},           // 666.7
		{100, 60, 20, bucket.Params{Max: 20, RefillAmount: 1, RefillMs: 600}},      // exact
		{5000, 1, 10, bucket.Params{Max: 10, RefillAmount: 5, RefillMs: 1}},        // the exact step fits
		{5000, 1, 2, bucket.Params{Max: 2, RefillAmount: 2, RefillMs: 1}},          // cannot be met: burst per ms
		{7000, 3, 5, bucket.Params{Max: 5, RefillAmount: 5, RefillMs: 2}},          // 2.14 ms: the burst forces rounding
		{math.MaxInt64, 1, 1, bucket.Params{Max: 1, RefillAmount: 1, RefillMs: 1}}, // saturates
	} {
		r := &Rule{Algorithm: TokenBucket, CreditLimit: tc.limit, ResetSeconds: tc.reset, Burst: tc.burst}
		if got := r.BucketParams(tc.limit); got != tc.want {
			t.Errorf("%d per %d s, burst %d: %+v, want %+v", tc.limit, tc.reset, tc.burst, got, tc.want)
		}
	}
}
