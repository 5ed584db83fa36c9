package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/client/ratelimitheader"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/httpport"
	"github.com/sluicehq/sluice/internal/policycmd"
)

// TestOverridesTranscript replays resp/overrides.txt on a server of its
// own with the rules of overrides.ini and a bound of 3 overrides.
func TestOverridesTranscript(t *testing.T) {
	srv := startServer(t, Config{
		Engine: engine.Tuning{MaxKeySize: 16},
		Clock:  newTestClock(transcriptTime).now,
		Policy: policycmd.Config{
			File:         filepath.Join(transcriptDir, "overrides.ini"),
			MaxOverrides: 3,
		},
	})
	runRESPTranscript(t, srv, filepath.Join(transcriptDir, "resp", "overrides.txt"))
}

// TestDialsTranscript replays resp/dials.txt on a server of its own with
// the rules of dials.ini: the dials it changes are the server's.
func TestDialsTranscript(t *testing.T) {
	srv := startServer(t, Config{
		Clock:  newTestClock(transcriptTime).now,
		Policy: policycmd.Config{File: filepath.Join(transcriptDir, "dials.ini")},
	})
	runRESPTranscript(t, srv, filepath.Join(transcriptDir, "resp", "dials.txt"))
}

// policyRequest sends method path body to srv's /v1/policy/ handler as
// remote, with the password pass when not "", and returns the status and
// the body.
func policyRequest(srv *Server, remote, pass, method, path, body string) (int, string) {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.RemoteAddr = remote
	if pass != "" {
		r.SetBasicAuth("default", pass)
	}
	w := httptest.NewRecorder()
	httpHandler(srv).ServeHTTP(w, r)
	return w.Code, strings.TrimSpace(w.Body.String())
}

// httpHandler is srv's HTTP port's handler, /metrics aside.
func httpHandler(srv *Server) http.Handler {
	return srv.http.port.Handler(httpport.Routes{Metrics: http.NotFoundHandler(), Policy: srv.policyHTTP()})
}

// policyServer starts a server with password pw, the rules of file, the
// test clock and cfg's other fields, logging to logs, and returns it with
// a client that is authenticated.
func policyServer(t *testing.T, cfg Config, file string, logs *bytes.Buffer) (*Server, *redis.Client) {
	t.Helper()
	cfg.Listen.Password, cfg.Clock = "pw", newTestClock(transcriptTime).now
	cfg.Policy.File = filepath.Join(transcriptDir, file)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	srv := startServer(t, cfg)
	c := newClient(t, srv)
	if err := c.Do(context.Background(), "AUTH", "pw").Err(); err != nil {
		t.Fatal(err)
	}
	return srv, c
}

// policyCase is a request to /v1/policy/ and what its answer must be:
// the status, and a part of the body.
type policyCase struct {
	method, path, pass, body string
	code                     int
	want                     string
}

// checkPolicyRequests sends each case as remote and checks its answer.
func checkPolicyRequests(t *testing.T, srv *Server, remote string, cases []policyCase) {
	t.Helper()
	for _, s := range cases {
		code, body := policyRequest(srv, remote, s.pass, s.method, s.path, s.body)
		if code != s.code || !strings.Contains(body, s.want) {
			t.Errorf("%s %s %s: %d %s; want %d with %s", s.method, s.path, s.body, code, body, s.code, s.want)
		}
	}
}

// The dials over HTTP (issue 30, step 3): the same changes as POLICY
// LIMIT and ENFORCE, seen by HIT at once, behind /backup's password and
// protected mode, each audited in the log and the metrics; bad input gets
// a 400 that says what was expected.
func TestDialsOverHTTP(t *testing.T) {
	var logs bytes.Buffer
	srv, c := policyServer(t, Config{}, "dials.ini", &logs)
	ctx := context.Background()
	remote := "10.1.2.3:5000"
	checkPolicyRequests(t, srv, remote, []policyCase{
		{"GET", "/v1/policy/", "", "", 401, "WRONGPASS"},
		{"PUT", "/v1/policy/limits/api", "wrong", `{"creditLimit": 1}`, 401, "WRONGPASS"},
		{"PUT", "/v1/policy/limits/api", "pw", `{"creditLimit": 1}`, 200, `{"label":"api","creditLimit":1,"resetSeconds":null,"state":"applied"}`},
		{"GET", "/v1/policy/", "pw", "", 200, `{"enforce":"on","limits":[{"label":"api","creditLimit":1,"resetSeconds":null,"state":"applied"}],"overrides":{}}`},
		{"PUT", "/v1/policy/enforce", "pw", `{"enforce": "shadow"}`, 200, `{"enforce":"shadow"}`},
		{"GET", "/v1/policy/enforce", "pw", "", 200, `{"enforce":"shadow"}`},
		{"PUT", "/v1/policy/limits/nope", "pw", `{"creditLimit": 1}`, 400, `is not a label of the rules in use`},
		{"PUT", "/v1/policy/limits/api", "pw", `{"creditLimit": -1}`, 400, `creditLimit is -1; expected a non-negative integer`},
		{"PUT", "/v1/policy/limits/api", "pw", `{"creditLimit": 1, "resetSeconds": -1}`, 400, `resetSeconds is negative`},
		{"PUT", "/v1/policy/limits/api", "pw", `{"creditLimit": "1"}`, 400, `not the JSON object expected`},
		{"PUT", "/v1/policy/limits/api", "pw", `{"credit": 1}`, 400, `unknown field`},
		{"PUT", "/v1/policy/limits/api", "pw", `{}`, 400, `the body has no \"creditLimit\"`},
		{"PUT", "/v1/policy/limits/api", "pw", ``, 400, `the body is empty`},
		{"PUT", "/v1/policy/limits/api", "pw", `{"creditLimit": 1` + strings.Repeat(" ", 5000) + `}`, 413, `over 4096 bytes`},
		{"PUT", "/v1/policy/enforce", "pw", `{"enforce": "maybe"}`, 400, `mode \"maybe\" is not one`},
		{"GET", "/v1/policy/limits/" + strings.Repeat("a", 300), "pw", "", 400, `label is 300 bytes`},
		{"GET", "/v1/policy/limits/try", "pw", "", 404, `label try has no runtime limit`},
	})
	// HIT sees them at once: limit 1, shadow lets the second through.
	for i, want := range []string{"[1 0 60]", "[1 0 60]"} {
		if got := fmt.Sprint(c.Do(ctx, "HIT", "path=/api", "ip=h").Val()); got != want {
			t.Fatalf("HIT %d: %s, want %s", i+1, got, want)
		}
	}
	if code, body := policyRequest(srv, remote, "pw", "DELETE", "/v1/policy/limits/api", ""); code != 200 || body != `{"label":"api","reset":true}` {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	if got, _ := c.Do(ctx, "POLICY", "ENFORCE").Text(); got != "shadow" {
		t.Fatalf("POLICY ENFORCE after the HTTP change: %q", got)
	}
	// Audited: an info line naming the client, and the counter.
	for _, want := range []string{
		"msg=\"policy changed\" change=limit via=http client=10.1.2.3:5000 user=default label=api creditLimit=1",
		"msg=\"policy changed\" change=enforce via=http client=10.1.2.3:5000 user=default enforce=shadow",
		"msg=\"policy changed\" change=reset via=http client=10.1.2.3:5000 user=default label=api",
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no audit line %s in\n%s", want, logs.String())
		}
	}
	if err := c.Do(ctx, "POLICY", "ENFORCE", "on").Err(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "change=enforce via=resp client=127.0.0.1:") {
		t.Errorf("no audit line of the RESP change in\n%s", logs.String())
	}
	if n := srv.polCmds.Changes.N[1][0].Load(); n != 1 {
		t.Errorf("HTTP limit changes counted %d, want 1", n)
	}

	// Protected mode, as /backup: loopback only.
	protected := startServer(t, Config{Policy: policycmd.Config{File: filepath.Join(transcriptDir, "dials.ini")}})
	if code, body := policyRequest(protected, remote, "", "GET", "/v1/policy/", ""); code != 403 || !strings.Contains(body, "protected mode") {
		t.Errorf("protected mode, a remote client: %d %s, want 403", code, body)
	}
	if code, _ := policyRequest(protected, "127.0.0.1:5000", "", "GET", "/v1/policy/", ""); code != 200 {
		t.Errorf("protected mode, a loopback client: %d, want 200", code)
	}
}

// Per-actor overrides over HTTP (issue 30, step 2): the same changes as
// POLICY OVERRIDE, seen by HIT at once, listed a page at a time, each
// audited; bad input gets a 400 that says what was expected, an actor
// without an override a 404.
func TestOverridesOverHTTP(t *testing.T) {
	var logs bytes.Buffer
	srv, c := policyServer(t, Config{Engine: engine.Tuning{MaxKeySize: 16}, Policy: policycmd.Config{MaxOverrides: 2}}, "overrides.ini", &logs)
	ctx := context.Background()
	remote := "10.1.2.3:5000"
	checkPolicyRequests(t, srv, remote, []policyCase{
		{"PUT", "/v1/policy/overrides/api/10.0.0.1", "", `{"limit": 3}`, 401, "WRONGPASS"},
		{"PUT", "/v1/policy/overrides/api/10.0.0.1", "pw", `{"limit": 3}`, 200, `{"label":"api","actor":"10.0.0.1","limit":3}`},
		{"PUT", "/v1/policy/overrides/api/a%2Fb", "pw", `{"limit": 0}`, 200, `{"label":"api","actor":"a/b","limit":0}`},
		{"GET", "/v1/policy/overrides/api/10.0.0.1", "pw", "", 200, `{"label":"api","actor":"10.0.0.1","limit":3}`},
		{"GET", "/v1/policy/overrides/api/10.0.0.2", "pw", "", 404, `actor \"10.0.0.2\" has no override in label api`},
		{"GET", "/v1/policy/overrides/api?count=1", "pw", "", 200, `{"cursor":"a31302e302e302e31","label":"api","overrides":[{"actor":"10.0.0.1","limit":3}]}`},
		{"GET", "/v1/policy/overrides/api?count=1&cursor=a31302e302e302e31", "pw", "", 200, `{"cursor":"0","label":"api","overrides":[{"actor":"a/b","limit":0}]}`},
		{"GET", "/v1/policy/", "pw", "", 200, `"overrides":{"api":2}`},
		{"PUT", "/v1/policy/overrides/api/10.0.0.3", "pw", `{"limit": 1}`, 400, `overrides are at their bound, 2 (--policy-max-overrides)`},
		{"PUT", "/v1/policy/overrides/nope/a", "pw", `{"limit": 1}`, 400, `is not a label of the rules in use`},
		{"PUT", "/v1/policy/overrides/shared/a", "pw", `{"limit": 1}`, 400, `has no actorField`},
		{"PUT", "/v1/policy/overrides/api/a", "pw", `{"limit": -1}`, 400, `limit is -1; expected a non-negative integer`},
		{"PUT", "/v1/policy/overrides/api/a", "pw", `{"limit": 1e30}`, 400, `not the JSON object expected`},
		{"PUT", "/v1/policy/overrides/api/a", "pw", `{}`, 400, `the body has no \"limit\"`},
		{"PUT", "/v1/policy/overrides/api/" + strings.Repeat("x", 17), "pw", `{"limit": 1}`, 400, `actor is 17 bytes, longer than --max-key-size 16`},
		{"GET", "/v1/policy/overrides/api?count=0", "pw", "", 400, `count \"0\" is not one; expected an integer from 1 to 1000`},
		{"GET", "/v1/policy/overrides/api?cursor=zz", "pw", "", 400, `cursor \"zz\" is not one`},
		{"GET", "/v1/policy/overrides/nope", "pw", "", 400, `is not a label of the rules in use`},
		{"GET", "/v1/policy/overrides/nope/a", "pw", "", 400, `is not a label of the rules in use`},
	})
	// HIT sees them at once.
	for i, want := range []string{"[1 2 60]", "[1 1 60]"} {
		if got := fmt.Sprint(c.Do(ctx, "HIT", "path=/api", "ip=10.0.0.1").Val()); got != want {
			t.Fatalf("HIT %d: %s, want %s", i+1, got, want)
		}
	}
	if code, body := policyRequest(srv, remote, "pw", "DELETE", "/v1/policy/overrides/api/10.0.0.1", ""); code != 200 || body != `{"actor":"10.0.0.1","label":"api","reset":true}` {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	// The window keeps its one credit left, under the rule's limit 2.
	if got := fmt.Sprint(c.Do(ctx, "HIT", "path=/api", "ip=10.0.0.1").Val()); got != "[1 0 60]" {
		t.Fatalf("HIT after DELETE: %s; want its last credit", got)
	}
	for _, want := range []string{
		"msg=\"policy changed\" change=override via=http client=10.1.2.3:5000 user=default label=api actor=10.0.0.1 limit=3",
		"msg=\"policy changed\" change=override_reset via=http client=10.1.2.3:5000 user=default label=api actor=10.0.0.1",
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no audit line %s in\n%s", want, logs.String())
		}
	}
}

// Envoy's rate limit service in the dials' modes: a descriptor over its
// limit, and a gcra one asking more than its burst at once (which the
// front end denies itself), are let through in shadow mode and counted in
// over_limit and shadow_mode; with enforcement off, allowed.
func TestDialsRLS(t *testing.T) {
	f := newRLS(t, Config{RLS: envoy.Config{Dir: rlsConfigDir(t, "domain: test\ndescriptors:\n  - key: fw\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: gc\n    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: gcra}\n")}})
	over := desc("gc", "v")
	over.HitsAddend = wrapperspb.UInt64(11)
	f.one(t, desc("fw", "v"))
	if st := f.one(t, desc("fw", "v")); st.Code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("fw over its limit, enforced: %v", st)
	}
	if st := f.one(t, over); st.Code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("gc over its burst, enforced: %v", st)
	}
	if err := f.srv.eng.SetEnforcement(engine.Shadow); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*rlcommon.RateLimitDescriptor{desc("fw", "v"), over} {
		if st := f.one(t, d); st.Code != rlspb.RateLimitResponse_OK || st.LimitRemaining != 0 {
			t.Fatalf("%v in shadow mode: %v; want OK with 0 left", d, st)
		}
	}
	for _, key := range []string{"fw", "gc"} {
		if m := rlsMetrics(t, f.srv, "test", key); m["over_limit"] != map[string]float64{"fw": 2, "gc": 22}[key] || m["shadow_mode"] != map[string]float64{"fw": 1, "gc": 11}[key] {
			t.Errorf("%s metrics after shadow mode: %v", key, m)
		}
	}
	if err := f.srv.eng.SetEnforcement(engine.Off); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*rlcommon.RateLimitDescriptor{desc("fw", "v"), over} {
		if st := f.one(t, d); st.Code != rlspb.RateLimitResponse_OK {
			t.Fatalf("%v with enforcement off: %v; want OK", d, st)
		}
	}
}

// /check's rate-limit headers follow each runtime limit: the fields built
// for one are not those of the limit before, nor the file's after RESET.
func TestDialsCheckHeaders(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(transcriptTime).now, Policy: policycmd.Config{File: filepath.Join(transcriptDir, "dials.ini")},
		Check: check.Config{HeaderStyle: ratelimitheader.Both}})
	base := startCheck(t, srv)
	lp := srv.pol.Current()
	for _, c := range []struct {
		limit int64 // -1: RESET
		want  string
	}{{3, "3"}, {3, "3"}, {4, "4"}, {-1, "2"}} {
		if c.limit < 0 {
			if _, err := srv.eng.ResetLimit(lp, "api"); err != nil {
				t.Fatal(err)
			}
		} else if err := srv.eng.SetLimit(lp, "api", engine.Limit{CreditLimit: c.limit, ResetSeconds: engine.FileReset}); err != nil {
			t.Fatal(err)
		}
		got := checkRequest(t, base, "GET /check/api | X-Forwarded-For: 10.0.0.1")
		if !strings.Contains(got, "X-Ratelimit-Limit: "+c.want+"\n") || !strings.Contains(got, `Ratelimit-Policy: "api";q=`+c.want+";w=60\n") {
			t.Errorf("limit %d: /check answered\n%s\nwant X-RateLimit-Limit and RateLimit-Policy's quota %s", c.limit, got, c.want)
		}
	}
}
