package server

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
)

// The end-to-end tests of /check behind real reverse proxies (issue 15,
// must-show 2): nginx and Caddy, from Debian, run the configurations of
// docs/proxies.md in front of a counting application.

// docBlock returns the fenced code block of docs/proxies.md that follows
// the line "<!-- tested: name -->", or, for name "" the first ```ini block.
func docBlock(t *testing.T, name string) string {
	t.Helper()
	raw, err := os.ReadFile("../docs/proxies.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := 0
	if name != "" {
		marker := "<!-- tested: " + name + " -->\n"
		i := strings.Index(doc, marker)
		if i < 0 {
			t.Fatalf("docs/proxies.md has no %q", marker)
		}
		start = i + len(marker)
	} else {
		start = strings.Index(doc, "```ini\n")
		if start < 0 {
			t.Fatal("docs/proxies.md has no ini block")
		}
	}
	rest := doc[start:]
	open := strings.Index(rest, "```")
	nl := strings.IndexByte(rest[open:], '\n')
	body := rest[open+nl+1:]
	end := strings.Index(body, "\n```")
	if open != 0 || nl < 0 || end < 0 {
		t.Fatalf("docs/proxies.md: no code block right after the %q marker", name)
	}
	return body[:end+1]
}

// substitute replaces the documented addresses by the test's, and fails
// when the documented configuration no longer uses one of them.
func substitute(t *testing.T, conf string, addrs map[string]string) string {
	t.Helper()
	for from, to := range addrs {
		if !strings.Contains(conf, from) {
			t.Fatalf("the documented configuration no longer mentions %s", from)
		}
		conf = strings.ReplaceAll(conf, from, to)
	}
	return conf
}

// needBinary returns the path of a program, or skips the test when it is
// missing, except under CI=true, where .ci/run installs it.
func needBinary(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing (Debian package %s; .ci/run installs it): %v", name, pkg, err)
		}
		t.Skipf("%s is missing (Debian package %s): %v", name, pkg, err)
	}
	return p
}

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startProxy runs cmd until the test ends and waits, a bounded number of
// attempts, until addr accepts connections; it fails early when the
// process exits.
func startProxy(t *testing.T, cmd *exec.Cmd, addr string, logFile string) {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	logs := func() string {
		l, _ := os.ReadFile(logFile)
		return out.String() + string(l)
	}
	for i := 0; ; i++ {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("%s exited: %v\n%s", cmd.Path, err, logs())
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if i == 500 {
			t.Fatalf("%s does not accept on %s: %v\n%s", cmd.Path, addr, err, logs())
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, bounded above
	}
}

// fromClient is an HTTP client whose connections come from the loopback
// address src (127.0.0.2, ...: Linux routes all of 127/8 to lo).
func fromClient(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
}

type proxyCase struct {
	name, bin, pkg string
	run            func(t *testing.T, bin, dir, conf, listen string) (*exec.Cmd, string)
}

func TestProxies(t *testing.T) {
	for _, pc := range []proxyCase{
		{name: "nginx", bin: "nginx", pkg: "nginx", run: runNginx},
		{name: "caddy", bin: "caddy", pkg: "caddy", run: runCaddy},
	} {
		t.Run(pc.name, func(t *testing.T) {
			bin := needBinary(t, pc.bin, pc.pkg)
			testProxy(t, pc, bin)
		})
	}
}

func runNginx(t *testing.T, bin, dir, conf, _ string) (*exec.Cmd, string) {
	errLog := filepath.Join(dir, "error.log")
	if err := os.WriteFile(filepath.Join(dir, "server.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	main := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
error_log %[1]s/error.log;
pid %[1]s/nginx.pid;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path %[1]s/client_body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    include %[1]s/server.conf;
}
`, dir)
	mainPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(mainPath, []byte(main), 0o644); err != nil {
		t.Fatal(err)
	}
	return exec.Command(bin, "-p", dir, "-c", mainPath, "-e", errLog), errLog
}

func runCaddy(t *testing.T, bin, dir, conf, _ string) (*exec.Cmd, string) {
	p := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(p, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--config", p, "--adapter", "caddyfile")
	// Caddy keeps an autosaved configuration and its data under these.
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
	return cmd, filepath.Join(dir, "none.log")
}

// testProxy drives "5 requests per 300 s per user, else per IP" through
// the proxy: the sixth request of a user, or of an IP, gets 429 with
// Retry-After and the fields from the proxy and never reaches the
// application; another user and another IP are unaffected; a client's
// own X-Forwarded-For does not change its key; allowed responses carry the
// fields too.
func testProxy(t *testing.T, pc proxyCase, bin string) {
	var upstreamHits atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamHits.Add(1)
		_, _ = w.Write([]byte("hello from the application\n"))
	}))
	t.Cleanup(app.Close)

	clock := newTestClock(t0)
	srv := startServer(t, Config{Clock: clock.now, Policy: policycmd.Config{File: policyFile(t, "rules.ini", docBlock(t, ""))}, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}, Check: check.Config{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		IdentityHeader: "X-User",
	}})
	checkURL := startCheck(t, srv)

	listen := freeAddr(t)
	conf := substitute(t, docBlock(t, pc.name), map[string]string{
		"127.0.0.1:9051": strings.TrimPrefix(checkURL, "http://"),
		"127.0.0.1:8080": strings.TrimPrefix(app.URL, "http://"),
		"127.0.0.1:8000": listen,
	})
	dir := t.TempDir()
	cmd, logFile := pc.run(t, bin, dir, conf, listen)
	startProxy(t, cmd, listen, logFile)

	url := "http://" + listen + "/orders?page=2"
	get := func(c *http.Client, headers ...string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(context.Background(), "GET", url, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range headers {
			k, v, _ := strings.Cut(h, ": ")
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		_, _ = body.ReadFrom(resp.Body)
		resp.Body.Close()
		return resp
	}
	c2, c3 := fromClient("127.0.0.2"), fromClient("127.0.0.3")

	allowed := func(what string, resp *http.Response, remaining int, resource string) {
		t.Helper()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d, want 200", what, resp.StatusCode)
		}
		for k, v := range map[string]string{
			"X-Ratelimit-Limit":     "5",
			"X-Ratelimit-Remaining": strconv.Itoa(remaining),
			"X-Ratelimit-Used":      strconv.Itoa(5 - remaining),
			"X-Ratelimit-Reset":     "1700000300",
			"X-Ratelimit-Resource":  resource,
		} {
			if got := resp.Header.Get(k); got != v {
				t.Errorf("%s: %s = %q, want %q", what, k, got, v)
			}
		}
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			t.Errorf("%s: Retry-After %q on an allowed response", what, ra)
		}
	}
	refused := func(what string, resp *http.Response, resource string) {
		t.Helper()
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("%s: status %d, want 429", what, resp.StatusCode)
		}
		for k, v := range map[string]string{
			"Retry-After":           "300",
			"X-Ratelimit-Limit":     "5",
			"X-Ratelimit-Remaining": "0",
			"X-Ratelimit-Used":      "5",
			"X-Ratelimit-Reset":     "1700000300",
			"X-Ratelimit-Resource":  resource,
		} {
			if got := resp.Header.Get(k); got != v {
				t.Errorf("%s: %s = %q, want %q", what, k, got, v)
			}
		}
	}

	for i := 1; i <= 5; i++ {
		allowed(fmt.Sprintf("alice's request %d", i), get(c2, "X-User: alice"), 5-i, "per-user")
	}
	if n := upstreamHits.Load(); n != 5 {
		t.Fatalf("the application saw %d requests, want 5", n)
	}
	refused("alice's sixth request", get(c2, "X-User: alice"), "per-user")
	if n := upstreamHits.Load(); n != 5 {
		t.Fatalf("the application saw %d requests after the refusal, want still 5", n)
	}
	allowed("bob, from the same address", get(c2, "X-User: bob"), 4, "per-user")

	// Anonymous requests from 127.0.0.2, each with another forged
	// X-Forwarded-For: the client is not a trusted proxy, so they all count
	// for 127.0.0.2.
	for i := 1; i <= 5; i++ {
		allowed(fmt.Sprintf("anonymous request %d from 127.0.0.2", i), get(c2, "X-Forwarded-For: 203.0.113."+strconv.Itoa(i)), 5-i, "per-ip")
	}
	refused("sixth anonymous request from 127.0.0.2, forged X-Forwarded-For", get(c2, "X-Forwarded-For: 198.51.100.77"), "per-ip")
	allowed("anonymous request from 127.0.0.3", get(c3), 4, "per-ip")
	if n := upstreamHits.Load(); n != 12 {
		t.Fatalf("the application saw %d requests, want 12 (the refused ones never reach it)", n)
	}
	hits := hitsByLabel(srv)
	if hits["per-user"] != [4]int64{6, 1, 0, 0} || hits["per-ip"] != [4]int64{6, 1, 0, 0} {
		t.Errorf("divvy_hits_total by label: %v", hits)
	}
}
