package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/keyspace"
)

// startReplicated starts one sluice process per address, in cluster mode
// with --cluster-replicas 3, each on its own data directory (dirs, reused
// by a restart).
func startReplicated(t *testing.T, addrs, bus, dirs []string, i int, extra ...string) *proc {
	t.Helper()
	flags := append([]string{"--addr", addrs[i], "--cluster-nodes", strings.Join(addrs, ","), "--cluster-ordinal", strconv.Itoa(i),
		"--cluster-replicas", "3", "--cluster-bus-nodes", strings.Join(bus, ","), "--cluster-election-timeout", "300ms"}, extra...)
	return startProc(t, dirs[i], flags...)
}

// startReplicatedNodes starts n processes with --cluster-replicas 3 and
// the extra flags, each on a data directory of its own.
func startReplicatedNodes(t *testing.T, n int, extra ...string) (addrs, bus, dirs []string, procs []*proc) {
	t.Helper()
	addrs, bus = freePorts(t, n), freePorts(t, n)
	procs = make([]*proc, n)
	for range n {
		dirs = append(dirs, t.TempDir())
	}
	for i := range procs {
		procs[i] = startReplicated(t, addrs, bus, dirs, i, extra...)
	}
	return addrs, bus, dirs, procs
}

// startReplicatedCluster starts three processes with --cluster-replicas 3
// and --fsync always (a write is answered once its shard's group has it),
// and a go-redis ClusterClient on them, closed with the test. go-redis
// reloads the slots on a MOVED, or every ClusterStateReloadInterval (60s
// by default), but not when the node it routes to refuses connections
// (go-redis issue #3979): a killed leader's slots are reached through the
// reload.
func startReplicatedCluster(t *testing.T) (addrs, bus, dirs []string, procs []*proc, cc *redis.ClusterClient) {
	t.Helper()
	addrs, bus, dirs, procs = startReplicatedNodes(t, 3, "--fsync", "always")
	cc = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: 200 * time.Millisecond})
	t.Cleanup(func() { cc.Close() })
	return addrs, bus, dirs, procs, cc
}

// waitHomeLeaders waits until INFO replication on each node i shows its
// three shards and shard i led and served by it, and every node's slot
// table (CLUSTER SLOTS) gives shard i's slots to node i, failing at
// deadline. The node that hands a shard back home learns of its new leader
// a moment after the home node leads it, and answers CLUSTERDOWN for its
// slots meanwhile.
func waitHomeLeaders(t *testing.T, procs []*proc, deadline time.Time) {
	t.Helper()
	for i, p := range procs {
		for {
			info, err := p.client(t).Info(context.Background(), "replication").Result()
			if err == nil && strings.Count(info, "\r\nshard_") == 3 && strings.Contains(info, "cluster_replicas:3\r\n") &&
				strings.Contains(info, "shard_"+strconv.Itoa(i)+":role=leader,serving=1,leader="+strconv.Itoa(i)+",") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d never showed its three shards and its home shard led: %v\n%s", i, err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i, p := range procs {
		c := p.client(t)
		for {
			slots, err := c.ClusterSlots(context.Background()).Result()
			home := err == nil && len(slots) == len(procs)
			for s := 0; home && s < len(slots); s++ {
				home = len(slots[s].Nodes) > 0 && slots[s].Nodes[0].Addr == procs[s].addr
			}
			if home {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d never gave each shard's slots to its home node: %v %+v", i, err, slots)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestReplicatedClusterFailover is issue 29's failover in its simplest
// form: three processes with --cluster-replicas 3 and --fsync always;
// go-redis' ClusterClient takes tokens from 60 buckets of 20 (at a fixed
// time, so nothing refills) from 8 goroutines while the leader of one
// shard is killed with SIGKILL. Every bucket's acknowledged admissions
// stay within its 20 tokens, every bucket reaches them (the shard is
// served again by another replica), and once the killed node is back on
// its volume every bucket reads empty, whichever node leads its shard.
func TestReplicatedClusterFailover(t *testing.T) {
	addrs, bus, dirs, procs, cc := startReplicatedCluster(t)
	ctx := context.Background()
	const buckets, limit = 60, 20
	key := func(b int) string { return "bucket:" + strconv.Itoa(b) }
	// Every shard served: one token from each bucket, retried until it
	// goes through.
	var mu sync.Mutex
	allowed := make([]int, buckets)
	take := func(b int) error {
		n, err := cc.Do(ctx, "RL.REDUCE", key(b), limit, 3600, "AT", clusterAt).Int64()
		if err != nil {
			return err
		}
		if n >= 1 {
			mu.Lock()
			allowed[b]++
			mu.Unlock()
		}
		return nil
	}
	deadline := time.Now().Add(60 * time.Second) // bounds a hang
	for b := range buckets {
		for take(b) != nil {
			if time.Now().After(deadline) {
				t.Fatalf("bucket %d never served", b)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The shard of bucket 0, and the node leading it.
	slot, err := cc.ClusterKeySlot(ctx, key(0)).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Leadership settles on each shard's home (node i leads shard i), as
	// INFO replication shows; the node killed is the home of bucket 0's
	// shard.
	waitHomeLeaders(t, procs, deadline)
	lead := int(slot) * 3 / 16384
	var wg sync.WaitGroup
	var failures sync.Map
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; time.Now().Before(deadline); round++ {
				done := true
				for b := w; b < buckets; b += 8 {
					mu.Lock()
					full := allowed[b] >= limit
					mu.Unlock()
					if full {
						continue
					}
					done = false
					if err := take(b); err != nil {
						failures.Store(err.Error(), true)
					}
				}
				if done {
					return
				}
			}
		}()
	}
	procs[lead].stop(t, syscall.SIGKILL)
	wg.Wait()
	for b, n := range allowed {
		if n > limit {
			t.Errorf("bucket %d admitted %d requests; its limit is %d", b, n, limit)
		}
		if n < limit {
			t.Errorf("bucket %d admitted %d of %d before the deadline", b, n, limit)
		}
	}
	failures.Range(func(k, _ any) bool { t.Logf("an error a client saw during the failover: %v", k); return true })
	// Back on its volume, the killed node takes its shard back, and every
	// bucket is empty whoever answers.
	procs[lead] = startReplicated(t, addrs, bus, dirs, lead, "--fsync", "always")
	deadline = time.Now().Add(60 * time.Second)
	for b := range buckets {
		for {
			n, err := cc.Do(ctx, "RL.GET", key(b), limit, 3600, "AT", clusterAt).Int64()
			if err == nil {
				if n != 0 {
					t.Errorf("bucket %d has %d tokens after %d admissions of %d", b, n, allowed[b], limit)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("bucket %d after the node's return: %v", b, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestReplicatedSweepOnlyOnLeaders: with replicated shards only a shard's
// leader sweeps its idle records (its deletes reach the replicas); a
// follower's sweep leaves them, so the deletions counted over the three
// nodes' sweeps (COMPACT) are exactly the idle windows, once each.
func TestReplicatedSweepOnlyOnLeaders(t *testing.T) {
	_, _, _, procs, cc := startReplicatedCluster(t)
	ctx := context.Background()
	const buckets = 30
	deadline := time.Now().Add(60 * time.Second) // bounds a hang
	// Each shard led from its home, where leadership settles: a sweep
	// while it moves may find its deletes refused, and COMPACT says so.
	waitHomeLeaders(t, procs, deadline)
	for b := range buckets {
		// A fixed window of 2023 (AT): expired, so idle, now.
		for cc.Do(ctx, "FW.INCR", "idle:"+strconv.Itoa(b), 10, 60, "AT", clusterAt).Err() != nil {
			if time.Now().After(deadline) {
				t.Fatalf("bucket %d never served", b)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	deleted := 0
	for i, p := range procs {
		c := p.client(t)
		if err := c.Do(ctx, "COMPACT").Err(); err != nil {
			t.Fatalf("node %d: COMPACT: %v", i, err)
		}
		info, err := c.Info(ctx, "storage").Result()
		if err != nil {
			t.Fatal(err)
		}
		_, rest, ok := strings.Cut(info, "last_sweep_deleted:")
		n, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(rest, "\r\n", 2)[0]))
		if !ok || err != nil {
			t.Fatalf("node %d: no last_sweep_deleted in INFO storage:\n%s", i, info)
		}
		deleted += n
	}
	if deleted != buckets {
		t.Errorf("the three nodes' sweeps deleted %d records; want the %d idle windows, each by its shard's leader alone", deleted, buckets)
	}
}

// TestReplicatedNodeRejoinsAfterLosingItsVolume is issue 29's lost
// volume: a node killed and started again on an empty data directory
// learns from the others that the cluster has run, rejoins every shard
// under a new identity (INFO replication's cluster_incarnation), by
// snapshot, and leads its home shard again, with every bucket as the
// cluster left it, those changed while it was away included.
func TestReplicatedNodeRejoinsAfterLosingItsVolume(t *testing.T) {
	addrs, bus, dirs, procs, cc := startReplicatedCluster(t)
	ctx := context.Background()
	const buckets, limit = 200, 1000
	deadline := time.Now().Add(90 * time.Second) // bounds a hang
	waitHomeLeaders(t, procs, deadline)
	key := func(b int) string { return "vol:" + strconv.Itoa(b) }
	// take takes n tokens from bucket b, retried until a node serves it.
	take := func(b, n int) {
		t.Helper()
		for {
			err := cc.Do(ctx, "RL.REDUCE", key(b), limit, 3600, "TAKE", n, "AT", clusterAt).Err()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("bucket %d: %v", b, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	taken := make([]int, buckets)
	for b := range buckets {
		take(b, b+1)
		taken[b] += b + 1
	}
	const lost = 0
	procs[lost].stop(t, syscall.SIGKILL)
	for b := 0; b < buckets; b += 3 { // while it is away
		take(b, 1)
		taken[b]++
	}
	dirs[lost] = t.TempDir()
	procs[lost] = startReplicated(t, addrs, bus, dirs, lost, "--fsync", "always")
	waitHomeLeaders(t, procs, deadline)
	info, err := procs[lost].client(t).Info(ctx, "replication").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info, "cluster_replicas_started:1\r\n") || strings.Contains(info, "cluster_incarnation:0\r\n") {
		t.Fatalf("the node on an empty directory did not rejoin under a new incarnation:\n%s", info)
	}
	// Every bucket, read on the rejoined node where it leads and through
	// the cluster elsewhere.
	direct := procs[lost].client(t)
	for b := range buckets {
		want := int64(limit - taken[b])
		n, err := cc.Do(ctx, "RL.GET", key(b), limit, 3600, "AT", clusterAt).Int64()
		if err != nil || n != want {
			t.Errorf("bucket %d after the rejoin: %d, %v; want %d", b, n, err, want)
		}
		if n, err := direct.Do(ctx, "RL.GET", key(b), limit, 3600, "AT", clusterAt).Int64(); err == nil && n != want {
			t.Errorf("bucket %d on the rejoined node: %d; want %d", b, n, want)
		}
	}
	procs[lost].stop(t, syscall.SIGTERM) // its log is complete once it exits
	if !strings.Contains(procs[lost].logs.String(), "lost its data") {
		t.Errorf("the node did not log that it lost its data:\n%s", procs[lost].logs)
	}
}

// TestReplicatedOverTLS: with --tls-cert, --tls-key and --tls-ca the
// replication port speaks mutual TLS only: the shards of three nodes
// commit (a write in --fsync always is answered once a majority of its
// shard has it), a HIT whose counter another node's shard holds is
// forwarded to that shard's leader over TLS, sluice cluster show reaches them with --cacert,
// --tls-cert and --tls-key (and none without), and a plain connection to
// a replication port gets no answer; without --tls-ca, replicated shards are refused at start, as
// the nodes could not authenticate each other.
func TestReplicatedOverTLS(t *testing.T) {
	cert, key := writeCA(t, filepath.Join(t.TempDir(), "ca"))
	rules, o := overrideCluster(t)
	tlsFlags := []string{"--tls-cert", cert, "--tls-key", key, "--tls-ca", cert, "--fsync", "always", "--policy", rules}
	addrs, bus := freePorts(t, 3), freePorts(t, 3)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	for i := range dirs {
		startReplicated(t, addrs, bus, dirs, i, tlsFlags...)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: 200 * time.Millisecond,
		TLSConfig: clientCert(t, cert, key)})
	defer cc.Close()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second) // bounds a hang
	// Buckets in every shard.
	for b := range 30 {
		for {
			err := cc.Do(ctx, "RL.REDUCE", "tls:"+strconv.Itoa(b), 10, 60, "AT", clusterAt).Err()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("bucket %d never served over replicated TLS: %v", b, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// A HIT on node 0 whose counter is in shard 2 (slots 10923-16383,
	// led from node 2) is forwarded to that shard's leader over TLS and
	// counted there: the rule allows 2 a year.
	actor := o.actorOn("10.0.3.", 10923, 16383)
	node := func(i int) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addrs[i], TLSConfig: clientCert(t, cert, key), MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	for n, want := range []int64{1, 1, 0} {
		var v []any
		var err error
		for {
			v, err = node(0).Do(ctx, "HIT", "path=/api", "ip="+actor).Slice()
			if err == nil || !strings.HasPrefix(err.Error(), "CLUSTERDOWN") || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond) // shard 2's leader still being elected
		}
		if err != nil || v[0] != want {
			t.Fatalf("HIT %d of %s on node 0, forwarded over TLS: %v, %v; want allowed %d", n+1, actor, v, err, want)
		}
	}
	if v, err := node(2).Do(ctx, "HIT", "path=/api", "ip="+actor).Slice(); err != nil || v[0] != int64(0) {
		t.Errorf("HIT of %s on node 2, the leader the hits were forwarded to: %v, %v; want it spent", actor, v, err)
	}

	// sluice cluster reaches the nodes over TLS with sluice backup's
	// flags; without them it reaches none.
	var out bytes.Buffer
	tool := []string{"cluster", "show", "--nodes", strings.Join(addrs, ","), "--cluster-command-timeout", "5s"}
	if err := runReloading(ctx, nil, append(tool, "--cacert", cert, "--tls-cert", cert, "--tls-key", key), noEnvLookup, nil, &out, &out); err != nil || !strings.HasPrefix(out.String(), "epoch 0\nshard 0 ") {
		t.Errorf("sluice cluster show over TLS: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := runReloading(ctx, nil, tool, noEnvLookup, nil, &out, &out); err == nil {
		t.Errorf("sluice cluster show without the TLS flags passed:\n%s", out.String())
	}
	c, err := net.Dial("tcp", bus[0])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second)) // bounds a hang only
	// A standing question, in plain TCP.
	c.Write([]byte("sluice-raft 2\nq\x01\x00"))
	if b, err := io.ReadAll(c); err == nil && (len(b) == 1 || strings.Contains(string(b), "sluice")) {
		t.Errorf("a plain connection to the replication port got %q", b)
	}

	p := startProcAsync(t, t.TempDir(), nil, "--addr", freePorts(t, 1)[0], "--cluster-nodes", strings.Join(addrs, ","), "--cluster-ordinal", "0",
		"--cluster-replicas", "3", "--cluster-bus-nodes", strings.Join(bus, ","), "--tls-cert", cert, "--tls-key", key)
	select {
	case <-p.exited:
	case <-p.addrc:
		t.Fatal("replicated shards started with TLS and no --tls-ca")
	case <-time.After(time.Minute): // a hang fails, not blocks the suite
		t.Fatal("neither served nor exited within a minute")
	}
	if !strings.Contains(p.logs.String(), "needs --tls-ca") {
		t.Errorf("the refusal does not name --tls-ca:\n%s", p.logs)
	}
}

// TestReplicatedNodeAddedByListIsRefused is the add-a-node-by-list
// case under replication: a node of three restarted with a fourth address
// listed (as a user adding a node would try) would place its shards
// anew, other slot ranges under the same Raft groups than its peers
// keep, and two leaders could count one slot's buckets. It exits with
// status 1 naming both placements; started again with its first flags it
// serves the buckets as they were.
func TestReplicatedNodeAddedByListIsRefused(t *testing.T) {
	addrs, bus, dirs, procs, cc := startReplicatedCluster(t)
	ctx := context.Background()
	deadline := time.Now().Add(90 * time.Second) // bounds a hang
	waitHomeLeaders(t, procs, deadline)
	for {
		err := cc.Do(ctx, "RL.REDUCE", "added", 10, 3600, "TAKE", 3, "AT", clusterAt).Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	procs[0].stop(t, syscall.SIGTERM)
	more, moreBus := append(addrs[:3:3], freePorts(t, 1)...), append(bus[:3:3], freePorts(t, 1)...)
	p := startProcAsync(t, dirs[0], nil, "--addr", addrs[0], "--cluster-nodes", strings.Join(more, ","), "--cluster-ordinal", "0",
		"--cluster-replicas", "3", "--cluster-bus-nodes", strings.Join(moreBus, ","), "--cluster-election-timeout", "300ms", "--fsync", "always")
	select {
	case <-p.exited:
	case addr := <-p.addrc:
		t.Fatalf("node 0 restarted with a fourth node listed serves on %s", addr)
	case <-time.After(time.Minute): // a hang fails, not blocks the suite
		t.Fatal("node 0 restarted with a fourth node listed neither served nor exited within a minute")
	}
	var exit *exec.ExitError
	if !errors.As(p.err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v; want status 1\n%s", p.err, p.logs)
	}
	for _, want := range []string{"replicas=3 nodes=" + strings.Join(addrs, ","), "replicas=3 nodes=" + strings.Join(more, ","), "flags it was first started with"} {
		if !strings.Contains(p.logs.String(), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, p.logs)
		}
	}
	procs[0] = startReplicated(t, addrs, bus, dirs, 0, "--fsync", "always")
	waitHomeLeaders(t, procs, deadline)
	if n, err := cc.Do(ctx, "RL.GET", "added", 10, 3600, "AT", clusterAt).Int64(); err != nil || n != 7 {
		t.Fatalf("after node 0's start with its first flags, RL.GET: %d, %v; want 7", n, err)
	}
}

// TestReplicatedMoreShardsThanNodes: with --cluster-shards 6 on three
// nodes, each node leads two shards (its home shards, i and i+3), CLUSTER
// SLOTS gives six ranges, and go-redis' ClusterClient writes to all of
// them; once node 1 is killed, its two shards are served by other
// replicas with every acknowledged write (--fsync always).
func TestReplicatedMoreShardsThanNodes(t *testing.T) {
	addrs, _, _, procs := startReplicatedNodes(t, 3, "--fsync", "always", "--cluster-shards", "6")
	ctx := context.Background()
	deadline := time.Now().Add(90 * time.Second) // bounds a hang
	for i, p := range procs {
		for {
			info, err := p.client(t).Info(ctx, "replication").Result()
			lines := infoShards(info)
			home, away := 0, 0 // shards led, at home and not
			for s, l := range lines {
				if strings.HasPrefix(l, "role=leader,serving=1,") {
					if s%3 == i {
						home++
					} else {
						away++
					}
				}
			}
			if err == nil && len(lines) == 6 && home == 2 && away == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d never showed six shards and led its two home shards: %v\n%s", i, err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The slot table follows the leaders at the next tick, and an
	// election on a loaded machine may move a shard from its home for a
	// while: asked again until every range is at home.
	atHome := func(slots []redis.ClusterSlot) bool {
		if len(slots) != 6 {
			return false
		}
		for s, r := range slots {
			if r.Start != 16384*s/6 || r.End != 16384*(s+1)/6-1 || r.Nodes[0].Addr != addrs[s%3] {
				return false
			}
		}
		return true
	}
	slots, err := procs[0].client(t).ClusterSlots(ctx).Result()
	for (err != nil || !atHome(slots)) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		slots, err = procs[0].client(t).ClusterSlots(ctx).Result()
	}
	if err != nil || !atHome(slots) {
		t.Fatalf("CLUSTER SLOTS: %+v, %v; want six ranges, range s on node s mod 3", slots, err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: 200 * time.Millisecond})
	defer cc.Close()
	const keys = 120
	take := func(k int) {
		t.Helper()
		for {
			err := cc.Do(ctx, "RL.REDUCE", "sh:"+strconv.Itoa(k), 100, 3600, "TAKE", 1, "AT", clusterAt).Err()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("key %d: %v", k, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for k := range keys {
		take(k)
	}
	procs[1].stop(t, syscall.SIGKILL)
	for k := range keys {
		take(k)
	}
	for k := range keys {
		if n, err := cc.Do(ctx, "RL.GET", "sh:"+strconv.Itoa(k), 100, 3600, "AT", clusterAt).Int64(); err != nil || n != 98 {
			t.Errorf("key %d after node 1's death: %d, %v; want 98", k, n, err)
		}
	}
}

// TestReplicatedHandbackLosesNothing: in --fsync everysec a node that
// stood in for a shard's home (killed, then back on its volume) hands
// the shard back only once the group has committed everything it
// decided: every take acknowledged while it led the shard is in the
// buckets the home node serves afterwards. Handing the leadership over
// at once, as before, dropped what the stand-in had decided in its last
// interval.
func TestReplicatedHandbackLosesNothing(t *testing.T) {
	addrs, bus, dirs, procs := startReplicatedNodes(t, 3, "--fsync", "everysec")
	ctx := context.Background()
	deadline := time.Now().Add(90 * time.Second) // bounds a hang
	waitHomeLeaders(t, procs, deadline)
	var keys []string // buckets of shard 0
	for k := 0; len(keys) < 30; k++ {
		if key := "hb:" + strconv.Itoa(k); keyspace.Slot([]byte(key)) < cluster.Slots/3 {
			keys = append(keys, key)
		}
	}
	procs[0].stop(t, syscall.SIGKILL)
	leads := func(p *proc, shard int) bool {
		info, err := p.client(t).Info(ctx, "replication").Result()
		return err == nil && strings.HasPrefix(infoShards(info)[shard], "role=leader,serving=1,")
	}
	for !leads(procs[1], 0) && !leads(procs[2], 0) {
		if time.Now().After(deadline) {
			t.Fatal("shard 0 not led by node 1 or 2 after node 0's death")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs[1:], ClusterStateReloadInterval: 100 * time.Millisecond, MaxRedirects: 16})
	defer cc.Close()
	const limit = 100000
	acked := make([]int, len(keys))
	pass := func() {
		for b, key := range keys {
			if cc.Do(ctx, "RL.REDUCE", key, limit, 3600, "TAKE", 1, "AT", clusterAt).Err() == nil {
				acked[b]++
			}
		}
	}
	pass()
	procs[0] = startReplicated(t, addrs, bus, dirs, 0, "--fsync", "everysec")
	for !leads(procs[0], 0) { // taking until the shard is back home
		if time.Now().After(deadline) {
			t.Fatal("shard 0 not back on node 0")
		}
		pass()
	}
	for b, key := range keys {
		left, err := cc.Do(ctx, "RL.GET", key, limit, 3600, "AT", clusterAt).Int64()
		if err != nil || left > int64(limit-acked[b]) {
			t.Errorf("bucket %s after the handback: %d left, %v; %d takes were acknowledged: want at most %d left", key, left, err, acked[b], limit-acked[b])
		}
	}
}
