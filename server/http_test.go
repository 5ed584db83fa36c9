package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/httpport"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
)

// httpListeners starts srv's HTTP listener and /check, and returns their
// addresses by name.
func httpListeners(t *testing.T, srv *Server) map[string]string {
	t.Helper()
	return map[string]string{
		"--http-addr":  strings.TrimPrefix(serveHTTPOn(t, srv), "http://"),
		"--check-addr": strings.TrimPrefix(startCheck(t, srv), "http://"),
	}
}

// httpRequestLine is a request line for the listener name that is
// answered 200: a probe, or /check without an identity (the policy's
// default rule has nothing to count).
func httpRequestLine(name string) string {
	if name == "--check-addr" {
		return "GET /check HTTP/1.1\r\nHost: sluice\r\n"
	}
	return "GET /healthz HTTP/1.1\r\nHost: sluice\r\n"
}

// headerLines is n bytes of header lines (each 1 KiB), without the blank
// line that ends a header.
func headerLines(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "X-Pad-%06d: %s\r\n", i, strings.Repeat("y", 1024-16))
	}
	return b.String()
}

// TestHTTPMaxHeaderBytes: a request whose header is longer than
// --http-max-header-bytes is answered 431 on both HTTP listeners (net/http
// allowed 1 MiB); a shorter one is served.
func TestHTTPMaxHeaderBytes(t *testing.T) {
	srv := startServer(t, Config{Policy: policycmd.Config{File: policyFile(t, "check.ini", checkPolicy)}})
	for name, addr := range httpListeners(t, srv) {
		for _, tc := range []struct {
			header int
			want   int
		}{{httpport.DefaultMaxHeaderBytes / 2, http.StatusOK}, {httpport.DefaultMaxHeaderBytes + 8<<10, http.StatusRequestHeaderFieldsTooLarge}} {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(c, httpRequestLine(name)+headerLines(tc.header)+"\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("%s: a %d-byte header: %v", name, tc.header, err)
			}
			if resp.StatusCode != tc.want {
				t.Fatalf("%s: a %d-byte header: status %d, want %d", name, tc.header, resp.StatusCode, tc.want)
			}
			c.Close()
		}
	}
}

// TestHTTPHeadersCountAgainstClients: what an HTTP connection has sent of
// an unfinished request header counts against --maxmemory-clients, on both
// listeners: a connection whose header would pass it is closed (and
// counted as evicted); what a header held is given back when its request
// is handled.
func TestHTTPHeadersCountAgainstClients(t *testing.T) {
	srv := startServer(t, Config{Policy: policycmd.Config{File: policyFile(t, "check.ini", checkPolicy)}, RESP: respserver.Tuning{MaxMemoryClients: respserver.LimitOf[int64](256 << 10)}, HTTP: httpport.Config{MaxHeaderBytes: 1 << 20}})
	evicted := int64(0)
	for name, addr := range httpListeners(t, srv) {
		dial := func() net.Conn {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		a := dial()
		head := httpRequestLine(name) + headerLines(200<<10)
		if _, err := io.WriteString(a, head); err != nil {
			t.Fatal(err)
		}
		waitClientMem(t, srv, name+": a 200 KiB header being read", func(m int64) bool { return m == int64(len(head)) })

		// A second unfinished header passes the bound: closed. Bounded:
		// before, it waited for the header timeout (10 s).
		b := dial()
		_ = b.SetDeadline(time.Now().Add(30 * time.Second))
		_, _ = io.WriteString(b, httpRequestLine(name)+headerLines(100<<10))
		_, _ = io.Copy(io.Discard, b) // until the server closes it
		evicted++
		if n := srv.stats.EvictedClients.Load(); n != evicted {
			t.Fatalf("%s: evicted clients %d, want %d", name, n, evicted)
		}

		// The first ends its header: served, and its header's memory is
		// given back.
		if _, err := io.WriteString(a, "\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(a), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: the first request, once whole: %v, %v", name, resp, err)
		}
		waitClientMem(t, srv, name+": after the request", func(m int64) bool { return m == 0 })
	}
}

// TestCloseClosesBusyHTTPConnections: Close drains the HTTP listener as it
// drains every other: a connection still busy when its grace is over
// (here one whose request header never ends) is closed, not left open
// on a server whose store is about to close.
func TestCloseClosesBusyHTTPConnections(t *testing.T) {
	srv := startServer(t, Config{})
	c, err := net.Dial("tcp", strings.TrimPrefix(serveHTTPOn(t, srv), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: sluice\r\n")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); srv.adm.Open() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the connection was not admitted")
		}
	}
	// Every wait of Close ends at once: the grace is over.
	srv.after = func(time.Duration) <-chan time.Time {
		ch := make(chan time.Time, 1)
		ch <- time.Time{}
		return ch
	}
	srv.Close()
	// Less than ReadHeaderTimeout (10 s), which would close it too.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); isTimeout(err) {
		t.Fatalf("the connection is still open after Close: %v", err)
	}
}
