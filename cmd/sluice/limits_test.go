package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
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
	"github.com/sluicehq/sluice/internal/admit"
)

// noFileEnv, "soft:hard", makes the re-executed test binary set its
// RLIMIT_NOFILE before main runs, as `prlimit --nofile=soft:hard` would.
const noFileEnv = "SLUICE_TEST_NOFILE"

func setNoFile(v string) error {
	if v == "" {
		return nil
	}
	soft, hard, ok := strings.Cut(v, ":")
	s, err1 := strconv.ParseUint(soft, 10, 64)
	h, err2 := strconv.ParseUint(hard, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return fmt.Errorf("%s=%q: want soft:hard", noFileEnv, v)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: s, Max: h}); err != nil {
		return fmt.Errorf("setrlimit RLIMIT_NOFILE %s: %w", v, err)
	}
	return nil
}

// needNoFile skips the test when this machine does not let a child
// process have a hard open-file limit of hard, which it inherits from
// this process; never under CI=true.
func needNoFile(t *testing.T, hard uint64) {
	t.Helper()
	var lim syscall.Rlimit
	err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	if err == nil && lim.Max >= hard {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("the hard open-file limit is %d (%v); the test needs %d", lim.Max, err, hard)
	}
	t.Skipf("the hard open-file limit is %d (%v); the test needs %d", lim.Max, err, hard)
}

// TestFDLimitCapsConnections runs sluice with an open-file limit of 128
// (soft) and 256 (hard) and opens 300 connections, RESP, HTTP and line
// protocol in turn: more than the limit. sluice raises its soft limit to
// 256, lowers maxclients to what 256 leaves after its reserve (92), and
// says so; every connection past that is answered with the refusal of its
// protocol instead of hanging in the backlog or taking descriptors from
// the store; an authenticated client keeps being served; and every
// acknowledged write survives a restart.
func TestFDLimitCapsConnections(t *testing.T) {
	needNoFile(t, 256)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.ini")
	if err := os.WriteFile(rules, []byte("[default]\ncreditLimit = 1000000\nresetSeconds = 3600\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	env := []string{noFileEnv + "=128:256"}
	flags := []string{"--requirepass", "pw", "--policy", rules, "--divvy-addr", "127.0.0.1:0", "--fsync", "everysec"}
	p := startProcEnv(t, data, env, flags...)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: p.addr, Password: "pw", PoolSize: 1, MaxRetries: -1, ReadTimeout: 2 * time.Minute, WriteTimeout: 2 * time.Minute})
	defer rdb.Close()
	acked := map[string]int64{}
	reduce := func(i int) {
		t.Helper()
		key := fmt.Sprintf("k%d", i%50)
		v, err := rdb.Do(ctx, "RL.REDUCE", key, 1_000_000_000, 3600, "AT", 1000).Int64()
		if err != nil {
			t.Fatalf("RL.REDUCE from the authenticated client during the flood: %v", err)
		}
		acked[key] = v
	}
	reduce(0)

	const conns = 300
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	admitted, refused := 0, 0
	for i := range conns {
		kind := [...]string{"resp", "http", "divvy"}[i%3]
		addr := map[string]string{"resp": p.addr, "http": p.httpAddr, "divvy": p.divvyAddr}[kind]
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d (%s): %v", i, kind, err)
		}
		// Only a guard against a hang: an answer takes microseconds.
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		r := bufio.NewReader(c)
		var ok bool
		switch kind {
		case "resp":
			_, err = io.WriteString(c, "PING\r\n")
			var line string
			if err == nil {
				line, err = r.ReadString('\n')
			}
			switch {
			case line == "+PONG\r\n":
				ok = true
			case line == "-ERR max number of clients reached\r\n":
			default:
				t.Fatalf("RESP connection %d (after %d admitted, %d refused): read %q, %v; want +PONG or the max clients error", i, admitted, refused, line, err)
			}
		case "http":
			_, err = io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: sluice\r\n\r\n")
			var resp *http.Response
			if err == nil {
				resp, err = http.ReadResponse(r, nil)
			}
			if err != nil {
				t.Fatalf("HTTP connection %d (after %d admitted, %d refused): %v; want 200 or 503", i, admitted, refused, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case 200:
				ok = true
			case 503:
			default:
				t.Fatalf("HTTP connection %d: status %d", i, resp.StatusCode)
			}
		case "divvy":
			_, err = io.WriteString(c, "HIT\n")
			var line string
			if err == nil {
				line, err = r.ReadString('\n')
			}
			switch {
			case strings.HasPrefix(line, "OK true"):
				ok = true
			case line == `ERR unknown "max number of clients reached"`+"\n":
			default:
				t.Fatalf("line connection %d (after %d admitted, %d refused): read %q, %v", i, admitted, refused, line, err)
			}
		}
		if ok {
			admitted++
			open = append(open, c)
		} else {
			refused++
			c.Close()
		}
		if i%10 == 0 {
			reduce(i/10 + 1)
		}
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid))
	t.Logf("%d connections: %d admitted, %d refused; sluice holds %d file descriptors of 256", conns, admitted, refused, len(fds))
	// maxclients 92, less the authenticated client, and HTTP's reserve for
	// probes past it.
	wantAdmitted := 91 + admit.HTTPReserve
	if admitted != wantAdmitted || refused != conns-wantAdmitted {
		t.Fatalf("admitted %d and refused %d; want %d admitted (maxclients 92, less the authenticated client, plus %d HTTP)", admitted, refused, wantAdmitted, admit.HTTPReserve)
	}
	for field, want := range map[string]string{"maxclients": "92", "maxclients_requested": "10000", "fd_limit": "256",
		"admitted_connections": strconv.Itoa(wantAdmitted + 1), "rejected_connections": strconv.Itoa(conns - wantAdmitted)} {
		if got := infoString(t, rdb, field); got != want {
			t.Errorf("INFO %s = %q, want %q", field, got, want)
		}
	}
	reduce(conns)

	// A burst of concurrent connections while the server is full: all
	// are refused (answered, or closed at once when 16 refusals are in
	// flight), and none makes the server run out of descriptors.
	var wg sync.WaitGroup
	for i := range 600 {
		addr := [...]string{p.addr, p.httpAddr, p.divvyAddr}[i%3]
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			_, _ = io.WriteString(c, "PING\r\n")
			_, _ = io.Copy(io.Discard, c)
		})
	}
	wg.Wait()
	reduce(conns + 10)
	if got := infoString(t, rdb, "rejected_connections"); got != strconv.Itoa(conns-wantAdmitted+600) {
		t.Errorf("INFO rejected_connections after the burst = %q, want %d", got, conns-wantAdmitted+600)
	}

	for _, c := range open {
		c.Close()
	}
	open = nil
	p.stop(t, syscall.SIGTERM)
	if p.err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", p.err, p.logs)
	}
	logs := p.logs.String()
	if strings.Contains(logs, "too many open files") {
		t.Errorf("sluice ran out of file descriptors:\n%s", logs)
	}
	for _, want := range []string{`"msg":"raised the open-file limit (soft RLIMIT_NOFILE) to the hard limit","from":128,"to":256`,
		`"msg":"maxclients lowered to what the open-file limit allows; raise the limit (ulimit -n, LimitNOFILE=) to serve more clients","maxclients":92,"requested":10000,"fd_limit":256`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %s:\n%s", want, logs)
		}
	}

	p2 := startProcEnv(t, data, env, flags...)
	rdb2 := redis.NewClient(&redis.Options{Addr: p2.addr, Password: "pw", MaxRetries: -1, ReadTimeout: 2 * time.Minute})
	defer rdb2.Close()
	for key, r := range acked {
		got, err := rdb2.Do(ctx, "RL.GET", key, 1_000_000_000, 3600, "AT", 1000).Int64()
		if err != nil || got != r-1 {
			t.Fatalf("%s after the restart: %d, %v; the last acknowledged reduce answered %d, so want %d", key, got, err, r, r-1)
		}
	}
}

// TestFDLimitTooLow: a limit that leaves too few descriptors for clients
// stops sluice at start with an error that says what to raise, before the
// store is opened.
func TestFDLimitTooLow(t *testing.T) {
	needNoFile(t, 100)
	data := filepath.Join(t.TempDir(), "data")
	// The deadline only guards against a sluice that starts and serves.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "--addr", "127.0.0.1:0", "--http-addr", "", "--data", data)
	cmd.Env = append(os.Environ(), execMainEnv+"=1", noFileEnv+"=100:100")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 ||
		!strings.Contains(string(out), "open-file limit (RLIMIT_NOFILE) is 100; sluice needs at least 180") {
		t.Fatalf("sluice with 100 descriptors: %v\n%s\nwant exit status 1 and an error naming the limit and the need", err, out)
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Fatalf("the data directory was created: %v", err)
	}
}

func infoString(t *testing.T, rdb *redis.Client, field string) string {
	t.Helper()
	info, err := rdb.Info(context.Background(), "everything").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return "(absent)"
}
