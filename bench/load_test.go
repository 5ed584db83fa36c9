package main

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// parseArray reads one RESP array of bulk strings, as a server would.
func parseArray(t *testing.T, r *bufio.Reader) []string {
	t.Helper()
	line, err := r.ReadString('\n')
	if err != nil || line[0] != '*' {
		t.Fatalf("array header %q, %v", line, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil {
		t.Fatal(err)
	}
	args := make([]string, n)
	for i := range args {
		h, err := r.ReadString('\n')
		if err != nil || h[0] != '$' {
			t.Fatalf("bulk header %q, %v", h, err)
		}
		size, _ := strconv.Atoi(strings.TrimSpace(h[1:]))
		buf := make([]byte, size+2)
		if _, err := readFull(r, buf); err != nil || string(buf[size:]) != "\r\n" {
			t.Fatalf("bulk body %q, %v", buf, err)
		}
		args[i] = string(buf[:size])
	}
	return args
}

func TestCommandsAreWellFormed(t *testing.T) {
	w := workload{Take: 2, Max: 100, RefillMs: 60000}
	var b []byte
	b = appendCommand(b, targetSluice, w, 42, opReduce, 0, 0, "")
	b = appendCommand(b, targetSluice, w, 7, opGet, 0, 0, "")
	b = appendCommand(b, targetSluice, w, 12345, opHit, 0, 0, "")
	b = appendCommand(b, targetRedisINCR, w, 9, opReduce, 0, 0, "")
	b = appendCommand(b, targetRedisLua, w, 3, opReduce, 0, 0, "abc123")
	b = appendCommand(b, targetRedisLua, w, 3, opGet, 0, 0, "abc123")
	r := bufio.NewReader(bytes.NewReader(b))
	want := []string{
		"RL.PREDUCE k:42 100 60000 TAKE 2",
		"RL.PGET k:7 100 60000",
		"HIT path=/bench ip=k:12345",
		"INCR k:9",
		"EVALSHA abc123 1 k:3 100 60000 100 2",
		"EVALSHA abc123 1 k:3 100 60000 100 0",
	}
	for _, w := range want {
		if got := strings.Join(parseArray(t, r), " "); got != w {
			t.Fatalf("got %q, want %q", got, w)
		}
	}
	if r.Buffered() != 0 {
		t.Fatalf("%d trailing bytes", r.Buffered())
	}
}

func TestKeyDistributions(t *testing.T) {
	var seq atomic.Int64
	for _, dist := range []string{"uniform", "zipf", "seq"} {
		g := newKeyGen(workload{Keys: 1000, Dist: dist, ZipfS: 1.2}, 1, &seq)
		seen := map[int64]int{}
		for range 5000 {
			k := g.next()
			if k < 0 || k >= 1000 {
				t.Fatalf("%s: key %d outside [0, 1000)", dist, k)
			}
			seen[k]++
		}
		switch dist {
		case "seq":
			if len(seen) != 1000 {
				t.Fatalf("seq visited %d keys, want all 1000", len(seen))
			}
		case "zipf":
			if seen[0] < 500 {
				t.Fatalf("zipf: key 0 drawn %d times of 5000; not skewed", seen[0])
			}
		}
	}
}

func TestReadReply(t *testing.T) {
	r := bufio.NewReader(strings.NewReader(":5\r\n-ERR nope\r\n$3\r\nabc\r\n*2\r\n:1\r\n:2\r\n%1\r\n+a\r\n:1\r\n$-1\r\n"))
	for i, wantErr := range []bool{false, true, false, false, false, false} {
		isErr, _, err := readReply(r)
		if err != nil || isErr != wantErr {
			t.Fatalf("reply %d: isErr=%v err=%v", i, isErr, err)
		}
	}
}

func TestScenarioPresetsValid(t *testing.T) {
	o := options{w: workload{Take: 1, Max: 100, RefillMs: 60000, ZipfS: 1.2}, set: map[string]bool{}}
	for _, s := range scenarios {
		if err := validate(o.overrides(s.W)); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
	}
	for _, g := range []string{groupMain, groupLimiters, groupRoll, groupRollMem} {
		if _, ok := docsParts[g]; !ok || len(group(g)) == 0 {
			t.Errorf("group %q: no docs part or no scenario", g)
		}
	}
}

func TestValidateRefusesMismatchedLimiterFlags(t *testing.T) {
	ok := workload{Conns: 1, Pipeline: 1, Requests: 1, Keys: 2, Dist: "uniform", Take: 1, Max: 100, RefillMs: 60000}
	for _, c := range []struct {
		name string
		edit func(*workload)
	}{
		{"unknown command", func(w *workload) { w.Command = "CL.NOPE" }},
		{"RL.PGET mixed into FW.PINCR", func(w *workload) { w.Command, w.GetPct = cmdFWPIncr, 10 }},
		{"CL.THROTTLE with a period that is not whole seconds", func(w *workload) { w.Command, w.RefillMs = cmdCLThrottle, 1500 }},
		{"a negative rate", func(w *workload) { w.Rate = -1 }},
		{"a rate that is not a number", func(w *workload) { w.Rate = math.NaN() }},
	} {
		w := ok
		c.edit(&w)
		if err := validate(w); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	w := ok
	w.Command, w.RefillMs = cmdCLPThrottle, 1500
	if err := validate(w); err != nil {
		t.Errorf("CL.PTHROTTLE with 1500 ms: %v", err)
	}
}

// TestLimiterCommandsAreWellFormed pins the exact bytes each new scenario
// sends, sluice's and the Redis rows', since sluice may not know the
// commands yet where the harness is built.
func TestLimiterCommandsAreWellFormed(t *testing.T) {
	base := workload{Take: 1, Max: 100, RefillMs: 60000}
	with := func(cmd string, take int64) workload {
		w := base
		w.Command, w.Take = cmd, take
		return w
	}
	cases := []struct {
		t    target
		w    workload
		want string
	}{
		{targetSluice, with(cmdCLThrottle, 1), "*6\r\n$11\r\nCL.THROTTLE\r\n$4\r\nk:42\r\n$3\r\n100\r\n$3\r\n100\r\n$2\r\n60\r\n$1\r\n1\r\n"},
		{targetSluice, with(cmdCLPThrottle, 2), "*6\r\n$12\r\nCL.PTHROTTLE\r\n$4\r\nk:42\r\n$3\r\n100\r\n$3\r\n100\r\n$5\r\n60000\r\n$1\r\n2\r\n"},
		{targetSluice, with(cmdFWPIncr, 1), "*4\r\n$8\r\nFW.PINCR\r\n$4\r\nk:42\r\n$3\r\n100\r\n$5\r\n60000\r\n"},
		{targetSluice, with(cmdFWPIncr, 3), "*6\r\n$8\r\nFW.PINCR\r\n$4\r\nk:42\r\n$3\r\n100\r\n$5\r\n60000\r\n$4\r\nCOST\r\n$1\r\n3\r\n"},
		{targetSluice, with(cmdFWIncr, 1), "*4\r\n$7\r\nFW.INCR\r\n$4\r\nk:42\r\n$3\r\n100\r\n$2\r\n60\r\n"},
		{targetRedisCell, with(cmdCLPThrottle, 1), "*6\r\n$11\r\nCL.THROTTLE\r\n$4\r\nk:42\r\n$3\r\n100\r\n$3\r\n100\r\n$2\r\n60\r\n$1\r\n1\r\n"},
		{targetRedisFW, with(cmdFWPIncr, 1), "*2\r\n$4\r\nINCR\r\n$25\r\nratelimit/k:42/1700000040\r\n" +
			"*4\r\n$6\r\nEXPIRE\r\n$25\r\nratelimit/k:42/1700000040\r\n$2\r\n60\r\n$2\r\nNX\r\n"},
		{targetRedisFW, with(cmdFWPIncr, 3), "*3\r\n$6\r\nINCRBY\r\n$25\r\nratelimit/k:42/1700000040\r\n$1\r\n3\r\n" +
			"*4\r\n$6\r\nEXPIRE\r\n$25\r\nratelimit/k:42/1700000040\r\n$2\r\n60\r\n$2\r\nNX\r\n"},
		{targetRedisFWMulti, with(cmdFWPIncr, 1), "*1\r\n$5\r\nMULTI\r\n" +
			"*2\r\n$4\r\nINCR\r\n$25\r\nratelimit/k:42/1700000040\r\n" +
			"*4\r\n$6\r\nEXPIRE\r\n$25\r\nratelimit/k:42/1700000040\r\n$2\r\n60\r\n$2\r\nNX\r\n" +
			"*1\r\n$4\r\nEXEC\r\n"},
		{targetRedisFWLua, with(cmdFWPIncr, 1), "*6\r\n$7\r\nEVALSHA\r\n$6\r\nabc123\r\n$1\r\n1\r\n$25\r\nratelimit/k:42/1700000040\r\n$1\r\n1\r\n$5\r\n60000\r\n"},
	}
	const nowUs = 1700000059_000000 // in the window that starts at 1700000040
	for _, c := range cases {
		got := string(appendCommand(nil, c.t, c.w, 42, opReduce, nowUs, 0, "abc123"))
		if got != c.want {
			t.Errorf("%s with %s (take %d):\n got %q\nwant %q", c.t, c.w.command(), c.w.Take, got, c.want)
		}
		// The bytes parse as RESP arrays, as many as the target's replies
		// (MULTI's four commands get four).
		r := bufio.NewReader(strings.NewReader(got))
		for range c.t.replies() {
			parseArray(t, r)
		}
		if r.Buffered() != 0 {
			t.Errorf("%s: %d bytes beyond its %d commands", c.t, r.Buffered(), c.t.replies())
		}
	}
}

func TestWindowStartIsAligned(t *testing.T) {
	w := workload{RefillMs: 60000}
	for _, c := range []struct{ now, want int64 }{{1700000040, 1700000040}, {1700000099, 1700000040}, {1700000100, 1700000100}} {
		if got := w.windowStart(time.Unix(c.now, 0)); got != c.want {
			t.Errorf("windowStart(%d) = %d, want %d", c.now, got, c.want)
		}
	}
}

func TestRequestText(t *testing.T) {
	w := workload{Command: cmdFWPIncr, Take: 1, Max: 100, RefillMs: 60000}
	for tg, want := range map[target]string{
		targetSluice:       "FW.PINCR k:<id> 100 60000",
		targetRedisFWMulti: "MULTI; INCR ratelimit/k:<id>/<window>; EXPIRE ratelimit/k:<id>/<window> 60 NX; EXEC",
		targetRedisFWLua:   "EVALSHA <sha> 1 ratelimit/k:<id>/<window> 1 60000",
	} {
		if got := requestText(tg, w); got != want {
			t.Errorf("%s: %q, want %q", tg, got, want)
		}
	}
	w = workload{Command: cmdRollLimit, Max: 10, RefillMs: 60000}
	for tg, want := range map[target]string{
		targetSluice:    "ROLL.LIMIT k:<id> 60000 10",
		targetRedisRoll: "MULTI; ZREMRANGEBYSCORE k:<id> 0 <now-interval>; ZADD k:<id> <now> <uuid>; ZRANGE k:<id> 0 -1 WITHSCORES; EXPIRE k:<id> 60; EXEC",
	} {
		if got := requestText(tg, w); got != want {
			t.Errorf("%s: %q, want %q", tg, got, want)
		}
	}
}

// fakeServer answers each RESP command it reads with reply(name), and
// counts the commands.
func fakeServer(t *testing.T, reply func(name string) string) (addr string, commands *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	commands = &atomic.Int64{}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				r := bufio.NewReader(c)
				w := bufio.NewWriter(c)
				for {
					args, err := readArray(r)
					if err != nil {
						return
					}
					commands.Add(1)
					w.WriteString(reply(strings.ToUpper(args[0])))
					if r.Buffered() == 0 {
						if w.Flush() != nil {
							return
						}
					}
				}
			})
		}
	})
	return ln.Addr().String(), commands
}

// readArray is parseArray for the fake server's goroutines, which must not
// call t.Fatal.
func readArray(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if line[0] != '*' {
		return nil, fmt.Errorf("array header %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 1 {
		return nil, fmt.Errorf("array header %q", line)
	}
	args := make([]string, n)
	for i := range args {
		h, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(h[1:]))
		if err != nil {
			return nil, err
		}
		buf := make([]byte, size+2)
		if _, err := readFull(r, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}

// TestRunFailsOnErrorReplies: a server that refuses the workload's command
// (here, one that does not know it) ends the run with an error that quotes
// the reply, instead of a throughput of refusals.
func TestRunFailsOnErrorReplies(t *testing.T) {
	addr, _ := fakeServer(t, func(name string) string {
		return "-ERR unknown command '" + name + "'\r\n"
	})
	w := workload{Conns: 4, Pipeline: 16, Requests: 100_000, Keys: 1000, Dist: "uniform", Take: 1, Max: 100, RefillMs: 60000}
	res, err := run(addr, targetSluice, w, "")
	if err == nil {
		t.Fatalf("run against a server that answers every command with an error: no error, %d requests, %d errors", res.Requests, res.Errors)
	}
	if !strings.Contains(err.Error(), "ERR unknown command 'RL.PREDUCE'") {
		t.Fatalf("the error does not quote the reply: %v", err)
	}
	if res.Requests >= w.Requests {
		t.Errorf("the run went on to all %d requests after the first error", res.Requests)
	}
}

// TestRunFailsWhenTheServerHangsUp: a server that closes connections
// instead of answering (as one does on a protocol error) ends the run with
// an error, not with a short run that looks like a measurement.
func TestRunFailsWhenTheServerHangsUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// Read the first round trip's four commands, so that the close
			// is a clean end of stream (unread data would make it a reset),
			// and hang up without a reply.
			go func() {
				r := bufio.NewReader(c)
				for range 4 {
					if _, err := readArray(r); err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
	w := workload{Conns: 2, Pipeline: 4, Requests: 1000, Keys: 100, Dist: "uniform", Take: 1, Max: 100, RefillMs: 60000}
	res, err := run(ln.Addr().String(), targetSluice, w, "")
	if err == nil {
		t.Fatalf("run against a server that hangs up: no error, %d requests", res.Requests)
	}
}

// TestRunReadsEveryReplyOfARequest: a request of two or four commands
// (INCR+EXPIRE, MULTI/EXEC) is one request, and all its replies are read,
// so that the connection stays in step and the count is right.
func TestRunReadsEveryReplyOfARequest(t *testing.T) {
	addr, commands := fakeServer(t, func(name string) string {
		switch name {
		case "MULTI":
			return "+OK\r\n"
		case "EXEC":
			return "*2\r\n:1\r\n:1\r\n"
		case "CL.THROTTLE", "CL.PTHROTTLE":
			return "*5\r\n:0\r\n:101\r\n:100\r\n:-1\r\n:1\r\n"
		case "FW.PINCR", "FW.INCR":
			return "*7\r\n:0\r\n:100\r\n:99\r\n:-1\r\n:60000\r\n:1\r\n:1700000060000\r\n"
		case "EVALSHA":
			return "*2\r\n:1\r\n:60000\r\n"
		case "ZREMRANGEBYSCORE", "ZADD", "ZRANGE", "EXPIRE":
			return "+QUEUED\r\n"
		case "ROLL.LIMIT":
			return "*5\r\n:0\r\n:0\r\n:0\r\n:0\r\n:9\r\n"
		}
		return ":1\r\n"
	})
	for _, c := range []struct {
		t   target
		cmd string
	}{
		{targetSluice, cmdCLThrottle}, {targetSluice, cmdCLPThrottle}, {targetSluice, cmdFWPIncr},
		{targetRedisCell, cmdCLThrottle}, {targetRedisFW, cmdFWPIncr}, {targetRedisFWMulti, cmdFWPIncr}, {targetRedisFWLua, cmdFWPIncr},
		{targetSluice, cmdRollLimit}, {targetRedisRoll, cmdRollLimit},
	} {
		w := workload{Command: c.cmd, Conns: 3, Pipeline: 7, Requests: 1000, Keys: 100, Dist: "uniform", Take: 1, Max: 100, RefillMs: 60000}
		before := commands.Load()
		res, err := run(addr, c.t, w, "abc123")
		if err != nil {
			t.Fatalf("%s: %v", targetName(c.t, w), err)
		}
		sent := commands.Load() - before
		if res.Requests != w.Requests || sent != w.Requests*int64(c.t.replies()) {
			t.Errorf("%s: %d requests, %d commands; want %d and %d", targetName(c.t, w), res.Requests, sent, w.Requests, w.Requests*int64(c.t.replies()))
		}
	}
}

// TestWriteDocsKeepsEachGroupApart: a limiters run rewrites its own part
// of the page and chart, and leaves the main scenarios' part alone.
func TestWriteDocsKeepsEachGroupApart(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/benchmarks.md"
	main := "# Benchmarks\n\n" + beginMarker + "\nmain figures\n" + endMarker + "\n\n## Profile findings\n\nfindings\n"
	if err := os.WriteFile(path, []byte(main), 0o644); err != nil {
		t.Fatal(err)
	}
	h := hdrhistogram.New(1, 60_000_000, 3)
	h.RecordValue(1000)
	sc, _ := findScenario("window")
	sc.W.Take, sc.W.Max, sc.W.RefillMs = 1, 100, 60000 // the flags' defaults
	rep := scenarioReport{Scenario: sc, Pinned: true, Results: []result{
		{Target: targetRedisFW, Requests: 1, Elapsed: time.Millisecond, Hist: h, CPU: 3 * time.Microsecond},
		{Target: targetSluice, Requests: 1, Elapsed: time.Millisecond, Hist: h, CPU: 4 * time.Microsecond},
	}}
	if err := writeDocs(path, []scenarioReport{rep}, []string{"--scenario", "window"}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(got)
	part := docsParts[groupLimiters]
	i, j, k := strings.Index(doc, part.begin), strings.Index(doc, part.end), strings.Index(doc, "## Profile findings")
	switch {
	case !strings.Contains(doc, beginMarker+"\nmain figures\n"+endMarker):
		t.Errorf("the main part changed:\n%s", doc)
	case i < 0 || j < i || k < j:
		t.Errorf("the limiters part is missing or not before Profile findings:\n%s", doc)
	case !strings.Contains(doc[i:j], "| sluice FW.PINCR |") || !strings.Contains(doc[i:j], "- redis INCR+EXPIRE: `INCR ratelimit/k:<id>/<window>; EXPIRE ratelimit/k:<id>/<window> 60 NX`"):
		t.Errorf("the limiters part lacks its rows:\n%s", doc[i:j])
	}
	if _, err := os.Stat(dir + "/benchmarks-limiters.png"); err != nil {
		t.Errorf("chart: %v", err)
	}
}

// TestRollCommandsAreWellFormed pins the bytes of the sliding-log rows:
// sluice's ROLL.LIMIT, and what rolling-rate-limiter's RedisRateLimiter
// sends for one limit(id), scores and the cut-off in µs, the TTL in whole
// seconds rounded up.
func TestRollCommandsAreWellFormed(t *testing.T) {
	w := workload{Command: cmdRollLimit, Take: 1, Max: 10, RefillMs: 60500}
	const now = 1700000059123456
	if got, want := string(appendCommand(nil, targetSluice, w, 42, opReduce, now, 7, "")),
		"*4\r\n$10\r\nROLL.LIMIT\r\n$4\r\nk:42\r\n$5\r\n60500\r\n$2\r\n10\r\n"; got != want {
		t.Errorf("sluice:\n got %q\nwant %q", got, want)
	}
	member := string(appendMember(nil, 7))
	want := "*1\r\n$5\r\nMULTI\r\n" +
		"*4\r\n$16\r\nZREMRANGEBYSCORE\r\n$4\r\nk:42\r\n$1\r\n0\r\n$16\r\n1699999998623456\r\n" +
		"*4\r\n$4\r\nZADD\r\n$4\r\nk:42\r\n$16\r\n1700000059123456\r\n$36\r\n" + member + "\r\n" +
		"*5\r\n$6\r\nZRANGE\r\n$4\r\nk:42\r\n$1\r\n0\r\n$2\r\n-1\r\n$10\r\nWITHSCORES\r\n" +
		"*3\r\n$6\r\nEXPIRE\r\n$4\r\nk:42\r\n$2\r\n61\r\n" +
		"*1\r\n$4\r\nEXEC\r\n"
	got := string(appendCommand(nil, targetRedisRoll, w, 42, opReduce, now, 7, ""))
	if got != want {
		t.Errorf("redis:\n got %q\nwant %q", got, want)
	}
	r := bufio.NewReader(strings.NewReader(got))
	for range targetRedisRoll.replies() {
		parseArray(t, r)
	}
	if r.Buffered() != 0 {
		t.Errorf("%d bytes beyond the request's %d commands", r.Buffered(), targetRedisRoll.replies())
	}
	// The member has a v4 UUID's layout, and differs per request: two
	// calls in the same µs must both be recorded, as uuid() makes them.
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for seq := range uint64(10000) {
		m := string(appendMember(nil, seq))
		if !uuid.MatchString(m) {
			t.Fatalf("member %d: %q is not laid out as a v4 UUID", seq, m)
		}
		if seen[m] {
			t.Fatalf("member %d: %q repeats", seq, m)
		}
		seen[m] = true
	}
}

// TestRunFailsOnErrorsInsideExec: Redis answers a failed command inside a
// transaction as an error element of EXEC's array (WRONGTYPE on a key of
// another type), and a refused transaction as -EXECABORT; either ends the
// run with an error that quotes it.
func TestRunFailsOnErrorsInsideExec(t *testing.T) {
	for _, exec := range []string{
		"*4\r\n:0\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n*0\r\n:1\r\n",
		"-EXECABORT Transaction discarded because of previous errors.\r\n",
	} {
		addr, _ := fakeServer(t, func(name string) string {
			switch name {
			case "MULTI":
				return "+OK\r\n"
			case "EXEC":
				return exec
			}
			return "+QUEUED\r\n"
		})
		w := workload{Command: cmdRollLimit, Conns: 2, Pipeline: 8, Requests: 10_000, Keys: 100, Dist: "uniform", Take: 1, Max: 10, RefillMs: 60000}
		res, err := run(addr, targetRedisRoll, w, "")
		if err == nil {
			t.Fatalf("EXEC answering %q: no error, %d requests", exec, res.Requests)
		}
		if first, _, _ := strings.Cut(exec[strings.Index(exec, "-")+1:], " "); !strings.Contains(err.Error(), first) {
			t.Errorf("the error does not quote %s: %v", first, err)
		}
	}
}

// TestPresetLimitsHold: a preset's own max and interval (the sliding
// logs') survive the flags' defaults, and a flag given on the command line
// still wins.
func TestPresetLimitsHold(t *testing.T) {
	o := options{w: workload{Take: 1, Max: 100, RefillMs: 60000, ZipfS: 1.2}, set: map[string]bool{}}
	sc, _ := findScenario("roll1000")
	if w := o.overrides(sc.W); w.Max != 1000 || w.RefillMs != 3_600_000 || w.Take != 1 {
		t.Errorf("roll1000 with default flags: max %d, interval %d, take %d", w.Max, w.RefillMs, w.Take)
	}
	o.set["max"] = true
	if w := o.overrides(sc.W); w.Max != 100 {
		t.Errorf("roll1000 with --max 100: max %d", w.Max)
	}
	pc, _ := findScenario("pipelined")
	if w := o.overrides(pc.W); w.Max != 100 || w.RefillMs != 60000 {
		t.Errorf("pipelined: max %d, refill %d; want the flags'", w.Max, w.RefillMs)
	}
}

// TestPrefillLogs: the logs rollbig writes are where ROLL.LIMIT looks for
// them, full and live.
func TestPrefillLogs(t *testing.T) {
	dir := t.TempDir()
	w := workload{Keys: 3, Max: 50, RefillMs: 60000}
	size, err := prefillLogs(dir, w)
	if err != nil {
		t.Fatal(err)
	}
	st, err := storage.Open(dir, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now().UnixMicro()
	found := map[string]bool{}
	err = st.Scan(nil, nil, func(k, v []byte) bool {
		rec, err := keyspace.Parse(k)
		if err != nil {
			t.Errorf("key %q: %v", k, err)
			return false
		}
		s, err := bucket.DecodeLogState(nil, v)
		if err != nil || len(v) != size || s.Interval != w.RefillMs || s.Live(now) != int(w.Max)+1 {
			t.Errorf("%q: %d bytes, interval %d, %d live entries, %v", k, len(v), s.Interval, s.Live(now), err)
		}
		found[string(k)] = rec.Kind != nil && rec.Kind.ID == keyspace.KindLog
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range w.Keys {
		k := string(keyspace.AppendLogKey(nil, []byte("k:"+strconv.FormatInt(i, 10))))
		if !found[k] {
			t.Errorf("no log at %q", k)
		}
	}
}

// TestReadReplyReadsAWholeArrayWithAnError: an error inside an array
// (EXEC's answer for a failed command) is reported, and the rest of the
// array is consumed, so that the next reply read is the next one sent.
func TestReadReplyReadsAWholeArrayWithAnError(t *testing.T) {
	r := bufio.NewReader(strings.NewReader("*3\r\n:1\r\n-WRONGTYPE first\r\n-ERR second\r\n+OK\r\n"))
	if isErr, msg, err := readReply(r); err != nil || !isErr || msg != "WRONGTYPE first" {
		t.Fatalf("the array: isErr=%v msg=%q err=%v; want its first error", isErr, msg, err)
	}
	if isErr, msg, err := readReply(r); err != nil || isErr {
		t.Fatalf("the reply after the array: isErr=%v msg=%q err=%v; want +OK", isErr, msg, err)
	}
	if r.Buffered() != 0 {
		t.Fatalf("%d bytes left", r.Buffered())
	}
}
