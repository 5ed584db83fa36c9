package main

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/keyspace"
)

// slotKeys returns n keys of one slot in 0-99 (a hash tag).
func slotKeys(n int) []string {
	tag := "a"
	for i := 0; keyspace.Slot([]byte(tag)) > 99; i++ {
		tag = "t" + strconv.Itoa(i)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "{" + tag + "}:" + strconv.Itoa(i)
	}
	return keys
}

// reduceAll takes one token from each key's bucket (10 tokens, AT fixed).
func reduceAll(t *testing.T, c *redis.Client, keys []string) {
	t.Helper()
	ctx := context.Background()
	cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Do(ctx, "RL.REDUCE", k, 10, 60, "TAKE", 1, "AT", clusterAt)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v: %v", cmds[0].Args(), err)
	}
}

// TestClusterMoveTargetKilled: a target killed in the middle of a move's
// copy leaves the source serving the slots; the tool says so, and that
// the target's partial copy could not be dropped, without printing
// "<nil>"; the target restarted has dropped the partial copy (it does
// not count as its records); the move run again completes with every
// bucket.
func TestClusterMoveTargetKilled(t *testing.T) {
	ports := freePorts(t, 2)
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	announced := []string{ports[0], proxyLn.Addr().String()}
	nodes := strings.Join(announced, ",")
	src := startProc(t, t.TempDir(), "--addr", ports[0], "--cluster-nodes", nodes, "--cluster-ordinal", "0")
	dstDir := t.TempDir()
	// fsync always: the records RESTORE wrote before the kill are on disk.
	dstFlags := []string{"--addr", ports[1], "--cluster-nodes", nodes, "--cluster-ordinal", "1", "--fsync", "always"}
	killed := startProc(t, dstDir, dstFlags...)
	var restores atomic.Int32
	proxy(t, proxyLn, ports[1], func(chunk []byte) proxyAction {
		if bytes.Contains(chunk, []byte("RESTORE")) && restores.Add(1) == 3 {
			killed.cmd.Process.Kill()
			<-killed.exited
			return proxyDrop
		}
		return proxyForward
	})
	keys := slotKeys(200)
	rs := src.client(t)
	reduceAll(t, rs, keys)
	ctx := context.Background()
	move := []string{"cluster", "move", "--nodes", nodes, "--slots", "0-99", "--to", announced[1], "--cluster-page", "10"}
	var out bytes.Buffer
	moveErr := runReloading(ctx, nil, move, noEnvLookup, nil, &out, &out)
	t.Logf("move: %v\n%s", moveErr, out.String())
	if moveErr == nil {
		t.Fatal("the move succeeded with its target killed")
	}

	rt := startProc(t, dstDir, dstFlags...).client(t)
	if n, err := rt.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Errorf("the target restarted holds %d records (%v); want 0: the partial copy dropped", n, err)
	}
	msg := moveErr.Error() + out.String()
	for _, want := range []string{"the source " + ports[0] + " serves them again", "could not drop its partial copy", "a restart drops it too"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the move's error does not say %q", want)
		}
	}
	if strings.Contains(msg, "<nil>") {
		t.Errorf("the move's output says <nil>")
	}
	if n, err := rs.Do(ctx, "RL.GET", keys[0], 10, 60, "AT", clusterAt).Int64(); err != nil || n != 9 {
		t.Fatalf("the source after the failed move, RL.GET: %d %v; want 9", n, err)
	}

	out.Reset()
	if err := runReloading(ctx, nil, move, noEnvLookup, nil, &out, &out); err != nil {
		t.Fatalf("the move again: %v\n%s", err, out.String())
	}
	if n, err := rt.DBSize(ctx).Result(); err != nil || n != int64(len(keys)) {
		t.Errorf("the target after the move holds %d records (%v); want %d", n, err, len(keys))
	}
	if n, err := rs.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Errorf("the source after the move holds %d records (%v); want 0", n, err)
	}
	for _, k := range keys {
		if n, err := rt.Do(ctx, "RL.GET", k, 10, 60, "AT", clusterAt).Int64(); err != nil || n != 9 {
			t.Fatalf("the target after the move, RL.GET %s: %d %v; want 9", k, n, err)
		}
	}
}

// TestClusterMoveSourceDropFails: when the source's CLUSTER DROP fails
// after the slots moved, the tool says the move is done, that the
// source's copy was not dropped and how to drop it, instead of
// "<nil> records dropped".
func TestClusterMoveSourceDropFails(t *testing.T) {
	ports := freePorts(t, 2)
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	announced := []string{proxyLn.Addr().String(), ports[1]}
	nodes := strings.Join(announced, ",")
	src := startProc(t, t.TempDir(), "--addr", ports[0], "--cluster-nodes", nodes, "--cluster-ordinal", "0")
	dst := startProc(t, t.TempDir(), "--addr", ports[1], "--cluster-nodes", nodes, "--cluster-ordinal", "1")
	proxy(t, proxyLn, ports[0], func(chunk []byte) proxyAction {
		if bytes.Contains(chunk, []byte("DROP")) {
			return proxyDrop
		}
		return proxyForward
	})
	keys := slotKeys(20)
	reduceAll(t, src.client(t), keys)
	ctx := context.Background()
	var out bytes.Buffer
	err = runReloading(ctx, nil, []string{"cluster", "move", "--nodes", nodes, "--slots", "0-99", "--to", announced[1]}, noEnvLookup, nil, &out, &out)
	if err != nil {
		t.Fatalf("move: %v\n%s", err, out.String())
	}
	t.Logf("move:\n%s", out.String())
	host, port, _ := net.SplitHostPort(announced[0])
	for _, want := range []string{"moved slots 0-99", "the source's copy was not dropped", "redis-cli -h " + host + " -p " + port + " CLUSTER DROP 0-99"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the move's output does not say %q", want)
		}
	}
	if strings.Contains(out.String(), "<nil>") {
		t.Errorf("the move's output says <nil>")
	}
	if n, err := dst.client(t).Do(ctx, "RL.GET", keys[0], 10, 60, "AT", clusterAt).Int64(); err != nil || n != 9 {
		t.Errorf("the target, RL.GET: %d %v; want 9", n, err)
	}
}

// TestClusterMoveLeavesAnotherMoveAlone: a move whose MIGRATE START the
// source refuses (another move off it is under way) ends its own import
// on the target and does not cancel the other move.
func TestClusterMoveLeavesAnotherMoveAlone(t *testing.T) {
	addrs := freePorts(t, 2)
	procs := startCluster(t, addrs)
	ctx := context.Background()
	rs := procs[0].client(t)
	if err := rs.Do(ctx, "CLUSTER", "MIGRATE", "START", "0-9").Err(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := runReloading(ctx, nil, []string{"cluster", "move", "--nodes", strings.Join(addrs, ","), "--slots", "100-199", "--to", addrs[1]}, noEnvLookup, nil, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "being moved off this node already") || !strings.Contains(err.Error(), "serves them as before") {
		t.Fatalf("a move off a source with another under way: %v\n%s; want it refused, the source serving as before", err, out.String())
	}
	if err := rs.Do(ctx, "CLUSTER", "MIGRATE", "DIRTY", 10).Err(); err != nil {
		t.Errorf("the other move after the refused one: %v; want it still under way", err)
	}
	if err := procs[1].client(t).Do(ctx, "CLUSTER", "SETTOPOLOGY", 1, addrs[0], "0-99,200-8191", addrs[1], "100-199,8192-16383").Err(); err != nil {
		t.Errorf("a push giving the target the slots after the refused move: %v; want it taken (its import ended)", err)
	}
}
