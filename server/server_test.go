package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/storage"
)

// startServer runs a real server on 127.0.0.1:0 with a store in a temporary
// directory, and stops both when the test ends.
func startServer(t testing.TB, cfg Config) *Server {
	t.Helper()
	return startServerOn(t, cfg, "127.0.0.1:0")
}

// startServerOn is startServer listening on addr.
func startServerOn(t testing.TB, cfg Config, addr string) *Server {
	t.Helper()
	store, err := storage.Open(t.TempDir(), StoreOptions(storage.Options{Sync: storage.SyncEverySec}))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store = store
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	serveAt(t, srv, store, addr)
	return srv
}

// serveOn serves srv on 127.0.0.1:0 until the test ends, then closes it and
// its store.
func serveOn(t testing.TB, srv *Server, store *storage.Store) {
	t.Helper()
	serveAt(t, srv, store, "127.0.0.1:0")
}

func serveAt(t testing.TB, srv *Server, store *storage.Store, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	for srv.Addr() == nil {
		runtime.Gosched()
	}
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if err := store.Close(); err != nil {
			t.Errorf("store close: %v", err)
		}
	})
}

func newClient(t testing.TB, srv *Server) *redis.Client {
	t.Helper()
	// Timeouts far beyond any reply: COMPACT of a large store under -race on
	// a busy machine takes seconds, and go-redis' default is 3s. A hang
	// still fails the test instead of blocking it.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), MaxRetries: -1, ReadTimeout: 2 * time.Minute, WriteTimeout: 2 * time.Minute})
	t.Cleanup(func() { c.Close() })
	return c
}

type upstreamFile struct {
	Suites []struct {
		Name              string `json:"name"`
		FreshState        *bool  `json:"fresh_state"`
		FreshStatePerStep bool   `json:"fresh_state_per_step"`
		Steps             []struct {
			Cmd    []string `json:"cmd"`
			Expect struct {
				Type  string          `json:"type"`
				Value json.RawMessage `json:"value"`
			} `json:"expect"`
		} `json:"steps"`
	} `json:"suites"`
}

// TestUpstreamCases runs every case of the Smyte server's test suite over
// the wire, through go-redis, against a real server.
func TestUpstreamCases(t *testing.T) {
	raw, err := os.ReadFile("testdata/rl-upstream.json")
	if err != nil {
		t.Fatal(err)
	}
	var f upstreamFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Suites) == 0 {
		t.Fatal("no suites in testdata/rl-upstream.json")
	}
	ctx := context.Background()
	steps := 0
	for _, suite := range f.Suites {
		t.Run(suite.Name, func(t *testing.T) {
			var rdb *redis.Client
			for i, st := range suite.Steps {
				if rdb == nil || suite.FreshStatePerStep {
					rdb = newClient(t, startServer(t, Config{}))
				}
				args := make([]any, len(st.Cmd))
				for j, a := range st.Cmd {
					args[j] = a
				}
				got, err := rdb.Do(ctx, args...).Result()
				checkReply(t, fmt.Sprintf("step %d %v", i, st.Cmd), st.Expect.Type, st.Expect.Value, got, err)
				steps++
			}
		})
	}
	if steps < 30 {
		t.Fatalf("ran only %d upstream steps", steps)
	}
}

func checkReply(t *testing.T, what, typ string, want json.RawMessage, got any, err error) {
	t.Helper()
	switch typ {
	case "integer":
		var w int64
		json.Unmarshal(want, &w)
		if err != nil || got != w {
			t.Fatalf("%s: got %#v, %v; want integer %d", what, got, err, w)
		}
	case "array":
		var w []int64
		json.Unmarshal(want, &w)
		arr, ok := got.([]any)
		if err != nil || !ok || len(arr) != len(w) {
			t.Fatalf("%s: got %#v, %v; want %v", what, got, err, w)
		}
		for i := range w {
			if arr[i] != w[i] {
				t.Fatalf("%s: got %#v; want %v", what, got, w)
			}
		}
	case "error":
		var w string
		json.Unmarshal(want, &w)
		if err == nil || !strings.EqualFold(err.Error(), "ERR "+w) {
			t.Fatalf("%s: got %#v, %v; want error %q", what, got, err, "ERR "+w)
		}
	default:
		t.Fatalf("%s: unknown expectation type %q", what, typ)
	}
}

func TestPipelineRepliesInOrder(t *testing.T) {
	rdb := newClient(t, startServer(t, Config{}))
	ctx := context.Background()
	pipe := rdb.Pipeline()
	var cmds []*redis.Cmd
	for range 300 {
		cmds = append(cmds, pipe.Do(ctx, "RL.PREDUCE", "k", 1000, 60000, "AT", 5))
		pipe.Do(ctx, "PING")
	}
	cmds = append(cmds, pipe.Do(ctx, "RL.PGET", "k", 1000, 60000, "AT", 5))
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, c := range cmds {
		if got, _ := c.Int64(); got != int64(1000-i) {
			t.Fatalf("reply %d = %d, want %d", i, got, 1000-i)
		}
	}
}

// Concurrent clients reducing shared buckets spend every token exactly
// once: the replies are a permutation of max..1.
func TestConcurrentReducesSpendEachTokenOnce(t *testing.T) {
	srv := startServer(t, Config{})
	ctx := context.Background()
	const clients, each = 8, 50
	seen := make(chan int64, clients*each)
	var wg sync.WaitGroup
	for range clients {
		rdb := newClient(t, srv)
		wg.Go(func() {
			for range each {
				v, err := rdb.Do(ctx, "RL.REDUCE", "shared", clients*each, 3600, "AT", 100).Int64()
				if err != nil {
					t.Error(err)
					return
				}
				seen <- v
			}
		})
	}
	wg.Wait()
	close(seen)
	got := map[int64]bool{}
	for v := range seen {
		if got[v] {
			t.Fatalf("token count %d handed out twice", v)
		}
		got[v] = true
	}
	if len(got) != clients*each {
		t.Fatalf("%d distinct replies, want %d", len(got), clients*each)
	}
}

func TestBuiltins(t *testing.T) {
	srv := startServer(t, Config{Build: Build{Version: "v9.9.9", Revision: "0123456789abcdef0123456789abcdef01234567"}})
	rdb := newClient(t, srv)
	ctx := context.Background()
	do := func(args ...any) (any, error) { return rdb.Do(ctx, args...).Result() }
	expect := func(want any, args ...any) {
		t.Helper()
		got, err := do(args...)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%v: got %#v, %v; want %v", args, got, err, want)
		}
	}
	expectErr := func(prefix string, args ...any) {
		t.Helper()
		_, err := do(args...)
		if err == nil || !strings.HasPrefix(err.Error(), prefix) {
			t.Fatalf("%v: got error %v, want prefix %q", args, err, prefix)
		}
	}
	expect("PONG", "PING")
	expect("hi", "PING", "hi")
	expect("x y", "ECHO", "x y")
	expect("OK", "SELECT", "0")
	expectErr("ERR DB index is out of range", "SELECT", "1")
	expect(1, "READY")
	expect("OK", "CLIENT", "SETNAME", "svc-a")
	expect("svc-a", "CLIENT", "GETNAME")
	expectErr("ERR Client names cannot contain spaces", "CLIENT", "SETNAME", "a b")
	expect("OK", "CLIENT", "SETINFO", "LIB-NAME", "mylib")
	expectErr("ERR unknown command 'NOPE', with args beginning with: 'a' ", "NOPE", "a")
	expectErr("ERR wrong number of arguments for 'echo' command", "ECHO")
	expectErr("ERR wrong number of arguments for 'rl.reduce' command", "RL.REDUCE", "k", "1")
	expectErr("ERR wrong number of arguments for 'rl.get' command", "RL.GET", "k", "1", "2", "at", "1", "refill", "1", "strict", "x")
	expectErr("ERR value is not an integer or out of range", "RL.REDUCE", "k", "10", "60", "AT", "9223372036854775807")
	expectErr("ERR value is not an integer or out of range", "RL.REDUCE", "k", "10", "2147483648")
	expectErr("NOPROTO", "HELLO", "4")
	if n, err := rdb.Do(ctx, "COMMAND", "COUNT").Int64(); err != nil || n < 10 {
		t.Fatalf("COMMAND COUNT = %d, %v", n, err)
	}
	info, err := rdb.Info(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Server", "sluice_version:v9.9.9", "sluice_revision:0123456789abcdef0123456789abcdef01234567", "redis_git_sha1:01234567", "redis_git_dirty:0", "# Clients", "connected_clients:", "# Stats", "total_commands_processed:", "# Persistence", "fsync_policy:everysec"} {
		if !strings.Contains(info, want) {
			t.Fatalf("INFO lacks %q:\n%s", want, info)
		}
	}
	if sec, _ := rdb.Info(ctx, "persistence").Result(); strings.Contains(sec, "# Server") || !strings.Contains(sec, "# Persistence") {
		t.Fatalf("INFO persistence:\n%s", sec)
	}
	// The bucket cache's bytes and its bound (the default).
	if sec, _ := rdb.Info(ctx, "storage").Result(); !strings.Contains(sec, "\r\nbucket_cache_bytes:") || !strings.Contains(sec, "\r\nbucket_cache_memory:"+strconv.Itoa(storage.DefaultCacheMemory)+"\r\n") {
		t.Fatalf("INFO storage lacks the bucket cache's bytes and bound:\n%s", sec)
	}
	// go-redis negotiated RESP3 with HELLO 3.
	hello, err := rdb.Do(ctx, "HELLO", "3").Result()
	if m, ok := hello.(map[any]any); err != nil || !ok || m["proto"] != int64(3) || m["server"] != "sluice" {
		t.Fatalf("HELLO 3 = %#v, %v", hello, err)
	}
	r2 := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), Protocol: 2})
	defer r2.Close()
	if v, err := r2.Do(ctx, "RL.REDUCE", "p2", 5, 1).Int64(); err != nil || v != 5 {
		t.Fatalf("RESP2 client: %d, %v", v, err)
	}
}

// rawConn talks RESP bytes directly, for input no client library sends.
func rawConn(t *testing.T, srv *Server) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// A hang must fail the test rather than stall it.
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

// TestMalformedInput sends the inputs that crash or hang redcon v1.6.2, and
// others, and checks that each gets a protocol error and a closed
// connection, while another client keeps being served.
func TestMalformedInput(t *testing.T) {
	srv := startServer(t, Config{})
	good := newClient(t, srv)
	ctx := context.Background()
	cases := map[string]string{
		"bulk length MaxInt64":  "*1\r\n$9223372036854775807\r\n",
		"arg count MaxInt64":    "*9223372036854775807\r\n",
		"arg count 2e9":         "*2000000000\r\n",
		"20-digit bulk length":  "*1\r\n$99999999999999999999\r\n",
		"1 GiB bulk length":     "*1\r\n$1073741824\r\n",
		"1e9 arguments":         "*1000000000\r\n",
		"negative bulk length":  "*1\r\n$-5\r\n",
		"non-digit count":       "*1x\r\n",
		"non-digit bulk length": "*1\r\n$1x\r\nP\r\n",
		"missing dollar":        "*1\r\n:1\r\n",
		"bulk without CRLF":     "*1\r\n$4\r\nPINGxx",
		"unbalanced quotes":     "PING \"abc\r\n",
	}
	for name, input := range cases {
		t.Run(name, func(t *testing.T) {
			c := rawConn(t, srv)
			// A valid command first: it must still be answered.
			if _, err := io.WriteString(c, "*1\r\n$4\r\nPING\r\n"+input); err != nil {
				t.Fatal(err)
			}
			r := bufio.NewReader(c)
			if line, err := r.ReadString('\n'); err != nil || line != "+PONG\r\n" {
				t.Fatalf("first reply %q, %v", line, err)
			}
			line, err := r.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "-ERR Protocol error") {
				t.Fatalf("got %q, %v; want a protocol error", line, err)
			}
			if _, err := r.ReadByte(); err != io.EOF {
				t.Fatalf("connection still open after a protocol error: %v", err)
			}
			if err := good.Ping(ctx).Err(); err != nil {
				t.Fatalf("other client: %v", err)
			}
		})
	}
	t.Run("random bytes", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		var wg sync.WaitGroup
		for i := range 50 {
			buf := make([]byte, 1+rng.IntN(4096))
			for j := range buf {
				buf[j] = byte(rng.UintN(256))
			}
			if i%2 == 0 {
				buf[0] = '*' // steer half of them into the multibulk parser
			}
			c := rawConn(t, srv)
			wg.Go(func() {
				c.Write(buf)
				// Whatever the server answers, it must end or keep the
				// connection without stalling other clients.
				c.(*net.TCPConn).CloseWrite()
				io.Copy(io.Discard, c)
			})
		}
		wg.Wait()
		if err := good.Ping(ctx).Err(); err != nil {
			t.Fatalf("other client after random input: %v", err)
		}
	})
	info, _ := good.Info(ctx, "stats").Result()
	if !strings.Contains(info, "protocol_errors:") || strings.Contains(info, "protocol_errors:0\r") {
		t.Fatalf("protocol errors not counted:\n%s", info)
	}
}

// A big argument sent one byte at a time is assembled, not re-parsed on
// every read, and served.
func TestSlowLargeArgument(t *testing.T) {
	srv := startServer(t, Config{Engine: engine.Tuning{MaxKeySize: 64 << 10}})
	c := rawConn(t, srv)
	key := strings.Repeat("k", 64<<10)
	msg := fmt.Sprintf("*4\r\n$9\r\nRL.REDUCE\r\n$%d\r\n%s\r\n$2\r\n10\r\n$2\r\n60\r\n", len(key), key)
	w := bufio.NewWriterSize(c, 1)
	for i := 0; i < len(msg); i += 1024 {
		w.WriteString(msg[i:min(i+1024, len(msg))])
		w.Flush()
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != ":10\r\n" {
		t.Fatalf("got %q, %v", line, err)
	}
}

func TestQuitStopsPipeline(t *testing.T) {
	srv := startServer(t, Config{})
	c := rawConn(t, srv)
	io.WriteString(c, "PING\r\nQUIT\r\nRL.REDUCE after-quit 10 60\r\n")
	all, _ := io.ReadAll(c)
	if string(all) != "+PONG\r\n+OK\r\n" {
		t.Fatalf("got %q", all)
	}
	rdb := newClient(t, srv)
	if v, err := rdb.Do(context.Background(), "RL.GET", "after-quit", 10, 60).Int64(); err != nil || v != 10 {
		t.Fatalf("command after QUIT ran: %d, %v", v, err)
	}
}

// Close lets a connection finish the pipeline it is executing: every reply
// it was due arrives.
func TestCloseFinishesPipelines(t *testing.T) {
	srv := startServer(t, Config{})
	rdb := newClient(t, srv)
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Fatal("server still answering after Close")
	}
	_, err := net.Dial("tcp", srv.Addr().String())
	if err == nil {
		t.Fatal("still accepting after Close")
	}
	var ne *net.OpError
	if !errors.As(err, &ne) {
		t.Fatalf("dial: %v", err)
	}
}

// gateHandler holds the "serving RESP" log line until released, which
// widens the window between Serve starting and its accept loop taking the listener.
type gateHandler struct {
	reached chan struct{}
	release chan struct{}
}

func (h *gateHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *gateHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "serving RESP" {
		close(h.reached)
		<-h.release
	}
	return nil
}
func (h *gateHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *gateHandler) WithGroup(string) slog.Handler      { return h }

// A Close that lands while Serve is starting still stops it.
func TestCloseDuringServeStart(t *testing.T) {
	store, err := storage.Open(t.TempDir(), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	h := &gateHandler{reached: make(chan struct{}), release: make(chan struct{})}
	srv, err := New(Config{Store: store, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	<-h.reached
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	close(h.release)
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(30 * time.Second): // a hang guard, not a timing claim
		t.Fatal("Serve kept running after Close")
	}
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Fatal("listener still accepting after Close")
	}
}

// BenchmarkPipelineOverTCP drives a real server over loopback with
// pipelines of 16 RL.PREDUCE on distinct keys from 4 connections, so its
// allocations per op are those of the whole server path: framing, the connection loop,
// the command, the store and the committer (the client side allocates
// nothing per op). Run with -memprofile to see where they come from.
func BenchmarkPipelineOverTCP(b *testing.B) {
	benchPipelineOverTCP(b, startServer(b, Config{}))
}

// BenchmarkPipelineOverTCPSmallCache is BenchmarkPipelineOverTCP with a
// hot-state cache of 16384 entries, full after the first few thousand
// pipelines: the steady state of a server whose cache is full, where each
// new bucket reuses an evicted entry. It shows 0 allocs/op; the other one
// shows the allocations of the cache while it grows (two per new bucket,
// TestNewRecordAllocs), until its 262144 entries are in use.
func BenchmarkPipelineOverTCPSmallCache(b *testing.B) {
	store, err := storage.Open(b.TempDir(), StoreOptions(storage.Options{Sync: storage.SyncEverySec, CacheEntries: 16384}))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(Config{Store: store})
	if err != nil {
		b.Fatal(err)
	}
	serveOn(b, srv, store)
	benchPipelineOverTCP(b, srv)
}

func benchPipelineOverTCP(b *testing.B, srv *Server) {
	var next atomic.Int64
	benchLoadOverTCP(b, srv, 4, func(*rand.Rand) int64 { return next.Add(1) % 1_000_000 })
}

// TestClientNamesAreCapped: a client name, library name or version is at
// most respserver.MaxClientName bytes (Redis has no limit): each is kept for the life
// of the connection, so without a cap a client could park up to three
// bulk strings of --max-bulk there.
func TestClientNamesAreCapped(t *testing.T) {
	srv := startServer(t, Config{})
	c := dialRaw(t, srv)
	ok, long := strings.Repeat("n", respserver.MaxClientName), strings.Repeat("n", respserver.MaxClientName+1)
	for _, tc := range []struct {
		what string
		cmd  []string
	}{
		{"client name", []string{"CLIENT", "SETNAME"}},
		{"lib-name", []string{"CLIENT", "SETINFO", "LIB-NAME"}},
		{"lib-ver", []string{"CLIENT", "SETINFO", "lib-ver"}},
		{"client name", []string{"HELLO", "2", "SETNAME"}},
	} {
		send := func(v string) string {
			var args [][]byte
			for _, a := range tc.cmd {
				args = append(args, []byte(a))
			}
			c.write(respCommand(append(args, []byte(v))...))
			return c.reply()
		}
		if got := send(ok); got != "+OK" && got != "*14" {
			t.Fatalf("%v with %d bytes: %q, want it accepted", tc.cmd, len(ok), got)
		}
		want := fmt.Sprintf("-ERR %s is %d bytes, longer than the limit of %d bytes", tc.what, len(long), respserver.MaxClientName)
		if got := send(long); got != want {
			t.Fatalf("%v with %d bytes: %q, want %q", tc.cmd, len(long), got, want)
		}
	}
	c.write([]byte("CLIENT GETNAME\r\n"))
	c.expect("$" + strconv.Itoa(respserver.MaxClientName)) // the last name accepted
}
