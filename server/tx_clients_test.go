package server

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTxClientLibraries runs transactions through the client libraries
// users have: redis-py's default pipeline (Debian's python3-redis),
// ioredis' multi().exec() and node-redis' multi().exec() (npm, pinned in
// testdata/clients/package.json; .ci/run installs them there). Each script
// checks its replies and that an aborted transaction left its bucket
// untouched. A missing library skips its case, except under CI=true.
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
	node := func(t *testing.T, module string) string {
		path, err := exec.LookPath("node")
		if err != nil {
			missing(t, "node")
		}
		if _, err := os.Stat(filepath.Join(dir, "node_modules", module)); err != nil {
			missing(t, "the npm package "+module+" (npm ci in server/testdata/clients)")
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
