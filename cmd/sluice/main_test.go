package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

	"github.com/sluicehq/sluice/internal/conffile"
)

// The process tests run sluice as a real process: the test binary
// re-executes itself with this variable set and runs main, so the server
// under test is this package's main, built with the same flags as the test.
const execMainEnv = "SLUICE_TEST_EXEC_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(execMainEnv) == "1" {
		// Not a variable of sluice's: it would log a warning about it.
		os.Unsetenv(execMainEnv)
		if err := setNoFile(os.Getenv(noFileEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "test helper:", err)
			os.Exit(3)
		}
		main()
		os.Exit(0)
	}
	if os.Getenv(exampleCurlEnv) == "1" {
		os.Exit(exampleCurl(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

type proc struct {
	cmd    *exec.Cmd
	addr   string
	exited chan struct{}
	err    error // exit status, valid after exited is closed
	logs   *bytes.Buffer
	// httpAddr and divvyAddr are the HTTP and line-protocol listeners'
	// addresses, set before addr is.
	httpAddr, divvyAddr, rlsAddr string
	addrc                        chan string // the RESP address, once logged
	checkAddr                    string      // the /check listener's
}

// startProc starts sluice on 127.0.0.1:0 with the data directory dir and
// waits for the address it logs.
func startProc(t *testing.T, dir string, flags ...string) *proc {
	t.Helper()
	return startProcEnv(t, dir, nil, flags...)
}

// startProcEnv is startProc with more environment variables.
func startProcEnv(t *testing.T, dir string, env []string, flags ...string) *proc {
	t.Helper()
	p := startProcAsync(t, dir, env, flags...)
	select {
	case p.addr = <-p.addrc:
	case <-p.exited:
		t.Fatalf("sluice exited before serving: %v\n%s", p.err, p.logs)
	}
	return p
}

// startProcAsync starts sluice as startProcEnv does, without waiting for
// it to serve: its RESP address arrives on p.addrc.
func startProcAsync(t *testing.T, dir string, env []string, flags ...string) *proc {
	t.Helper()
	args := append([]string{"--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data", dir, "--log-format", "json"}, flags...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), execMainEnv+"=1"), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{}), logs: &bytes.Buffer{}, addrc: make(chan string, 1)}
	addrc := p.addrc
	var mu sync.Mutex
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			p.logs.Write(sc.Bytes())
			p.logs.WriteByte('\n')
			mu.Unlock()
			var line struct {
				Msg       string `json:"msg"`
				Addr      string `json:"addr"`
				HTTPAddr  string `json:"http_addr"`
				DivvyAddr string `json:"divvy_addr"`
				RLSAddr   string `json:"rls_addr"`
				CheckAddr string `json:"check_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "sluice starting" {
				p.httpAddr, p.divvyAddr, p.rlsAddr, p.checkAddr = line.HTTPAddr, line.DivvyAddr, line.RLSAddr, line.CheckAddr
				addrc <- line.Addr
			}
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
	})
	return p
}

func (p *proc) client(t *testing.T) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1, ReadTimeout: 2 * time.Minute, WriteTimeout: 2 * time.Minute})
	t.Cleanup(func() { c.Close() })
	return c
}

// waitInfo polls INFO section until it shows field.
func waitInfo(t *testing.T, c *redis.Client, section, field string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := c.Info(context.Background(), section).Result()
		if err == nil && strings.Contains(info, field+"\r\n") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("INFO %s never showed %s:\n%s", section, field, info)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (p *proc) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	<-p.exited
}

// TestRestartKeepsEveryBucket: reduce buckets, stop with SIGTERM, start on
// the same directory: every bucket reads back exactly.
func TestRestartKeepsEveryBucket(t *testing.T) {
	for _, mode := range []string{"everysec", "no"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			p := startProc(t, dir, "--fsync", mode)
			rdb := p.client(t)
			ctx := context.Background()
			want := map[string]int64{}
			pipe := rdb.Pipeline()
			for i := range 500 {
				key := fmt.Sprintf("user:%d", i)
				pipe.Do(ctx, "RL.PREDUCE", key, 100, 60000, "TAKE", i%7+1, "AT", 1000)
				want[key] = int64(100 - (i%7 + 1))
			}
			pipe.Do(ctx, "RL.SESSIONIZE", "sess", 1, 3600, "AT", 7)
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			p.stop(t, syscall.SIGTERM)
			if p.err != nil {
				t.Fatalf("exit after SIGTERM: %v\n%s", p.err, p.logs)
			}
			if !strings.Contains(p.logs.String(), "shutdown complete") {
				t.Fatalf("no clean shutdown in the log:\n%s", p.logs)
			}
			p2 := startProc(t, dir, "--fsync", mode)
			rdb2 := p2.client(t)
			for key, v := range want {
				got, err := rdb2.Do(ctx, "RL.PGET", key, 100, 60000, "AT", 1000).Int64()
				if err != nil || got != v {
					t.Fatalf("%s after restart: %d, %v; want %d", key, got, err, v)
				}
			}
			sess, err := rdb2.Do(ctx, "RL.SESSIONIZE", "sess", 1, 3600, "AT", 8).Int64Slice()
			if err != nil || len(sess) != 2 || sess[0] != 0 || sess[1] != 7000 {
				t.Fatalf("session after restart: %v, %v", sess, err)
			}
		})
	}
}

// reduceUntilKilled runs clients that each reduce their own keys one command
// at a time, recording the last reply per key, until the server dies.
// Every key has max 1e9 and a one-hour refill at a fixed AT, so a reply r
// means the bucket holds r-1 afterwards.
func reduceUntilKilled(t *testing.T, p *proc, clients int, killAfter int64) map[string]int64 {
	ctx := context.Background()
	var (
		mu    sync.Mutex
		last  = map[string]int64{}
		total int64
		once  sync.Once
		wg    sync.WaitGroup
	)
	for w := range clients {
		rdb := p.client(t)
		wg.Go(func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("c%d-k%d", w, i%20)
				v, err := rdb.Do(ctx, "RL.REDUCE", key, 1_000_000_000, 3600, "AT", 1000).Int64()
				if err != nil {
					return // the server was killed
				}
				mu.Lock()
				last[key] = v
				total++
				if total == killAfter {
					once.Do(func() { p.cmd.Process.Signal(syscall.SIGKILL) })
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	<-p.exited
	return last
}

// TestCrashLosesNoAcknowledgedReduce: with --fsync always, SIGKILL while
// clients reduce in a loop; after a restart no bucket has more tokens than
// the last reply a client received implies.
func TestCrashLosesNoAcknowledgedReduce(t *testing.T) {
	dir := t.TempDir()
	p := startProc(t, dir, "--fsync", "always")
	last := reduceUntilKilled(t, p, 4, 2000)
	if len(last) == 0 {
		t.Fatal("no reduce was acknowledged")
	}
	p2 := startProc(t, dir, "--fsync", "always")
	rdb := p2.client(t)
	ctx := context.Background()
	for key, r := range last {
		got, err := rdb.Do(ctx, "RL.GET", key, 1_000_000_000, 3600, "AT", 1000).Int64()
		if err != nil {
			t.Fatal(err)
		}
		// r-1 is left after the acknowledged reduce; the client had at most
		// one more reduce in flight, which may or may not have landed.
		if got > r-1 || got < r-2 {
			t.Fatalf("%s: %d tokens after the crash, last reply %d implies %d (or %d with one unacknowledged reduce)", key, got, r, r-1, r-2)
		}
	}
}

// TestCrashEverySecBound: with --fsync everysec, every reduce acknowledged
// before a completed periodic sync survives SIGKILL. INFO tells when a sync
// covering the writes has happened.
func TestCrashEverySecBound(t *testing.T) {
	dir := t.TempDir()
	p := startProc(t, dir, "--fsync", "everysec")
	rdb := p.client(t)
	ctx := context.Background()
	for i := range 300 {
		if err := rdb.Do(ctx, "RL.REDUCE", fmt.Sprintf("k%d", i), 10, 3600, "TAKE", 3, "AT", 50).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Wait for the committer to apply the writes and for the once-a-second
	// sync to cover them: synced_round reaches the applied round seen now.
	applied := infoInt(t, rdb, "applied_round")
	for infoInt(t, rdb, "synced_round") < applied || applied == 0 {
		applied = max(applied, infoInt(t, rdb, "applied_round"))
		time.Sleep(20 * time.Millisecond) // polling the server's state, not ordering
	}
	p.stop(t, syscall.SIGKILL)
	p2 := startProc(t, dir)
	rdb2 := p2.client(t)
	for i := range 300 {
		got, err := rdb2.Do(ctx, "RL.GET", fmt.Sprintf("k%d", i), 10, 3600, "AT", 50).Int64()
		if err != nil || got != 7 {
			t.Fatalf("k%d after crash: %d, %v; want 7", i, got, err)
		}
	}
}

func infoInt(t *testing.T, rdb *redis.Client, field string) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "persistence").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("INFO persistence has no %s:\n%s", field, info)
	return 0
}

// TestRedisCLITranscripts drives the server with redis-cli, in RESP2 and
// with -3 (HELLO 3), and compares what a user sees with golden transcripts
// in testdata/. Lines starting with "> " are typed commands; the lines after
// them are redis-cli's output.
func TestRedisCLITranscripts(t *testing.T) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-cli is missing; .ci/run installs it (Debian package redis-tools)")
		}
		t.Skip("redis-cli not installed (Debian package redis-tools)")
	}
	for _, tc := range []struct{ file, flag string }{{"transcript-resp2.txt", ""}, {"transcript-resp3.txt", "-3"}} {
		t.Run(tc.file, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			var input bytes.Buffer
			var want []string
			for _, line := range strings.Split(strings.TrimRight(string(raw), "\n"), "\n") {
				if cmd, ok := strings.CutPrefix(line, "> "); ok {
					input.WriteString(cmd + "\n")
					continue
				}
				want = append(want, line)
			}
			p := startProc(t, t.TempDir())
			_, port, _ := strings.Cut(p.addr, ":")
			args := []string{"-p", port, "--no-raw"}
			if tc.flag != "" {
				args = append(args, tc.flag)
			}
			cmd := exec.Command(cli, args...)
			cmd.Stdin = &input
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("redis-cli: %v\n%s", err, out)
			}
			got := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("redis-cli %s output differs from testdata/%s\n--- got\n%s\n--- want\n%s", tc.flag, tc.file, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

func TestConfigFromEnvAndFlags(t *testing.T) {
	env := map[string]string{"SLUICE_FSYNC": "always", "SLUICE_MAX_BULK": "2MiB", "SLUICE_ADDR": ":1", "SLUICE_CACHE_MEMORY": "32MiB", "SLUICE_MAX_KEY_SIZE": "1KiB", "SLUICE_COMMIT_QUEUE_MEMORY": "4MiB"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := parseConfig([]string{"--addr", "127.0.0.1:7"}, lookup, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.fsync != "always" || cfg.maxBulk != 2<<20 || cfg.addr != "127.0.0.1:7" || cfg.cacheMemory != 32<<20 || cfg.maxKeySize != 1<<10 || cfg.commitQueueMem != 4<<20 {
		t.Fatalf("got %+v", cfg)
	}
	env["SLUICE_MAX_ARGS"] = "lots"
	if _, err := parseConfig(nil, lookup, io.Discard); err == nil || !strings.Contains(err.Error(), "SLUICE_MAX_ARGS") {
		t.Fatalf("bad env value: %v", err)
	}
	delete(env, "SLUICE_MAX_ARGS")
	env["SLUICE_VERSION"] = "1.2.3" // a deployment's own variable, not --version
	if cfg, err := parseConfig(nil, lookup, io.Discard); err != nil || cfg.showVersion {
		t.Fatalf("SLUICE_VERSION was read as --version: %+v, %v", cfg, err)
	}
	var help bytes.Buffer
	parseConfig([]string{"--help"}, func(string) (string, bool) { return "", false }, &help)
	for _, want := range []string{"--fsync, SLUICE_FSYNC", "--max-query-buffer, SLUICE_MAX_QUERY_BUFFER"} {
		if !strings.Contains(help.String(), want) {
			t.Fatalf("--help lacks %q:\n%s", want, help.String())
		}
	}
	if err := run(context.Background(), []string{"--fsync", "maybe", "--data", t.TempDir()}, lookup, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "fsync") {
		t.Fatalf("bad --fsync: %v", err)
	}
}

func TestReadPassword(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p, err := readPassword("", write("ok", "s3cret\n"), 0); err != nil || p != "s3cret" {
		t.Fatalf("file with a trailing newline: %q, %v", p, err)
	}
	if p, err := readPassword("direct", "", 0); err != nil || p != "direct" {
		t.Fatalf("--requirepass: %q, %v", p, err)
	}
	for name, content := range map[string]string{"empty": "\n", "two-lines": "a\nb\n"} {
		if _, err := readPassword("", write(name, content), 0); err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("%s password file: %v, want an error naming it", name, err)
		}
	}
	// Read as every configuration file: a regular file within the limit.
	if _, err := readPassword("", write("big", "s3cret\n"), 4); !errors.Is(err, conffile.ErrTooBig) || !strings.Contains(err.Error(), "over the limit of 4") {
		t.Fatalf("password file over --max-config-file: %v", err)
	}
	if _, err := readPassword("", dir, 0); !errors.Is(err, conffile.ErrNotRegular) || !strings.Contains(err.Error(), dir+" is a directory") {
		t.Fatalf("password file that is a directory: %v", err)
	}
	noEnv := func(string) (string, bool) { return "", false }
	for _, args := range [][]string{
		{"--requirepass", "a", "--requirepass-file", "f"},
		{"--protected-mode", "maybe"},
		{"--enable-debug-command", "maybe"},
		{"--tls-cert", "c"},
		{"--tls-ca", "ca"},
		{"--maxclients", "0"},
		{"--timeout", "-1"},
		{"--max-key-size", "0"},
		{"--commit-queue-memory", "0"},
		{"--committers", "-1"},
		{"--committers", "65"},
		{"--store-compaction-concurrency", "-1"},
		{"--store-compaction-concurrency", "65"},
		{"--cluster-forward-queue", "0"},
	} {
		if _, err := parseConfig(args, noEnv, io.Discard); err == nil {
			t.Errorf("parseConfig(%v) accepted it", args)
		}
	}
}

// redis-cli's interactive HELP shows an RL.* command's summary and
// arguments, built from COMMAND DOCS (issue 19). redis-cli runs under a
// pseudo-terminal from script(1); its line editor asks the terminal for the
// cursor position (ESC [6n) twice before each prompt (the terminal's width,
// then the cursor), so the test answers both and sends the next line only
// after the second: input sent earlier would be read as the answer.
func TestRedisCLIHelp(t *testing.T) {
	text := redisCLISession(t, "HELP RL.REDUCE")
	for _, want := range []string{"RL.REDUCE", "key max refill_s [REFILL refill] [TAKE take] [AT unix_s] [STRICT]", "summary:", "Takes TAKE tokens", "group:", "rate-limit"} {
		if !strings.Contains(text, want) {
			t.Errorf("redis-cli HELP RL.REDUCE lacks %q:\n%q", want, text)
		}
	}
}

// redis-cli knows a container's subcommands from COMMAND DOCS: HELP CLIENT
// SETNAME shows its summary and argument, and Tab completes "client setn"
// to CLIENT SETNAME (the name set proves the completed line ran; without
// the subcommand records Tab has nothing to offer and the server answers
// "unknown subcommand 'setn'").
func TestRedisCLISubcommands(t *testing.T) {
	text := redisCLISession(t, "HELP CLIENT SETNAME", "client setn\t tabbed", "CLIENT GETNAME")
	for _, want := range []string{"CLIENT SETNAME", "connection-name", "Names the connection", "CLIENT SETNAME tabbed", `"tabbed"`} {
		if !strings.Contains(text, want) {
			t.Errorf("redis-cli session lacks %q:\n%q", want, text)
		}
	}
}

// redisCLISession runs redis-cli interactively against a new server,
// types lines at its prompts, then quit, and returns what the terminal
// showed.
func redisCLISession(t *testing.T, lines ...string) string {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err == nil {
		_, err = exec.LookPath("script")
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-cli or script is missing; .ci/run installs them (redis-tools, bsdutils)")
		}
		t.Skip("redis-cli or script not installed")
	}
	p := startProc(t, t.TempDir())
	_, port, _ := strings.Cut(p.addr, ":")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang fails, not blocks the suite
	defer cancel()
	cmd := exec.CommandContext(ctx, "script", "-qc", cli+" -p "+port, "/dev/null")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines = append(lines, "quit")
	var got []byte
	buf := make([]byte, 4096)
	seen, queries := 0, 0
	for {
		n, err := out.Read(buf)
		got = append(got, buf[:n]...)
		for {
			i := bytes.Index(got[seen:], []byte("\x1b[6n"))
			if i < 0 {
				break
			}
			seen += i + 4
			queries++
			reply := "\x1b[1;1R"
			if queries%2 == 0 && len(lines) > 0 { // the second query of a prompt: it is up
				reply += lines[0] + "\r"
				lines = lines[1:]
			}
			io.WriteString(in, reply)
		}
		if err != nil {
			break
		}
	}
	in.Close()
	cmd.Wait()
	return string(got)
}
