package main

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestRLSOverrideOverTheWire (issue 30, must show 1, for Envoy's
// descriptors): RLS.OVERRIDE changes what the rate limit service answers
// for one descriptor at once, on a running server, and not for another;
// it survives a SIGTERM restart and a reload that changes the limit's
// requests_per_unit (a new counter, which reads the override); RESET
// restores the configuration's limit. The unit is a year, so that no
// window ends in the test.
func TestRLSOverrideOverTheWire(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "rls")
	if err := os.Mkdir(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(rpu string) {
		replaceFile(t, filepath.Join(conf, "api.yaml"), "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: year\n      requests_per_unit: "+rpu+"\n")
	}
	write("1")
	flags := []string{"--rls-addr", "127.0.0.1:0", "--rls-config", conf}
	ctx := context.Background()
	p := startProc(t, filepath.Join(dir, "data"), flags...)
	c := p.client(t)
	do := func(args ...any) any {
		t.Helper()
		v, err := c.Do(ctx, args...).Result()
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return v
	}
	want := func(what, user string, code rlspb.RateLimitResponse_Code, limit, remaining uint32) {
		t.Helper()
		st := shouldRateLimit(t, rlsClient(t, p.rlsAddr), user)
		if st.Code != code || st.GetCurrentLimit().GetRequestsPerUnit() != limit || st.LimitRemaining != remaining {
			t.Fatalf("%s: %v; want %v, limit %d, %d remaining", what, st, code, limit, remaining)
		}
	}

	if got := do("RLS.OVERRIDE", "api", "user=vip", "3"); got != "OK" {
		t.Fatalf("RLS.OVERRIDE: %v", got)
	}
	want("vip's first hit", "vip", rlspb.RateLimitResponse_OK, 3, 2)
	want("vip's second hit", "vip", rlspb.RateLimitResponse_OK, 3, 1)
	want("another user", "alice", rlspb.RateLimitResponse_OK, 1, 0)
	want("another user again", "alice", rlspb.RateLimitResponse_OVER_LIMIT, 1, 0)

	p.stop(t, syscall.SIGTERM)
	if p.err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", p.err, p.logs)
	}
	p = startProc(t, filepath.Join(dir, "data"), flags...)
	c = p.client(t)
	if got := do("RLS.OVERRIDE", "api", "user=vip"); got != int64(3) {
		t.Fatalf("RLS.OVERRIDE after the restart: %v; want 3", got)
	}
	want("vip after the restart", "vip", rlspb.RateLimitResponse_OK, 3, 0)
	want("vip over the override", "vip", rlspb.RateLimitResponse_OVER_LIMIT, 3, 0)

	// A reload to another requests_per_unit starts new counters, which
	// take the override.
	write("2")
	if got := do("POLICY", "RELOAD"); got != "OK" {
		t.Fatalf("POLICY RELOAD: %v", got)
	}
	want("vip after the reload", "vip", rlspb.RateLimitResponse_OK, 3, 2)
	want("another user after the reload", "bob", rlspb.RateLimitResponse_OK, 2, 1)

	if got := do("RLS.OVERRIDE", "api", "user=vip", "RESET"); got != int64(1) {
		t.Fatalf("RLS.OVERRIDE RESET: %v; want 1", got)
	}
	// The live counter keeps what vip used (1 of the year's window) under
	// the configuration's limit again.
	want("vip after RESET", "vip", rlspb.RateLimitResponse_OK, 2, 0)
	want("vip over the configuration's limit", "vip", rlspb.RateLimitResponse_OVER_LIMIT, 2, 0)
	waitInfo(t, c, "policy", "policy_overrides:0")
}
