package server

import (
	"context"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/policy"
)

// algorithmSteps drive ../policy/testdata/algorithms.{ini,json}: one rule
// per algorithm, each with its own users, at times in ms after t0 (a whole
// multiple of the 10 s windows). Replies are HIT's: allowed, credits left,
// seconds until reset.
var algorithmSteps = []struct {
	at         int64
	line, want string
}{
	// fixedWindow, 2 per 10 s, aligned to the epoch: user b's window ends
	// with a's, not 10 s after its first hit.
	{0, "HIT path=/fw user=a", "OK true 1 10"},
	{1000, "HIT path=/fw user=a", "OK true 0 9"},
	{2000, "HIT path=/fw user=a", "OK false 0 8"},
	{2000, "HIT path=/fw user=b", "OK true 1 8"},
	{9999, "HIT path=/fw user=a", "OK false 0 1"},
	{10000, "HIT path=/fw user=a", "OK true 1 10"},

	// tokenBucket, 2 per 10 s: a bucket of 2 refilled with one token every
	// 5 s; reset is the time until it is full.
	{0, "HIT path=/tb user=a", "OK true 1 5"},
	{1000, "HIT path=/tb user=a", "OK true 0 9"},
	{2000, "HIT path=/tb user=a", "OK false 0 8"},
	{5000, "HIT path=/tb user=a", "OK true 0 10"},

	// gcra, 2 per 10 s with a burst of 3: one every 5 s, three at once.
	{0, "HIT path=/gcra user=a", "OK true 2 5"},
	{0, "HIT path=/gcra user=a", "OK true 1 10"},
	{0, "HIT path=/gcra user=a", "OK true 0 15"},
	{0, "HIT path=/gcra user=a", "OK false 0 15"},
	{5000, "HIT path=/gcra user=a", "OK true 0 15"},

	// slidingLog, 2 per 10 s and at least 1 s apart; a denied hit is not
	// recorded.
	{0, "HIT path=/log user=a", "OK true 1 10"},
	{500, "HIT path=/log user=a", "OK false 0 10"}, // too close to the first
	{1000, "HIT path=/log user=a", "OK true 0 10"},
	{2000, "HIT path=/log user=a", "OK false 0 9"}, // a third in 10 s
	{10000, "HIT path=/log user=a", "OK true 0 10"},

	// divvy, with a per-request quota: 2 per 60 s, quotas up to 5.
	{0, "HIT path=/quota user=q1 quota=4", "OK true 3 60"},
	{0, "HIT path=/quota user=q1 quota=4", "OK true 2 60"},
	{0, "HIT path=/quota user=q1 quota=4", "OK true 1 60"},
	{0, "HIT path=/quota user=q1 quota=4", "OK true 0 60"},
	{0, "HIT path=/quota user=q1 quota=4", "OK false 0 60"},
	{0, "HIT path=/quota user=q2 quota=99", "OK true 4 60"}, // over the bound: 5
	{0, "HIT path=/quota user=q2 quota=99999999999999999999999", "OK true 3 60"},
	{0, "HIT path=/quota user=q3 quota=abc", "OK true 1 60"}, // malformed: creditLimit
	{0, "HIT path=/quota user=q3 quota=-3", "OK true 0 60"},
	{0, "HIT path=/quota user=q3 quota=2.5", "OK false 0 60"},
	{0, "HIT path=/quota user=q4", "OK true 1 60"}, // missing: creditLimit
	{0, "HIT path=/quota user=q4", "OK true 0 60"},
	{0, "HIT path=/quota user=q4", "OK false 0 60"},
	{0, "HIT path=/quota user=q5 quota=0", "OK false 0 -1"}, // a quota of 0 denies
	// A quota that changes: lowering it caps what is left at once,
	// raising it takes effect in the next window.
	{0, "HIT path=/quota user=q6 quota=5", "OK true 4 60"},
	{0, "HIT path=/quota user=q6 quota=5", "OK true 3 60"},
	{1000, "HIT path=/quota user=q6 quota=2", "OK true 0 59"},
	{1000, "HIT path=/quota user=q6 quota=5", "OK false 0 59"},
	{60000, "HIT path=/quota user=q6 quota=5", "OK true 4 60"},

	// gcra with a quota: 10 per 10 s is one a second in bursts of 10; the
	// stored state is reinterpreted under another quota, as CL.THROTTLE
	// does with other parameters.
	{0, "HIT path=/gcra-quota user=g1 quota=10", "OK true 9 1"},
	{0, "HIT path=/gcra-quota user=g1 quota=10", "OK true 8 2"},
	{0, "HIT path=/gcra-quota user=g1 quota=1000", "OK true 79 3"}, // clamped to 100
	{0, "HIT path=/gcra-quota user=g2", "OK true 1 5"},
	{0, "HIT path=/gcra-quota user=g2 quota=x", "OK true 0 10"},
	{0, "HIT path=/gcra-quota user=g2", "OK false 0 10"},

	// divvy, named.
	{0, "HIT path=/divvy", "OK true 2 3600"},
	{1000, "HIT path=/divvy", "OK true 1 3599"},

	{0, "HIT path=/elsewhere", "OK false 0 -1"},
}

// TestAlgorithmsOverBothProtocols: HIT over RESP and the line protocol
// keeps its reply shape for every algorithm, and replies as each
// algorithm counts.
func TestAlgorithmsOverBothProtocols(t *testing.T) {
	for _, file := range []string{"algorithms.ini", "algorithms.json"} {
		path := filepath.Join("..", "policy", "testdata", file)
		t.Run(file+"/line", func(t *testing.T) {
			clock := newTestClock(t0)
			srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: clock.now})
			c := dialLine(t, startDivvy(t, srv))
			for i, st := range algorithmSteps {
				clock.ms.Store(t0 + st.at)
				c.send(st.line + "\n")
				if got := c.line(); got != st.want {
					t.Fatalf("step %d at %d %q: got %q, want %q", i, st.at, st.line, got, st.want)
				}
			}
		})
		t.Run(file+"/resp", func(t *testing.T) {
			clock := newTestClock(t0)
			srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: clock.now})
			for i, st := range algorithmSteps {
				clock.ms.Store(t0 + st.at)
				if got := hitRESP(t, srv, st.line); got != st.want {
					t.Fatalf("step %d at %d %q: got %q, want %q", i, st.at, st.line, got, st.want)
				}
			}
		})
	}
}

// TestStaggeredRule: a staggered fixedWindow rule's windows are shifted by
// the FNV-1a hash of its counter identity, as FW.INCR STAGGER shifts a
// key's, so two users' windows end at different times.
func TestStaggeredRule(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "algorithms.ini")
	clock := newTestClock(t0)
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: clock.now})
	p := srv.pol.Current().Policy
	ends := map[int64]bool{}
	for _, user := range []string{"a", "b", "c", "d"} {
		req := policy.Request{{Key: []byte("path"), Value: []byte("/fws")}, {Key: []byte("user"), Value: []byte(user)}}
		r, _ := p.Match(req, nil)
		h := fnv.New64a()
		h.Write(r.AppendCounterID(nil, req))
		off := int64(h.Sum64() % 10000) // t0 is a multiple of the window: the window ends off ms later
		if off == 0 {
			off = 10000
		}
		want := "OK true 1 " + strconv.FormatInt((off+999)/1000, 10)
		if got := hitRESP(t, srv, "HIT path=/fws user="+user); got != want {
			t.Errorf("user %s: got %q, want %q (offset %d ms)", user, got, want, off)
		}
		ends[off] = true
	}
	if len(ends) < 2 {
		t.Errorf("four users' windows all end together: %v", ends)
	}
}

// TestHitEntryPoint calls the engine's Hit as GET /check does: the request's
// fields and a hit count, and an answer with what rate-limit headers need.
func TestHitEntryPoint(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "algorithms.ini")
	clock := newTestClock(t0)
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: clock.now})
	lp := srv.pol.Current()
	r := srv.eng.NewRound()
	hit := func(hits int64, kv ...string) policy.Outcome {
		t.Helper()
		var req policy.Request
		for i := 0; i < len(kv); i += 2 {
			req = append(req, policy.Field{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
		}
		out, err := r.Hit(lp, req, hits, clock.now().UnixNano())
		if err != nil {
			t.Fatalf("hit %v %d: %v", kv, hits, err)
		}
		if _, err := r.Commit(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	type want struct {
		allowed                             bool
		left, limit, retryMs, resetMs, secs int64
		label                               string
		quota                               policy.QuotaStatus
	}
	check := func(name string, o policy.Outcome, w want) {
		t.Helper()
		got := want{o.Allowed, o.CreditsLeft, o.Limit, o.RetryAfterMs, o.ResetAfterMs, o.SecondsUntilReset, "", o.Quota}
		if o.Rule != nil {
			got.label = o.Rule.Label
		}
		if got != w {
			t.Errorf("%s: got %+v, want %+v", name, got, w)
		}
	}
	// fixedWindow: more hits than the limit can never pass; two fit.
	check("fw 3", hit(3, "path", "/fw", "user", "z"), want{false, 2, 2, -1, 10_000, 10, "fw", policy.QuotaNone})
	clock.ms.Store(t0 + 2500)
	check("fw 2", hit(2, "path", "/fw", "user", "z"), want{true, 0, 2, -1, 7500, 8, "fw", policy.QuotaNone})
	check("fw 1", hit(1, "path", "/fw", "user", "z"), want{false, 0, 2, 7500, 7500, 8, "fw", policy.QuotaNone})
	check("fw 0", hit(0, "path", "/fw", "user", "z"), want{true, 0, 2, -1, 7500, 8, "fw", policy.QuotaNone})
	// divvy: two credits at once.
	check("divvy 2", hit(2, "path", "/divvy"), want{true, 1, 3, -1, 3600_000, 3600, "divvy", policy.QuotaNone})
	check("divvy 2 more", hit(2, "path", "/divvy"), want{false, 1, 3, 3600_000, 3600_000, 3600, "divvy", policy.QuotaNone})
	check("divvy 4", hit(4, "path", "/divvy"), want{false, 1, 3, -1, 3600_000, 3600, "divvy", policy.QuotaNone})
	// tokenBucket and gcra take several tokens.
	check("tb 2", hit(2, "path", "/tb", "user", "z"), want{true, 0, 2, -1, 10_000, 10, "tb", policy.QuotaNone})
	check("gcra 3", hit(3, "path", "/gcra", "user", "z"), want{true, 0, 3, -1, 15_000, 15, "gcra", policy.QuotaNone})
	check("gcra 1", hit(1, "path", "/gcra", "user", "z"), want{false, 0, 3, 5_000, 15_000, 15, "gcra", policy.QuotaNone})
	// The quota is reported.
	check("quota clamped", hit(1, "path", "/quota", "user", "z", "quota", "50"), want{true, 4, 5, -1, 60_000, 60, "quota", policy.QuotaClamped})
	check("quota used", hit(1, "path", "/quota", "user", "y", "quota", "3"), want{true, 2, 3, -1, 60_000, 60, "quota", policy.QuotaUsed})
	check("quota malformed", hit(1, "path", "/quota", "user", "x", "quota", "3x"), want{true, 1, 2, -1, 60_000, 60, "quota", policy.QuotaMalformed})
	check("quota missing", hit(1, "path", "/quota", "user", "w"), want{true, 1, 2, -1, 60_000, 60, "quota", policy.QuotaMissing})
	check("quota 0", hit(1, "path", "/quota", "user", "v", "quota", "0"), want{false, 0, 0, -1, -1, -1, "quota", policy.QuotaUsed})
	check("always deny", hit(1, "path", "/nowhere"), want{false, 0, 0, -1, -1, -1, "", policy.QuotaNone})

	// A slidingLog records one hit at a time.
	_, err := r.Hit(lp, policy.Request{{Key: []byte("path"), Value: []byte("/log")}, {Key: []byte("user"), Value: []byte("z")}}, 2, clock.now().UnixNano())
	if err == nil || !strings.Contains(srv.errorText(err), "a slidingLog rule records one hit at a time") {
		t.Fatalf("2 hits on a slidingLog rule: %v", err)
	}
}

// TestRuleCountersAreRecordsOfTheirKind: each algorithm's counters are
// counted by INFO keyspace under their kind, and the sweep deletes them
// once idle.
func TestRuleCountersAreRecordsOfTheirKind(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "algorithms.ini")
	clock := newTestClock(t0)
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: clock.now})
	for _, line := range []string{
		"HIT path=/fw user=a", "HIT path=/fws user=a", "HIT path=/tb user=a", "HIT path=/gcra user=a",
		"HIT path=/log user=a", "HIT path=/quota user=a", "HIT path=/gcra-quota user=a quota=7", "HIT path=/elsewhere",
	} {
		hitRESP(t, srv, line)
	}
	rc := newClient(t, srv)
	ctx := context.Background()
	info, err := rc.Info(ctx, "keyspace").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"db0:keys=7,", "keys_rule_window:2", "keys_rule_bucket:1", "keys_rule_gcra:2", "keys_rule_log:1", "keys_divvy:1",
		"keys_window:0", "keys_bucket:0", "keys_gcra:0", "keys_log:0"} {
		if !strings.Contains(info, want) {
			t.Errorf("INFO keyspace lacks %q:\n%s", want, info)
		}
	}
	// An hour on, every counter is idle: the sweep deletes them all.
	clock.ms.Store(t0 + 3600_000)
	if err := rc.Do(ctx, "COMPACT").Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := rc.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE after the counters went idle: %d, %v; want 0", n, err)
	}
}

// TestRuleCountersUnreachableFromRESP: a rule counter's key is no key of
// a RESP command: DEL of the bytes of its identity and actor (the client
// key it had when rule counters were records of the command kinds) leaves
// it alone, and so do the commands of its algorithm on that key.
func TestRuleCountersUnreachableFromRESP(t *testing.T) {
	for _, tc := range []struct{ alg, spend string }{
		{"divvy", ""}, {"gcra", "CL.THROTTLE"}, {"slidingLog", "ROLL.LIMIT"}, {"fixedWindow", "FW.INCR"}, {"tokenBucket", "RL.REDUCE"},
	} {
		t.Run(tc.alg, func(t *testing.T) {
			path := policyFile(t, "p.ini", "[path=/x ip=*]\nalgorithm = "+tc.alg+"\ncreditLimit = 2\nresetSeconds = 3600\nactorField = ip\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n")
			srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: newTestClock(t0).now})
			rc := newClient(t, srv)
			ctx := context.Background()
			hit := func() string {
				v, err := rc.Do(ctx, "HIT", "path=/x", "ip=10.0.0.1").Slice()
				if err != nil {
					t.Fatal(err)
				}
				return fmt.Sprint(v[0])
			}
			hit()
			hit()
			if got := hit(); got != "0" {
				t.Fatalf("third HIT allowed %s, want 0", got)
			}
			id := string(srv.pol.Current().Policy.Rules()[0].AppendCounterID(nil, policy.Request{{Key: []byte("ip"), Value: []byte("10.0.0.1")}}))
			if n, err := rc.Del(ctx, id).Result(); err != nil || n != 0 {
				t.Errorf("DEL <rule identity + actor> = %d, %v; want 0: no command key is a rule counter", n, err)
			}
			var args []any
			switch tc.spend {
			case "CL.THROTTLE":
				args = []any{"CL.THROTTLE", id, 0, 1, 3600}
			case "ROLL.LIMIT":
				args = []any{"ROLL.LIMIT", id, 3600000, 5}
			case "FW.INCR":
				args = []any{"FW.INCR", id, 5, 3600}
			case "RL.REDUCE":
				args = []any{"RL.REDUCE", id, 10, 3600}
			}
			if args != nil {
				if err := rc.Do(ctx, args...).Err(); err != nil {
					t.Fatalf("%v: %v", args, err)
				}
			}
			if got := hit(); got != "0" {
				t.Errorf("after DEL and %s of the key %q, HIT allowed %s: a RESP command reached the rule's counter", tc.spend, id, got)
			}
		})
	}
}
