package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/client/httplimit"
	"github.com/sluicehq/sluice/client/internal/sluicetest"
)

func TestMain(m *testing.M) { os.Exit(sluicetest.Main(m)) }

// t0 is the clock of the end-to-end tests: 1700000000 s, 200 s into a
// 300 s window aligned to the epoch, so that the window ends at
// 1700000100.
const t0 = 1700000000

func fixedClock() time.Time { return time.Unix(t0, 0) }

func startSluice(t *testing.T, flags ...string) (*sluicetest.Proc, *redis.Client) {
	t.Helper()
	// The sweep is off: the records of a replayed past are idle to it.
	p := sluicetest.Start(t, t.TempDir(), append([]string{"--sweep-interval", "0"}, flags...)...)
	return p, newRedis(t, p.Addr)
}

func newRedis(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Minute, ReadTimeout: time.Minute})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// serve runs an httptest server with the middleware in front of a handler
// that answers 200 "ok".
func serve(t *testing.T, cfg httplimit.Config) *httptest.Server {
	t.Helper()
	mw, err := httplimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	})))
	t.Cleanup(srv.Close)
	return srv
}

// get sends a GET with the given header fields (name, value, ...).
func get(t *testing.T, srv *httptest.Server, fields ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", srv.URL+"/api", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(fields); i += 2 {
		req.Header.Add(fields[i], fields[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

func userOf(r *http.Request) string { return r.Header.Get("X-User") }

// want is what one response must carry.
type want struct {
	status     int
	remaining  int64
	used       int64
	reset      int64  // X-RateLimit-Reset, Unix s
	t          int64  // RateLimit's t
	retryAfter string // "" for none
}

func checkResp(t *testing.T, what string, resp *http.Response, w want) {
	t.Helper()
	h := resp.Header
	got := fmt.Sprintf("%d remaining=%s used=%s reset=%s ratelimit=%s retry-after=%q limit=%s policy=%s",
		resp.StatusCode, h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Used"), h.Get("X-RateLimit-Reset"),
		h.Get("RateLimit"), h.Get("Retry-After"), h.Get("X-RateLimit-Limit"), h.Get("RateLimit-Policy"))
	exp := fmt.Sprintf(`%d remaining=%d used=%d reset=%d ratelimit="default";r=%d;t=%d retry-after=%q limit=5 policy="default";q=5;w=300`,
		w.status, w.remaining, w.used, w.reset, w.remaining, w.t, w.retryAfter)
	if got != exp {
		t.Errorf("%s:\n got %s\nwant %s", what, got, exp)
	}
}

// TestSlidingLogCountsRefused: "5 per 300 s" as a sliding log that records
// refused requests (the default): five 200s, then 429s whose
// X-RateLimit-Used is the client's lower bound, Max + 1 (the reply does
// not say how many actions the log holds beyond Max).
func TestSlidingLogCountsRefused(t *testing.T) {
	_, rdb := startSluice(t)
	srv := serve(t, httplimit.Config{
		Client:   client.New(rdb, client.Config{Now: fixedClock}),
		Limit:    client.SlidingLog{Interval: 300 * time.Second, Max: 5},
		Identity: userOf,
		Headers:  httplimit.BothHeaders,
	})
	for k := int64(1); k <= 7; k++ {
		w := want{200, 5 - k, k, t0 + 300, 300, ""}
		if k > 5 {
			w = want{429, 0, 6, t0 + 300, 300, "300"}
		}
		checkResp(t, fmt.Sprintf("alice's request %d", k), get(t, srv, "X-User", "alice"), w)
	}
}

// TestFiveEveryFiveMinutes is the scenario, for each kind: a real
// sluice, the middleware in front of an httptest server, "5 per 300 s per
// user". Seven requests of one user: five 200s with X-RateLimit-Remaining
// 4 to 0, then 429s with Retry-After and the fields. Another user is not
// affected; anonymous requests are keyed by IP; an X-Forwarded-For sent
// by an untrusted peer is ignored, and one through a trusted proxy is
// read right to left.
func TestFiveEveryFiveMinutes(t *testing.T) {
	_, rdb := startSluice(t)
	c := client.New(rdb, client.Config{Now: fixedClock})
	for _, kind := range []struct {
		name  string
		limit client.Limit // nil: Requests 5, Per 300 s (the default fixed window)
		// want of the k-th request of a caller (k from 1)
		want func(k int64) want
	}{
		{"fixed window (default)", nil, func(k int64) want {
			// The window ends at t0+100 whatever the request; refused
			// requests count.
			if k <= 5 {
				return want{200, 5 - k, k, t0 + 100, 100, ""}
			}
			return want{429, 0, k, t0 + 100, 100, "100"}
		}},
		{"GCRA", client.GCRA{Count: 5, Period: 300 * time.Second}, func(k int64) want {
			// One request per 60 s, in bursts of 5: the k-th is whole
			// again k×60 s later; a refused one may retry in 60 s.
			if k <= 5 {
				return want{200, 5 - k, k, t0 + 60*k, 60 * k, ""}
			}
			return want{429, 0, 5, t0 + 300, 60, "60"}
		}},
		{"token bucket", client.TokenBucket{Max: 5, Refill: 300 * time.Second}, func(k int64) want {
			// 5 tokens, all refilled every 300 s: the client reckons the
			// refill from now (an upper bound, see client.TokenBucket).
			if k <= 5 {
				return want{200, 5 - k, k, t0 + 300, 300, ""}
			}
			return want{429, 0, 5, t0 + 300, 300, "300"}
		}},
		{"sliding log", client.SlidingLog{Interval: 300 * time.Second, Max: 5, NoCountBlocked: true}, func(k int64) want {
			// Five actions at t0 fill the log until t0+300; refused ones
			// are not recorded, so the log stays at five.
			if k <= 5 {
				return want{200, 5 - k, k, t0 + 300, 300, ""}
			}
			return want{429, 0, 5, t0 + 300, 300, "300"}
		}},
	} {
		t.Run(kind.name, func(t *testing.T) {
			prefix := "e2e:" + kind.name + ":"
			cfg := httplimit.Config{
				Client:         c,
				Limit:          kind.limit,
				Identity:       userOf,
				KeyPrefix:      prefix,
				Headers:        httplimit.BothHeaders,
				TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			}
			if kind.limit == nil {
				cfg.Requests, cfg.Per = 5, 300*time.Second
			}
			srv := serve(t, cfg)
			for k := int64(1); k <= 7; k++ {
				checkResp(t, fmt.Sprintf("alice's request %d", k), get(t, srv, "X-User", "alice"), kind.want(k))
			}
			checkResp(t, "bob's first request", get(t, srv, "X-User", "bob"), kind.want(1))

			// Anonymous: keyed by the peer, 127.0.0.1. The spoofed
			// X-Forwarded-For comes from a peer that is not a trusted
			// proxy, so it counts against 127.0.0.1 too.
			checkResp(t, "anonymous", get(t, srv), kind.want(1))
			checkResp(t, "anonymous with a spoofed X-Forwarded-For", get(t, srv, "X-Forwarded-For", "203.0.113.9"), kind.want(2))
			checkResp(t, "anonymous again", get(t, srv), kind.want(3))

			// Behind a trusted proxy (loopback here), the client is the
			// rightmost untrusted entry, not the leftmost.
			cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
			proxied := serve(t, cfg)
			checkResp(t, "through a trusted proxy", get(t, proxied, "X-Forwarded-For", "6.6.6.6, 203.0.113.9"), kind.want(1))
			checkResp(t, "the same client, leftmost entry changed", get(t, proxied, "X-Forwarded-For", "7.7.7.7, 203.0.113.9"), kind.want(2))
			checkResp(t, "another client", get(t, proxied, "X-Forwarded-For", "203.0.113.10"), kind.want(1))

			// The keys in sluice are the documented ones.
			for key, used := range map[string]int64{"user:alice": 7, "user:bob": 1, "ip:127.0.0.1": 3, "ip:203.0.113.9": 2, "ip:203.0.113.10": 1, "ip:6.6.6.6": 0} {
				lim := kind.limit
				if lim == nil {
					lim = client.FixedWindow{Limit: 5, Window: 300 * time.Second}
				}
				res, err := c.Peek(context.Background(), prefix+key, lim, 0)
				if err != nil {
					t.Fatal(err)
				}
				if want := min(used, kind.want(used).used); res.Used != want {
					t.Errorf("key %s%s: used %d, want %d", prefix, key, res.Used, want)
				}
			}
		})
	}
}

// TestIPv6ByNetwork: anonymous IPv6 clients of one /64 share a limit.
func TestIPv6ByNetwork(t *testing.T) {
	_, rdb := startSluice(t)
	c := client.New(rdb, client.Config{Now: fixedClock})
	srv := serve(t, httplimit.Config{Client: c, Requests: 5, Per: 300 * time.Second, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	r := get(t, srv, "X-Forwarded-For", "2001:db8:1:2::1")
	r2 := get(t, srv, "X-Forwarded-For", "2001:db8:1:2:ffff::9")
	r3 := get(t, srv, "X-Forwarded-For", "2001:db8:1:3::1")
	got := []string{r.Header.Get("X-RateLimit-Remaining"), r2.Header.Get("X-RateLimit-Remaining"), r3.Header.Get("X-RateLimit-Remaining")}
	if strings.Join(got, ",") != "4,3,4" {
		t.Errorf("remaining %v: want 4,3,4 (the first two in one /64)", got)
	}
}

// TestOptions: cost, skip, the problem+json body, an explicit Key, and the
// header styles, against a real sluice.
func TestOptions(t *testing.T) {
	_, rdb := startSluice(t)
	c := client.New(rdb, client.Config{Now: fixedClock})
	srv := serve(t, httplimit.Config{
		Client: c, Requests: 5, Per: 300 * time.Second, KeyPrefix: "opt:",
		Key:         func(r *http.Request) string { return r.Header.Get("X-Api-Key") },
		Cost:        func(r *http.Request) int64 { n, _ := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64); return n },
		Skip:        func(r *http.Request) bool { return r.URL.Query().Has("health") },
		ProblemJSON: true,
		PolicyName:  "per-key",
	})
	resp := get(t, srv, "X-Api-Key", "k1", "X-Cost", "3")
	if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Used") != "3" || resp.Header.Get("X-RateLimit-Resource") != "per-key" || resp.Header.Get("RateLimit") != "" {
		t.Errorf("cost 3: %d %v", resp.StatusCode, resp.Header)
	}
	resp, err := srv.Client().Get(srv.URL + "/?health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" {
		t.Errorf("skipped request: %d %v", resp.StatusCode, resp.Header)
	}
	// A cost of 0 looks: the count stays.
	if resp := get(t, srv, "X-Api-Key", "k1", "X-Cost", "0"); resp.Header.Get("X-RateLimit-Used") != "3" {
		t.Errorf("cost 0: used %s, want 3", resp.Header.Get("X-RateLimit-Used"))
	}
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set("X-Api-Key", "k1")
	req.Header.Set("X-Cost", "3")
	resp, err = srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var problem struct {
		Type     string   `json:"type"`
		Status   int      `json:"status"`
		Policies []string `json:"violated-policies"`
	}
	if resp.StatusCode != 429 || resp.Header.Get("Content-Type") != "application/problem+json" || json.Unmarshal(body, &problem) != nil ||
		problem.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" || problem.Status != 429 || len(problem.Policies) != 1 || problem.Policies[0] != "per-key" {
		t.Errorf("429 as problem+json: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	// An empty Key falls back to the IP; the identity function is not
	// consulted when Key is set.
	if resp := get(t, srv, "X-Cost", "1"); resp.Header.Get("X-RateLimit-Used") != "1" {
		t.Errorf("empty key: used %s, want 1 (a fresh IP key)", resp.Header.Get("X-RateLimit-Used"))
	}
	// A negative cost is refused by the client: fail open by default.
	if resp := get(t, srv, "X-Api-Key", "k2", "X-Cost", "-1"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" {
		t.Errorf("negative cost: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestConfigErrors(t *testing.T) {
	c := client.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), client.Config{})
	for _, tc := range []struct {
		cfg  httplimit.Config
		want string
	}{
		{httplimit.Config{Requests: 5, Per: time.Second}, "Config.Client is required"},
		{httplimit.Config{Client: c}, "no limit"},
		{httplimit.Config{Client: c, Requests: 5, Per: time.Second, Limit: client.GCRA{Count: 1, Period: time.Second}}, "not both"},
		{httplimit.Config{Client: c, Requests: 5, Per: time.Microsecond}, "FixedWindow.Window 1µs"},
		{httplimit.Config{Client: c, Limit: client.TokenBucket{Max: 0, Refill: time.Second}}, "TokenBucket.Max 0"},
		{httplimit.Config{Client: c, Requests: 5, Per: time.Second, IPv6Bits: 129}, "IPv6Bits 129: want 1 to 128"},
		{httplimit.Config{Client: c, Requests: 5, Per: time.Second, IPv4Bits: -1}, "IPv4Bits -1"},
		{httplimit.Config{Client: c, Requests: 5, Per: time.Second, TrustedProxies: []netip.Prefix{{}}}, "invalid prefix"},
		{httplimit.Config{Client: c, Requests: 5, Per: time.Second, PolicyName: "a\nb"}, "PolicyName"},
		{httplimit.Config{Client: c, Requests: 5, Per: time.Second, Headers: 9}, "unknown HeaderStyle 9"},
	} {
		_, err := httplimit.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error saying %q", tc.cfg, err, tc.want)
		}
	}
}

// lockedBuffer is a log destination the handlers write while the test
// reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// checkFailModes sends one request through a middleware in each fail mode
// in front of c, which cannot answer, and checks the response and the log.
func checkFailModes(t *testing.T, c *client.Client, logWants string) {
	t.Helper()
	for _, closed := range []bool{false, true} {
		var logs lockedBuffer
		srv := serve(t, httplimit.Config{Client: c, Requests: 5, Per: 300 * time.Second, FailClosed: closed, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		req, _ := http.NewRequest("GET", srv.URL, nil)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		line := logs.String()
		if !closed {
			if resp.StatusCode != 200 || string(body) != "ok" || resp.Header.Get("X-RateLimit-Limit") != "" {
				t.Errorf("fail open: %d %q %v; want the handler's 200 without rate-limit fields", resp.StatusCode, body, resp.Header)
			}
			if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "fail open") || !strings.Contains(line, logWants) {
				t.Errorf("fail open: log %q; want a warning with %q", line, logWants)
			}
			continue
		}
		if resp.StatusCode != 503 || !strings.Contains(string(body), "rate limiter cannot answer") {
			t.Errorf("fail closed: %d %q; want 503", resp.StatusCode, body)
		}
		if !strings.Contains(line, "fail closed") || !strings.Contains(line, logWants) {
			t.Errorf("fail closed: log %q; want %q", line, logWants)
		}
	}
}

// TestRequestCancelled: a request whose own context is done when the call
// fails is dropped: no handler, no response, no log line blaming sluice.
func TestRequestCancelled(t *testing.T) {
	var logs lockedBuffer
	c := client.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), client.Config{})
	mw, err := httplimit.New(httplimit.Config{Client: c, Requests: 5, Per: time.Minute, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	called := false
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	if called || rec.Body.Len() != 0 || logs.String() != "" {
		t.Errorf("cancelled request: handler called %v, body %q, log %q; want none", called, rec.Body, logs.String())
	}
}

// TestRequestDeadline: a request whose context passed a deadline (a
// timeout in front of the middleware) goes by the fail mode: 503 when
// failing closed, the handler when failing open; never an empty 200.
func TestRequestDeadline(t *testing.T) {
	for _, failClosed := range []bool{false, true} {
		c := client.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), client.Config{})
		mw, err := httplimit.New(httplimit.Config{Client: c, Requests: 5, Per: time.Minute, FailClosed: failClosed, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		called := false
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { called = true; w.Write([]byte("handler ran")) }))
		ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
		cancel()
		switch {
		case failClosed && (called || rec.Code != http.StatusServiceUnavailable):
			t.Errorf("fail closed, deadline passed: handler called %v, status %d; want 503", called, rec.Code)
		case !failClosed && (!called || rec.Body.String() != "handler ran"):
			t.Errorf("fail open, deadline passed: handler called %v, body %q; want the handler's response", called, rec.Body)
		}
	}
}

// TestSluiceDown: sluice killed, in both fail modes.
func TestSluiceDown(t *testing.T) {
	p, rdb := startSluice(t)
	p.Kill()
	checkFailModes(t, client.New(rdb, client.Config{}), "connection refused")
}

// TestStoreUnavailableReply: a server answering sluice's store-unavailable
// text, word for word, in both fail modes.
func TestStoreUnavailableReply(t *testing.T) {
	const text = "ERR store unavailable: writes to the data directory are failing (disk full or I/O error); the server retries and takes changes again by itself"
	addr := sluicetest.Serve(t, func([]string) string { return "-" + text + "\r\n" })
	rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	checkFailModes(t, client.New(rdb, client.Config{}), "store unavailable")
}

// TestStoreUnavailableDiskFull: a real sluice whose data directory is on
// a full tmpfs answers store-unavailable, and the middleware follows its
// fail mode. It needs mount (root); it skips where the machine refuses,
// except under CI=true.
func TestStoreUnavailableDiskFull(t *testing.T) {
	disk := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", disk).CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount a tmpfs: %v: %s", err, out)
		}
		t.Skipf("this machine refuses to mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", disk).Run() })
	p := sluicetest.Start(t, filepath.Join(disk, "data"), "--memtable-size", "1MiB", "--sweep-interval", "0")
	c := client.New(newRedis(t, p.Addr), client.Config{})
	fill(t, disk)
	ctx := context.Background()
	key := strings.Repeat("k", 1000)
	for i := 0; ; i++ {
		_, err := c.Take(ctx, key+strconv.Itoa(i), client.FixedWindow{Limit: 5, Window: time.Hour}, 1)
		if errors.Is(err, client.ErrUnavailable) && strings.Contains(err.Error(), "store unavailable") {
			break
		}
		if err != nil {
			t.Fatalf("write %d on a full disk: %v, want store unavailable", i, err)
		}
		if i > 1_000_000 {
			t.Fatal("a million writes to a full disk succeeded")
		}
	}
	checkFailModes(t, c, "store unavailable")
}

// fill writes a file into dir until its filesystem is full.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			t.Fatal(err)
		}
	}
}
