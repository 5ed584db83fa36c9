package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/keyspace"
)

// freePorts picks n free ports on loopback by listening and closing: the
// nodes must know each other's addresses before they start. Another
// process could take a port in between; that race is accepted.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	addrs, release := reservePorts(t, n)
	release()
	return addrs
}

// reservePorts listens on n loopback ports and returns their addresses,
// and release, which closes the listeners for the processes to take;
// until then no listener of the test can get one of them.
func reservePorts(t *testing.T, n int) (addrs []string, release func()) {
	t.Helper()
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
}

// startCluster starts one sluice process per address, in cluster mode with
// the initial topology of addrs, and returns them in ordinal order.
func startCluster(t *testing.T, addrs []string, extra ...string) []*proc {
	t.Helper()
	procs := make([]*proc, len(addrs))
	for i, a := range addrs {
		flags := append([]string{"--addr", a, "--cluster-nodes", strings.Join(addrs, ","), "--cluster-ordinal", strconv.Itoa(i)}, extra...)
		procs[i] = startProc(t, t.TempDir(), flags...)
		if procs[i].addr != a {
			t.Fatalf("node %d serves on %s, want %s", i, procs[i].addr, a)
		}
	}
	return procs
}

// ownerOf is the ordinal owning key under the initial topology of n nodes.
func ownerOf(key string, n int) int {
	s := int(keyspace.Slot([]byte(key)))
	for i := range n {
		if s <= cluster.Slots*(i+1)/n-1 {
			return i
		}
	}
	return n - 1
}

const clusterAt = 1700000000

// TestClusterEndToEnd is issue 17's first must-show: three sluice
// processes in cluster mode; go-redis' ClusterClient runs RL.REDUCE,
// CL.THROTTLE and FW.INCR on 10k keys with no error, and every key's state
// is on the node owning its slot and nowhere else; redis-py's RedisCluster
// does the same on a subset and parses CLUSTER SLOTS, SHARDS, NODES and
// INFO; DEL across slots gets CROSSSLOT.
func TestClusterEndToEnd(t *testing.T) {
	addrs := freePorts(t, 3)
	procs := startCluster(t, addrs)
	ctx := context.Background()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	defer cc.Close()
	const keys = 10000
	key := func(i int) string { return "user:" + strconv.Itoa(i) }
	for start := 0; start < keys; start += 500 {
		cmds, err := cc.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := start; i < start+500; i++ {
				k := key(i)
				p.Do(ctx, "RL.REDUCE", k, 100, 60, "TAKE", 3, "AT", clusterAt)
				p.Do(ctx, "CL.THROTTLE", k, 15, 30, 60, "AT", clusterAt)
				p.Do(ctx, "FW.INCR", k, 10, 60, "AT", clusterAt)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("pipeline from key %d: %v", start, err)
		}
		for _, c := range cmds {
			if c.Err() != nil {
				t.Fatalf("%v: %v", c.Args(), c.Err())
			}
		}
	}
	// Each node, asked directly, holds exactly its keys' records (three
	// kinds per key) and redirects the others.
	plain := make([]*redis.Client, len(procs))
	var total int64
	for i, p := range procs {
		plain[i] = p.client(t)
		n, err := plain[i].DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if total != 3*keys {
		t.Fatalf("DBSIZE over the nodes: %d, want %d", total, 3*keys)
	}
	checkOwners(t, plain, keys, key, 97)

	crossA, crossB := key(0), key(1)
	if keyspace.Slot([]byte(crossA)) == keyspace.Slot([]byte(crossB)) {
		t.Fatal("test keys share a slot")
	}
	err := plain[ownerOf(crossA, 3)].Del(ctx, crossA, crossB).Err()
	if err == nil || err.Error() != "CROSSSLOT Keys in request don't hash to the same slot" {
		t.Fatalf("DEL across slots: %v", err)
	}
	if n, err := cc.Del(ctx, crossA).Result(); err != nil || n != 1 {
		t.Fatalf("DEL through the cluster client: %d %v", n, err)
	}

	t.Run("redis-py", func(t *testing.T) {
		py := pythonWithRedisCluster(t)
		const pyKeys = 300
		ports := make([]string, len(addrs))
		for i, a := range addrs {
			_, ports[i], _ = net.SplitHostPort(a)
		}
		cmd := exec.Command(py, "-c", redisPyCluster, strings.Join(ports, ","), strconv.Itoa(pyKeys))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("redis-py: %v\n%s", err, out)
		}
		t.Logf("redis-py: %s", out)
		var got struct {
			Slots  [][3]any `json:"slots"`
			Nodes  int      `json:"nodes"`
			Myself int      `json:"myself"`
			State  string   `json:"state"`
			Known  string   `json:"known"`
			Shards int      `json:"shards"`
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("redis-py output %q: %v", out, err)
		}
		if len(got.Slots) != 3 || got.Nodes != 3 || got.Myself != 1 || got.State != "ok" || got.Known != "3" || got.Shards != 3 {
			t.Fatalf("redis-py parsed: %+v", got)
		}
		for i, r := range got.Slots {
			if r[2] != addrs[i] {
				t.Fatalf("redis-py: CLUSTER SLOTS range %d is on %v, want %s", i, r[2], addrs[i])
			}
		}
		checkOwners(t, plain, pyKeys, func(i int) string { return "py:" + strconv.Itoa(i) }, 97)
	})
}

// checkOwners asks every node for every key's bucket: the owner answers
// want tokens, the others MOVED to the owner.
func checkOwners(t *testing.T, plain []*redis.Client, keys int, key func(int) string, want int64) {
	t.Helper()
	ctx := context.Background()
	for i, c := range plain {
		cmds, _ := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for k := range keys {
				p.Do(ctx, "RL.GET", key(k), 100, 60, "AT", clusterAt)
			}
			return nil
		})
		for k, cmd := range cmds {
			owner := ownerOf(key(k), len(plain))
			n, err := cmd.(*redis.Cmd).Int64()
			if owner == i {
				if err != nil || n != want {
					t.Fatalf("node %d, its key %s: %d %v, want %d", i, key(k), n, err, want)
				}
				continue
			}
			var moved string
			if err != nil {
				moved = err.Error()
			}
			if !strings.HasPrefix(moved, "MOVED "+strconv.Itoa(int(keyspace.Slot([]byte(key(k)))))+" ") {
				t.Fatalf("node %d, key %s of node %d: %d %v, want MOVED", i, key(k), owner, n, err)
			}
		}
	}
}

// pythonWithRedisCluster returns a Python that imports redis.cluster (Debian's
// python3-redis); it skips the test when there is none, unless CI=true.
func pythonWithRedisCluster(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(py, "-c", "import redis.cluster").Run() == nil {
			return py
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no python3 with the redis module (Debian python3-redis); .ci/run installs it")
	}
	t.Skip("no python3 with the redis module (apt-get install python3-redis)")
	return ""
}

// redisPyCluster runs the limit commands through redis-py's RedisCluster
// and prints what it parsed of the CLUSTER replies, as JSON.
const redisPyCluster = `
import json, sys
from redis.cluster import RedisCluster, ClusterNode
ports = [int(p) for p in sys.argv[1].split(",")]
n = int(sys.argv[2])
rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in ports])
for i in range(n):
    k = "py:%d" % i
    rc.execute_command("RL.REDUCE", k, 100, 60, "TAKE", 3, "AT", 1700000000)
    rc.execute_command("CL.THROTTLE", k, 15, 30, 60, "AT", 1700000000)
    rc.execute_command("FW.INCR", k, 10, 60, "AT", 1700000000)
node = rc.get_node("127.0.0.1", ports[0])
slots = rc.cluster_slots(target_nodes=node)
nodes = rc.cluster_nodes()
info = rc.cluster_info(target_nodes=node)
shards = rc.execute_command("CLUSTER SHARDS", target_nodes=node)
out = {
    "slots": sorted([[int(k[0]), int(k[1]), "%s:%d" % tuple(v["primary"])] for k, v in slots.items()]),
    "nodes": len(nodes),
    "myself": sum(1 for v in nodes.values() if "myself" in v["flags"]),
    "state": info["cluster_state"],
    "known": str(info["cluster_known_nodes"]),
    "shards": len(shards),
}
print(json.dumps(out))
`
