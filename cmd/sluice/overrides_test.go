package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestOverridesOverTheWire (issue 30, must show 1, the overrides): a
// per-actor override, set over RESP or HTTP, changes what HIT and GET
// /check answer for that actor at once on a running server, and for no
// other; it survives a
// SIGTERM restart and rule-file reloads (one that changes the rule's
// limit, whose counters start afresh, and one that drops the label,
// which keeps it, orphaned); RESET restores the rule's limit. /check's
// actor is its client's address, 127.0.0.1. Windows last a year, so that
// none ends in the test.
func TestOverridesOverTheWire(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.ini")
	write := func(text string) { replaceFile(t, rules, text) }
	rule := func(limit, label string) string {
		return "[path=/api ip=*]\ncreditLimit = " + limit + "\nresetSeconds = 31536000\nactorField = ip\n" + label + "\n[default]\ncreditLimit = 0\nresetSeconds = 0\n"
	}
	write(rule("1", "label = api"))
	flags := []string{"--policy", rules, "--check-addr", "127.0.0.1:0"}
	ctx := context.Background()
	p := startProc(t, filepath.Join(dir, "data"), flags...)
	c := p.client(t)
	do := func(args ...any) string {
		t.Helper()
		v, err := c.Do(ctx, args...).Result()
		if err != nil && err != redis.Nil {
			t.Fatalf("%v: %v", args, err)
		}
		return fmt.Sprint(v)
	}
	hit := func(ip string) string {
		t.Helper()
		return do("HIT", "path=/api", "ip="+ip)
	}
	check := func(wantCode int, wantLimit, wantLeft string) {
		t.Helper()
		cl := http.Client{Timeout: 30 * time.Second}
		res, err := cl.Get("http://" + p.checkAddr + "/check/api")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if h := res.Header; res.StatusCode != wantCode || h.Get("X-RateLimit-Limit") != wantLimit || h.Get("X-RateLimit-Remaining") != wantLeft {
			t.Fatalf("/check: %d, limit %q, remaining %q; want %d, %s, %s", res.StatusCode, h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), wantCode, wantLimit, wantLeft)
		}
	}

	if got := do("POLICY", "OVERRIDE", "api", "127.0.0.1", "3"); got != "OK" {
		t.Fatalf("POLICY OVERRIDE: %s", got)
	}
	if got := hit("127.0.0.1"); !strings.HasPrefix(got, "[1 2 ") {
		t.Fatalf("HIT of the overridden actor: %s; want allowed, 2 left of 3", got)
	}
	check(http.StatusOK, "3", "1")
	if a, b := hit("10.0.0.9"), hit("10.0.0.9"); !strings.HasPrefix(a, "[1 0 ") || !strings.HasPrefix(b, "[0 0 ") {
		t.Fatalf("another actor: %s then %s; want the rule's limit, 1", a, b)
	}

	p.stop(t, syscall.SIGTERM)
	if p.err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", p.err, p.logs)
	}
	p = startProc(t, filepath.Join(dir, "data"), flags...)
	c = p.client(t)
	check(http.StatusOK, "3", "0")
	check(http.StatusTooManyRequests, "3", "0")
	waitInfo(t, c, "policy", "policy_override_labels:api=1")

	// The same over HTTP (/v1/policy/, loopback in protected mode).
	put, err := http.NewRequest("PUT", "http://"+p.httpAddr+"/v1/policy/overrides/api/10.0.0.8", strings.NewReader(`{"limit": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := (&http.Client{Timeout: 30 * time.Second}).Do(put)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("PUT /v1/policy/overrides/api/10.0.0.8: %d", res.StatusCode)
	}
	if a, b, c := hit("10.0.0.8"), hit("10.0.0.8"), hit("10.0.0.8"); !strings.HasPrefix(a, "[1 1 ") || !strings.HasPrefix(b, "[1 0 ") || !strings.HasPrefix(c, "[0 0 ") {
		t.Fatalf("an actor overridden over HTTP: %s, %s, %s; want its limit 2", a, b, c)
	}

	// A reload that changes the rule's limit starts new counters: the
	// actor's is created under its override.
	reload := func(text string) {
		t.Helper()
		write(text)
		if got := do("POLICY", "RELOAD"); got != "OK" {
			t.Fatalf("POLICY RELOAD: %s", got)
		}
	}
	reload(rule("2", "label = api"))
	check(http.StatusOK, "3", "2")
	reload(rule("2", ""))
	if got := do("POLICY", "SHOW"); !strings.Contains(got, "[label api orphanedOverrides 2]") {
		t.Fatalf("POLICY SHOW with the label dropped: %s", got)
	}
	check(http.StatusOK, "2", "0") // the rule's own limit, on the same counter
	reload(rule("2", "label = api"))
	check(http.StatusTooManyRequests, "3", "0") // a divvy window keeps its credits left
	if got := do("POLICY", "OVERRIDES", "api"); got != "[0 [10.0.0.8 2 127.0.0.1 3]]" {
		t.Fatalf("POLICY OVERRIDES: %s", got)
	}

	if got := do("POLICY", "OVERRIDE", "api", "127.0.0.1", "RESET"); got != "1" {
		t.Fatalf("RESET: %s; want 1", got)
	}
	check(http.StatusTooManyRequests, "2", "0")
	if got := do("POLICY", "OVERRIDE", "api", "127.0.0.1"); got != "<nil>" && got != "[]" {
		t.Fatalf("the override after RESET: %s; want none", got)
	}
	waitMetric(t, p, `sluice_policy_changes_total{change="override_reset",via="resp"} 1`)
}
