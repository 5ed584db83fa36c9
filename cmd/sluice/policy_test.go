package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestBadPolicyStopsStartup(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "rules.ini")
	if err := os.WriteFile(bad, []byte("[default]\ncreditLimit = 1\nresetSeconds = 1\nlabel = two words\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	none := func(string) (string, bool) { return "", false }
	err := run(context.Background(), []string{"--policy", bad, "--data", data, "--http-addr", "", "--addr", "127.0.0.1:0"}, none, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--policy: policy: "+bad+":4: rule 1 [default]: label") {
		t.Fatalf("bad --policy: %v", err)
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Fatalf("the data directory was created before the policy was checked: %v", err)
	}
	err = run(context.Background(), []string{"--divvy-addr", "127.0.0.1:0", "--data", data}, none, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--divvy-addr needs --policy") {
		t.Fatalf("--divvy-addr without --policy: %v", err)
	}
}

// replaceFile writes text to path as operators are told to: to a file
// beside it, renamed over it.
func replaceFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path+".new", []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// TestSIGHUPReloadsPolicy runs sluice as a process with --policy and
// --divvy-addr: SIGHUP puts a new file in use without dropping the
// line-protocol connection, and a bad file is refused and counted while
// the rules in use stay.
func TestSIGHUPReloadsPolicy(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.ini")
	write := func(text string) { replaceFile(t, rules, text) }
	write("[default]\ncreditLimit = 7\nresetSeconds = 0\n")
	p := startProc(t, filepath.Join(dir, "data"), "--policy", rules, "--divvy-addr", "127.0.0.1:0")
	conn, err := net.Dial("tcp", p.divvyAddr)
	if err != nil {
		t.Fatalf("dial the line protocol at %q: %v", p.divvyAddr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(conn)
	hit := func() string {
		t.Helper()
		if _, err := io.WriteString(conn, "HIT a=b\n"); err != nil {
			t.Fatal(err)
		}
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSuffix(l, "\n")
	}
	if got := hit(); got != "OK true 7 0" {
		t.Fatalf("before the reload: %q", got)
	}
	c := p.client(t)
	write("[default]\ncreditLimit = 9\nresetSeconds = 0\n")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitInfo(t, c, "policy", "policy_reloads:1")
	if got := hit(); got != "OK true 9 0" {
		t.Fatalf("after SIGHUP, on the same connection: %q", got)
	}
	write("[default]\ncreditLimit = nine\nresetSeconds = 0\n")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitInfo(t, c, "policy", "policy_reload_failures:1")
	if got := hit(); got != "OK true 9 0" {
		t.Fatalf("after a bad file: %q, want the rules kept", got)
	}
	p.stop(t, syscall.SIGTERM) // the logs are complete once it has exited
	if !strings.Contains(p.logs.String(), "policy reload failed; keeping the rules in use") {
		t.Fatalf("the failed reload was not logged:\n%s", p.logs)
	}
}
