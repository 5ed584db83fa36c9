package server

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/storage"
)

func newTestClock(ms int64) *testClock {
	c := &testClock{}
	c.ms.Store(ms)
	return c
}

// startDivvy serves the line protocol of srv on 127.0.0.1:0.
func startDivvy(t testing.TB, srv *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeDivvy(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; err != nil {
			t.Errorf("ServeDivvy: %v", err)
		}
	})
	return ln.Addr().String()
}

// lineClient is one line-protocol connection.
type lineClient struct {
	t    testing.TB
	conn net.Conn
	r    *bufio.Reader
}

func dialLine(t testing.TB, addr string) *lineClient {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	return &lineClient{t: t, conn: conn, r: bufio.NewReader(conn)}
}

func (c *lineClient) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, s); err != nil {
		c.t.Fatal(err)
	}
}

func (c *lineClient) line() string {
	c.t.Helper()
	l, err := c.r.ReadString('\n')
	if err != nil {
		c.t.Fatalf("reading a reply: %v (read %q)", err, l)
	}
	return strings.TrimSuffix(l, "\n")
}

// closed checks that the server closed the connection with nothing more.
func (c *lineClient) closed() {
	c.t.Helper()
	rest, err := io.ReadAll(c.r)
	if err != nil || len(rest) != 0 {
		c.t.Fatalf("after ERR: read %q, %v; want the connection closed", rest, err)
	}
}

// policyFile writes a rule file into a temporary directory.
func policyFile(t testing.TB, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// hitRESP sends a line's HIT over RESP and words the reply as the line
// protocol does, so both transports share one table.
func hitRESP(t *testing.T, srv *Server, line string) string {
	t.Helper()
	c := newClient(t, srv)
	fields := strings.Fields(line)
	args := make([]any, len(fields))
	for i, f := range fields {
		args[i] = f
	}
	v, err := c.Do(context.Background(), args...).Result()
	if err != nil {
		return "ERR " + err.Error()
	}
	a, ok := v.([]any)
	if !ok || len(a) != 3 {
		t.Fatalf("HIT reply %#v: want an array of 3 integers", v)
	}
	return fmt.Sprintf("OK %t %d %d", a[0].(int64) == 1, a[1].(int64), a[2].(int64))
}

const t0 = int64(1_700_000_000_000)

// TestExampleConfigOverBothProtocols runs divvy's README walk-through on its
// example configuration, over the line protocol and over RESP: three cookie
// requests per hour per IP, the fourth denied, another IP fresh, the
// window reset an hour after the first hit, the canary counted but never
// deciding, and the default deny.
func TestExampleConfigOverBothProtocols(t *testing.T) {
	steps := []struct {
		at   int64 // ms after t0
		line string
		want string
	}{
		{0, "HIT method=GET path=/status", "OK true 999 60"},
		{2000, "HIT method=GET path=/status", "OK true 998 58"},
		{0, "HIT method=GET path=/pantry/cookies/oatmeal ip=192.168.1.1", "OK true 2 3600"},
		{1000, "HIT method=GET path=/pantry/cookies/oatmeal ip=192.168.1.1", "OK true 1 3599"},
		{2000, "HIT method=GET path=/pantry/cookies/oatmeal ip=192.168.1.1", "OK true 0 3598"},
		{3000, "HIT method=GET path=/pantry/cookies/oatmeal ip=192.168.1.1", "OK false 0 3597"},
		{4000, "HIT method=GET path=/pantry/cookies/oatmeal ip=4.3.2.1", "OK true 2 3600"},
		{3600_000 - 1, "HIT method=GET path=/pantry/cookies/oatmeal ip=192.168.1.1", "OK false 0 1"},
		{3600_000, "HIT method=GET path=/pantry/cookies/oatmeal ip=192.168.1.1", "OK true 2 3600"},
		{0, "HIT method=GET path=/pantry/cookies/special-cookie ip=10.0.0.2", "OK true 2 3600"},
		{1000, "HIT method=GET path=/pantry/cookies/special-cookie ip=10.0.0.2", "OK true 1 3599"},
		{0, "HIT method=GET path=/pantry/cookies/oatmeal", "OK false 0 -1"},
		{0, "HIT method=DELETE path=/status", "OK false 0 -1"},
		{0, "HIT", "OK false 0 -1"},
	}
	for _, file := range []string{"example-config.ini", "example-config.json"} {
		path := filepath.Join("..", "policy", "testdata", file)
		t.Run(file+"/line", func(t *testing.T) {
			clock := newTestClock(t0)
			srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: clock.now})
			c := dialLine(t, startDivvy(t, srv))
			for i, st := range steps {
				clock.ms.Store(t0 + st.at)
				c.send(st.line + "\n")
				if got := c.line(); got != st.want {
					t.Fatalf("step %d %q: got %q, want %q", i, st.line, got, st.want)
				}
			}
			// The canary took one credit a day and was counted, without deciding.
			hits := hitsByLabel(srv)
			if got := hits[""]; got != [4]int64{9, 5, 1, 1} {
				t.Errorf("hits of unlabelled rules (accepted, rejected, canary-accepted, canary-rejected) = %v, want [9 5 1 1]", got)
			}
			c.send("GET method=GET\n")
			if got := c.line(); got != `ERR unknown-command "Unrecognized command: GET"` {
				t.Fatalf("unknown command: %q", got)
			}
			c.closed()
		})
		t.Run(file+"/resp", func(t *testing.T) {
			clock := newTestClock(t0)
			srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: clock.now})
			for i, st := range steps {
				clock.ms.Store(t0 + st.at)
				if got := hitRESP(t, srv, st.line); got != st.want {
					t.Fatalf("step %d %q: got %q, want %q", i, st.line, got, st.want)
				}
			}
			if got := hitRESP(t, srv, "HIT method"); !strings.Contains(got, "argument 1 is not key=value") {
				t.Fatalf("HIT method: %q, want the key=value error", got)
			}
		})
	}
}

// hitsByLabel reads the divvy_hits_total counters.
func hitsByLabel(srv *Server) map[string][4]int64 {
	m := map[string][4]int64{}
	for _, hc := range srv.pol.LabelCounts() {
		m[hc.Label] = [4]int64{hc.Accepted.Load(), hc.Rejected.Load(), hc.CanaryAccepted.Load(), hc.CanaryRejected.Load()}
	}
	return m
}

// TestTestConfig: divvy's test configuration, both formats: labelled
// rules, a labelled canary, actors, and a counted default.
func TestTestConfig(t *testing.T) {
	for _, file := range []string{"test-config.ini", "test-config.json"} {
		t.Run(file, func(t *testing.T) {
			clock := newTestClock(t0)
			srv := startServer(t, Config{Policy: policycmd.Config{File: filepath.Join("..", "policy", "testdata", file)}, Clock: clock.now})
			c := dialLine(t, startDivvy(t, srv))
			var want []string
			var req strings.Builder
			// Ten per minute per ip for /ping, the local canary counting too.
			for i := range 11 {
				req.WriteString("HIT method=GET path=/ping ip=1.1.1.1 local=true\n")
				if i < 10 {
					want = append(want, fmt.Sprintf("OK true %d 60", 9-i))
				} else {
					want = append(want, "OK false 0 60")
				}
			}
			req.WriteString("HIT method=GET path=/ping ip=2.2.2.2 isAuthenticated=true\n")
			want = append(want, "OK true 99 60")
			req.WriteString("HIT method=POST ip=3.3.3.3 path=/accounts isAuthenticated=true\n")
			want = append(want, "OK true 0 60")
			req.WriteString("HIT method=POST ip=3.3.3.3 path=/accounts isAuthenticated=true\n")
			want = append(want, "OK false 0 60")
			req.WriteString("HIT method=POST ip=3.3.3.3 path=/other\n")
			want = append(want, "OK true 4 60")
			req.WriteString("HIT method=PUT\n")
			want = append(want, "OK true 0 60")
			req.WriteString("HIT method=PUT\n")
			want = append(want, "OK false 0 60")
			c.send(req.String()) // one pipelined write
			for i, w := range want {
				if got := c.line(); got != w {
					t.Fatalf("reply %d: got %q, want %q", i, got, w)
				}
			}
			hits := hitsByLabel(srv)
			if got := hits["get-ping-by-ip"]; got != [4]int64{10, 1, 0, 0} {
				t.Errorf("get-ping-by-ip hits = %v, want [10 1 0 0]", got)
			}
			if got := hits["get-ping-by-ip-from-local"]; got != [4]int64{0, 0, 11, 0} {
				t.Errorf("canary hits = %v, want [0 0 11 0]", got)
			}
			if got := hits["post-by-ip"]; got != [4]int64{1, 0, 0, 0} {
				t.Errorf("post-by-ip hits = %v, want [1 0 0 0]", got)
			}
		})
	}
}

func TestLineProtocolErrorsCloseTheConnection(t *testing.T) {
	path := policyFile(t, "p.ini", "[path=/x ip=*]\ncreditLimit = 5\nresetSeconds = 60\nactorField = ip\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n")
	clock := newTestClock(t0)
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: clock.now, Divvy: divvy.Config{MaxLine: 100}})
	addr := startDivvy(t, srv)
	for _, tc := range []struct {
		name, send, want string
	}{
		// Blank lines and white space are ignored; "\r\n" ends a line too.
		{"unknown command", "\n  \r\nhit path=/x ip=a\r\nPING\nHIT path=/x ip=a\n", "OK true 4 60\n" + `ERR unknown-command "Unrecognized command: PING"` + "\n"},
		{"parse error", "HIT path=/x ip=a\nHIT path=\"/x\n" + "HIT path=/x ip=a\n", "OK true 3 60\n" + `ERR unknown "Unexpected end of quoted string."` + "\n"},
		{"no equals", "HIT path\n", `ERR unknown "Unexpected end of input string."` + "\n"},
		{"line too long", "HIT path=/x ip=a q=" + strings.Repeat("v", 100) + "\nHIT path=/x ip=a\n", `ERR unknown "line too long"` + "\n"},
		{"line too long, unfinished", "HIT path=/x ip=a q=" + strings.Repeat("v", 300), `ERR unknown "line too long"` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialLine(t, addr)
			c.send(tc.send)
			got, err := io.ReadAll(c.r)
			if err != nil || string(got) != tc.want {
				t.Fatalf("got %q, %v; want %q then the connection closed", got, err, tc.want)
			}
		})
	}
	// The lines after each bad one were not executed: ip=a took exactly
	// two credits.
	c := dialLine(t, addr)
	c.send("HIT path=/x ip=a\n")
	if got := c.line(); got != "OK true 2 60" {
		t.Fatalf("after the errors: %q, want OK true 2 60", got)
	}
	// A last line without "\n" is executed when the client closes its side.
	c.send("HIT path=/x ip=b")
	_ = c.conn.(*net.TCPConn).CloseWrite()
	if got, err := io.ReadAll(c.r); err != nil || string(got) != "OK true 4 60\n" {
		t.Fatalf("last line at EOF: %q, %v", got, err)
	}
	if n := srv.divvy.ErrUnknownCommand.Load(); n != 1 {
		t.Errorf("unknown-command errors = %d, want 1", n)
	}
	if n := srv.divvy.ErrUnknown.Load(); n != 4 {
		t.Errorf("unknown errors = %d, want 4", n)
	}
}

// TestLineProtocolConcurrentPipelines: 200 connections each pipeline 50
// HITs in one write, half on a counter of their own and half on one
// shared counter. Each connection's replies come in order (its own
// counter counts down one by one), and the shared counter's 3000 credits
// are each given exactly once among 5000 hits.
func TestLineProtocolConcurrentPipelines(t *testing.T) {
	const (
		conns  = 200
		perOwn = 25
		shared = 3000
	)
	path := policyFile(t, "p.ini", fmt.Sprintf(`[path=/own ip=*]
creditLimit = 30
resetSeconds = 3600
actorField = ip
label = own

[path=/shared]
creditLimit = %d
resetSeconds = 3600
label = shared

[default]
creditLimit = 0
resetSeconds = 0
`, shared))
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: newTestClock(t0).now})
	addr := startDivvy(t, srv)
	var (
		mu         sync.Mutex
		sharedLeft []int
		wg         sync.WaitGroup
	)
	errs := make(chan error, conns)
	for i := range conns {
		wg.Go(func() {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
			var b strings.Builder
			for range perOwn {
				fmt.Fprintf(&b, "HIT path=/own ip=10.0.%d.%d\nHIT path=/shared\n", i/256, i%256)
			}
			go io.WriteString(conn, b.String())
			r := bufio.NewReader(conn)
			var left []int
			for j := range 2 * perOwn {
				l, err := r.ReadString('\n')
				if err != nil {
					errs <- fmt.Errorf("conn %d reply %d: %v", i, j, err)
					return
				}
				var ok bool
				var n, secs int
				if _, err := fmt.Sscanf(l, "OK %t %d %d\n", &ok, &n, &secs); err != nil {
					errs <- fmt.Errorf("conn %d reply %d: %q", i, j, l)
					return
				}
				if j%2 == 0 {
					if want := 29 - j/2; !ok || n != want {
						errs <- fmt.Errorf("conn %d own reply %d: %q, want OK true %d (replies out of order?)", i, j/2, l, want)
						return
					}
				} else if ok {
					left = append(left, n)
				}
			}
			mu.Lock()
			sharedLeft = append(sharedLeft, left...)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	slices.Sort(sharedLeft)
	if len(sharedLeft) != shared {
		t.Fatalf("shared counter allowed %d hits, want exactly %d", len(sharedLeft), shared)
	}
	for i, n := range sharedLeft {
		if n != i {
			t.Fatalf("shared credits left: %d given out twice or never (sorted position %d holds %d)", i, i, n)
		}
	}
	if got := hitsByLabel(srv)["shared"]; got != [4]int64{shared, conns*perOwn - shared, 0, 0} {
		t.Errorf("shared hits = %v", got)
	}
}

// TestPolicyReloadUnderLoad: while clients on both protocols hit without
// pause, the rule file flips between two versions, with bad files in
// between. No request fails, every reply comes from one version, and every
// canary counted belongs to the same version as the reply of its request.
func TestPolicyReloadUnderLoad(t *testing.T) {
	version := func(n int) string {
		return fmt.Sprintf(`[path=/x]
creditLimit = 5
resetSeconds = 0
matchPolicy = canary
label = canary-%d

[path=/x]
creditLimit = %d
resetSeconds = 0
label = rule-%d

[default]
creditLimit = 0
resetSeconds = 0
`, n, 100*n, n)
	}
	path := policyFile(t, "p.ini", version(1))
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}})
	addr := startDivvy(t, srv)
	stop := make(chan struct{})
	var seen [3]atomic.Int64 // replies from version 1 and 2
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	check := func(reply string) bool {
		switch reply {
		case "OK true 100 0":
			seen[1].Add(1)
		case "OK true 200 0":
			seen[2].Add(1)
		default:
			errs <- fmt.Errorf("reply %q from neither version", reply)
			return false
		}
		return true
	}
	for range 4 {
		wg.Go(func() {
			c := dialLine(t, addr)
			for {
				select {
				case <-stop:
					return
				default:
				}
				c.conn.Write([]byte("HIT path=/x\nHIT path=/x\n"))
				for range 2 {
					l, err := c.r.ReadString('\n')
					if err != nil {
						errs <- err
						return
					}
					if !check(strings.TrimSuffix(l, "\n")) {
						return
					}
				}
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			c := newClient(t, srv)
			for {
				select {
				case <-stop:
					return
				default:
				}
				v, err := c.Do(context.Background(), "HIT", "path=/x").Slice()
				if err != nil {
					errs <- err
					return
				}
				if !check(fmt.Sprintf("OK %t %d %d", v[0].(int64) == 1, v[1], v[2])) {
					return
				}
			}
		})
	}
	c := newClient(t, srv)
	for i := range 60 {
		text := version(1 + i%2)
		if i%5 == 4 {
			text = "[path=/x]\ncreditLimit = -1\nresetSeconds = 0\n" // bad: kept the old rules
		}
		if err := os.WriteFile(path+".tmp", []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
		err := c.Do(context.Background(), "POLICY", "RELOAD").Err()
		if (err != nil) != (i%5 == 4) {
			t.Fatalf("reload %d: %v", i, err)
		}
		// Let some hits run under each version.
		for n := seen[1].Load() + seen[2].Load(); seen[1].Load()+seen[2].Load() < n+50; {
			time.Sleep(time.Millisecond)
			select {
			case err := <-errs:
				t.Fatal(err)
			default:
			}
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	hits := hitsByLabel(srv)
	for v := 1; v <= 2; v++ {
		rule, canary := hits["rule-"+strconv.Itoa(v)], hits["canary-"+strconv.Itoa(v)]
		if rule[0] != seen[v].Load() || canary[2] != seen[v].Load() {
			t.Errorf("version %d: %d replies, rule counted %d, its canary %d: a request mixed two versions", v, seen[v].Load(), rule[0], canary[2])
		}
		if seen[v].Load() == 0 {
			t.Errorf("no reply came from version %d", v)
		}
	}
	if n := srv.pol.ReloadFailures.Load(); n != 12 {
		t.Errorf("failed reloads = %d, want 12", n)
	}
}

func TestPolicyCommands(t *testing.T) {
	path := policyFile(t, "p.ini", "[method=GET path=/x ip=*]\ncreditLimit = 3\nresetSeconds = 60\nactorField = ip\nlabel = x\ncomment = 'three a minute'\n\n"+
		"[path=/y]\ncreditLimit = 10\nresetSeconds = 1\nalgorithm = gcra\nburst = 5\nquotaField = quota\nmaxQuota = 100\n\n"+
		"[path=/z]\ncreditLimit = 10\nresetSeconds = 1\nalgorithm = fixedWindow\nstagger = true\n\n"+
		"[path=/w]\ncreditLimit = 10\nresetSeconds = 1\nalgorithm = slidingLog\nminGapMillis = 20\n\n"+
		"[default]\ncreditLimit = 1\nresetSeconds = 0\n")
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}})
	c := newClient(t, srv)
	ctx := context.Background()
	v, err := c.Do(ctx, "POLICY", "SHOW").Slice()
	if err != nil {
		t.Fatal(err)
	}
	want := "[[position 1 operation [method=GET path=/x ip=*] creditLimit 3 resetSeconds 60 algorithm divvy stagger false burst 0 minGapMillis 0 quotaField  maxQuota 0 actorField ip matchPolicy stop shadow false label x comment three a minute limitSource file effectiveCreditLimit 3 effectiveResetSeconds 60 limitProblem  overrides 0] " +
		"[position 2 operation [path=/y] creditLimit 10 resetSeconds 1 algorithm gcra stagger false burst 5 minGapMillis 0 quotaField quota maxQuota 100 actorField  matchPolicy stop shadow false label  comment  limitSource file effectiveCreditLimit 10 effectiveResetSeconds 1 limitProblem  overrides 0] " +
		"[position 3 operation [path=/z] creditLimit 10 resetSeconds 1 algorithm fixedWindow stagger true burst 0 minGapMillis 0 quotaField  maxQuota 0 actorField  matchPolicy stop shadow false label  comment  limitSource file effectiveCreditLimit 10 effectiveResetSeconds 1 limitProblem  overrides 0] " +
		"[position 4 operation [path=/w] creditLimit 10 resetSeconds 1 algorithm slidingLog stagger false burst 0 minGapMillis 20 quotaField  maxQuota 0 actorField  matchPolicy stop shadow false label  comment  limitSource file effectiveCreditLimit 10 effectiveResetSeconds 1 limitProblem  overrides 0] " +
		"[position 5 operation [default] creditLimit 1 resetSeconds 0 algorithm divvy stagger false burst 0 minGapMillis 0 quotaField  maxQuota 0 actorField  matchPolicy stop shadow false label  comment  limitSource file effectiveCreditLimit 1 effectiveResetSeconds 0 limitProblem  overrides 0]]"
	if got := fmt.Sprint(v); got != want {
		t.Fatalf("POLICY SHOW:\n got %s\nwant %s", got, want)
	}
	// A bad file: the error names it, the rule and the problem; the rules stay.
	if err := os.WriteFile(path, []byte("[a=1]\ncreditLimit = 1\nresetSeconds = 1\n\n[default]\ncreditLimit = 1\nresetSeconds = 1\nlabel = bad label\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = c.Do(ctx, "POLICY", "RELOAD").Err()
	if err == nil || !strings.Contains(err.Error(), path+":8: rule 2 [default]: label ") || !strings.Contains(err.Error(), "rules in use are kept") {
		t.Fatalf("POLICY RELOAD of a bad file: %v", err)
	}
	if v, _ := c.Do(ctx, "POLICY", "SHOW").Slice(); len(v) != 5 {
		t.Fatalf("rules after a failed reload: %v", v)
	}
	info, err := c.Info(ctx, "policy").Result()
	if err != nil || !strings.Contains(info, "policy_reload_failures:1") || !strings.Contains(info, "policy_rules:5") {
		t.Fatalf("INFO policy: %q, %v", info, err)
	}
	if err := c.Do(ctx, "POLICY", "LIST").Err(); err == nil || !strings.Contains(err.Error(), "expected POLICY RELOAD, POLICY SHOW, POLICY LIMIT") {
		t.Fatalf("POLICY LIST: %v", err)
	}

	// Without a policy, HIT and POLICY say how to get one.
	bare := startServer(t, Config{})
	bc := newClient(t, bare)
	for _, args := range [][]any{{"HIT", "a=b"}, {"POLICY", "SHOW"}, {"POLICY", "RELOAD"}} {
		if err := bc.Do(ctx, args...).Err(); err == nil || !strings.Contains(err.Error(), "--policy FILE") {
			t.Errorf("%v without a policy: %v", args, err)
		}
	}
}

func TestBadPolicyFileStopsNew(t *testing.T) {
	store, err := storage.Open(t.TempDir(), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	path := policyFile(t, "p.ini", "[a=1]\ncreditLimit = 1\nresetSeconds = 1\n")
	_, err = New(Config{Store: store, Policy: policycmd.Config{File: path}})
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "default") {
		t.Fatalf("New with a file lacking a default: %v", err)
	}
}

// TestSweepDropsEndedWindows: counters are stored records, and the sweep
// deletes those whose window has ended, keeping live ones.
func TestSweepDropsEndedWindows(t *testing.T) {
	path := policyFile(t, "p.ini", "[path=/a ip=*]\ncreditLimit = 2\nresetSeconds = 60\nactorField = ip\n\n[path=/b]\ncreditLimit = 2\nresetSeconds = 3600\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n")
	clock := newTestClock(t0)
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: clock.now})
	c := dialLine(t, startDivvy(t, srv))
	c.send("HIT path=/a ip=1\nHIT path=/a ip=2\nHIT path=/b\nHIT path=/c\n")
	for range 4 {
		c.line()
	}
	rc := newClient(t, srv)
	ctx := context.Background()
	dbsize := func() int64 {
		n, err := rc.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := dbsize(); n != 3 {
		t.Fatalf("DBSIZE after hits on three counters = %d, want 3 (always-deny touches none)", n)
	}
	clock.ms.Store(t0 + 60_000)
	if err := rc.Do(ctx, "COMPACT").Err(); err != nil {
		t.Fatal(err)
	}
	if n := dbsize(); n != 1 {
		t.Fatalf("DBSIZE after the minute windows ended = %d, want 1", n)
	}
	c.send("HIT path=/b\nHIT path=/a ip=1\n")
	if got := c.line() + "|" + c.line(); got != "OK true 0 3540|OK true 1 60" {
		t.Fatalf("after the sweep: %q", got)
	}
}

func TestLineProtocolLimits(t *testing.T) {
	path := policyFile(t, "p.ini", "[default]\ncreditLimit = 1\nresetSeconds = 0\n")
	t.Run("idle timeout", func(t *testing.T) {
		srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Divvy: divvy.Config{IdleTimeout: 50 * time.Millisecond}})
		c := dialLine(t, startDivvy(t, srv))
		c.send("HIT\n")
		if got := c.line(); got != "OK true 1 0" {
			t.Fatalf("HIT: %q", got)
		}
		c.closed() // returns when the server closes the idle connection
		if n := srv.stats.IdleClosed.Load(); n != 1 {
			t.Fatalf("idle closed = %d, want 1", n)
		}
	})
	t.Run("maxclients is shared with RESP", func(t *testing.T) {
		srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Listen: admit.Config{MaxClients: 2}})
		addr := startDivvy(t, srv)
		newClient(t, srv).Ping(context.Background())
		c := dialLine(t, addr)
		c.send("HIT\n")
		c.line()
		extra := dialLine(t, addr)
		if got, err := io.ReadAll(extra.r); err != nil || string(got) != `ERR unknown "max number of clients reached"`+"\n" {
			t.Fatalf("third client: %q, %v", got, err)
		}
	})
	t.Run("pipeline bound", func(t *testing.T) {
		// Rounds of at most 3 lines: 10 pipelined lines still get 10
		// replies, in order.
		srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Divvy: divvy.Config{MaxPipeline: 3}})
		c := dialLine(t, startDivvy(t, srv))
		c.send(strings.Repeat("HIT\n", 10))
		for i := range 10 {
			if got := c.line(); got != "OK true 1 0" {
				t.Fatalf("reply %d: %q", i, got)
			}
		}
	})
	t.Run("shutdown closes idle connections", func(t *testing.T) {
		srv := startServer(t, Config{Policy: policycmd.Config{File: path}})
		c := dialLine(t, startDivvy(t, srv))
		c.send("HIT\n")
		c.line()
		srv.Close()
		c.closed()
	})
}

// BenchmarkHitLine measures a pipelined HIT over the line protocol on a
// counted rule, end to end, and its allocations.
func BenchmarkHitLine(b *testing.B) {
	path := policyFile(b, "p.ini", "[path=/x ip=*]\ncreditLimit = 1000000000\nresetSeconds = 3600\nactorField = ip\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n")
	srv := startServer(b, Config{Policy: policycmd.Config{File: path}})
	c := dialLine(b, startDivvy(b, srv))
	const depth = 16
	var req strings.Builder
	for i := range depth {
		fmt.Fprintf(&req, "HIT path=/x ip=10.0.0.%d\n", i)
	}
	batch := []byte(req.String())
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += depth {
		if _, err := c.conn.Write(batch); err != nil {
			b.Fatal(err)
		}
		for range depth {
			if _, err := c.r.ReadSlice('\n'); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// FuzzDivvyLines sends arbitrary bytes to the line protocol: the server
// answers only whole reply lines, OK lines then at most one ERR line last,
// and never hangs or crashes.
func FuzzDivvyLines(f *testing.F) {
	path := policyFile(f, "p.ini", "[path=/x ip=*]\ncreditLimit = 3\nresetSeconds = 60\nactorField = ip\n\n[path=/y]\ncreditLimit = 1\nresetSeconds = 0\nmatchPolicy = canary\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n")
	srv := startServer(f, Config{Policy: policycmd.Config{File: path}, Divvy: divvy.Config{MaxLine: 256, MaxPipeline: 4}})
	addr := startDivvy(f, srv)
	for _, seed := range []string{
		"HIT path=/x ip=1\n", "hit\r\n\r\nHIT path=/y\n", "HIT \"a b\"=\"c=d\"\nHIT x=\"\n", "PING\nHIT\n",
		"HIT a=b c", "HIT a=\"b\"c=d\n", strings.Repeat("HIT path=/x ip=2\n", 9), "\x00\xff=\n", strings.Repeat("x", 300),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		go func() {
			conn.Write(in) // fails once the server closes after an ERR
			conn.(*net.TCPConn).CloseWrite()
		}()
		out, err := io.ReadAll(conn)
		if err != nil && !strings.Contains(err.Error(), "reset by peer") {
			t.Fatalf("reading the replies: %v", err)
		}
		if len(out) > 0 && out[len(out)-1] != '\n' {
			t.Fatalf("a reply is not a whole line: %q", out)
		}
		lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		for i, l := range lines {
			switch {
			case l == "" && len(out) == 0:
			case strings.HasPrefix(l, "OK "):
				var ok bool
				var n, secs int64
				if _, err := fmt.Sscanf(l, "OK %t %d %d", &ok, &n, &secs); err != nil {
					t.Fatalf("reply %q: %v", l, err)
				}
			case strings.HasPrefix(l, "ERR unknown"):
				if i != len(lines)-1 {
					t.Fatalf("replies after an ERR: %q", out)
				}
			default:
				t.Fatalf("reply %q is neither OK nor ERR", l)
			}
		}
	})
}

// An idle connection whose last command was a big HIT holds a few KiB: the
// parsed fields of a HIT point into the pipeline's buffer, so keeping them
// (even beyond len, or after a parse error) kept the whole command; and a
// counter key built from a big actor value was kept as well.
func TestIdleConnectionsLetBigHITsGo(t *testing.T) {
	const size = 7 << 20
	// Made when sent, so that the test's own copies are not in the heap
	// measured before.
	cmds := []struct {
		name string
		cmd  func(big []byte) []byte
	}{
		{"big value", func(big []byte) []byte {
			return respCommand([]byte("HIT"), []byte("method=GET"), append([]byte("path="), big...))
		}},
		// The store refuses writes (below), so the counter key is built
		// and the hit refused before anything is stored: the heap measured
		// holds no big record.
		{"big actor value", func(big []byte) []byte {
			return respCommand([]byte("HIT"), []byte("method=GET"), []byte("path=/pantry/x"), append([]byte("ip="), big...))
		}},
		{"parse error after a field", func(big []byte) []byte {
			return respCommand([]byte("HIT"), []byte("method=GET"), big)
		}},
	}
	disk := storage.NewMemDisk()
	store, err := storage.Open("db", storage.Options{Sync: storage.SyncAlways, Disk: disk})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "policy", "testdata", "example-config.ini")
	srv, err := New(Config{Store: store, Policy: policycmd.Config{File: path}, Engine: engine.Tuning{MaxKeySize: 8 << 20}, RESP: respserver.Tuning{MaxBulk: 8 << 20, MaxQueryBuffer: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, store)
	conns := make([]*rawClient, 2*len(cmds))
	for i := range conns {
		conns[i] = dialRaw(t, srv)
		conns[i].write([]byte("PING\r\n"))
		conns[i].expect("+PONG")
	}
	disk.FailWrites(fmt.Errorf("injected: %w", syscall.ENOSPC))
	conns[0].write([]byte("RL.REDUCE k 10 60\r\n"))
	if r := conns[0].reply(); !strings.HasPrefix(r, "-ERR store unavailable") {
		t.Fatalf("RL.REDUCE on a failing disk: %q, want the store unavailable", r)
	}
	before := heapInuse()
	for i, c := range conns {
		cmd := cmds[i%len(cmds)]
		c.write(cmd.cmd(bytes.Repeat([]byte("x"), size)))
		if r := c.reply(); r != "*3" && !strings.HasPrefix(r, "-ERR HIT argument 2 is not key=value") && !strings.HasPrefix(r, "-ERR store unavailable") {
			t.Fatalf("%s: reply %.80q", cmd.name, r)
		}
		// Served after the HIT's pipeline is done with, buffers included.
		c.write([]byte("PING\r\n"))
		c.expect("+PONG")
	}
	grew := heapInuse() - before
	disk.FailWrites(nil)
	for store.Unavailable() != nil { // the retried write goes through, so the store closes cleanly
		time.Sleep(time.Millisecond)
	}
	t.Logf("%d idle clients that each sent a %d MiB HIT: server heap grew %d KiB; client buffers counted: %d KiB",
		len(conns), size>>20, grew>>10, srv.stats.ClientMem.Load()>>10)
	if grew > 2<<20 {
		t.Fatalf("heap grew %d KiB after the HITs were answered; idle connections should hold a few KiB each", grew>>10)
	}
}

// The buffers a HIT keeps between pipelines are counted against
// --maxmemory-clients like the connection's others.
func TestClientMemoryCountsHitBuffers(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "example-config.ini")
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}})
	// 128 fields of 6 bytes: a command of under 2 KiB whose parsed fields
	// (two slice headers each) take 6 KiB, under connKeepBuf, so kept.
	const fields = 128
	args := [][]byte{nil}
	for i := range fields {
		args = append(args, fmt.Appendf(nil, "k%03d=v", i))
	}
	// grew is how much the client buffers grew for a command of name and
	// args, sent alone on a new connection.
	grew := func(name, reply string) int64 {
		c := dialRaw(t, srv)
		defer c.conn.Close()
		c.write([]byte("PING\r\n"))
		c.expect("+PONG")
		before := srv.stats.ClientMem.Load()
		args[0] = []byte(name)
		c.write(respCommand(args...))
		if r := c.reply(); !strings.HasPrefix(r, reply) {
			t.Fatalf("%s: reply %q, want %q...", name, r, reply)
		}
		c.write([]byte("PING\r\n"))
		c.expect("+PONG")
		return srv.stats.ClientMem.Load() - before
	}
	// ECHO with as many arguments is refused: it grows the same framing
	// buffers, not the HIT's.
	hit, echo := grew("HIT", "*3"), grew("ECHO", "-ERR wrong number of arguments")
	t.Logf("a command of %d arguments: client buffers grew %d bytes for HIT, %d for ECHO", fields+1, hit, echo)
	if want := int64(fields * engine.FieldSize); hit-echo < want {
		t.Fatalf("client buffers grew %d bytes after a HIT of %d fields and %d after an ECHO as long; the HIT's parsed fields alone take %d",
			hit, fields, echo, want)
	}
}
