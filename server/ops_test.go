package server

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/storage"
)

func dial(t *testing.T, srv *Server) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	return conn
}

// roundTrip sends raw RESP and reads one line of reply.
func roundTrip(t *testing.T, conn net.Conn, r *bufio.Reader, req string) string {
	t.Helper()
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading the reply to %q: %v", req, err)
	}
	return line
}

func TestMaxClients(t *testing.T) {
	srv := startServer(t, Config{Listen: admit.Config{MaxClients: 2}})
	var open []net.Conn
	for range 2 {
		c := dial(t, srv)
		if got := roundTrip(t, c, bufio.NewReader(c), "PING\r\n"); got != "+PONG\r\n" {
			t.Fatalf("PING = %q", got)
		}
		open = append(open, c)
	}
	extra := dial(t, srv)
	got, err := io.ReadAll(extra)
	if err != nil || string(got) != "-ERR max number of clients reached\r\n" {
		t.Fatalf("third client got %q, %v; want the max clients error and EOF", got, err)
	}
	if n := srv.stats.RejectedMax.Load(); n != 1 {
		t.Fatalf("rejected (maxclients) = %d, want 1", n)
	}
	// A slot that frees up is usable again.
	open[0].Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c := dial(t, srv)
		if roundTrip(t, c, bufio.NewReader(c), "PING\r\n") == "+PONG\r\n" {
			break
		}
		c.Close() // refused: the closed slot is not free yet
		if time.Now().After(deadline) {
			t.Fatal("no client admitted after one closed")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestIdleTimeoutClosesIdleConnections(t *testing.T) {
	srv := startServer(t, Config{RESP: respserver.Tuning{IdleTimeout: 50 * time.Millisecond}})
	idle := dial(t, srv)
	got, err := io.ReadAll(idle) // returns when the server closes it
	if err != nil || len(got) != 0 {
		t.Fatalf("idle connection: read %q, %v; want a plain close", got, err)
	}
	if n := srv.stats.IdleClosed.Load(); n != 1 {
		t.Fatalf("idle closed = %d, want 1", n)
	}
}

// TestClientThatNeverReads: a client that pipelines without reading its
// replies is held back by TCP once the server's writes block, so server
// memory stays bounded; a pipeline whose replies alone exceed the reply
// buffer limit is cut off with an error.
func TestClientThatNeverReads(t *testing.T) {
	t.Run("backpressure", func(t *testing.T) {
		srv := startServer(t, Config{})
		conn := dial(t, srv)
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		chunk := bytes.Repeat([]byte("INFO\r\n"), 10000) // ~30 MB of replies
		sent := 0
		for sent < 1<<30 {
			// Once the server stops reading, a write waits; a deadline
			// that has passed is how we know it does.
			_ = conn.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
			n, err := conn.Write(chunk)
			sent += n
			if err != nil {
				if !isTimeout(err) {
					t.Fatalf("write: %v", err)
				}
				break
			}
		}
		if sent >= 1<<30 {
			t.Fatal("the server read 1 GiB of commands whose replies nobody read")
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		grew := int64(after.HeapInuse) - int64(before.HeapInuse)
		limit := int64(respserver.DefaultMaxReplyBuffer + respserver.DefaultMaxQueryBuffer + 32<<20)
		t.Logf("sent %d MiB of INFO commands without reading; server heap grew %d MiB", sent>>20, grew>>20)
		if grew > limit {
			t.Fatalf("heap grew %d bytes, more than the %d the limits allow", grew, limit)
		}
	})
	t.Run("reply buffer limit", func(t *testing.T) {
		// A long pipeline's replies go out in chunks, so only one reply
		// bigger than the limit (INFO's is a few KiB) trips it.
		srv := startServer(t, Config{RESP: respserver.Tuning{MaxReplyBuffer: 1 << 10}})
		conn := dial(t, srv)
		if _, err := conn.Write([]byte("PING\r\nINFO\r\nPING\r\n")); err != nil {
			t.Fatal(err)
		}
		all, _ := io.ReadAll(conn)
		if !bytes.HasSuffix(all, []byte("-ERR reply buffer limit reached (--max-reply-buffer); closing the connection\r\n")) {
			t.Fatalf("reply did not end with the limit error; last bytes %q", all[max(0, len(all)-120):])
		}
		if n := srv.stats.ReplyOverflows.Load(); n != 1 {
			t.Fatalf("reply overflows = %d, want 1", n)
		}
	})
}

func serveHTTPOn(t *testing.T, srv *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeHTTP(ln)
	return "http://" + ln.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestMetricsAndHealth(t *testing.T) {
	store, err := storage.Open(t.TempDir(), storage.Options{Sync: storage.SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Store: store, Listen: admit.Config{Password: "pw", ShutdownTimeout: time.Minute}, Build: Build{Version: "v9.9.9", Revision: "0123456789abcdef0123456789abcdef01234567-dirty"}})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, store)
	base := serveHTTPOn(t, srv)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), Password: "pw", PoolSize: 1, MaxRetries: -1})
	defer c.Close()
	c.Do(ctx, "AUTH", "wrong")
	if err := c.Do(ctx, "AUTH", "pw").Err(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		c.Do(ctx, "RL.REDUCE", "k", 3, 60, "AT", 1000)
	}
	c.Do(ctx, "RL.REDUCE", "k", 3, 60, "AT", 1000) // denied
	c.Do(ctx, "RL.REDUCE", "k", "x", 60)           // error
	c.Do(ctx, "RL.GET", "k", 3, 60, "AT", 1000)    // ok
	c.Do(ctx, "NOSUCHCOMMAND")                     // unknown
	pipe := c.Pipeline()                           // counted per pipeline, still exact
	for range 5 {
		pipe.Do(ctx, "RL.PREDUCE", "p", 2, 1000, "AT", 5)
	}
	pipe.Exec(ctx)

	code, body := get(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`sluice_commands_total{command="rl.reduce",result="allowed"} 3`,
		`sluice_commands_total{command="rl.reduce",result="denied"} 1`,
		`sluice_commands_total{command="rl.reduce",result="error"} 1`,
		`sluice_commands_total{command="rl.reduce",result="ok"} 0`,
		`sluice_commands_total{command="rl.get",result="ok"} 1`,
		`sluice_commands_total{command="rl.preduce",result="allowed"} 2`,
		`sluice_commands_total{command="rl.preduce",result="denied"} 3`,
		`sluice_commands_total{command="auth",result="error"} 1`,
		`sluice_commands_total{command="auth",result="ok"} 1`,
		`sluice_unknown_commands_total 1`,
		`sluice_auth_failures_total 1`,
		`sluice_connections`,
		`sluice_connections_total`,
		`sluice_rejected_connections_total{reason="maxclients"} 0`,
		`sluice_buckets 2`,
		`sluice_build_info{goversion="` + runtime.Version() + `",revision="0123456789abcdef0123456789abcdef01234567-dirty",version="v9.9.9"} 1`,
		`sluice_pipeline_duration_seconds_count`,
		`sluice_store_unavailable 0`,
		`process_resident_memory_bytes`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want+"\n") && !strings.Contains(body, want+" ") && !strings.Contains(body, want+"{") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if !strings.Contains(body, "sluice_fsyncs_total ") || strings.Contains(body, "sluice_fsyncs_total 0\n") {
		t.Error("/metrics: no fsyncs counted in --fsync always")
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}
	if code, body := get(t, base+"/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("/readyz: %d %q", code, body)
	}

	// During shutdown /readyz turns unready while connections drain. A
	// client that never reads keeps one connection busy, so the drain
	// lasts until the test lets it go.
	hog := dial(t, srv)
	_, _ = hog.Write([]byte("AUTH pw\r\n"))
	chunk := bytes.Repeat([]byte("INFO\r\n"), 10000)
	for {
		_ = hog.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := hog.Write(chunk); err != nil {
			break // the server is stuck writing to us
		}
	}
	closed := make(chan struct{})
	go func() { srv.Close(); close(closed) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := get(t, base+"/readyz")
		if code == http.StatusServiceUnavailable && body == "shutting down\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz during shutdown: %d %q", code, body)
		}
		time.Sleep(time.Millisecond)
	}
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Fatalf("/healthz during shutdown: %d", code)
	}
	hog.Close()
	<-closed
}

// smallSendBuffers is a listener whose connections have a small socket
// send buffer, so that a client that does not read stalls them soon.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4 << 10)
	}
	return c, err
}

// stall writes chunk to conn, never reading, until the server stops
// reading because its replies cannot be sent; a write deadline that passes
// is how it knows.
func stall(t *testing.T, conn net.Conn, chunk []byte) {
	t.Helper()
	for sent := 0; sent < 1<<30; {
		_ = conn.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
		n, err := conn.Write(chunk)
		sent += n
		if err != nil {
			if !isTimeout(err) {
				t.Fatalf("write: %v", err)
			}
			return
		}
	}
	t.Fatal("the server read 1 GiB of commands whose replies nobody read")
}

// TestCloseForcesConnectionsAtNineTenths: Close closes the connections
// still busy after nine tenths of ShutdownTimeout, then waits for them at
// most the last tenth, on both protocols. cmd/sluice closes the store after
// nine tenths: a Close that waited the whole timeout left connections
// running commands on a closed store, and a line-protocol connection stuck
// after its close held Close forever.
func TestCloseForcesConnectionsAtNineTenths(t *testing.T) {
	const timeout = 10 * time.Second
	path := filepath.Join("..", "policy", "testdata", "example-config.ini")
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Listen: admit.Config{ShutdownTimeout: timeout}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeDivvy(smallSendBuffers{ln})

	resp := dial(t, srv)
	stall(t, resp, respCommand([]byte("ECHO"), bytes.Repeat([]byte("x"), 1<<20)))
	line, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer line.Close()
	_ = line.(*net.TCPConn).SetReadBuffer(4 << 10)
	stall(t, line, bytes.Repeat([]byte("HIT method=GET path=/status\n"), 1000))

	// Every wait ends at once: the durations asked for are what counts.
	var (
		mu    sync.Mutex
		waits []time.Duration
	)
	srv.after = func(d time.Duration) <-chan time.Time {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		ch := make(chan time.Time, 1)
		ch <- time.Time{}
		return ch
	}
	srv.Close()
	mu.Lock()
	defer mu.Unlock()
	force, rest := 0, 0
	for _, d := range waits {
		switch {
		case d > timeout/2 && d <= timeout-timeout/10:
			force++
		case d <= timeout/10:
			rest++
		}
	}
	t.Logf("waits of Close with a %v timeout: %v", timeout, waits)
	if len(waits) != 4 || force != 2 || rest != 2 {
		t.Fatalf("Close with a %v timeout and a stalled connection on each protocol waited %v; want, for each protocol, up to %v before closing them and up to %v after",
			timeout, waits, timeout-timeout/10, timeout/10)
	}
}
