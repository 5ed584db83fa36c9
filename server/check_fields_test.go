package server

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client/ratelimitheader"
	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
)

// checkDirect asks srv's /check handler directly, from peer, with the raw
// request target target and headers.
func checkDirect(srv *Server, method, target, peer string, headers ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, nil)
	req.RemoteAddr = peer
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Add(k, v)
	}
	w := httptest.NewRecorder()
	srv.check.h.ServeHTTP(w, req)
	return w
}

const noOrdersPolicy = "[path=/orders]\ncreditLimit = 0\nresetSeconds = 0\nlabel = no-orders\n\n[default]\ncreditLimit = 100\nresetSeconds = 300\n"

// TestCheckNormalisesPath: a rule on a path cannot be evaded by writing
// the path another way in X-Forwarded-Uri, or after /check (Envoy).
func TestCheckNormalisesPath(t *testing.T) {
	srv := startServer(t, Config{Policy: policycmd.Config{File: policyFile(t, "rules.ini", noOrdersPolicy)}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	for _, p := range []string{"/orders", "/%6Frders", "//orders", "/x/../orders", "/./orders?x=1", "/%2e%2e/orders"} {
		if w := checkDirect(srv, "GET", "/check", "127.0.0.1:1", "X-Forwarded-Uri: "+p); w.Code != http.StatusTooManyRequests {
			t.Errorf("X-Forwarded-Uri %s: status %d, want 429 (rule no-orders)", p, w.Code)
		}
		if w := checkDirect(srv, "POST", "/check"+p, "127.0.0.1:1"); w.Code != http.StatusTooManyRequests {
			t.Errorf("POST /check%s: status %d, want 429 (rule no-orders)", p, w.Code)
		}
	}
	for _, p := range []string{"/orders/", "/a%2Forders", "/ordersx"} {
		if w := checkDirect(srv, "GET", "/check", "127.0.0.1:1", "X-Forwarded-Uri: "+p); w.Code != http.StatusOK {
			t.Errorf("X-Forwarded-Uri %s: status %d, want 200 (another path)", p, w.Code)
		}
	}
}

// TestCheckEnvoyUncleanPathIsChecked: paths under /check/ that are not
// clean are checked, not redirected (Envoy would hand a redirect to the
// client as a denial); paths outside /check are 404.
func TestCheckEnvoyUncleanPathIsChecked(t *testing.T) {
	srv := startServer(t, Config{Policy: policycmd.Config{File: policyFile(t, "rules.ini", noOrdersPolicy)}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	base := startCheck(t, srv)
	raw := func(method, target string) *http.Response {
		t.Helper()
		conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: app.example\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", method, target)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, tc := range []struct {
		target string
		want   int
	}{
		{"/check/orders", 429}, {"/check//orders", 429}, {"/check/x/../orders", 429}, {"/check/./orders", 429},
		{"/check/a/./b", 200}, {"/check", 200}, {"/check/", 200}, {"/check?x=1", 200},
		{"/checkout", 404}, {"/", 404}, {"/x/../check", 404},
	} {
		resp := raw("POST", tc.target)
		if resp.StatusCode != tc.want {
			t.Errorf("POST %s: %d (Location %q), want %d", tc.target, resp.StatusCode, resp.Header.Get("Location"), tc.want)
		}
	}
}

// TestCheckPathNormalisedThroughProxies: through the documented nginx and
// Caddy configurations, a path written another way (which both pass on
// as the client wrote it, and the application decodes) is still denied by
// a rule on the path, and never reaches the application.
func TestCheckPathNormalisedThroughProxies(t *testing.T) {
	for _, pc := range []proxyCase{
		{name: "nginx", bin: "nginx", pkg: "nginx", run: runNginx},
		{name: "caddy", bin: "caddy", pkg: "caddy", run: runCaddy},
	} {
		t.Run(pc.name, func(t *testing.T) {
			bin := needBinary(t, pc.bin, pc.pkg)
			var mu sync.Mutex
			var seen []string
			app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				seen = append(seen, r.URL.Path)
				mu.Unlock()
				_, _ = w.Write([]byte("app\n"))
			}))
			t.Cleanup(app.Close)
			srv := startServer(t, Config{Policy: policycmd.Config{File: policyFile(t, "rules.ini", noOrdersPolicy)}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}, Check: check.Config{
				TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
			}})
			checkURL := startCheck(t, srv)
			listen := freeAddr(t)
			conf := substitute(t, docBlock(t, pc.name), map[string]string{
				"127.0.0.1:9051": strings.TrimPrefix(checkURL, "http://"),
				"127.0.0.1:8080": strings.TrimPrefix(app.URL, "http://"),
				"127.0.0.1:8000": listen,
			})
			cmd, logFile := pc.run(t, bin, t.TempDir(), conf, listen)
			startProxy(t, cmd, listen, logFile)
			for _, p := range []string{"/orders", "/%6Frders", "//orders", "/x/../orders", "/other"} {
				// A raw request, so that the path goes as written.
				conn, err := net.Dial("tcp", listen)
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", p, listen)
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				conn.Close()
				want := http.StatusTooManyRequests
				if p == "/other" {
					want = http.StatusOK
				}
				if resp.StatusCode != want {
					t.Errorf("GET %s through %s: %d, want %d", p, pc.name, resp.StatusCode, want)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if len(seen) != 1 || seen[0] != "/other" {
				t.Errorf("the application saw %q, want only /other", seen)
			}
		})
	}
}

// TestCheckIPPrefixes: /check keys an IPv6 client by its /64 (and an IPv4
// one by its address) unless --check-ipv6-bits/--check-ipv4-bits say
// otherwise, so a client rotating through its /64 shares one limit.
func TestCheckIPPrefixes(t *testing.T) {
	for _, tc := range []struct {
		name         string
		v4, v6       int
		addrs        func(i int) string
		wantAllowed  int
		wantIPSuffix string
	}{
		{"ipv6 default /64", 0, 0, func(i int) string { return fmt.Sprintf("2001:db8:1:2::%x", i) }, 5, ""},
		{"ipv6 /128", 0, 128, func(i int) string { return fmt.Sprintf("2001:db8:1:2::%x", i) }, 20, ""},
		{"ipv4 default /32", 0, 0, func(i int) string { return fmt.Sprintf("192.0.2.%d", i) }, 20, ""},
		{"ipv4 /24", 24, 0, func(i int) string { return fmt.Sprintf("192.0.2.%d", i) }, 5, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startServer(t, Config{Clock: newTestClock(t0).now, Policy: policycmd.Config{File: policyFile(t, "check.ini", checkPolicy)}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}, Check: check.Config{
				TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
				IPv4Bits:       tc.v4, IPv6Bits: tc.v6,
			}})
			allowed := 0
			for i := 1; i <= 20; i++ {
				if w := checkDirect(srv, "GET", "/check", "127.0.0.1:1", "X-Forwarded-For: "+tc.addrs(i)); w.Code == http.StatusOK {
					allowed++
				}
			}
			if allowed != tc.wantAllowed {
				t.Errorf("20 requests from %s..%s under a per-IP limit of 5: %d allowed, want %d", tc.addrs(1), tc.addrs(20), allowed, tc.wantAllowed)
			}
		})
	}
}

// TestCheckUntrustedPeerIsTheClient: with trusted proxies configured, a
// peer that is not one of them is taken for the client itself: its
// identity header, field headers and X-Forwarded-Method/-Host/-Uri are
// ignored (as its X-Forwarded-For is), so it cannot spend another user's
// counter or choose the path a rule sees.
func TestCheckUntrustedPeerIsTheClient(t *testing.T) {
	clock := newTestClock(t0)
	srv := startServer(t, Config{Clock: clock.now, Policy: policycmd.Config{File: policyFile(t, "check.ini", "[plan=free]\ncreditLimit = 0\nresetSeconds = 0\nlabel = free\n\n[path=/orders]\ncreditLimit = 0\nresetSeconds = 0\nlabel = no-orders\n\n"+checkPolicy)}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}, Check: check.Config{
		IdentityHeader: "X-User",
		FieldHeaders:   []check.FieldHeader{{Field: "plan", Header: "X-Plan"}},
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
	}, Listen: admit.Config{AllowRemoteWithoutAuth: true}})
	const outsider, proxy = "127.0.0.1:4711", "10.1.2.3:4711"
	for i := 0; i < 5; i++ {
		w := checkDirect(srv, "GET", "/check", outsider, "X-User: alice", "X-Forwarded-For: 203.0.113.9")
		if got := w.Header().Get("X-Ratelimit-Resource"); got != "per-ip" {
			t.Fatalf("untrusted peer naming alice: counted by %q, want per-ip (its own address)", got)
		}
	}
	if w := checkDirect(srv, "GET", "/check", proxy, "X-User: alice"); w.Code != http.StatusOK || w.Header().Get("X-Ratelimit-Remaining") != "4" {
		t.Errorf("alice through the trusted proxy: %d, remaining %q; want 200, 4 (the outsider spent none of hers)", w.Code, w.Header().Get("X-Ratelimit-Remaining"))
	}
	if w := checkDirect(srv, "GET", "/check", outsider, "X-Plan: free"); w.Header().Get("X-Ratelimit-Resource") == "free" {
		t.Errorf("an untrusted peer's field header reached the rules")
	}
	if w := checkDirect(srv, "GET", "/check", proxy, "X-Plan: free"); w.Header().Get("X-Ratelimit-Resource") != "free" {
		t.Errorf("the trusted proxy's field header did not reach the rules")
	}
	if w := checkDirect(srv, "GET", "/check/orders", "127.0.0.2:1", "X-Forwarded-Uri: /other"); w.Header().Get("X-Ratelimit-Resource") != "no-orders" {
		t.Errorf("an untrusted peer's X-Forwarded-Uri chose the path: resource %q, want no-orders (its own path)", w.Header().Get("X-Ratelimit-Resource"))
	}
	if w := checkDirect(srv, "GET", "/check", proxy, "X-Forwarded-Uri: /orders"); w.Header().Get("X-Ratelimit-Resource") != "no-orders" {
		t.Errorf("the trusted proxy's X-Forwarded-Uri was not believed")
	}
}

// TestCheckRateLimitPolicyIsTheRate: RateLimit-Policy states the rate
// (the limit per period that applied), never the burst, which only
// X-RateLimit-Limit reports; a rule with a burst costs no more
// allocations per /check than one without.
func TestCheckRateLimitPolicyIsTheRate(t *testing.T) {
	clock := newTestClock(t0)
	path := policyFile(t, "check.ini", "[path=/burst]\nalgorithm = gcra\ncreditLimit = 60\nresetSeconds = 60\nburst = 2\nlabel = burst\nquotaField = quota\nmaxQuota = 1000\n\n"+
		"[path=/tb]\nalgorithm = tokenBucket\ncreditLimit = 60\nresetSeconds = 60\nburst = 3\nlabel = tb\n\n"+
		"[path=/burst2]\nalgorithm = gcra\ncreditLimit = 60\nresetSeconds = 60\nburst = 2\nlabel = burst2\n\n"+
		"[path=/plain]\nalgorithm = gcra\ncreditLimit = 60\nresetSeconds = 60\nlabel = plain\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n")
	srv := startServer(t, Config{Clock: clock.now, Policy: policycmd.Config{File: path}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}, Check: check.Config{
		HeaderStyle:  ratelimitheader.Both,
		FieldHeaders: []check.FieldHeader{{Field: "quota", Header: "X-Quota"}},
	}})
	for _, tc := range []struct {
		path, quota, policy, limit string
	}{
		{"/plain", "", `"plain";q=60;w=60`, "60"},
		{"/burst", "", `"burst";q=60;w=60`, "2"},
		{"/burst2", "", `"burst2";q=60;w=60`, "2"},
		{"/tb", "", `"tb";q=60;w=60`, "3"},
		{"/burst", "120", `"burst";q=120;w=60`, "2"},
	} {
		w := checkDirect(srv, "GET", "/check", "127.0.0.1:1", "X-Forwarded-Uri: "+tc.path, "X-Quota: "+tc.quota)
		if got := w.Header().Get("Ratelimit-Policy"); got != tc.policy {
			t.Errorf("%s quota %q: RateLimit-Policy %q, want %q", tc.path, tc.quota, got, tc.policy)
		}
		if got := w.Header().Get("X-Ratelimit-Limit"); got != tc.limit {
			t.Errorf("%s quota %q: X-RateLimit-Limit %q, want %q (the burst)", tc.path, tc.quota, got, tc.limit)
		}
	}
	allocs := map[string]float64{}
	for _, p := range []string{"/plain", "/burst2"} {
		req := httptest.NewRequest("GET", "/check", nil)
		req.RemoteAddr = "127.0.0.1:4711"
		req.Header.Set("X-Forwarded-Uri", p)
		allocs[p] = testing.AllocsPerRun(200, func() {
			clock.ms.Add(1000)
			srv.check.h.ServeHTTP(httptest.NewRecorder(), req)
		})
	}
	t.Logf("allocations per /check (handler and recorder): %v", allocs)
	// AllocsPerRun counts the whole process's allocations, the store's
	// background work included, so a margin of 2 keeps out that noise; the
	// fields rebuilt per request cost 4 more.
	if allocs["/burst2"] > allocs["/plain"]+2 {
		t.Errorf("a rule with a burst costs %v allocations per /check, one without %v", allocs["/burst2"], allocs["/plain"])
	}
}

// nonLoopbackIPv4 returns an IPv4 address of this machine that is not
// loopback, for tests of what protected mode does to remote peers. A
// machine without one (a container with only lo) gets 198.18.0.1/32 added
// to lo (RFC 2544's benchmarking range: no real peer uses it), which
// needs root; the test skips only when that is refused, and never under
// CI=true.
func nonLoopbackIPv4(t *testing.T) net.IP {
	t.Helper()
	if ip := firstNonLoopbackIP(); ip != nil {
		return ip
	}
	const addr = "198.18.0.1/32"
	out, err := exec.Command("ip", "addr", "add", addr, "dev", "lo").CombinedOutput()
	switch {
	case err == nil:
		t.Cleanup(func() { _ = exec.Command("ip", "addr", "del", addr, "dev", "lo").Run() })
	case strings.Contains(string(out), "File exists"):
		// Another test added it and removes it.
	case os.Getenv("CI") == "true":
		t.Fatalf("no non-loopback IPv4 address, and ip addr add %s dev lo: %v: %s", addr, err, out)
	default:
		t.Skipf("no non-loopback IPv4 address, and ip addr add %s dev lo: %v: %s", addr, err, out)
	}
	return net.IPv4(198, 18, 0, 1).To4()
}
