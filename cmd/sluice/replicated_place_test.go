package main

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
)

// TestReplicatedShardPlacedOnAnotherNode: four processes with
// --cluster-replicas 3, in --fsync always and everysec, go-redis
// ClusterClients
// taking tokens from 24 buckets of shard 0 throughout. With sluice
// cluster place, shard 0 goes from nodes 0, 1, 2 to 0, 1, 3 (node 3
// takes its buckets by snapshot, node 2 lets them go), then to 1, 3, 2
// (its leader's node leaves it: the leadership goes to node 1, its new
// home, once the old leader's decisions are committed: in everysec
// too, none is lost). Every node follows each epoch. Then nodes 0 and 2 are killed
// (node 2 had rejoined the shard), which under the first placement
// would have left the shard one replica of three: nodes 1 and 3 serve
// it, and every bucket holds exactly its limit less the takes
// acknowledged (less, at most, the takes that failed, which may or may
// not have been made): no acknowledged take is lost, none counted twice.
func TestReplicatedShardPlacedOnAnotherNode(t *testing.T) {
	for _, fsync := range []string{"always", "everysec"} {
		t.Run(fsync, func(t *testing.T) { testShardPlaced(t, fsync) })
	}
}

func testShardPlaced(t *testing.T, fsync string) {
	addrs, _, _, procs := startReplicatedNodes(t, 4, "--fsync", fsync)
	ctx := context.Background()
	deadline := time.Now().Add(120 * time.Second) // bounds a hang
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: 200 * time.Millisecond})
	defer cc.Close()
	const limit = 1000000
	// Keys of shard 0: slots 0-4095 of four shards.
	var keys []string
	for k := 0; len(keys) < 24; k++ {
		if key := "pl:" + strconv.Itoa(k); keyspace.Slot([]byte(key)) < 4096 {
			keys = append(keys, key)
		}
	}
	tk := newTakers(cc, keys, limit)
	for b := range keys {
		for tk.take(ctx, b) != nil {
			if time.Now().After(deadline) {
				t.Fatalf("bucket %s never served", keys[b])
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	tk.run(ctx, 8, deadline)
	place := func(epoch int, to ...int) {
		t.Helper()
		var out bytes.Buffer
		var nodes []string
		for _, o := range to {
			nodes = append(nodes, addrs[o])
		}
		for {
			out.Reset()
			err := runReloading(ctx, nil, []string{"cluster", "place", "--nodes", strings.Join(addrs, ","), "--shard", "0", "--to", strings.Join(nodes, ",")},
				noEnvLookup, nil, &out, &out)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sluice cluster place: %v\n%s", err, out.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
		if want := "shard 0 0-4095 " + strings.Join(nodes, ",") + "\n"; !strings.Contains(out.String(), "placed: epoch "+strconv.Itoa(epoch)+"\n") || !strings.Contains(out.String(), want) {
			t.Fatalf("sluice cluster place printed:\n%s\nwant epoch %d and the line %q", out.String(), epoch, want)
		}
		// Every node follows: those named hold the shard, caught up, the
		// others hold nothing of it.
		for i, p := range procs {
			for {
				info, err := p.client(t).Info(ctx, "replication").Result()
				line, holds := infoShards(info)[0]
				ok := err == nil && strings.Contains(info, "cluster_placement_epoch:"+strconv.Itoa(epoch)+"\r\n")
				if slices.Contains(to, i) {
					ok = ok && holds && strings.Contains(line, "apply_lag=0,") && !strings.Contains(line, "commit=0,")
				} else {
					ok = ok && !holds
				}
				if ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("node %d never followed epoch %d of the placement: %v\n%s", i, epoch, err, info)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	place(1, 0, 1, 3)
	place(2, 1, 3, 2)
	for {
		info, err := procs[1].client(t).Info(ctx, "replication").Result()
		if err == nil && strings.HasPrefix(infoShards(info)[0], "role=leader,serving=1,") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 1, shard 0's new home, never led it: %v\n%s", err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// sluice cluster show gives the placement every node follows, and
	// exits 0: the nodes' slot tables, rebuilt on each leader change, have
	// epochs of their own.
	var out bytes.Buffer
	if err := runReloading(ctx, nil, []string{"cluster", "show", "--nodes", strings.Join(addrs, ",")}, noEnvLookup, nil, &out, &out); err != nil {
		t.Errorf("sluice cluster show: %v\n%s", err, out.String())
	}
	if want := "epoch 2\n"; !strings.HasPrefix(out.String(), want) || !strings.Contains(out.String(), "shard 0 0-4095 "+addrs[1]+","+addrs[3]+","+addrs[2]+"\n") {
		t.Errorf("sluice cluster show printed:\n%s\nwant the placement at epoch 2", out.String())
	}
	procs[0].stop(t, syscall.SIGKILL)
	procs[2].stop(t, syscall.SIGKILL)
	tk.stop()
	total, errs := tk.check(t, ctx, deadline, "on nodes 1 and 3 alone")
	t.Logf("%d takes acknowledged, %d failed (retried), over two moves and two kills", total, errs)
}

// TestShowPlacementDisagreement: sluice cluster show on a replicated
// cluster prints the placement of the highest epoch and fails naming
// each node that follows an older one, or another at that epoch, or has
// none yet; with every node on one placement it passes, whichever leader
// each names.
func TestShowPlacementDisagreement(t *testing.T) {
	const p2 = "epoch 2\nshard 0 0-8191 a:1,b:1,c:1\nshard 1 8192-16383 b:1,c:1,d:1\n"
	var out bytes.Buffer
	ct := &clusterTool{out: &out, order: []string{"a:1", "b:1", "c:1", "d:1"}}
	places := map[string]string{
		"a:1": p2, "b:1": "epoch 1\nshard 0 0-8191 a:1,b:1,d:1\nshard 1 8192-16383 b:1,c:1,d:1\n",
		"c:1": "epoch 2\nshard 0 0-8191 a:1,b:1,d:1\nshard 1 8192-16383 b:1,c:1,d:1\n",
	}
	err := ct.showPlacement(places, []string{"d:1"})
	if err == nil || !strings.Contains(err.Error(), "nodes b:1,c:1,d:1 do not follow the placement of epoch 2") {
		t.Errorf("three nodes behind or apart: %v", err)
	}
	for _, want := range []string{p2, "node b:1: placement epoch 1, not 2\n", "node c:1: another placement at epoch 2\n", "node d:1: no placement"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("show printed:\n%s\nwant %q", out.String(), want)
		}
	}
	out.Reset()
	if err := ct.showPlacement(map[string]string{"a:1": p2, "b:1": p2, "c:1": p2, "d:1": p2}, nil); err != nil || out.String() != p2 {
		t.Errorf("every node on one placement: %v, printed:\n%s", err, out.String())
	}
}
