package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestReplicatedRebalance: four processes with --cluster-replicas 3 (four
// shards, three replicas each), go-redis ClusterClients taking tokens
// from buckets of every shard throughout. sluice cluster rebalance with
// the first three nodes moves node 3's three replicas, one shard at a
// time, each onto a node that lacked it, shard 3's home too, and returns
// once each move has finished: node 3 then holds no shard, and every
// other node holds all four. sluice cluster remove-node then
// removes node 3, and a second rebalance finds nothing to move. Fewer
// nodes than replicas are refused. Node 3, restarted on an empty data
// directory with the flags it first had, learns it was removed and waits
// to be added (it used to wait for the others to answer, which refuse a
// node removed); added again it is node 4, and a rebalance onto the four
// nodes moves three replicas onto it. Every bucket holds exactly its
// limit less the takes acknowledged (less, at most, those that failed).
func TestReplicatedRebalance(t *testing.T) {
	addrs, bus, dirs, procs := startReplicatedNodes(t, 4, "--fsync", "always")
	ctx := context.Background()
	deadline := time.Now().Add(120 * time.Second) // bounds a hang
	waitHomeLeaders(t, procs, deadline)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: 200 * time.Millisecond})
	defer cc.Close()
	var keys []string
	for k := range 40 {
		keys = append(keys, "rb:"+strconv.Itoa(k))
	}
	tk := newTakers(cc, keys, 1000000)
	tk.run(ctx, 4, deadline)
	defer tk.stop()

	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := runReloading(ctx, nil, append([]string{"cluster"}, args...), noEnvLookup, nil, &out, &out)
		return out.String(), err
	}
	three := strings.Join(addrs[:3], ",")
	if out, err := run("rebalance", "--nodes", addrs[0]+","+addrs[1]); err == nil || !strings.Contains(err.Error(), "want at least 3") {
		t.Errorf("rebalance onto 2 nodes: %v\n%s\nwant an error: 3 replicas need 3 nodes", err, out)
	}
	out, err := run("rebalance", "--nodes", three)
	if err != nil {
		t.Fatalf("rebalance onto nodes 0-2: %v\n%s", err, out)
	}
	if strings.Count(out, "\nshard ")+strings.Count(out[:min(len(out), 6)], "shard ") != 3 || !strings.HasSuffix(out, "balanced: 3 shards moved\n") || strings.Contains(out, "-> "+addrs[3]) {
		t.Errorf("rebalance onto nodes 0-2 printed:\n%s\nwant three shards moved off %s", out, addrs[3])
	}
	for i, p := range procs {
		info, err := p.client(t).Info(ctx, "replication").Result()
		shards := infoShards(info)
		want := 4
		if i == 3 {
			want = 0
		}
		if err != nil || len(shards) != want {
			t.Errorf("node %d after the rebalance holds %d shards (%v); want %d\n%s", i, len(shards), err, want, info)
		}
	}
	if out, err := run("remove-node", "--nodes", three, "--remove", addrs[3]); err != nil || !strings.Contains(out, "node 3 removed\n") {
		t.Fatalf("remove-node after the rebalance: %v\n%s", err, out)
	}
	if out, err := run("rebalance", "--nodes", three); err != nil || out != "balanced: no replica to move\n" {
		t.Errorf("rebalance again: %v\n%s\nwant nothing to move", err, out)
	}

	// Node 3, removed, restarted on an empty data directory with the
	// flags it first had, learns it was removed and waits to be added.
	procs[3].stop(t, syscall.SIGTERM)
	dirs[3] = t.TempDir()
	procs[3] = startReplicated(t, addrs, bus, dirs, 3, "--fsync", "always")
	waitInfo := func(want string) {
		t.Helper()
		for {
			info, err := procs[3].client(t).Info(ctx, "replication").Result()
			if err == nil && strings.Contains(info, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("node 3 never showed %q: %v\n%s", want, err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitInfo("cluster_ordinal:-1\r\n")
	// Added again, it is node 4, and the rebalance onto all four moves
	// three replicas onto it, one a home.
	if out, err := run("add-node", "--nodes", three, "--add", addrs[3], "--add-bus", bus[3]); err != nil || !strings.Contains(out, "node 4 "+addrs[3]+" "+bus[3]+"\n") {
		t.Fatalf("add-node of node 3's address again: %v\n%s\nwant it node 4", err, out)
	}
	waitInfo("cluster_ordinal:4\r\n")
	out, err = run("rebalance", "--nodes", strings.Join(addrs, ","))
	if err != nil || !strings.HasSuffix(out, "balanced: 3 shards moved\n") {
		t.Fatalf("rebalance onto the four: %v\n%s", err, out)
	}
	info, err := procs[3].client(t).Info(ctx, "replication").Result()
	if n := len(infoShards(info)); err != nil || n != 3 {
		t.Errorf("node 4 after the rebalance onto it holds %d shards (%v); want 3\n%s", n, err, info)
	}
	tk.stop()
	acked, failed := tk.check(t, ctx, deadline, "after the rebalances")
	t.Logf("%d takes acknowledged, %d failed (retried), over six moves, a removal and an addition; the last rebalance printed:\n%s", acked, failed, out)
}
