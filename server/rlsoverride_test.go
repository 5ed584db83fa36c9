package server

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/transcript"
)

// TestRLSOverridesTranscript replays rls-overrides.txt: RLS.OVERRIDE and
// RLS.OVERRIDES over RESP, and the ShouldRateLimit calls they change, on
// a server with the RLS tests' configuration, --max-key-size 32 and
// --policy-max-overrides 3.
func TestRLSOverridesTranscript(t *testing.T) {
	f := newRLS(t, Config{Engine: engine.Tuning{MaxKeySize: 32}, Policy: policycmd.Config{MaxOverrides: 3}})
	c := dialRaw(t, f.srv)
	r := bufio.NewReader(c.conn)
	transcript.Run(t, filepath.Join(transcriptDir, "rls-overrides.txt"), *rewrite, func(req string) string {
		if !strings.HasPrefix(req, "RLS.") {
			return rlsRequest(f, req)
		}
		c.write(respCommand(commandWords(req)...))
		b, err := readRESPReply(r)
		if err != nil {
			t.Fatalf("> %s: %v after %q", req, err, b)
		}
		return string(b)
	})
}

// An override's limit is the one the rate limit headers report, and the
// change is audited and counted as POLICY OVERRIDE's are.
func TestRLSOverrideHeadersAndAudit(t *testing.T) {
	var logs bytes.Buffer
	f := newRLS(t, Config{RLS: envoy.Config{Dir: rlsConfigDir(t, rlsYAML), ResponseHeaders: true}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	c := newClient(t, f.srv)
	if err := c.Do(ctx, "RLS.OVERRIDE", "test", "k=a", "7").Err(); err != nil {
		t.Fatal(err)
	}
	resp := f.call(t, &rlspb.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a")}})
	h := map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	if h["RateLimit-Limit"] != "7" || h["RateLimit-Remaining"] != "6" || resp.Statuses[0].CurrentLimit.RequestsPerUnit != 7 {
		t.Fatalf("headers %v, current_limit %v; want the override's 7, 6 remaining", h, resp.Statuses[0].CurrentLimit)
	}
	if !strings.Contains(logs.String(), `msg="policy changed" change=override via=resp client=127.0.0.1:`) ||
		!strings.Contains(logs.String(), `domain=test descriptor="k=a" requests_per_unit=7`) {
		t.Errorf("no audit line of RLS.OVERRIDE in\n%s", logs.String())
	}
	if n := f.srv.polCmds.Changes.N[0][3].Load(); n != 1 {
		t.Errorf("override changes over RESP counted %d, want 1", n)
	}
	if got, _ := c.Info(ctx, "policy").Result(); !strings.Contains(got, "policy_override_labels:rls:test=1\r\n") {
		t.Errorf("INFO policy does not count the override under rls:test:\n%s", got)
	}
}

// RLS.OVERRIDE over HTTP, under /v1/policy/rls/: the same changes, seen
// by ShouldRateLimit at once, listed a page at a time; bad input gets a
// 400 that says what was expected, a descriptor without an override a
// 404.
func TestRLSOverridesOverHTTP(t *testing.T) {
	f := newRLS(t, Config{Engine: engine.Tuning{MaxKeySize: 32}})
	remote := "127.0.0.1:5000"
	checkPolicyRequests(t, f.srv, remote, []policyCase{
		{"PUT", "/v1/policy/rls/test/override?entry=k=a", "", `{"requests_per_unit": 5}`, 200, `{"domain":"test","descriptor":[{"key":"k","value":"a"}],"requests_per_unit":5}`},
		{"PUT", "/v1/policy/rls/test/override?entry=key_1=value_1&entry=user=bkthomps", "", `{"requests_per_unit": 1}`, 200, `"requests_per_unit":1`},
		{"GET", "/v1/policy/rls/test/override?entry=k=a", "", "", 200, `{"domain":"test","descriptor":[{"key":"k","value":"a"}],"requests_per_unit":5}`},
		{"GET", "/v1/policy/rls/test/override?entry=k=b", "", "", 404, `the descriptor has no override in domain \"test\"`},
		{"GET", "/v1/policy/rls/test/overrides?count=1", "", "", 200, `"overrides":[{"descriptor":[{"key":"k","value":"a"}],"requests_per_unit":5}]`},
		{"GET", "/v1/policy/", "", "", 200, `"overrides":{"rls:test":2}`},
		{"PUT", "/v1/policy/rls/nope/override?entry=k=a", "", `{"requests_per_unit": 5}`, 400, `domain \"nope\" is not configured`},
		{"PUT", "/v1/policy/rls/test/override?entry=nothing=here", "", `{"requests_per_unit": 5}`, 400, `reaches no rate_limit`},
		{"PUT", "/v1/policy/rls/test/override?entry=k=a", "", `{"requests_per_unit": -1}`, 400, `requests_per_unit is -1; expected a non-negative integer`},
		{"PUT", "/v1/policy/rls/test/override?entry=k=a", "", `{"limit": 1}`, 400, `unknown field`},
		{"PUT", "/v1/policy/rls/test/override", "", `{"requests_per_unit": 1}`, 400, `no entry parameter`},
		{"PUT", "/v1/policy/rls/test/override?entry=k", "", `{"requests_per_unit": 1}`, 400, `entry \"k\" is not one`},
		{"GET", "/v1/policy/rls/nope/overrides", "", "", 400, `domain \"nope\" is not configured`},
	})
	if st := f.one(t, desc("k", "a")); st.CurrentLimit.RequestsPerUnit != 5 || st.LimitRemaining != 4 {
		t.Fatalf("after the PUT: %v; want the override 5, 4 remaining", st)
	}
	checkPolicyRequests(t, f.srv, remote, []policyCase{
		{"DELETE", "/v1/policy/rls/test/override?entry=k=a", "", "", 200, `{"descriptor":[{"key":"k","value":"a"}],"domain":"test","reset":true}`},
		{"DELETE", "/v1/policy/rls/test/override?entry=k=a", "", "", 200, `"reset":false`},
	})
	if st := f.one(t, desc("k", "a")); st.CurrentLimit.RequestsPerUnit != 3 || st.LimitRemaining != 1 {
		t.Fatalf("after the DELETE: %v; want the configuration's 3, 1 remaining", st)
	}
}

// A gcra limit without burst lets its limit through at once: under an
// override, the override's. A hits_addend over the configured limit but
// within the override is counted; one over the override is OVER_LIMIT
// without being counted.
func TestRLSOverrideGCRABurst(t *testing.T) {
	f := newRLS(t, Config{RLS: envoy.Config{Dir: rlsConfigDir(t, "domain: test\ndescriptors:\n  - key: gc\n    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: gcra}\n")}})
	c := newClient(t, f.srv)
	if err := c.Do(context.Background(), "RLS.OVERRIDE", "test", "gc=a", "20").Err(); err != nil {
		t.Fatal(err)
	}
	d := desc("gc", "a")
	d.HitsAddend = wrapperspb.UInt64(15)
	if st := f.one(t, d); st.Code != rlspb.RateLimitResponse_OK || st.CurrentLimit.RequestsPerUnit != 20 || st.LimitRemaining != 5 {
		t.Fatalf("15 at once under an override of 20: %v; want OK, 5 remaining", st)
	}
	d.HitsAddend = wrapperspb.UInt64(21)
	if st := f.one(t, d); st.Code != rlspb.RateLimitResponse_OVER_LIMIT || st.CurrentLimit.RequestsPerUnit != 20 {
		t.Fatalf("21 at once under an override of 20: %v; want OVER_LIMIT", st)
	}
}

// A reload that drops the domain keeps its overrides: they are read,
// listed and reset by the domain's name, and once the last is reset the
// domain is unknown.
func TestRLSOverrideOrphanedByReload(t *testing.T) {
	dir := rlsConfigDir(t, rlsYAML)
	f := newRLS(t, Config{RLS: envoy.Config{Dir: dir}})
	c := newClient(t, f.srv)
	ctx := context.Background()
	do := func(args ...any) string {
		t.Helper()
		v, err := c.Do(ctx, args...).Result()
		if err != nil {
			return "error " + err.Error()
		}
		return fmt.Sprint(v)
	}
	if got := do("RLS.OVERRIDE", "test", "k=a", "5"); got != "OK" {
		t.Fatalf("RLS.OVERRIDE: %s", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte("domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.srv.ReloadRLS(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		args []any
		want string
	}{
		{[]any{"RLS.OVERRIDE", "test", "k=a"}, "5"},
		{[]any{"RLS.OVERRIDES", "test"}, "[0 [[k=a] 5]]"},
		{[]any{"RLS.OVERRIDE", "test", "k=a", "6"}, `error ERR domain "test" is not configured; expected a domain of the --rls-config files`},
		{[]any{"RLS.OVERRIDE", "test", "k=a", "RESET"}, "1"},
		{[]any{"RLS.OVERRIDE", "test", "k=a"}, `error ERR domain "test" is not configured; expected a domain of the --rls-config files`},
		{[]any{"RLS.OVERRIDE", "test", "k=a", "RESET"}, `error ERR domain "test" is not configured; expected a domain of the --rls-config files`},
	} {
		if got := do(s.args...); got != s.want {
			t.Errorf("%v: %s; want %s", s.args, got, s.want)
		}
	}
}
