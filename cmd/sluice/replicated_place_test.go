package main

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	addrs, bus := freePorts(t, 4), freePorts(t, 4)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()}
	procs := make([]*proc, 4)
	for i := range procs {
		procs[i] = startReplicated(t, addrs, bus, dirs, i, "--fsync", fsync)
	}
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
	var mu sync.Mutex
	acked, failed := make([]int64, len(keys)), make([]int64, len(keys))
	take := func(b int) error {
		n, err := cc.Do(ctx, "RL.REDUCE", keys[b], limit, 3600, "AT", clusterAt).Int64()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			failed[b]++
		case n >= 1:
			acked[b]++
		}
		return err
	}
	for b := range keys {
		for take(b) != nil {
			if time.Now().After(deadline) {
				t.Fatalf("bucket %s never served", keys[b])
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && time.Now().Before(deadline) {
				for b := w; b < len(keys); b += 8 {
					if take(b) != nil {
						time.Sleep(10 * time.Millisecond)
					}
				}
			}
		}()
	}
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
	procs[0].stop(t, syscall.SIGKILL)
	procs[2].stop(t, syscall.SIGKILL)
	stop.Store(true)
	wg.Wait()
	for b := range keys {
		for {
			n, err := cc.Do(ctx, "RL.GET", keys[b], limit, 3600, "AT", clusterAt).Int64()
			if err == nil {
				if n > limit-acked[b] || n < limit-acked[b]-failed[b] {
					t.Errorf("%s on nodes 1 and 3 alone: %d tokens left after %d takes acknowledged and %d failed; want %d less at most %d", keys[b], n, acked[b], failed[b], limit-acked[b], failed[b])
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s on nodes 1 and 3 alone: %v", keys[b], err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var total, errs int64
	for b := range keys {
		total, errs = total+acked[b], errs+failed[b]
	}
	t.Logf("%d takes acknowledged, %d failed (retried), over two moves and two kills", total, errs)
}
