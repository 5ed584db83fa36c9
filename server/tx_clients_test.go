package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTxClientLibraries runs transactions through the client libraries
// users have: redis-py's default pipeline (Debian's python3-redis),
// ioredis' multi().exec() and node-redis' multi().exec() (npm, pinned in
// testdata/clients/package-lock.json; the test installs them there with
// npm ci when they are not, once). Each script checks its replies and that
// an aborted transaction left its bucket untouched. A missing library, or
// npm, skips its case, except under CI=true.
func TestTxClientLibraries(t *testing.T) {
	ci := os.Getenv("CI") == "true"
	dir, err := filepath.Abs(filepath.Join("testdata", "clients"))
	if err != nil {
		t.Fatal(err)
	}
	missing := func(t *testing.T, what string) {
		t.Helper()
		if ci {
			t.Fatalf("%s is missing (CI=true: .ci/run installs it)", what)
		}
		t.Skipf("%s is missing; install it to run this test", what)
	}
	// Debian's python3-redis is for Debian's python3, which need not be
	// the first python3 on PATH.
	python := func(t *testing.T) string {
		for _, p := range []string{"/usr/bin/python3", "python3"} {
			if path, err := exec.LookPath(p); err == nil && exec.Command(path, "-c", "import redis").Run() == nil {
				return path
			}
		}
		missing(t, "python3 with the redis module (Debian: python3-redis)")
		return ""
	}
	install := sync.OnceValue(func() error { return npmInstall(t.Context(), dir) })
	node := func(t *testing.T, module string) string {
		path, err := exec.LookPath("node")
		if err != nil {
			missing(t, "node")
		}
		if err := install(); err != nil {
			missing(t, "the npm package "+module+": "+err.Error())
		}
		return path
	}
	cases := []struct {
		name string
		cmd  func(t *testing.T) []string
	}{
		{"redis-py", func(t *testing.T) []string { return []string{python(t), "tx.py"} }},
		{"ioredis", func(t *testing.T) []string { return []string{node(t, "ioredis"), "ioredis.js"} }},
		{"node-redis", func(t *testing.T) []string { return []string{node(t, "redis"), "node-redis.js"} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			argv := tc.cmd(t)
			srv := startServer(t, Config{})
			host, port, err := net.SplitHostPort(srv.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(argv[0], append(argv[1:], host, port)...)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "ok" {
				t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
			}
		})
	}
}

// npmInstall makes dir/node_modules hold the packages dir/package.json
// pins, at those versions: when one is missing or at another version, it
// runs npm ci (the versions of package-lock.json), within 5 minutes.
func npmInstall(ctx context.Context, dir string) error {
	var pkg struct{ Dependencies map[string]string }
	raw, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &pkg); err != nil {
		return fmt.Errorf("%s/package.json: %w", dir, err)
	}
	installed := func() error {
		for name, want := range pkg.Dependencies {
			var got struct{ Version string }
			raw, err := os.ReadFile(filepath.Join(dir, "node_modules", name, "package.json"))
			if err == nil {
				err = json.Unmarshal(raw, &got)
			}
			if err != nil || got.Version != want {
				return fmt.Errorf("node_modules/%s is not version %s (%q, %v)", name, want, got.Version, err)
			}
		}
		return nil
	}
	if installed() == nil {
		return nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return fmt.Errorf("not installed in %s, and no npm to install it: %w", dir, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci in %s: %w\n%s", dir, err, out)
	}
	return installed()
}
