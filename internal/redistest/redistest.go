// Package redistest starts a real redis-server for the tests that compare
// sluice's replies with Redis': each test gets its own, on a Unix socket in
// a temporary directory, stopped when the test ends.
package redistest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Start starts redis-server on a Unix socket in a temporary directory,
// without persistence, for the tests that compare sluice's replies with
// Redis'. It skips the test when redis-server is not installed, except
// under CI.
func Start(t *testing.T) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server is missing; .ci/run installs it (Debian package redis-server)")
		}
		t.Skip("redis-server not installed (Debian package redis-server)")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "redis.sock")
	cmd := exec.Command(bin, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, MaxRetries: -1, PoolSize: 1, Protocol: 2})
	t.Cleanup(func() { c.Close() })
	deadline := time.Now().Add(30 * time.Second) // a hang guard
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "log"))
			t.Fatalf("redis-server did not answer on %s:\n%s", sock, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c
}
