package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/keyspace"
)

// TestReplicatedNodeAdded: three processes with --cluster-replicas 3,
// go-redis ClusterClients taking tokens from 20 buckets of shard 0
// throughout; a
// fourth, started with the first three's flags and its own address past
// --cluster-size, serves nothing until sluice cluster add-node adds it;
// then it learns the placement and joins the placement group, and sluice
// cluster place moves shard 0 onto it as its home: it leads the shard
// with its buckets, every node's CLUSTER SLOTS names it for
// the shard's slots and no other node, sluice cluster show passes, and
// after a restart it is still node 3 and leads the shard again. Then the
// shard is moved back and sluice cluster remove-node removes the node:
// CLUSTER NODES leaves it out, and restarted it waits to be added again.
// Every bucket then holds exactly its limit less the takes acknowledged
// (less, at most, those that failed, which may or may not have been made).
func TestReplicatedNodeAdded(t *testing.T) {
	addrs, bus, dirs, procs, cc := startReplicatedCluster(t)
	ctx := context.Background()
	deadline := time.Now().Add(120 * time.Second) // bounds a hang
	waitHomeLeaders(t, procs, deadline)
	var keys []string // of shard 0: slots 0-5460 of three shards
	for k := 0; len(keys) < 20; k++ {
		if key := "add:" + strconv.Itoa(k); keyspace.Slot([]byte(key)) <= 5460 {
			keys = append(keys, key)
		}
	}
	// Tokens are taken throughout, by four clients.
	const limit = 1000000
	tk := newTakers(cc, keys, limit)
	tk.run(ctx, 4, deadline)
	defer tk.stop()
	more, moreBus := freePorts(t, 1), freePorts(t, 1)
	all := append(append([]string{}, addrs...), more[0])
	dirs = append(dirs, t.TempDir())
	startNew := func() *proc {
		return startProc(t, dirs[3], "--addr", more[0], "--cluster-nodes", strings.Join(all, ","), "--cluster-size", "3", "--cluster-ordinal", "3",
			"--cluster-replicas", "3", "--cluster-bus-nodes", strings.Join(bus, ","), "--cluster-election-timeout", "300ms", "--fsync", "always")
	}
	added := startNew()
	info := func(p *proc) string {
		s, _ := p.client(t).Info(ctx, "replication").Result()
		return s
	}
	if s := info(added); !strings.Contains(s, "cluster_ordinal:-1\r\n") || !strings.Contains(s, "cluster_replicas_started:0\r\n") {
		t.Errorf("node 3 before it was added:\n%s", s)
	}
	if err := added.client(t).Do(ctx, "RL.GET", keys[0], limit, 3600, "AT", clusterAt).Err(); err == nil || !strings.HasPrefix(err.Error(), "CLUSTERDOWN") {
		t.Errorf("a bucket on node 3 before it was added: %v; want CLUSTERDOWN", err)
	}
	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		for {
			out.Reset()
			err := runReloading(ctx, nil, args, noEnvLookup, nil, &out, &out)
			if err == nil {
				return out.String()
			}
			if time.Now().After(deadline) {
				t.Fatalf("sluice %s: %v\n%s", strings.Join(args, " "), err, out.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	out := run("cluster", "add-node", "--nodes", strings.Join(addrs, ","), "--add", more[0], "--add-bus", moreBus[0])
	if want := "node 3 " + more[0] + " " + moreBus[0] + "\n"; !strings.HasPrefix(out, "added: epoch 1\n") || !strings.Contains(out, want) {
		t.Fatalf("sluice cluster add-node printed:\n%s\nwant epoch 1 and the line %q", out, want)
	}
	var s string
	for s = info(added); !strings.Contains(s, "cluster_ordinal:3\r\n") || !strings.Contains(s, "cluster_placement_epoch:1\r\n"); s = info(added) {
		if time.Now().After(deadline) {
			t.Fatalf("node 3 never joined:\n%s", s)
		}
		time.Sleep(20 * time.Millisecond)
	}
	out = run("cluster", "place", "--nodes", strings.Join(all, ","), "--shard", "0", "--to", more[0]+","+addrs[0]+","+addrs[1])
	if !strings.HasPrefix(out, "placed: epoch 2\n") {
		t.Fatalf("sluice cluster place printed:\n%s", out)
	}
	ledFromNode3 := func() {
		t.Helper()
		for s = info(added); !strings.HasPrefix(infoShards(s)[0], "role=leader,serving=1,"); s = info(added) {
			if time.Now().After(deadline) {
				t.Fatalf("node 3 never led shard 0:\n%s", s)
			}
			time.Sleep(20 * time.Millisecond)
		}
		for _, key := range keys {
			// Its slot table follows its leadership at the next tick.
			n, err := added.client(t).Do(ctx, "RL.GET", key, limit, 3600, "AT", clusterAt).Int64()
			for err != nil && (strings.HasPrefix(err.Error(), "CLUSTERDOWN") || strings.HasPrefix(err.Error(), "MOVED")) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				n, err = added.client(t).Do(ctx, "RL.GET", key, limit, 3600, "AT", clusterAt).Int64()
			}
			if err != nil || n <= 0 || n >= limit {
				t.Errorf("%s on node 3: %d, %v; want its tokens, some taken", key, n, err)
			}
		}
	}
	ledFromNode3()
	// Every node's slot table gives shard 0's slots to node 3 alone.
	for i, p := range append(procs, added) {
		for {
			slots, err := p.client(t).ClusterSlots(ctx).Result()
			owner := ""
			for _, r := range slots {
				if r.Start <= 0 && r.End >= 0 && len(r.Nodes) > 0 {
					owner = r.Nodes[0].Addr
				}
				if r.Start <= 5460 && r.End >= 0 && !(r.Start == 0 && r.End == 5460) {
					t.Fatalf("node %d's CLUSTER SLOTS splits shard 0's slots: %+v", i, slots)
				}
			}
			if err == nil && owner == more[0] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d's CLUSTER SLOTS never gave slots 0-5460 to node 3: %v %+v", i, err, slots)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	out = run("cluster", "show", "--nodes", strings.Join(all, ","))
	if !strings.Contains(out, "shard 0 0-5460 "+more[0]+","+addrs[0]+","+addrs[1]+"\n") {
		t.Errorf("sluice cluster show printed:\n%s", out)
	}
	added.stop(t, syscall.SIGTERM)
	added = startNew()
	for s = info(added); !strings.Contains(s, "cluster_ordinal:3\r\n") || !strings.Contains(s, "cluster_placement_epoch:2\r\n"); s = info(added) {
		if time.Now().After(deadline) {
			t.Fatalf("node 3 after its restart:\n%s", s)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ledFromNode3()
	// Removed: shard 0 moved back, then the node taken out of the list.
	out = run("cluster", "place", "--nodes", strings.Join(all, ","), "--shard", "0", "--to", strings.Join(addrs, ","))
	if !strings.HasPrefix(out, "placed: epoch 3\n") {
		t.Fatalf("sluice cluster place printed:\n%s", out)
	}
	for s = info(added); infoShards(s)[0] != ""; s = info(added) {
		if time.Now().After(deadline) {
			t.Fatalf("node 3 never let shard 0 go:\n%s", s)
		}
		time.Sleep(20 * time.Millisecond)
	}
	out = run("cluster", "remove-node", "--nodes", strings.Join(addrs, ","), "--remove", more[0])
	if !strings.HasPrefix(out, "removed: epoch 4\n") || !strings.Contains(out, "node 3 removed\n") {
		t.Fatalf("sluice cluster remove-node printed:\n%s", out)
	}
	for _, p := range procs {
		for {
			nodes, err := p.client(t).ClusterNodes(ctx).Result()
			if err == nil && !strings.Contains(nodes, more[0]) && strings.Count(nodes, "\n") == 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("CLUSTER NODES never left node 3 out: %v\n%s", err, nodes)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	run("cluster", "show", "--nodes", strings.Join(addrs, ","))
	// Every take acknowledged through the moves is counted once.
	tk.stop()
	total, errs := tk.check(t, ctx, deadline, "after the removal")
	t.Logf("%d takes acknowledged, %d failed (retried), over the addition, two moves, a restart and the removal", total, errs)
	// Restarted, it is no node of the cluster: it waits to be added again.
	added.stop(t, syscall.SIGTERM)
	added = startNew()
	if s := info(added); !strings.Contains(s, "cluster_ordinal:-1\r\n") {
		t.Errorf("node 3, removed, after its restart:\n%s", s)
	}
}
