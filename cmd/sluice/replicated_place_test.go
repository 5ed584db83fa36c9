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

	"github.com/sluicehq/sluice/keyspace"
)

// TestReplicatedShardPlacedOnAnotherNode: four processes with
// --cluster-replicas 3; shard 0 (nodes 0, 1, 2) is moved to nodes 0, 1, 3
// with sluice cluster place. Every node follows the placement's new
// epoch; node 3 takes the shard's buckets by snapshot and node 2 lets
// the shard go. Then nodes 0 and 2 are killed: before the move that
// would have left shard 0 one replica of three, with no quorum; now
// nodes 1 and 3 serve it, every bucket as it was.
func TestReplicatedShardPlacedOnAnotherNode(t *testing.T) {
	addrs, bus := freePorts(t, 4), freePorts(t, 4)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()}
	procs := make([]*proc, 4)
	for i := range procs {
		procs[i] = startReplicated(t, addrs, bus, dirs, i, "--fsync", "always")
	}
	ctx := context.Background()
	deadline := time.Now().Add(90 * time.Second) // bounds a hang
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: 200 * time.Millisecond})
	defer cc.Close()
	// Keys of shard 0: slots 0-4095 of four shards.
	var keys []string
	for k := 0; len(keys) < 40; k++ {
		if key := "pl:" + strconv.Itoa(k); keyspace.Slot([]byte(key)) < 4096 {
			keys = append(keys, key)
		}
	}
	take := func(key string) {
		t.Helper()
		for {
			err := cc.Do(ctx, "RL.REDUCE", key, 100, 3600, "TAKE", 1, "AT", clusterAt).Err()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("key %s: %v", key, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, key := range keys {
		take(key)
	}

	var out bytes.Buffer
	for {
		out.Reset()
		err := runReloading(ctx, nil, []string{"cluster", "place", "--nodes", strings.Join(addrs, ","), "--shard", "0", "--to", addrs[0] + "," + addrs[1] + "," + addrs[3]},
			noEnvLookup, nil, &out, &out)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice cluster place: %v\n%s", err, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if want := "shard 0 0-4095 " + addrs[0] + "," + addrs[1] + "," + addrs[3] + "\n"; !strings.Contains(out.String(), "placed: epoch 1\n") || !strings.Contains(out.String(), want) {
		t.Fatalf("sluice cluster place printed:\n%s\nwant epoch 1 and the line %q", out.String(), want)
	}
	for i, p := range procs {
		for {
			info, err := p.client(t).Info(ctx, "replication").Result()
			lines := infoShards(info)
			_, holds := lines[0]
			ok := err == nil && strings.Contains(info, "cluster_placement_epoch:1\r\n")
			switch i {
			case 2:
				ok = ok && !holds
			case 3:
				ok = ok && holds && strings.Contains(lines[0], "apply_lag=0,") && !strings.Contains(lines[0], "commit=0,")
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d never followed the move of shard 0: %v\n%s", i, err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	procs[0].stop(t, syscall.SIGKILL)
	procs[2].stop(t, syscall.SIGKILL)
	for _, key := range keys {
		take(key)
	}
	for _, key := range keys {
		if n, err := cc.Do(ctx, "RL.GET", key, 100, 3600, "AT", clusterAt).Int64(); err != nil || n != 98 {
			t.Errorf("%s on nodes 1 and 3 alone: %d, %v; want 98", key, n, err)
		}
	}
}
