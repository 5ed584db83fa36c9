package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
)

// TestDialsOverTheWire (issue 30, must show 1): a runtime limit and
// POLICY ENFORCE shadow change what HIT, GET /check and Envoy's rate limit
// service answer at once on a running server; both survive a SIGTERM
// restart and rule-file reloads (one that drops the label keeps the
// limit, orphaned, shown in INFO); RESET and ENFORCE on restore the
// file's behaviour. Windows last a year, so that none ends in the test.
func TestDialsOverTheWire(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.ini")
	write := func(path, text string) { replaceFile(t, path, text) }
	const year = "31536000"
	withLabel := func(limit string) string {
		return "[path=/api]\ncreditLimit = " + limit + "\nresetSeconds = " + year + "\nlabel = api\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n"
	}
	write(rules, withLabel("3"))
	conf := filepath.Join(dir, "rls")
	if err := os.Mkdir(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(conf, "api.yaml"), "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: year\n      requests_per_unit: 1\n")
	flags := []string{"--policy", rules, "--check-addr", "127.0.0.1:0", "--rls-addr", "127.0.0.1:0", "--rls-config", conf}
	ctx := context.Background()

	p := startProc(t, filepath.Join(dir, "data"), flags...)
	c := p.client(t)
	do := func(c *redis.Client, args ...any) any {
		t.Helper()
		v, err := c.Do(ctx, args...).Result()
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return v
	}
	hit := func(c *redis.Client) string {
		t.Helper()
		return fmt.Sprint(do(c, "HIT", "path=/api"))
	}
	check := func(p *proc) (int, http.Header) {
		t.Helper()
		cl := http.Client{Timeout: 30 * time.Second}
		res, err := cl.Get("http://" + p.checkAddr + "/check/api")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode, res.Header
	}

	// A lowered limit applies at once, to HIT and /check alike (they
	// share the rule's counter).
	if got := do(c, "POLICY", "LIMIT", "api", "1"); got != "OK" {
		t.Fatalf("POLICY LIMIT: %v", got)
	}
	if got := hit(c); !strings.HasPrefix(got, "[1 0 ") {
		t.Fatalf("first HIT under the runtime limit 1: %s; want allowed, 0 left", got)
	}
	if got := hit(c); !strings.HasPrefix(got, "[0 0 ") {
		t.Fatalf("second HIT: %s; want denied", got)
	}
	if code, h := check(p); code != http.StatusTooManyRequests || h.Get("X-RateLimit-Limit") != "1" {
		t.Fatalf("/check under the runtime limit: %d, limit %q; want 429 and 1", code, h.Get("X-RateLimit-Limit"))
	}
	rls := rlsClient(t, p.rlsAddr)
	if st := shouldRateLimit(t, rls, "alice"); st.Code != rlspb.RateLimitResponse_OK {
		t.Fatalf("RLS first hit: %v", st)
	}
	if st := shouldRateLimit(t, rls, "alice"); st.Code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("RLS second hit: %v; want OVER_LIMIT", st)
	}

	// Shadow: every front end lets through what the limit refuses.
	if got := do(c, "POLICY", "ENFORCE", "shadow"); got != "OK" {
		t.Fatalf("POLICY ENFORCE shadow: %v", got)
	}
	shadowed := func(p *proc, c *redis.Client, rls rlspb.RateLimitServiceClient) {
		t.Helper()
		if got := hit(c); !strings.HasPrefix(got, "[1 0 ") {
			t.Fatalf("HIT in shadow mode: %s; want allowed, 0 left", got)
		}
		if code, h := check(p); code != http.StatusOK || h.Get("X-Sluice-Shadow") != "over-limit" || h.Get("X-RateLimit-Remaining") != "0" {
			t.Fatalf("/check in shadow mode: %d %v; want 200, shadow over-limit, 0 remaining", code, h)
		}
		if st := shouldRateLimit(t, rls, "alice"); st.Code != rlspb.RateLimitResponse_OK || st.LimitRemaining != 0 {
			t.Fatalf("RLS in shadow mode: %v; want OK with 0 left", st)
		}
	}
	shadowed(p, c, rls)
	waitMetric(t, p, `sluice_policy_enforce{mode="shadow"} 1`)

	p.stop(t, syscall.SIGTERM)
	if p.err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", p.err, p.logs)
	}
	p = startProc(t, filepath.Join(dir, "data"), flags...)
	c = p.client(t)
	rls = rlsClient(t, p.rlsAddr)
	shadowed(p, c, rls)
	if _, h := check(p); h.Get("X-RateLimit-Limit") != "1" {
		t.Fatalf("after the restart: /check limit %q; want the runtime limit 1", h.Get("X-RateLimit-Limit"))
	}

	// A reload that changes the file's limit keeps the runtime one; one
	// that drops the label keeps it, orphaned; the label back applies it.
	reload := func(text string) {
		t.Helper()
		write(rules, text)
		if got := do(c, "POLICY", "RELOAD"); got != "OK" {
			t.Fatalf("POLICY RELOAD: %v", got)
		}
	}
	reload(withLabel("5"))
	if _, h := check(p); h.Get("X-RateLimit-Limit") != "1" {
		t.Fatalf("after a reload: /check limit %q; want the runtime limit 1", h.Get("X-RateLimit-Limit"))
	}
	reload("[path=/api]\ncreditLimit = 5\nresetSeconds = " + year + "\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n")
	waitInfo(t, c, "policy", "policy_runtime_limits_orphaned:1")
	waitInfo(t, c, "policy", "policy_orphaned_labels:api")
	if got := fmt.Sprint(do(c, "POLICY", "SHOW")); !strings.Contains(got, "[label api limitSource orphaned runtimeCreditLimit 1 runtimeResetSeconds -1]") {
		t.Fatalf("POLICY SHOW with the label dropped: %s", got)
	}
	reload(withLabel("5"))
	if _, h := check(p); h.Get("X-RateLimit-Limit") != "1" {
		t.Fatalf("with the label back: /check limit %q; want the runtime limit 1", h.Get("X-RateLimit-Limit"))
	}

	// RESET and ENFORCE on: the file's behaviour again.
	if got := do(c, "POLICY", "LIMIT", "api", "RESET"); got != int64(1) {
		t.Fatalf("POLICY LIMIT api RESET: %v; want 1", got)
	}
	if got := do(c, "POLICY", "ENFORCE", "on"); got != "OK" {
		t.Fatalf("POLICY ENFORCE on: %v", got)
	}
	if code, h := check(p); code != http.StatusTooManyRequests || h.Get("X-RateLimit-Limit") != "5" || h.Get("X-Sluice-Shadow") != "" {
		t.Fatalf("after RESET: /check %d limit %q shadow %q; want 429 (the window's credits are spent), the file's 5, no shadow", code, h.Get("X-RateLimit-Limit"), h.Get("X-Sluice-Shadow"))
	}
	if st := shouldRateLimit(t, rls, "alice"); st.Code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("RLS after ENFORCE on: %v; want OVER_LIMIT", st)
	}
	p.stop(t, syscall.SIGTERM) // the logs are complete once it has exited
	// This process was set to shadow only by the store: it said so.
	if !strings.Contains(p.logs.String(), "policy enforcement is not on") {
		t.Fatalf("a restart in shadow mode did not warn:\n%s", p.logs)
	}
}
