package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestConfigFileNotRegularHangsNothing: a named pipe named *.yaml in
// --rls-config, then SIGHUP, used to block the reload in open(2), and
// with it SIGTERM (the signal loop ran the reload) and POLICY RELOAD (it
// waited for the reload's lock). Now the reload refuses it, naming it,
// POLICY RELOAD answers, SIGTERM stops the process; a symlink to
// /dev/zero is refused without being read, a file over --max-config-file
// with both sizes, and a named pipe as --policy stops the start.
func TestConfigFileNotRegularHangsNothing(t *testing.T) {
	dir := t.TempDir()
	rlsDir := filepath.Join(dir, "rls")
	if err := os.Mkdir(rlsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rlsDir, "a.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(dir, "rules.ini")
	if err := os.WriteFile(rules, []byte("[default]\ncreditLimit = 7\nresetSeconds = 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, filepath.Join(dir, "data"), "--rls-config", rlsDir, "--policy", rules, "--shutdown-timeout", "10s", "--max-config-file", "64KiB")
	fifo := filepath.Join(rlsDir, "b.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mkfifo: %v", err)
		}
		t.Skipf("mkfifo: %v", err)
	}
	// Were the reload blocked, the test would end it by opening the pipe
	// for writing, so that its own run ends.
	defer func() {
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	}()
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// A client that gives up rather than wait for ever on a reply.
	c := redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1, ReadTimeout: time.Minute})
	defer c.Close()
	reload := func() error {
		t.Helper()
		err := c.Do(context.Background(), "POLICY", "RELOAD").Err()
		if err != nil && !strings.HasPrefix(err.Error(), "ERR ") {
			t.Fatalf("POLICY RELOAD got no reply: %v", err)
		}
		return err
	}
	if err := reload(); err == nil || !strings.Contains(err.Error(), fifo+" is a named pipe (FIFO); expected a regular file") {
		t.Fatalf("POLICY RELOAD with a named pipe in --rls-config: %v", err)
	}
	// SIGHUP's reload has failed too, and been logged.
	waitInfo(t, c, "policy", "rls_reload_failures:2")

	if err := os.Remove(fifo); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/dev/zero"); err == nil {
		if err := os.Symlink("/dev/zero", fifo); err != nil {
			t.Fatal(err)
		}
		if err := reload(); err == nil || !strings.Contains(err.Error(), fifo+", a symlink to /dev/zero, is a character device; expected a regular file") {
			t.Fatalf("POLICY RELOAD with a symlink to /dev/zero in --rls-config: %v", err)
		}
		if err := os.Remove(fifo); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(fifo, make([]byte, 65<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := reload(); err == nil || !strings.Contains(err.Error(), fifo+" is 66560 bytes, 1024 over the limit of 65536 (--max-config-file)") {
		t.Fatalf("POLICY RELOAD with a file over --max-config-file: %v", err)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		t.Fatalf("still running a minute after SIGTERM, with --shutdown-timeout 10s\n%s", p.logs)
	}
	if p.err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", p.err, p.logs)
	}
	if !strings.Contains(p.logs.String(), "rls config reload failed; keeping the configuration in use") || !strings.Contains(p.logs.String(), "named pipe (FIFO)") {
		t.Fatalf("the failed reloads were not logged:\n%s", p.logs)
	}

	// At startup, the named pipe stops the start, naming it, instead of
	// blocking it.
	pipeRules := filepath.Join(dir, "pipe.ini")
	if err := syscall.Mkfifo(pipeRules, 0o600); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if f, err := os.OpenFile(pipeRules, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	}()
	none := func(string) (string, bool) { return "", false }
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), []string{"--policy", pipeRules, "--data", filepath.Join(dir, "data2"), "--http-addr", "", "--addr", "127.0.0.1:0"}, none, io.Discard, io.Discard)
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "--policy: policy: conffile: not a regular file: "+pipeRules+" is a named pipe (FIFO); expected a regular file or a symlink to one") {
			t.Fatalf("start with a named pipe as --policy: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a named pipe as --policy blocked the start")
	}
}
