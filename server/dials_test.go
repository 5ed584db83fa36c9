package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/client/ratelimitheader"
	"github.com/sluicehq/sluice/internal/engine"
)

// TestOverridesTranscript replays resp/overrides.txt on a server of its
// own with the rules of overrides.ini and a bound of 3 overrides.
func TestOverridesTranscript(t *testing.T) {
	srv := startServer(t, Config{
		MaxKeySize:         16,
		Clock:              newTestClock(transcriptTime).now,
		PolicyFile:         filepath.Join(transcriptDir, "overrides.ini"),
		PolicyMaxOverrides: 3,
	})
	runRESPTranscript(t, srv, filepath.Join(transcriptDir, "resp", "overrides.txt"))
}

// TestDialsTranscript replays resp/dials.txt on a server of its own with
// the rules of dials.ini: the dials it changes are the server's.
func TestDialsTranscript(t *testing.T) {
	srv := startServer(t, Config{
		Clock:      newTestClock(transcriptTime).now,
		PolicyFile: filepath.Join(transcriptDir, "dials.ini"),
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
	srv.policyHTTP().ServeHTTP(w, r)
	return w.Code, strings.TrimSpace(w.Body.String())
}

// The dials over HTTP (issue 30, step 3): the same changes as POLICY
// LIMIT and ENFORCE, seen by HIT at once, behind /backup's password and
// protected mode, each audited in the log and the metrics; bad input gets
// a 400 that says what was expected.
func TestDialsOverHTTP(t *testing.T) {
	var logs bytes.Buffer
	srv := startServer(t, Config{
		Password:   "pw",
		Clock:      newTestClock(transcriptTime).now,
		PolicyFile: filepath.Join(transcriptDir, "dials.ini"),
		Logger:     slog.New(slog.NewTextHandler(&logs, nil)),
	})
	c := newClient(t, srv)
	ctx := context.Background()
	if err := c.Do(ctx, "AUTH", "pw").Err(); err != nil {
		t.Fatal(err)
	}
	remote := "10.1.2.3:5000"
	for _, s := range []struct {
		method, path, pass, body string
		code                     int
		want                     string
	}{
		{"GET", "/v1/policy/", "", "", 401, "WRONGPASS"},
		{"PUT", "/v1/policy/limits/api", "wrong", `{"creditLimit": 1}`, 401, "WRONGPASS"},
		{"PUT", "/v1/policy/limits/api", "pw", `{"creditLimit": 1}`, 200, `{"label":"api","creditLimit":1,"resetSeconds":null,"state":"applied"}`},
		{"GET", "/v1/policy/", "pw", "", 200, `{"enforce":"on","limits":[{"label":"api","creditLimit":1,"resetSeconds":null,"state":"applied"}]}`},
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
	} {
		code, body := policyRequest(srv, remote, s.pass, s.method, s.path, s.body)
		if code != s.code || !strings.Contains(body, s.want) {
			t.Errorf("%s %s %s: %d %s; want %d with %s", s.method, s.path, s.body, code, body, s.code, s.want)
		}
	}
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
	protected := startServer(t, Config{PolicyFile: filepath.Join(transcriptDir, "dials.ini")})
	if code, body := policyRequest(protected, remote, "", "GET", "/v1/policy/", ""); code != 403 || !strings.Contains(body, "protected mode") {
		t.Errorf("protected mode, a remote client: %d %s, want 403", code, body)
	}
	if code, _ := policyRequest(protected, "127.0.0.1:5000", "", "GET", "/v1/policy/", ""); code != 200 {
		t.Errorf("protected mode, a loopback client: %d, want 200", code)
	}
}

// Envoy's rate limit service in the dials' modes: a descriptor over its
// limit, and a gcra one asking more than its burst at once (which the
// front end denies itself), are let through in shadow mode and counted in
// over_limit and shadow_mode; with enforcement off, allowed.
func TestDialsRLS(t *testing.T) {
	f := newRLS(t, Config{RLS: RLSConfig{Dir: rlsConfigDir(t, "domain: test\ndescriptors:\n  - key: fw\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: gc\n    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: gcra}\n")}})
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
	srv := startServer(t, Config{Clock: newTestClock(transcriptTime).now, PolicyFile: filepath.Join(transcriptDir, "dials.ini"),
		Check: CheckConfig{HeaderStyle: ratelimitheader.Both}})
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
