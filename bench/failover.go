package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/keyspace"
)

// The failover scenario (issue 29, must-show 2) measures how long a
// replicated shard goes without a decision when its leader dies: three
// sluice processes with --cluster-replicas 3 --fsync always, on fresh data
// directories; the leader of shard 0 is killed with SIGKILL --kills times,
// each time restarted on its volume, and the next kill waits until every
// shard is served again (and led from its home, as the cluster's balancing
// brings it back). Each kill is timed twice, from the SIGKILL:
//
//   - server side: to the first RL.REDUCE on a key of the shard answered by
//     one of the surviving nodes, each asked directly by a plain client (no
//     retries, no routing), all of them in parallel, every
//     failoverPoll; a follower's -MOVED says nothing, so asking every
//     survivor is what following it would do;
//   - ClusterClient: to the first success of go-redis' ClusterClient, with
//     ClusterStateReloadInterval 1s and every other option at its default,
//     calling RL.REDUCE on that key in a loop. go-redis does not reload its
//     slots when the node it routes to refuses connections (go-redis issue
//     #3979), so with the default reload interval (60s) a killed leader's
//     slots fail in it for up to a minute, whatever the server does: that
//     figure would measure go-redis, not sluice.
//
// Nothing is pinned: three servers and the generator share the machine.

// failoverPoll is the pause between two attempts of one prober: the
// figures' resolution, short beside an election, long enough not to take
// the CPU the election needs.
const failoverPoll = 5 * time.Millisecond

// failoverReload is the ClusterClient's ClusterStateReloadInterval.
const failoverReload = time.Second

// failoverShard is the shard whose leader is killed.
const failoverShard = 0

// failoverHome bounds the wait for every shard to be led from its home
// after a restart: the node killed is then caught up, and the next kill
// takes the home's leadership; a shard still led from elsewhere then is
// noted, and its leader killed next.
const failoverHome = 10 * time.Second

// failoverKill is one kill's figures; a zero duration did not happen
// before the kill's timeout.
type failoverKill struct {
	Node       int           // the ordinal killed
	Server     time.Duration // to the first decision by a survivor
	ServerNode int           // the survivor that made it
	Client     time.Duration // to the ClusterClient's first success
	ClientErrs int           // its failed calls before that
	ClientErr  string        // the last of them
	Back       time.Duration // from the restart to every shard served again
	Note       string
}

// failoverReport is the scenario's results.
type failoverReport struct {
	Flags   []string // every node's flags beyond addresses and directories
	Kills   []failoverKill
	Timeout time.Duration
	Load    [2]string
}

// failoverNode is one of the three processes and what the scenario keeps
// to restart it as itself.
type failoverNode struct {
	wrap    []string // runs the process, such as taskset; nil: none
	ordinal int
	addr    string
	dir     string
	args    []string
	srv     *server
	rdb     *redis.Client // plain: no retries, no routing
}

// start starts the node's process on its directory, as itself, and a
// fresh plain client to it.
func (n *failoverNode) start(bin string) error {
	n.srv = &server{name: fmt.Sprintf("sluice node %d", n.ordinal), cmd: command(n.wrap, bin, n.args...), addr: n.addr, dir: n.dir, log: &bytes.Buffer{}}
	n.srv.cmd.Stderr = n.srv.log
	if err := n.srv.start(); err != nil {
		return err
	}
	if err := n.srv.waitReady(); err != nil {
		return err
	}
	if n.rdb != nil {
		n.rdb.Close()
	}
	n.rdb = redis.NewClient(&redis.Options{Addr: n.addr, MaxRetries: -1, DialTimeout: 500 * time.Millisecond,
		ReadTimeout: time.Second, WriteTimeout: time.Second, PoolSize: 4})
	return nil
}

// shardKeys returns, for each shard, a key whose slot is in it.
func shardKeys(shards []cluster.Shard) []string {
	keys := make([]string, len(shards))
	for i, s := range shards {
		for n := 0; ; n++ {
			k := "failover:" + strconv.Itoa(n)
			if sl := keyspace.Slot([]byte(k)); sl >= s.Slots.First && sl <= s.Slots.Last {
				keys[i] = k
				break
			}
		}
	}
	return keys
}

// failoverArgs is the RL.REDUCE each probe sends: a bucket that never runs
// dry (a million tokens, refilled every second), so that every call is a
// decision the shard must commit.
func failoverArgs(key string) []any { return []any{"RL.REDUCE", key, 1_000_000, 1} }

// runFailover starts the three nodes, then kills shard failoverShard's
// leader kills times, printing a line per kill.
func runFailover(o options, kills int, timeout time.Duration, log io.Writer) (rep failoverReport, err error) {
	rep.Timeout = timeout
	tmp, bin, err := workDir(o, "bench-failover-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(tmp)
	rep.Load[0] = loadAverage()
	defer func() { rep.Load[1] = loadAverage() }()
	nodes, addrs, shards, keys, flags, err := startReplicatedNodes(o, tmp, bin)
	defer stopNodes(nodes)
	if err != nil {
		return rep, err
	}
	rep.Flags = flags
	fmt.Fprintf(log, "== failover: 3 nodes, sluice %s; %d SIGKILLs of shard %d's leader (slots %d-%d, key %s), each timed out after %s\n",
		strings.Join(rep.Flags, " "), kills, failoverShard, shards[failoverShard].Slots.First, shards[failoverShard].Slots.Last, keys[failoverShard], timeout)
	t0 := time.Now()
	_, note, err := waitServed(nodes, keys, shards, t0.Add(timeout), t0.Add(timeout))
	if err != nil {
		return rep, fmt.Errorf("the cluster never served every shard: %w%s", err, nodeLogs(nodes))
	}
	if note == "" {
		note = "each led from its home"
	}
	fmt.Fprintf(log, "   every shard served %.2f s after the nodes answered PING: %s\n", time.Since(t0).Seconds(), note)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: failoverReload})
	defer cc.Close()
	for k := range kills {
		kill, err := failoverOnce(bin, nodes, cc, keys, shards, timeout)
		if err != nil {
			return rep, fmt.Errorf("kill %d: %w%s", k+1, err, nodeLogs(nodes))
		}
		rep.Kills = append(rep.Kills, kill)
		fmt.Fprintf(log, "   kill %2d/%d: %s\n", k+1, kills, kill.line(timeout))
	}
	return rep, nil
}

// startReplicatedNodes starts three local nodes with --cluster-replicas 3
// --fsync always and o's --server-flags, each on a directory under tmp;
// it returns them (stopNodes stops them, even on an error), their
// addresses, the placement, a key of each shard and the flags.
func startReplicatedNodes(o options, tmp, bin string) (nodes []*failoverNode, addrs []string, shards []cluster.Shard, keys, flags []string, err error) {
	flags = append([]string{"--cluster-replicas", "3", "--fsync", "always"}, strings.Fields(o.serverFlags)...)
	nodes, addrs, shards, keys, err = startClusterNodes(tmp, bin, 3, flags, nil)
	return nodes, addrs, shards, keys, flags, err
}

// startClusterNodes starts three local nodes of a cluster with replicas
// replicas per shard (flags must say --cluster-replicas), each with flags
// and under wrap(its ordinal) when wrap is set, on a directory under tmp;
// it returns them (stopNodes stops them, even on an error), their
// addresses, the placement and a key of each shard.
func startClusterNodes(tmp, bin string, replicas int, flags []string, wrap func(int) []string) (nodes []*failoverNode, addrs []string, shards []cluster.Shard, keys []string, err error) {
	const n = 3
	if shards, err = cluster.Place(n, replicas); err != nil {
		return nil, nil, nil, nil, err
	}
	keys = shardKeys(shards)
	var bus []string
	for range 2 * n {
		a, err := freeAddr()
		if err != nil {
			return nil, nil, nil, nil, err
		}
		if len(addrs) < n {
			addrs = append(addrs, a)
		} else {
			bus = append(bus, a)
		}
	}
	nodes = make([]*failoverNode, n)
	for i := range nodes {
		httpAddr, err := freeAddr()
		if err != nil {
			return nodes, nil, nil, nil, err
		}
		dir := filepath.Join(tmp, "node-"+strconv.Itoa(i))
		f := append([]string{"--cluster-nodes", strings.Join(addrs, ","), "--cluster-ordinal", strconv.Itoa(i),
			"--cluster-bus-nodes", strings.Join(bus, ",")}, flags...)
		nodes[i] = &failoverNode{ordinal: i, addr: addrs[i], dir: dir, args: sluiceArgs(addrs[i], httpAddr, dir, f)}
		if wrap != nil {
			nodes[i].wrap = wrap(i)
		}
	}
	for _, nd := range nodes {
		if err := nd.start(bin); err != nil {
			return nodes, nil, nil, nil, err
		}
	}
	return nodes, addrs, shards, keys, nil
}

// stopNodes stops the nodes that were started, and closes their clients.
func stopNodes(nodes []*failoverNode) {
	for _, nd := range nodes {
		if nd == nil {
			continue
		}
		if nd.rdb != nil {
			nd.rdb.Close()
		}
		if nd.srv != nil {
			nd.srv.stop()
		}
	}
}

// failoverOnce kills the leader of failoverShard, times the two probes,
// restarts the node on its volume and waits until every shard is served.
func failoverOnce(bin string, nodes []*failoverNode, cc *redis.ClusterClient, keys []string, shards []cluster.Shard, timeout time.Duration) (failoverKill, error) {
	var kill failoverKill
	key := keys[failoverShard]
	// The client routes the key to its leader before the kill.
	warm, cancel := context.WithTimeout(context.Background(), timeout)
	for cc.Do(warm, failoverArgs(key)...).Err() != nil {
		if warm.Err() != nil {
			cancel()
			return kill, errors.New("the ClusterClient got no decision before the kill")
		}
		time.Sleep(failoverPoll)
	}
	cancel()
	leaders, _, err := waitServed(nodes, keys, shards, time.Now().Add(timeout), time.Now())
	if err != nil {
		return kill, err
	}
	victim := nodes[leaders[failoverShard]]
	kill.Node = victim.ordinal
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var wg sync.WaitGroup
	t0 := time.Now()
	if err := victim.srv.cmd.Process.Kill(); err != nil {
		return kill, fmt.Errorf("SIGKILL node %d: %w", victim.ordinal, err)
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		kill.Server, kill.ServerNode = firstDecision(ctx, nodes, victim, key, t0)
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			err := cc.Do(ctx, failoverArgs(key)...).Err()
			if err == nil {
				kill.Client = time.Since(t0)
				return
			}
			if ctx.Err() == nil {
				kill.ClientErrs++
				kill.ClientErr = err.Error()
			}
			time.Sleep(failoverPoll)
		}
	}()
	wg.Wait()
	<-victim.srv.done
	t1 := time.Now()
	if err := victim.start(bin); err != nil {
		return kill, fmt.Errorf("restart node %d: %w", victim.ordinal, err)
	}
	_, note, err := waitServed(nodes, keys, shards, time.Now().Add(timeout), time.Now().Add(failoverHome))
	if err != nil {
		return kill, fmt.Errorf("after node %d's restart: %w", victim.ordinal, err)
	}
	kill.Back, kill.Note = time.Since(t1), note
	return kill, nil
}

// firstDecision asks every node but the victim, each in its own
// goroutine, for a decision on key until one makes it, and returns the
// time from t0 and which node; zero and -1 if none did before ctx ended.
func firstDecision(ctx context.Context, nodes []*failoverNode, victim *failoverNode, key string, t0 time.Time) (time.Duration, int) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type win struct {
		d    time.Duration
		node int
	}
	won := make(chan win, len(nodes))
	for _, nd := range nodes {
		if nd == victim {
			continue
		}
		go func() {
			for ctx.Err() == nil {
				if nd.rdb.Do(ctx, failoverArgs(key)...).Err() == nil {
					won <- win{time.Since(t0), nd.ordinal}
					return
				}
				time.Sleep(failoverPoll)
			}
		}()
	}
	select {
	case w := <-won:
		return w.d, w.node
	case <-ctx.Done():
		return 0, -1
	}
}

// waitServed waits until every shard's key gets a decision from exactly
// one node (its leader) and, until home, until each shard is led from its
// home; it returns the leaders by shard, and a note naming the shards
// still led from elsewhere after home. It fails when some shard is not
// served by the deadline.
func waitServed(nodes []*failoverNode, keys []string, shards []cluster.Shard, deadline, home time.Time) ([]int, string, error) {
	for {
		leaders, err := probeLeaders(nodes, keys)
		atHome := err == nil
		for s, l := range leaders {
			atHome = atHome && l == shards[s].Replicas[0]
		}
		if atHome {
			return leaders, "", nil
		}
		if err != nil && time.Now().After(deadline) {
			return nil, "", err
		}
		if err == nil && !time.Now().Before(home) {
			var away []string
			for s, l := range leaders {
				if l != shards[s].Replicas[0] {
					away = append(away, fmt.Sprintf("shard %d led by node %d", s, l))
				}
			}
			return leaders, strings.Join(away, ", ") + " (not its home)", nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// probeLeaders sends each shard's decision to every node and returns the
// one that made it, by shard; an error if a shard got none, or several.
func probeLeaders(nodes []*failoverNode, keys []string) ([]int, error) {
	leaders := make([]int, len(keys))
	for s, k := range keys {
		leaders[s] = -1
		var why []string
		for _, nd := range nodes {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := nd.rdb.Do(ctx, failoverArgs(k)...).Err()
			cancel()
			switch {
			case err == nil && leaders[s] >= 0:
				return nil, fmt.Errorf("shard %d: nodes %d and %d both decided on %s", s, leaders[s], nd.ordinal, k)
			case err == nil:
				leaders[s] = nd.ordinal
			default:
				why = append(why, fmt.Sprintf("node %d: %v", nd.ordinal, err))
			}
		}
		if leaders[s] < 0 {
			return leaders, fmt.Errorf("shard %d not served (%s)", s, strings.Join(why, "; "))
		}
	}
	return leaders, nil
}

// nodeLogs is the nodes' logs, for an error.
func nodeLogs(nodes []*failoverNode) string {
	var b strings.Builder
	for _, nd := range nodes {
		if nd.srv != nil && nd.srv.exited() {
			fmt.Fprintf(&b, "\nnode %d's log (it exited: %v):\n%s", nd.ordinal, nd.srv.cmd.ProcessState, nd.srv.log)
		}
	}
	return b.String()
}

// line is the kill's line of the output.
func (k failoverKill) line(timeout time.Duration) string {
	server := fmt.Sprintf("server side %s (node %d decided)", secs(k.Server, timeout), k.ServerNode)
	if k.Server == 0 {
		server = "server side " + secs(0, timeout)
	}
	client := fmt.Sprintf("ClusterClient %s", secs(k.Client, timeout))
	if k.ClientErrs > 0 {
		client += fmt.Sprintf(" (%d failed calls before, the last: %s)", k.ClientErrs, k.ClientErr)
	}
	s := fmt.Sprintf("node %d killed: %s, %s; restarted, every shard served %.2f s later", k.Node, server, client, k.Back.Seconds())
	if k.Note != "" {
		s += "; " + k.Note
	}
	return s
}

// secs is a figure in seconds, or "> timeout" for one that did not happen.
func secs(d, timeout time.Duration) string {
	if d == 0 {
		return fmt.Sprintf("> %.0f s (timed out)", timeout.Seconds())
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// failoverStats is the median and worst of one figure over the kills, a
// kill that timed out counting as the worst; missed is how many did.
type failoverStats struct {
	Median, Best, Worst time.Duration
	Missed              int
}

// statsOf is the stats of ds, a zero in it a kill that timed out.
func statsOf(ds []time.Duration, timeout time.Duration) failoverStats {
	var st failoverStats
	var v []time.Duration
	for _, d := range ds {
		if d == 0 {
			st.Missed++
			d = timeout
		}
		v = append(v, d)
	}
	if len(v) == 0 {
		return st
	}
	slices.Sort(v)
	st.Best, st.Worst = v[0], v[len(v)-1]
	if len(v)%2 == 1 {
		st.Median = v[len(v)/2]
	} else {
		st.Median = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return st
}

func (st failoverStats) String() string {
	s := fmt.Sprintf("median %.2f s, worst %.2f s, best %.2f s", st.Median.Seconds(), st.Worst.Seconds(), st.Best.Seconds())
	if st.Missed > 0 {
		s += fmt.Sprintf(" (%d timed out, counted as the timeout)", st.Missed)
	}
	return s
}

// failoverSummary is the scenario's summary line.
func failoverSummary(rep failoverReport) string {
	var server, client []time.Duration
	away := 0
	for _, k := range rep.Kills {
		server, client = append(server, k.Server), append(client, k.Client)
		if k.Note != "" {
			away++
		}
	}
	return fmt.Sprintf("failover over %d SIGKILLs of a leader, sluice %s: server side %s; ClusterClient (ClusterStateReloadInterval %s) %s; after %d of the restarts a shard was not led from its home %s later; load average %s at the start, %s at the end",
		len(rep.Kills), strings.Join(rep.Flags, " "), statsOf(server, rep.Timeout), failoverReload, statsOf(client, rep.Timeout), away, failoverHome, rep.Load[0], rep.Load[1])
}
