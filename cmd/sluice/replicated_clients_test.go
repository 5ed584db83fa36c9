package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// failoverClient is a client library's script (testdata/clients) taking
// tokens in passes, and the lines it prints.
type failoverClient struct {
	name  string
	cmd   *exec.Cmd
	stdin interface{ Close() error }
	lines chan string
	done  chan error
}

func startFailoverClient(t *testing.T, name string, argv []string, env []string) *failoverClient {
	t.Helper()
	c := &failoverClient{name: name, cmd: exec.Command(argv[0], argv[1:]...), lines: make(chan string, 1024), done: make(chan error, 1)}
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stderr = os.Stderr
	stdin, err := c.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.stdin = stdin
	t.Cleanup(func() { c.cmd.Process.Kill() })
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case c.lines <- sc.Text():
			default: // a test that stopped reading
			}
		}
		c.done <- c.cmd.Wait()
		close(c.lines)
	}()
	return c
}

// passes waits for n more passes, failing on an error line or at
// deadline.
func (c *failoverClient) passes(t *testing.T, n int, deadline time.Time) {
	t.Helper()
	for n > 0 {
		select {
		case l, ok := <-c.lines:
			switch {
			case !ok:
				t.Fatalf("%s exited: %v", c.name, <-c.done)
			case strings.HasPrefix(l, "pass "):
				n--
			default:
				t.Fatalf("%s: %s", c.name, l)
			}
		case <-time.After(time.Until(deadline)):
			t.Fatalf("%s: %d passes short at the deadline", c.name, n)
		}
	}
}

// TestReplicatedClientsRideAFailover is issue 29's must-show 5 for
// ioredis' Cluster and redis-py's RedisCluster, with the retry settings
// docs/cluster.md gives (ioredis: retryDelayOnFailover 250 ms; redis-py:
// its defaults, from 4.4.0 on): through a SIGKILL of a shard's leader, at
// the default election timeout, their calls are retried until the shard
// is served again, and no error reaches the caller. (go-redis'
// ClusterClient is TestReplicatedClusterFailover's.)
func TestReplicatedClientsRideAFailover(t *testing.T) {
	py := pythonWithRedisCluster(t)
	node, err := exec.LookPath("node")
	modules, _ := filepath.Abs(filepath.Join("..", "..", "server", "testdata", "clients", "node_modules"))
	if err == nil {
		_, err = os.Stat(filepath.Join(modules, "ioredis", "package.json"))
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node with ioredis in %s: %v (.ci/run installs it)", modules, err)
		}
		t.Skipf("node with ioredis in %s: %v (npm ci in server/testdata/clients)", modules, err)
	}
	addrs, _, _, procs := startReplicatedNodes(t, 3, "--fsync", "always", "--cluster-election-timeout", "1s")
	deadline := time.Now().Add(90 * time.Second) // bounds a hang
	waitHomeLeaders(t, procs, deadline)
	var ports []string
	for _, a := range addrs {
		ports = append(ports, a[strings.LastIndexByte(a, ':')+1:])
	}
	const keys = "30" // in every shard
	clients := []*failoverClient{
		startFailoverClient(t, "ioredis", []string{node, filepath.Join("testdata", "clients", "failover.js"), strings.Join(ports, ","), keys}, []string{"NODE_PATH=" + modules}),
	}
	// redis-py before 4.4.0 (Debian 12's python3-redis is 4.3.4) cannot
	// reload the slots once a node is dead, with Redis Cluster as with
	// sluice: its RedisCluster deep-copies its connection arguments,
	// which hold a lock ("cannot pickle '_thread.lock' object"), fixed
	// by redis-py's pull request #2377.
	if out, err := exec.Command(py, "-c", "import redis; print(redis.__version__)").Output(); err != nil || !atLeast(strings.TrimSpace(string(out)), 4, 4) {
		t.Logf("redis-py %s: not run, it fails over only from 4.4.0 on", strings.TrimSpace(string(out)))
	} else {
		clients = append(clients, startFailoverClient(t, "redis-py", []string{py, filepath.Join("testdata", "clients", "failover.py"), strings.Join(ports, ","), keys}, nil))
	}
	for _, c := range clients {
		c.passes(t, 2, deadline)
	}
	procs[0].stop(t, syscall.SIGKILL) // shard 0's leader, at home
	for _, c := range clients {
		c.passes(t, 10, deadline)
	}
	for _, c := range clients {
		c.stdin.Close()
		for l := range c.lines {
			if !strings.HasPrefix(l, "pass ") {
				t.Errorf("%s: %s", c.name, l)
			}
		}
		if err := <-c.done; err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// atLeast reports whether version v (major.minor...) is at least
// major.minor.
func atLeast(v string, major, minor int) bool {
	var a, b int
	if _, err := fmt.Sscanf(v, "%d.%d", &a, &b); err != nil {
		return false
	}
	return a > major || a == major && b >= minor
}
