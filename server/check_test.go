package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client/ratelimitheader"
	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/storage"
)

// checkPolicy is the rule: 5 requests per 300 s per user when the
// proxy names one, else per IP.
const checkPolicy = `[user=*]
creditLimit = 5
resetSeconds = 300
actorField = user
label = per-user

[path=/api/* method=POST]
creditLimit = 1
resetSeconds = 60
actorField = ip
label = api-post

[default]
creditLimit = 5
resetSeconds = 300
actorField = ip
label = per-ip
`

// startCheck serves srv's /check on 127.0.0.1:0 and returns its base URL.
func startCheck(t testing.TB, srv *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeCheck(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; err != nil {
			t.Errorf("ServeCheck: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// checkGet asks /check with the given headers ("Name: value").
func checkGet(t testing.TB, method, url string, headers ...string) *http.Response {
	t.Helper()
	return checkGetVia(t, http.DefaultClient, method, url, headers...)
}

// clientFrom is an HTTP client whose connections come from the loopback
// address ip (127.0.0.2: any of 127/8 is on lo).
func clientFrom(ip net.IP) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}).DialContext}}
}

// checkGetVia is checkGet through client.
func checkGetVia(t testing.TB, client *http.Client, method, url string, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Add(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestCheckEndpoint drives the rule through /check: five requests
// per user pass with the headers counting down, the sixth gets 429 with
// Retry-After, another user and another IP are unaffected, an
// X-Forwarded-For from a peer that is not a trusted proxy is ignored, one
// from a trusted proxy is read right to left, and Envoy's form (the
// original method, the path after /check) reaches the rules too. The
// proxy is the peer 127.0.0.1; 127.0.0.2 is a client that reaches /check
// itself.
func TestCheckEndpoint(t *testing.T) {
	clock := newTestClock(t0)
	path := policyFile(t, "check.ini", checkPolicy)
	srv := startServer(t, Config{Clock: clock.now, Policy: policycmd.Config{File: path}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}, Check: check.Config{
		IdentityHeader: "X-User",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		HeaderStyle:    ratelimitheader.Both,
	}})
	base := startCheck(t, srv)

	for i := 1; i <= 5; i++ {
		resp := checkGet(t, "GET", base+"/check", "X-User: alice", "X-Forwarded-Uri: /x?y=1")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("alice's request %d: status %d, want 200", i, resp.StatusCode)
		}
		want := map[string]string{
			"X-Ratelimit-Limit":     "5",
			"X-Ratelimit-Remaining": string(rune('0' + 5 - i)),
			"X-Ratelimit-Used":      string(rune('0' + i)),
			"X-Ratelimit-Reset":     "1700000300",
			"X-Ratelimit-Resource":  "per-user",
			"Ratelimit-Policy":      `"per-user";q=5;w=300`,
			"Ratelimit":             `"per-user";r=` + string(rune('0'+5-i)) + ";t=300",
		}
		for k, v := range want {
			if got := resp.Header.Get(k); got != v {
				t.Errorf("alice's request %d: %s = %q, want %q", i, k, got, v)
			}
		}
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			t.Errorf("allowed request %d has Retry-After %q", i, ra)
		}
	}
	clock.ms.Add(100_000) // 200 s of the window left
	resp := checkGet(t, "GET", base+"/check", "X-User: alice")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "200" || resp.Header.Get("X-Ratelimit-Remaining") != "0" {
		t.Fatalf("alice's sixth: status %d, Retry-After %q, remaining %q; want 429, 200, 0", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("X-Ratelimit-Remaining"))
	}
	if resp := checkGet(t, "GET", base+"/check", "X-User: bob"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-Ratelimit-Remaining") != "4" {
		t.Fatalf("bob: status %d, remaining %q; want 200, 4", resp.StatusCode, resp.Header.Get("X-Ratelimit-Remaining"))
	}

	// Anonymous: keyed by IP. The peer 127.0.0.2 is no trusted proxy, so
	// the X-Forwarded-For it sends is ignored: every request counts for
	// 127.0.0.2.
	direct := clientFrom(net.IPv4(127, 0, 0, 2))
	for i := 1; i <= 5; i++ {
		spoof := "X-Forwarded-For: 203.0.113." + string(rune('0'+i))
		if resp := checkGetVia(t, direct, "GET", base+"/check", spoof); resp.StatusCode != http.StatusOK {
			t.Fatalf("anonymous request %d: status %d, want 200", i, resp.StatusCode)
		}
	}
	if resp := checkGetVia(t, direct, "GET", base+"/check", "X-Forwarded-For: 198.51.100.7"); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-Ratelimit-Resource") != "per-ip" {
		t.Fatalf("sixth anonymous request with a spoofed X-Forwarded-For: status %d, resource %q; want 429 per-ip", resp.StatusCode, resp.Header.Get("X-Ratelimit-Resource"))
	}

	// Through the trusted proxy, the rightmost untrusted entry is the
	// client: a fresh IP.
	trustedClient := http.DefaultClient
	req, _ := http.NewRequest("GET", base+"/check", nil)
	req.Header.Set("X-Forwarded-For", "192.0.2.66, 198.51.100.9")
	r2, err := trustedClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != http.StatusOK || r2.Header.Get("X-Ratelimit-Remaining") != "4" {
		t.Fatalf("via a trusted proxy: status %d, remaining %q; want 200, 4 (the client 198.51.100.9 is fresh)", r2.StatusCode, r2.Header.Get("X-Ratelimit-Remaining"))
	}

	// Envoy's ext_authz: the original method, the original path after the
	// /check prefix.
	if resp := checkGet(t, "POST", base+"/check/api/orders", "X-User: "); resp.StatusCode != http.StatusOK || resp.Header.Get("X-Ratelimit-Resource") != "api-post" {
		t.Fatalf("POST /check/api/orders: status %d, resource %q; want 200 api-post (an empty identity is no user)", resp.StatusCode, resp.Header.Get("X-Ratelimit-Resource"))
	}
	resp = checkGet(t, "POST", base+"/check/api/orders")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-Ratelimit-Resource") != "api-post" || resp.Header.Get("Retry-After") != "60" {
		t.Fatalf("second POST /check/api/orders: status %d, resource %q, Retry-After %q; want 429 api-post 60", resp.StatusCode, resp.Header.Get("X-Ratelimit-Resource"), resp.Header.Get("Retry-After"))
	}

	hits := hitsByLabel(srv)
	if hits["per-user"] != [4]int64{6, 1, 0, 0} || hits["per-ip"] != [4]int64{6, 1, 0, 0} || hits["api-post"] != [4]int64{1, 1, 0, 0} {
		t.Errorf("hits by label %v", hits)
	}
	if a, d := srv.check.h.Allowed.Load(), srv.check.h.Denied.Load(); a != 13 || d != 3 {
		t.Errorf("sluice_check_requests_total: allowed %d denied %d, want 13 and 3", a, d)
	}
}

// TestCheckFieldHeader: a configured field header reaches the rules as a
// request field; absent, the field is absent.
func TestCheckFieldHeader(t *testing.T) {
	path := policyFile(t, "check.ini", `[plan=free]
creditLimit = 1
resetSeconds = 60
label = free

[default]
creditLimit = 100
resetSeconds = 60
`)
	srv := startServer(t, Config{Clock: newTestClock(t0).now, Policy: policycmd.Config{File: path}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}, Check: check.Config{
		FieldHeaders: []check.FieldHeader{{Field: "plan", Header: "x-plan"}},
	}})
	base := startCheck(t, srv)
	if resp := checkGet(t, "GET", base+"/check", "X-Plan: free"); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Resource") != "free" {
		t.Fatalf("X-Plan: free: status %d resource %q; want 200 free", resp.StatusCode, resp.Header.Get("X-Ratelimit-Resource"))
	}
	if resp := checkGet(t, "GET", base+"/check", "X-Plan: free"); resp.StatusCode != 429 {
		t.Fatalf("second X-Plan: free: status %d; want 429", resp.StatusCode)
	}
	if resp := checkGet(t, "GET", base+"/check"); resp.StatusCode != 200 || resp.Header.Get("X-Ratelimit-Resource") != "rule-2" {
		t.Fatalf("no X-Plan: status %d resource %q; want 200 rule-2 (the default rule has no label)", resp.StatusCode, resp.Header.Get("X-Ratelimit-Resource"))
	}
	if err := check.ValidateFieldHeader(check.FieldHeader{Field: "ip", Header: "X-Ip"}); err == nil || !strings.Contains(err.Error(), "builds itself") {
		t.Errorf("field ip from a header: %v, want refused", err)
	}
}

// TestCheckProtectedMode: in protected mode /check answers loopback peers
// only, since it has no password; --protected-mode no answers everyone.
func TestCheckProtectedMode(t *testing.T) {
	path := policyFile(t, "check.ini", checkPolicy)
	for _, tc := range []struct {
		open bool
		want int
	}{{false, http.StatusForbidden}, {true, http.StatusOK}} {
		srv := startServer(t, Config{Policy: policycmd.Config{File: path}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}, Listen: admit.Config{AllowRemoteWithoutAuth: tc.open}})
		req := httptest.NewRequest("GET", "/check", nil)
		req.RemoteAddr = "192.0.2.1:4711"
		w := httptest.NewRecorder()
		srv.check.h.ServeHTTP(w, req)
		if w.Code != tc.want {
			t.Errorf("protected mode off=%v: status %d, want %d (%s)", tc.open, w.Code, tc.want, w.Body.String())
		}
	}
}

// TestCheckNeedsPolicy: without rules there is nothing to answer with, so
// ServeCheck refuses to start.
func TestCheckNeedsPolicy(t *testing.T) {
	srv := startServer(t, Config{RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := srv.ServeCheck(ln); !errors.Is(err, rules.ErrNoPolicy) {
		t.Fatalf("ServeCheck without a policy: %v, want rules.ErrNoPolicy", err)
	}
}

// TestCheckStoreError: with the store refusing writes, --on-store-error
// deny answers 503 with Retry-After (no decision could be stored), allow
// lets the decision stand and says so in X-Sluice-Degraded.
func TestCheckStoreError(t *testing.T) {
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow=%v", allow), func(t *testing.T) {
			disk := storage.NewMemDisk()
			store, err := storage.Open("db", storage.Options{Sync: storage.SyncAlways, Disk: disk})
			if err != nil {
				t.Fatal(err)
			}
			path := policyFile(t, "check.ini", checkPolicy)
			srv, err := New(Config{Store: store, Engine: onStoreError(allow), Policy: policycmd.Config{File: path}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
			if err != nil {
				t.Fatal(err)
			}
			serveOn(t, srv, store)
			base := startCheck(t, srv)
			if resp := checkGet(t, "GET", base+"/check"); resp.StatusCode != 200 || resp.Header.Get("X-Sluice-Degraded") != "" {
				t.Fatalf("before the failure: status %d, degraded %q", resp.StatusCode, resp.Header.Get("X-Sluice-Degraded"))
			}
			disk.FailWrites(fmt.Errorf("injected: %w", syscall.ENOSPC))
			resp := checkGet(t, "GET", base+"/check")
			switch {
			case allow && (resp.StatusCode != 200 || resp.Header.Get("X-Sluice-Degraded") != "store-unavailable" || resp.Header.Get("X-Ratelimit-Remaining") != "3"):
				t.Fatalf("allow: status %d, degraded %q, remaining %q; want 200, store-unavailable, 3", resp.StatusCode, resp.Header.Get("X-Sluice-Degraded"), resp.Header.Get("X-Ratelimit-Remaining"))
			case !allow && (resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1"):
				t.Fatalf("deny: status %d, Retry-After %q; want 503, 1", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			if f := srv.check.h.Failed.Load(); f != int64(b2i(!allow)) {
				t.Errorf("errors counted %d", f)
			}
			disk.FailWrites(nil)
		})
	}
}

// TestCheckAlgorithmsAndQuota: /check answers for every algorithm a rule
// chooses, with Retry-After as that algorithm computes it (GCRA: the
// spacing of hits, not the whole period), and a per-request quota taken
// from a header through --check-field-header: honoured within maxQuota,
// clamped over it, and creditLimit when malformed, with X-Sluice-Quota
// saying which; RateLimit-Policy names the limit that applied.
func TestCheckAlgorithmsAndQuota(t *testing.T) {
	clock := newTestClock(t0)
	path := policyFile(t, "check.ini", `[path=/gcra]
algorithm = gcra
creditLimit = 60
resetSeconds = 60
burst = 2
actorField = ip
label = gcra

[path=/quota]
algorithm = fixedWindow
creditLimit = 2
resetSeconds = 60
quotaField = quota
maxQuota = 5
actorField = tenant
label = quota

[default]
creditLimit = 0
resetSeconds = 0
`)
	srv := startServer(t, Config{Clock: clock.now, Policy: policycmd.Config{File: path}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}, Check: check.Config{
		FieldHeaders: []check.FieldHeader{{Field: "quota", Header: "X-Quota"}, {Field: "tenant", Header: "X-Tenant"}},
		HeaderStyle:  ratelimitheader.Both,
	}})
	base := startCheck(t, srv)

	// GCRA: 1 a second in bursts of 2; the third at once waits a second.
	for i := 0; i < 2; i++ {
		if resp := checkGet(t, "GET", base+"/check", "X-Forwarded-Uri: /gcra"); resp.StatusCode != 200 {
			t.Fatalf("gcra hit %d: status %d", i+1, resp.StatusCode)
		}
	}
	resp := checkGet(t, "GET", base+"/check", "X-Forwarded-Uri: /gcra")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || resp.Header.Get("X-Ratelimit-Limit") != "2" {
		t.Fatalf("third gcra hit: status %d, Retry-After %q, limit %q; want 429, 1, 2 (the burst)", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("X-Ratelimit-Limit"))
	}

	for _, tc := range []struct {
		tenant, quota string
		allowed       int
		limit, status string
	}{
		{"a", "4", 4, "4", ""},
		{"b", "50", 5, "5", "clamped"},
		{"c", "lots", 2, "2", "malformed"},
		{"d", "", 2, "2", "missing"},
	} {
		for i := 1; i <= tc.allowed+1; i++ {
			h := []string{"X-Forwarded-Uri: /quota", "X-Tenant: " + tc.tenant}
			if tc.quota != "" {
				h = append(h, "X-Quota: "+tc.quota)
			}
			resp := checkGet(t, "GET", base+"/check", h...)
			want := 200
			if i > tc.allowed {
				want = 429
			}
			if resp.StatusCode != want || resp.Header.Get("X-Ratelimit-Limit") != tc.limit || resp.Header.Get("X-Sluice-Quota") != tc.status ||
				resp.Header.Get("Ratelimit-Policy") != `"quota";q=`+tc.limit+";w=60" {
				t.Fatalf("tenant %s, quota %q, hit %d: status %d, limit %q, X-Sluice-Quota %q, RateLimit-Policy %q; want %d, %s, %q",
					tc.tenant, tc.quota, i, resp.StatusCode, resp.Header.Get("X-Ratelimit-Limit"), resp.Header.Get("X-Sluice-Quota"), resp.Header.Get("Ratelimit-Policy"), want, tc.limit, tc.status)
			}
		}
	}
	// The default denies without a counter: 429 and no Retry-After,
	// since waiting does not help.
	if resp := checkGet(t, "GET", base+"/check", "X-Forwarded-Uri: /other"); resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("always-deny: status %d, Retry-After %q; want 429 and none", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestCheckTLS: with --tls-cert /check is on TLS only; with --tls-ca, in
// protected mode, a proxy that is not on loopback is answered when it
// presents a certificate the CA signed, and refused with 403 without one.
func TestCheckTLS(t *testing.T) {
	pki := newTestPKI(t)
	path := policyFile(t, "check.ini", checkPolicy)
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}, Listen: admit.Config{TLS: &admit.TLSFiles{Cert: pki.cert, Key: pki.key, CA: pki.ca}}})
	ip := nonLoopbackIPv4(t)
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeCheck(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; err != nil {
			t.Errorf("ServeCheck: %v", err)
		}
	})
	url := "https://" + ln.Addr().String() + "/check"
	get := func(cert *tls.Certificate) (int, error) {
		cfg := &tls.Config{RootCAs: pki.caPool, MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} // the server's certificate names 127.0.0.1 only
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		defer c.CloseIdleConnections()
		resp, err := c.Get(url)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get(&pki.client); err != nil || code != http.StatusOK {
		t.Fatalf("with a client certificate, from %s: %d, %v; want 200", ip, code, err)
	}
	if code, err := get(nil); err != nil || code != http.StatusForbidden {
		t.Fatalf("without a client certificate, from %s: %d, %v; want 403 (protected mode)", ip, code, err)
	}
	if resp, err := http.Get("http://" + ln.Addr().String() + "/check"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP was answered 200 by a TLS listener")
		}
	}
}

// TestCheckMetrics: /metrics carries the endpoint's counters and
// histogram, and the hits of /check in divvy_hits_total by label.
func TestCheckMetrics(t *testing.T) {
	path := policyFile(t, "check.ini", checkPolicy)
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	base := startCheck(t, srv)
	for i := 0; i < 6; i++ {
		checkGet(t, "GET", base+"/check")
	}
	_, body := get(t, serveHTTPOn(t, srv)+"/metrics")
	for _, want := range []string{
		`sluice_check_requests_total{result="allowed"} 5`,
		`sluice_check_requests_total{result="denied"} 1`,
		`sluice_check_duration_seconds_count 6`,
		`divvy_hits_total{rule_label="per-ip",status="accepted"} 5`,
		`divvy_hits_total{rule_label="per-ip",status="rejected"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
