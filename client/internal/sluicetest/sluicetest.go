// Package sluicetest runs a real sluice for the client's end-to-end tests.
//
// The client module does not depend on the server's module (that would
// bring Pebble into its users' builds), so the tests build the sluice
// binary from the repository around the module, once per test binary, with
// the go command that runs the tests; SLUICE_BIN names a binary to use
// instead. Outside a checkout of the repository (the module alone, from a
// proxy) the end-to-end tests skip, except under CI=true, where they fail.
package sluicetest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

const serverModule = "module github.com/sluicehq/sluice\n"

var errNoCheckout = errors.New("not in a checkout of github.com/sluicehq/sluice: no go.mod of that module above the working directory")

var build struct {
	once sync.Once
	dir  string // removed by Main
	bin  string
	err  error
}

// Main runs the tests and removes the binary it built. Call it from
// TestMain: os.Exit(sluicetest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
	return code
}

// Binary returns the path of a sluice binary, building it on first use.
func Binary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		if bin := os.Getenv("SLUICE_BIN"); bin != "" {
			build.bin = bin
			return
		}
		root, err := repoRoot()
		if err != nil {
			build.err = err
			return
		}
		goCmd, err := exec.LookPath("go")
		if err != nil {
			build.err = fmt.Errorf("no go command to build sluice with: %w", err)
			return
		}
		build.dir, err = os.MkdirTemp("", "sluicetest-")
		if err != nil {
			build.err = err
			return
		}
		bin := filepath.Join(build.dir, "sluice")
		cmd := exec.Command(goCmd, "build", "-o", bin, "./cmd/sluice")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build ./cmd/sluice in %s: %v\n%s", root, err, out)
			return
		}
		build.bin = bin
	})
	if build.err != nil {
		if os.Getenv("CI") != "true" && errors.Is(build.err, errNoCheckout) {
			t.Skipf("no sluice to test against: %v (set SLUICE_BIN)", build.err)
		}
		t.Fatal(build.err)
	}
	return build.bin
}

// repoRoot finds the server module's directory above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte(serverModule)) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errNoCheckout
		}
		dir = parent
	}
}

// Proc is a running sluice.
type Proc struct {
	Addr string // its RESP address, on 127.0.0.1

	cmd    *exec.Cmd
	exited chan struct{}
	mu     sync.Mutex
	logs   bytes.Buffer
}

// Start runs sluice on 127.0.0.1:0 with its data in dir, plus flags, and
// waits until it serves. It is killed when the test ends.
func Start(t testing.TB, dir string, flags ...string) *Proc {
	t.Helper()
	args := append([]string{"--addr", "127.0.0.1:0", "--http-addr", "", "--data", dir, "--log-format", "json"}, flags...)
	cmd := exec.Command(Binary(t), args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Proc{cmd: cmd, exited: make(chan struct{})}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.logs.Write(sc.Bytes())
			p.logs.WriteByte('\n')
			p.mu.Unlock()
			var line struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "sluice starting" {
				addrc <- line.Addr
			}
		}
		cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.Kill)
	select {
	case p.Addr = <-addrc:
	case <-p.exited:
		t.Fatalf("sluice exited before serving:\n%s", p.Logs())
	}
	return p
}

// Kill stops the process and waits for it to exit.
func (p *Proc) Kill() {
	p.cmd.Process.Kill()
	<-p.exited
}

// Logs is what the process has logged so far.
func (p *Proc) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}
