package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
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

// TestReplicatedClusterTopologyReplies: on three processes with
// --cluster-replicas 3, CLUSTER SLOTS, SHARDS and NODES give each shard's
// slots to its leader as master; SHARDS lists its two followers as
// replicas, online, on every node, while SLOTS and NODES, where a node has
// one role, show each node as the master it is of its home shard.
// go-redis' ClusterClient, which reads SLOTS, sends every write and, with
// ReadOnly, every read to the leader (no MOVED); a follower that is sent
// READONLY still redirects. INFO replication and /metrics give each
// shard's lag. Once a node is killed, a leader shows it failed: left out
// of SLOTS, failed in SHARDS, fail in NODES, behind in INFO and /metrics.
func TestReplicatedClusterTopologyReplies(t *testing.T) {
	addrs, _, _, procs, _ := startReplicatedCluster(t)
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second) // bounds a hang
	waitHomeLeaders(t, procs, deadline)
	ids := make([]string, len(addrs))
	for i, a := range addrs {
		ids[i] = cluster.NodeID(a)
	}
	// until retries check until it passes on every node, failing with its
	// last complaint at deadline: leadership and the followers' health
	// settle over a few ticks.
	until := func(what string, check func(i int, c *redis.Client) string) {
		t.Helper()
		for i, p := range procs {
			if p == nil {
				continue
			}
			c := p.client(t)
			for {
				complaint := check(i, c)
				if complaint == "" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("node %d: %s: %s", i, what, complaint)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	home := func(shard int) (first, last int) { return 16384 * shard / 3, 16384*(shard+1)/3 - 1 }

	until("CLUSTER SLOTS", func(_ int, c *redis.Client) string {
		slots, err := c.ClusterSlots(ctx).Result()
		if err != nil {
			return err.Error()
		}
		if len(slots) != 3 {
			return fmt.Sprintf("%d ranges: %+v", len(slots), slots)
		}
		for s, r := range slots {
			first, last := home(s)
			var got []string
			for _, n := range r.Nodes {
				got = append(got, n.Addr+" "+n.ID)
			}
			// Its followers master the other shards: not listed.
			want := []string{addrs[s] + " " + ids[s]}
			if r.Start != first || r.End != last || !slices.Equal(got, want) {
				return fmt.Sprintf("range %d-%d served by %v; want %d-%d by %v (the leader alone)", r.Start, r.End, got, first, last, want)
			}
		}
		return ""
	})
	until("CLUSTER SHARDS", func(_ int, c *redis.Client) string {
		shards, err := c.ClusterShards(ctx).Result()
		if err != nil {
			return err.Error()
		}
		if len(shards) != 3 {
			return fmt.Sprintf("%d shards: %+v", len(shards), shards)
		}
		for s, sh := range shards {
			first, last := home(s)
			if len(sh.Slots) != 1 || sh.Slots[0].Start != int64(first) || sh.Slots[0].End != int64(last) || len(sh.Nodes) != 3 {
				return fmt.Sprintf("shard %d: %+v", s, sh)
			}
			for j, n := range sh.Nodes {
				o := (s + j) % 3
				role := "replica"
				if j == 0 {
					role = "master"
				}
				if n.ID != ids[o] || n.Role != role || n.Health != "online" || n.Port == 0 {
					return fmt.Sprintf("shard %d, node %d: %+v; want node %s, %s, online", s, j, n, ids[o], role)
				}
			}
			if sh.Nodes[0].ReplicationOffset <= 0 {
				return fmt.Sprintf("shard %d: the master's replication offset is %d", s, sh.Nodes[0].ReplicationOffset)
			}
		}
		return ""
	})
	until("CLUSTER NODES", func(i int, c *redis.Client) string {
		out, err := c.ClusterNodes(ctx).Result()
		if err != nil {
			return err.Error()
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 3 {
			return fmt.Sprintf("%d lines:\n%s", len(lines), out)
		}
		for o, l := range lines {
			first, last := home(o)
			flags := "master"
			if o == i {
				flags = "myself,master"
			}
			want := fmt.Sprintf("%s %s@0 %s - 0 0 ", ids[o], addrs[o], flags)
			if !strings.HasPrefix(l, want) || !strings.HasSuffix(l, fmt.Sprintf(" connected %d-%d", first, last)) {
				return fmt.Sprintf("line %q; want %q ... connected %d-%d", l, want, first, last)
			}
		}
		return ""
	})

	// go-redis with its defaults sends writes to each slot's first node,
	// the leader: none is answered MOVED. With ReadOnly it sends reads to
	// a slot's replicas, of which SLOTS lists none: to the leader too.
	var mu sync.Mutex
	sent := map[string]int{}  // address → rate-limit commands sent
	moved := map[string]int{} // address → MOVED answered
	hook := func(rdb *redis.Client) {
		addr := rdb.Options().Addr
		rdb.AddHook(redirects{addr: addr, mu: &mu, sent: sent, moved: moved})
	}
	writer := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer writer.Close()
	writer.OnNewNode(hook)
	for k := range 30 {
		if err := writer.Do(ctx, "RL.REDUCE", fmt.Sprintf("w%d", k), 10, 60, "AT", clusterAt).Err(); err != nil {
			t.Fatalf("RL.REDUCE w%d: %v", k, err)
		}
	}
	mu.Lock()
	if len(moved) != 0 || sent[addrs[0]]+sent[addrs[1]]+sent[addrs[2]] != 30 {
		t.Errorf("go-redis' ClusterClient sent its 30 writes as %v and was answered MOVED by %v; want every write to the leader", sent, moved)
	}
	clear(sent)
	mu.Unlock()

	reader := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ReadOnly: true})
	defer reader.Close()
	reader.OnNewNode(hook)
	for k := range 30 {
		n, err := reader.Do(ctx, "RL.GET", fmt.Sprintf("w%d", k), 10, 60, "AT", clusterAt).Int64()
		if err != nil || n != 9 {
			t.Fatalf("RL.GET w%d through a ReadOnly ClusterClient: %d, %v; want 9 tokens left", k, n, err)
		}
	}
	mu.Lock()
	if len(moved) != 0 || sent[addrs[0]]+sent[addrs[1]]+sent[addrs[2]] != 30 {
		t.Errorf("a ReadOnly ClusterClient sent its 30 reads as %v and was answered MOVED by %v; want every read to the leader", sent, moved)
	}
	mu.Unlock()
	// READONLY is taken, and a follower still redirects a rate-limit
	// command to the leader.
	conn := procs[1].client(t).Conn()
	defer conn.Close()
	if err := conn.ReadOnly(ctx).Err(); err != nil {
		t.Fatalf("READONLY: %v", err)
	}
	key := "{a}" // slot 15495: shard 2, led by node 2
	if err := conn.Do(ctx, "RL.GET", key, 10, 60, "AT", clusterAt).Err(); err == nil || !strings.HasPrefix(err.Error(), "MOVED 15495 "+addrs[2]) {
		t.Errorf("RL.GET of shard 2's key on node 1 after READONLY: %v; want MOVED to node 2", err)
	}

	// INFO replication: each leader's followers lack nothing once the
	// writes are through; a follower heard from its leader.
	until("INFO replication", func(i int, c *redis.Client) string {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err.Error()
		}
		lines := infoShards(info)
		lead := lines[i]
		want := fmt.Sprintf(",lag=0,lag_%d=0,lag_%d=0,slots=", min((i+1)%3, (i+2)%3), max((i+1)%3, (i+2)%3))
		if !strings.HasPrefix(lead, fmt.Sprintf("role=leader,serving=1,leader=%d,", i)) || !strings.Contains(lead, ",apply_lag=0,last=") || !strings.Contains(lead, want) {
			return fmt.Sprintf("its shard: %q; want apply_lag=0, last= and %q", lead, want)
		}
		for s, l := range lines {
			if s != i && (!strings.HasPrefix(l, fmt.Sprintf("role=follower,serving=0,leader=%d,", s)) || !strings.Contains(l, ",apply_lag=") || !strings.Contains(l, ",leader_silent_ms=") || strings.Contains(l, ",leader_silent_ms=-1")) {
				return fmt.Sprintf("shard %d: %q; want a follower of %d with apply_lag= and leader_silent_ms=", s, l, s)
			}
		}
		return ""
	})

	// The metrics: each node leads its home shard, whose rounds it
	// proposed and timed; every series of every shard it holds is there.
	for i, p := range procs {
		m := scrape(t, p)
		for s := range 3 {
			for _, name := range []string{"sluice_replication_leader", "sluice_replication_leader_changes_total", "sluice_replication_apply_lag_entries",
				"sluice_replication_follower_lag_entries", "sluice_replication_snapshots_sent_total", "sluice_replication_snapshot_sent_bytes_total",
				"sluice_replication_snapshots_received_total", "sluice_replication_snapshot_received_bytes_total", "sluice_replication_proposal_duration_seconds_count"} {
				if _, ok := m[fmt.Sprintf("%s{shard=\"%d\"}", name, s)]; !ok {
					t.Errorf("node %d: no %s of shard %d in /metrics", i, name, s)
				}
			}
		}
		home := fmt.Sprintf("{shard=\"%d\"}", i)
		if m["sluice_replication_leader"+home] != 1 || m["sluice_replication_leader_changes_total"+home] < 1 || m["sluice_replication_proposal_duration_seconds_count"+home] < 1 {
			t.Errorf("node %d: its home shard's metrics: leader %v, leader changes %v, proposals timed %v; want 1, at least 1, at least 1", i,
				m["sluice_replication_leader"+home], m["sluice_replication_leader_changes_total"+home], m["sluice_replication_proposal_duration_seconds_count"+home])
		}
	}

	// Node 2 dies: node 0, which leads shard 0, shows it failed, and
	// behind by the writes made since.
	procs[2].stop(t, syscall.SIGKILL)
	procs[2] = nil
	c0 := procs[0].client(t)
	for k, n := 0, 0; n < 5; k++ {
		key := fmt.Sprintf("after%d", k)
		if keyspace.Slot([]byte(key)) > 5460 {
			continue
		}
		n++
		for writer.Do(ctx, "RL.REDUCE", key, 10, 60, "AT", clusterAt).Err() != nil {
			if time.Now().After(deadline) {
				t.Fatalf("shard 0 not served after node 2's death")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	info, err := c0.Info(ctx, "replication").Result()
	if err != nil {
		t.Fatal(err)
	}
	if l := infoShards(info)[0]; !strings.Contains(l, ",lag_1=0,lag_2=") || strings.Contains(l, ",lag_2=0,") {
		t.Errorf("node 0's shard 0 after writes with node 2 dead: %q; want node 1 level, node 2 behind", l)
	}
	if lag := scrape(t, procs[0])[`sluice_replication_follower_lag_entries{shard="0"}`]; lag < 1 {
		t.Errorf("node 0's shard 0 after writes with node 2 dead: follower lag %v in /metrics; want node 2 behind", lag)
	}
	until("node 2 failed", func(i int, c *redis.Client) string {
		if i != 0 {
			return ""
		}
		slots, err := c0.ClusterSlots(ctx).Result()
		if err != nil {
			return err.Error()
		}
		for _, r := range slots {
			for _, n := range r.Nodes[1:] {
				if n.ID == ids[2] {
					return fmt.Sprintf("SLOTS lists node 2 as a replica of %d-%d", r.Start, r.End)
				}
			}
		}
		shards, err := c0.ClusterShards(ctx).Result()
		if err != nil {
			return err.Error()
		}
		if len(shards) == 0 || len(shards[0].Nodes) != 3 || shards[0].Nodes[0].ID != ids[0] || shards[0].Nodes[2].ID != ids[2] || shards[0].Nodes[2].Health != "failed" {
			return fmt.Sprintf("SHARDS' shard 0: %+v; want node 2 failed", shards)
		}
		out, err := c0.ClusterNodes(ctx).Result()
		if err != nil {
			return err.Error()
		}
		// Once another node leads shard 2, node 2 leads nothing: a slave
		// of shard 0's leader, failed, with no slots.
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, ids[2]+" ") && !strings.HasPrefix(l, ids[2]+" "+addrs[2]+"@0 slave,fail "+ids[0]+" ") || strings.HasPrefix(l, ids[2]+" ") && !strings.HasSuffix(l, " disconnected") {
				return fmt.Sprintf("NODES' line of node 2: %q; want slave,fail of node 0, disconnected, no slots", l)
			}
		}
		return ""
	})
}

// scrape returns the series of p's /metrics, name{labels} to value.
func scrape(t *testing.T, p *proc) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]float64{}
	for _, l := range strings.Split(string(b), "\n") {
		series, v, ok := strings.Cut(l, " ")
		if f, err := strconv.ParseFloat(v, 64); ok && err == nil && !strings.HasPrefix(l, "#") {
			m[series] = f
		}
	}
	return m
}

// infoShards returns INFO replication's shard lines, by shard, without
// their names.
func infoShards(info string) map[int]string {
	m := map[int]string{}
	for _, l := range strings.Split(info, "\r\n") {
		var s int
		if k, v, ok := strings.Cut(l, ":"); ok && strings.HasPrefix(k, "shard_") {
			if _, err := fmt.Sscanf(k, "shard_%d", &s); err == nil {
				m[s] = v
			}
		}
	}
	return m
}

// redirects is a go-redis hook that counts the rate-limit commands sent
// to a node and the MOVED replies it gave.
type redirects struct {
	addr        string
	mu          *sync.Mutex
	sent, moved map[string]int
}

func (h redirects) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h redirects) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if strings.HasPrefix(strings.ToLower(cmd.Name()), "rl.") {
			h.mu.Lock()
			h.sent[h.addr]++
			if err != nil && strings.HasPrefix(err.Error(), "MOVED ") {
				h.moved[h.addr]++
			}
			h.mu.Unlock()
		}
		return err
	}
}

func (h redirects) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
