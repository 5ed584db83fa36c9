package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/faultnet"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// The fault harness of replicated shards (issue 29, must-show 1): local
// sluice processes with --cluster-replicas, every Raft link through a
// faultnet proxy of its own, go-redis ClusterClients taking tokens from a
// few hundred buckets throughout, and faults injected one after another
// on the leader of a shard. Each phase uses buckets of its own (limit
// faultLimit, refilled whole every faultRefill on the server clock, so
// nothing refills in a run but what a clock jump gives), which the load
// drains: every acknowledged admission is counted per bucket.
//
// SLUICE_FAULT_ROUNDS=n runs every fault n times per case (default 1);
// SLUICE_FAULT_BUCKETS the buckets of a phase (default 60);
// SLUICE_FAULT_LOGS=dir keeps the processes' logs of a failed case there;
// SLUICE_FAULT_ONLY=name runs the fault of that name alone.

const (
	faultLimit  = 10
	faultRefill = 3600 // seconds; a clock jump of faultJump refills once
	faultJump   = time.Hour
	// faultWorkers each send one command at a time: go-redis' cluster
	// pipelines write one command's reply from two goroutines when a
	// node's batch is retried (the race detector's report), so the load
	// is not pipelined.
	faultWorkers = 32
	// faultElection is the processes' --cluster-election-timeout.
	faultElection = 300 * time.Millisecond
	// faultPhaseLimit bounds each phase, a hang included.
	faultPhaseLimit = 90 * time.Second
)

// faultCase is one shape of cluster the harness runs.
type faultCase struct {
	nodes, replicas int
	fsync           string
}

func (c faultCase) String() string {
	return fmt.Sprintf("n%d-r%d-%s", c.nodes, c.replicas, c.fsync)
}

// faultCluster is the processes of a case, their links and data.
type faultCluster struct {
	t      *testing.T
	c      faultCase
	shards []cluster.Shard
	addrs  []string // RESP, reached by the clients directly
	bus    []string // each node's replication listener
	dirs   []string
	// links[i][j] carries node i's connections to node j (nil for i ==
	// j): node i's --cluster-bus-nodes names it at index j. The
	// transport keeps one connection per pair, dialed by the lower
	// ordinal, and the higher one asks for it over a connection of its
	// own: isolating a node cuts links[i][j] and links[j][i].
	links [][]*faultnet.Proxy
	procs []*proc
	// started is every process started, restarts included, by node, for
	// SLUICE_FAULT_LOGS.
	started [][]*proc
	cc      *redis.ClusterClient
	// phases are the phases run, for the check of the replicas' stores.
	phases []*phase
	// answeredBy maps each command a node answered without an error to
	// that node's address (answerHook), so that a bucket over its limit
	// says who acknowledged what.
	answeredBy sync.Map
}

// answerHook notes which node answered each command.
type answerHook struct {
	fc   *faultCluster
	addr string
}

func (h answerHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h answerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Err() == nil {
			h.fc.answeredBy.Store(cmd, h.addr)
		}
		return err
	}
}
func (h answerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// node is the ordinal of the node at addr, or -1.
func (fc *faultCluster) node(addr string) int { return slices.Index(fc.addrs, addr) }

// faultClusterOptions are the clients' settings: the slot table is
// reloaded every 100ms (go-redis does not reload it when the node it
// routes to refuses connections, go-redis issue #3979), redirects and
// retries are generous (an election answers CLUSTERDOWN or TRYAGAIN, and
// a partitioned leader's slots time out), and a read times out after
// 2s, far beyond a round on a loaded CI machine. A timed-out or failed
// request counts as not admitted, whatever the server did.
func faultClusterOptions(addrs []string) *redis.ClusterOptions {
	return &redis.ClusterOptions{
		Addrs:                      addrs,
		ClusterStateReloadInterval: 100 * time.Millisecond,
		MaxRedirects:               16,
		MaxRetries:                 16,
		MinRetryBackoff:            10 * time.Millisecond,
		MaxRetryBackoff:            100 * time.Millisecond,
		DialTimeout:                500 * time.Millisecond,
		ReadTimeout:                2 * time.Second,
		WriteTimeout:               2 * time.Second,
	}
}

func startFaultCluster(t *testing.T, c faultCase) *faultCluster {
	t.Helper()
	shards, err := cluster.Place(c.nodes, c.replicas)
	if err != nil {
		t.Fatal(err)
	}
	// The nodes' ports stay taken while the proxies take ports of their
	// own, so that no proxy gets one.
	addrs, releaseAddrs := reservePorts(t, c.nodes)
	bus, releaseBus := reservePorts(t, c.nodes)
	fc := &faultCluster{t: t, c: c, shards: shards, addrs: addrs, bus: bus,
		links: make([][]*faultnet.Proxy, c.nodes), procs: make([]*proc, c.nodes), started: make([][]*proc, c.nodes)}
	// Registered first, so it runs after the processes are killed.
	t.Cleanup(fc.keepLogs)
	for i := range c.nodes {
		fc.dirs = append(fc.dirs, t.TempDir())
		fc.links[i] = make([]*faultnet.Proxy, c.nodes)
		for j := range c.nodes {
			if i == j {
				continue
			}
			p, err := faultnet.Listen(fc.bus[j])
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			fc.links[i][j] = p
		}
	}
	releaseAddrs()
	releaseBus()
	for i := range c.nodes {
		fc.start(i)
	}
	fc.cc = redis.NewClusterClient(faultClusterOptions(fc.addrs))
	fc.cc.OnNewNode(func(rdb *redis.Client) { rdb.AddHook(answerHook{fc: fc, addr: rdb.Options().Addr}) })
	t.Cleanup(func() { fc.cc.Close() })
	return fc
}

// start starts node i on its data directory (again, after a stop).
func (fc *faultCluster) start(i int) {
	fc.t.Helper()
	bus := slices.Clone(fc.bus)
	for j, p := range fc.links[i] {
		if p != nil {
			bus[j] = p.Addr()
		}
	}
	fc.procs[i] = startProc(fc.t, fc.dirs[i], "--addr", fc.addrs[i], "--cluster-nodes", strings.Join(fc.addrs, ","),
		"--cluster-ordinal", strconv.Itoa(i), "--cluster-replicas", strconv.Itoa(fc.c.replicas),
		"--cluster-bus-nodes", strings.Join(bus, ","), "--cluster-election-timeout", faultElection.String(),
		"--fsync", fc.c.fsync, "--enable-debug-command", "local")
	fc.started[i] = append(fc.started[i], fc.procs[i])
}

// keepLogs writes the log of every process of a failed test to the
// directory SLUICE_FAULT_LOGS names, if set: node<i>.<start>.log.
func (fc *faultCluster) keepLogs() {
	dir := os.Getenv("SLUICE_FAULT_LOGS")
	if dir == "" || !fc.t.Failed() {
		return
	}
	dir = filepath.Join(dir, fc.c.String())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fc.t.Error(err)
		return
	}
	for i, ps := range fc.started {
		for n, p := range ps {
			<-p.exited
			name := filepath.Join(dir, fmt.Sprintf("node%d.%d.log", i, n))
			if err := os.WriteFile(name, p.logs.Bytes(), 0o644); err != nil {
				fc.t.Error(err)
			}
		}
	}
	fc.t.Logf("the processes' logs are in %s", dir)
}

// isolate cuts every link of node i, both ways; heal brings them back.
func (fc *faultCluster) isolate(i int, cut bool) {
	for j := range fc.c.nodes {
		for _, p := range []*faultnet.Proxy{fc.links[i][j], fc.links[j][i]} {
			switch {
			case p == nil:
			case cut:
				p.Cut()
			default:
				p.Heal()
			}
		}
	}
}

// shardStatus is a shard's line of INFO replication on one node.
type shardStatus struct {
	role            string
	serving         bool
	leader          int
	term, commit    uint64
	applied         uint64
	found, answered bool
}

// status reads node i's INFO replication: its shards' lines by shard,
// none when it does not answer (within a second).
func (fc *faultCluster) status(i int) map[int]shardStatus {
	c := redis.NewClient(&redis.Options{Addr: fc.addrs[i], MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer c.Close()
	info, err := c.Info(context.Background(), "replication").Result()
	if err != nil {
		return nil
	}
	out := map[int]shardStatus{}
	for _, line := range strings.Split(info, "\r\n") {
		name, fields, ok := strings.Cut(line, ":")
		shard, err := strconv.Atoi(strings.TrimPrefix(name, "shard_"))
		if !ok || !strings.HasPrefix(name, "shard_") || err != nil {
			continue
		}
		st := shardStatus{found: true, answered: true}
		for _, kv := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseUint(v, 10, 64)
			switch k {
			case "role":
				st.role = v
			case "serving":
				st.serving = v == "1"
			case "leader":
				st.leader, _ = strconv.Atoi(v)
			case "term":
				st.term = n
			case "commit":
				st.commit = n
			case "applied":
				st.applied = n
			}
		}
		out[shard] = st
	}
	return out
}

// place moves shard to the nodes of replicas with sluice cluster place,
// and waits until every node follows the new placement and each of
// those nodes has applied what the shard committed.
func (fc *faultCluster) place(shard int, replicas []int) {
	fc.t.Helper()
	deadline := time.Now().Add(faultPhaseLimit)
	var to []string
	for _, o := range replicas {
		to = append(to, fc.addrs[o])
	}
	var out bytes.Buffer
	fc.waitFor(deadline, fmt.Sprintf("sluice cluster place of shard %d on %v", shard, replicas), func() bool {
		out.Reset()
		return runReloading(context.Background(), nil, []string{"cluster", "place", "--nodes", strings.Join(fc.addrs, ","), "--shard", strconv.Itoa(shard), "--to", strings.Join(to, ",")},
			noEnvLookup, nil, &out, &out) == nil
	})
	var epoch int
	if _, err := fmt.Sscanf(out.String(), "placed: epoch %d\n", &epoch); err != nil {
		fc.t.Fatalf("sluice cluster place printed %q: %v", out.String(), err)
	}
	fc.waitFor(deadline, fmt.Sprintf("every node following epoch %d, shard %d on %v", epoch, shard, replicas), func() bool {
		for i := range fc.c.nodes {
			c := redis.NewClient(&redis.Options{Addr: fc.addrs[i], MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
			info, err := c.Info(context.Background(), "replication").Result()
			c.Close()
			if err != nil || !strings.Contains(info, "cluster_placement_epoch:"+strconv.Itoa(epoch)+"\r\n") {
				return false
			}
		}
		for _, o := range replicas {
			if st := fc.status(o)[shard]; !st.found || st.commit == 0 || st.applied < st.commit {
				return false
			}
		}
		return true
	})
}

// waitFor polls cond every 20ms until it holds, failing the test with
// what at deadline.
func (fc *faultCluster) waitFor(deadline time.Time, what string, cond func() bool) {
	fc.t.Helper()
	for !cond() {
		if time.Now().After(deadline) {
			fc.t.Fatalf("%s: never, within the deadline", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// showAgrees checks that sluice cluster show finds every node following
// one placement, though each node names the others' replication
// addresses by proxies of its own.
func (fc *faultCluster) showAgrees() {
	fc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), faultPhaseLimit)
	defer cancel()
	var out bytes.Buffer
	if err := runReloading(ctx, nil, []string{"cluster", "show", "--nodes", strings.Join(fc.addrs, ",")}, noEnvLookup, nil, &out, &out); err != nil {
		fc.t.Fatalf("sluice cluster show: %v\n%s", err, out.String())
	}
}

// waitHomeLeaders waits until every node shows each of its shards, and
// shard i led and served by node i (where leadership settles), with
// every replica of the shard naming node i its leader at the same term.
// A leader's own word is not enough: one cut off, or stopped, goes on
// calling itself leader of its old term until it hears of the new one,
// so a check of the home node alone can pass while another replica
// leads, and the decisions it then acknowledges are lost when it does
// hear of it.
func (fc *faultCluster) waitHomeLeaders(deadline time.Time) {
	fc.t.Helper()
	fc.waitFor(deadline, "every shard led from its home node, as all its replicas see it", func() bool {
		views := make([]map[int]shardStatus, fc.c.nodes)
		for i := range fc.c.nodes {
			if views[i] = fc.status(i); len(views[i]) != fc.c.replicas {
				return false
			}
		}
		return homeLed(fc.shards, views)
	})
}

// homeLed reports whether views (each node's INFO replication, by shard)
// show every shard i led and served by node i, and every other replica
// of it following node i at the same term.
func homeLed(shards []cluster.Shard, views []map[int]shardStatus) bool {
	for i, sh := range shards {
		home := views[i][i]
		if home.role != "leader" || !home.serving || home.leader != i {
			return false
		}
		for _, r := range sh.Replicas {
			if st := views[r][i]; r != i && (st.role == "leader" || st.leader != i || st.term != home.term) {
				return false
			}
		}
	}
	return true
}

// terms are the terms of every shard as its home node shows them.
func (fc *faultCluster) terms() []uint64 {
	out := make([]uint64, len(fc.shards))
	for i := range fc.shards {
		out[i] = fc.status(i)[i].term
	}
	return out
}

// waitLeaderElsewhere waits until a replica of shard other than node
// serves it as leader, and returns when that was seen.
func (fc *faultCluster) waitLeaderElsewhere(shard, node int, deadline time.Time) time.Time {
	fc.t.Helper()
	fc.waitFor(deadline, fmt.Sprintf("shard %d led by a node other than %d", shard, node), func() bool {
		for _, r := range fc.shards[shard].Replicas {
			if r == node {
				continue
			}
			if st := fc.status(r)[shard]; st.role == "leader" && st.serving {
				return true
			}
		}
		return false
	})
	return time.Now()
}

// waitApplied waits until every replica of every shard has applied what
// its leader committed.
func (fc *faultCluster) waitApplied(deadline time.Time) {
	fc.t.Helper()
	fc.waitFor(deadline, "every replica applied its shard's commits", func() bool {
		sts := make([]map[int]shardStatus, fc.c.nodes)
		for i := range sts {
			sts[i] = fc.status(i)
		}
		for s, sh := range fc.shards {
			lead := sts[s][s]
			if lead.role != "leader" {
				return false
			}
			for _, r := range sh.Replicas {
				if st := sts[r][s]; st.applied != lead.commit || st.commit != lead.commit {
					return false
				}
			}
		}
		return true
	})
}

// debug runs DEBUG on node i.
func (fc *faultCluster) debug(i int, args ...any) {
	fc.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: fc.addrs[i], MaxRetries: -1})
	defer c.Close()
	if err := c.Do(context.Background(), append([]any{"DEBUG"}, args...)...).Err(); err != nil {
		fc.t.Fatalf("node %d: DEBUG %v: %v", i, args, err)
	}
}

// ack is an admission acknowledged: when, and by which node (-1:
// unknown).
type ack struct {
	at   time.Time
	node int
}

// phase is the load of one fault: its buckets, what was acknowledged of
// each, and the fault's times.
type phase struct {
	fc     *faultCluster
	name   string
	target int // the shard, and its home node, the fault hits
	keys   []string
	shard  []int // each bucket's shard

	// gate holds the workers back while held (Lock): a clock jump's
	// first look at each bucket is the test's own.
	gate sync.RWMutex
	mu   struct {
		sync.Mutex
		acked   []int   // acknowledged admissions
		allow   []int   // the most a bucket may admit: its limit, plus a jump's refill
		ackAt   [][]ack // each admission acknowledged
		drained []bool  // denied once since drainFrom
		left    int     // buckets not drained
		errs    map[string]int
	}
	startTerms         []uint64 // each shard's term when the phase began
	requests, failures atomic.Int64
	drainFrom          atomic.Int64 // unix ns; a denial counts from then
	faultAt            atomic.Int64 // unix ns; 0 before the fault
	firstAfter         atomic.Int64 // unix ns of the target shard's first decision after it
	stop               chan struct{}
	stopOnce           sync.Once
	wg                 sync.WaitGroup
}

func (fc *faultCluster) newPhase(name string, target, buckets int) *phase {
	ph := &phase{fc: fc, name: name, target: target, stop: make(chan struct{})}
	ph.mu.errs = map[string]int{}
	owner := make([]int, cluster.Slots)
	for i, sh := range fc.shards {
		for s := sh.Slots.First; s <= sh.Slots.Last; s++ {
			owner[s] = i
		}
	}
	for b := range buckets {
		k := name + ":" + strconv.Itoa(b)
		ph.keys = append(ph.keys, k)
		ph.shard = append(ph.shard, owner[keyspace.Slot([]byte(k))])
		ph.mu.allow = append(ph.mu.allow, faultLimit)
	}
	ph.mu.acked = make([]int, buckets)
	ph.mu.ackAt = make([][]ack, buckets)
	ph.resetDrain()
	return ph
}

// resetDrain starts waiting anew for every bucket's denial.
func (ph *phase) resetDrain() {
	ph.mu.Lock()
	ph.mu.drained = make([]bool, len(ph.keys))
	ph.mu.left = len(ph.keys)
	ph.drainFrom.Store(time.Now().UnixNano())
	ph.mu.Unlock()
}

// take sends one RL.REDUCE per bucket of bs, one after another, and
// counts the replies; it returns them (-1 for an error).
func (ph *phase) take(ctx context.Context, bs []int) []int64 {
	out := make([]int64, len(bs))
	for i, b := range bs {
		out[i] = ph.take1(ctx, b)
	}
	return out
}

// take1 sends one RL.REDUCE to bucket b and counts its reply, which it
// returns (-1 for an error).
func (ph *phase) take1(ctx context.Context, b int) int64 {
	start := time.Now().UnixNano()
	cmd := ph.fc.cc.Do(ctx, "RL.REDUCE", ph.keys[b], faultLimit, faultRefill)
	now := time.Now()
	ph.requests.Add(1)
	ph.mu.Lock()
	defer ph.mu.Unlock()
	n, err := cmd.Int64()
	by, _ := ph.fc.answeredBy.LoadAndDelete(cmd)
	if err != nil {
		ph.failures.Add(1)
		ph.mu.errs[err.Error()]++
		return -1
	}
	if f := ph.faultAt.Load(); f != 0 && start >= f && ph.shard[b] == ph.target {
		ph.firstAfter.CompareAndSwap(0, now.UnixNano())
	}
	if n >= 1 {
		ph.mu.acked[b]++
		a := ack{at: now, node: -1}
		if addr, ok := by.(string); ok {
			a.node = ph.fc.node(addr)
		}
		ph.mu.ackAt[b] = append(ph.mu.ackAt[b], a)
	} else if start >= ph.drainFrom.Load() && !ph.mu.drained[b] {
		ph.mu.drained[b] = true
		ph.mu.left--
	}
	return n
}

// run starts the workers, which take tokens round-robin over the buckets
// until stopped.
func (ph *phase) run(ctx context.Context) {
	var next atomic.Int64
	for range faultWorkers {
		ph.wg.Add(1)
		go func() {
			defer ph.wg.Done()
			for {
				select {
				case <-ph.stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				b := int(next.Add(1)-1) % len(ph.keys)
				ph.gate.RLock()
				ph.take1(ctx, b)
				ph.gate.RUnlock()
			}
		}()
	}
}

// end stops the workers and waits for them; again, it does nothing.
func (ph *phase) end() {
	ph.stopOnce.Do(func() { close(ph.stop) })
	ph.wg.Wait()
}

// ackedTotal is the admissions acknowledged so far.
func (ph *phase) ackedTotal() int {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	n := 0
	for _, a := range ph.mu.acked {
		n += a
	}
	return n
}

// waitDrained waits until every bucket was denied since the last
// resetDrain.
func (ph *phase) waitDrained(deadline time.Time) {
	ph.fc.t.Helper()
	ph.fc.waitFor(deadline, ph.name+": every bucket drained", func() bool {
		ph.mu.Lock()
		defer ph.mu.Unlock()
		return ph.mu.left == 0
	})
}

// fault is one kind of fault the harness injects on node, the home and
// leader of shard node (or, for wipe, on a follower of that shard).
// inject breaks it and returns the repair; when moves is set, the harness
// waits until another replica leads the shard before it repairs.
type fault struct {
	name   string
	moves  bool
	inject func(fc *faultCluster, ph *phase, node int) (heal func())
}

// faultKinds are the faults, in the order each round runs them.
func faultKinds() []fault {
	return []fault{
		{name: "kill", moves: true, inject: func(fc *faultCluster, _ *phase, node int) func() {
			fc.procs[node].stop(fc.t, syscall.SIGKILL)
			return func() { fc.start(node) }
		}},
		{name: "stop", moves: true,
			inject: func(fc *faultCluster, _ *phase, node int) func() {
				// SIGCONT once another replica leads, so the node was stopped
				// for longer than an election timeout; it wakes as a leader of
				// a past term, with clients' commands waiting on its sockets.
				p := fc.procs[node].cmd.Process
				if err := p.Signal(syscall.SIGSTOP); err != nil {
					fc.t.Fatal(err)
				}
				return func() {
					if err := p.Signal(syscall.SIGCONT); err != nil {
						fc.t.Fatal(err)
					}
				}
			}},
		// A follower of the shard loses its volume: SIGKILL, its data
		// directory deleted, started again on an empty one. It rejoins
		// every shard it holds under a new identity, by snapshot, and
		// the end-of-case check finds its records equal to the other
		// replicas'.
		{name: "wipe", inject: func(fc *faultCluster, _ *phase, node int) func() {
			f := (node + 1) % fc.c.nodes // a replica of shard node: replicas >= 3
			fc.procs[f].stop(fc.t, syscall.SIGKILL)
			if err := os.RemoveAll(fc.dirs[f]); err != nil {
				fc.t.Fatal(err)
			}
			return func() { fc.start(f) }
		}},
		{name: "partition", moves: true, inject: func(fc *faultCluster, _ *phase, node int) func() {
			fc.isolate(node, true)
			return func() { fc.isolate(node, false) }
		}},
		{name: "clock", inject: jumpClock},
		// The shard's replicas are moved (sluice cluster place): its home
		// to its second replica, which the leader hands its leadership to
		// once what it decided is committed, and, with more nodes than
		// replicas, its last replica to a node that held none, which joins
		// by snapshot while the other leaves; the repair moves them back.
		{name: "move", moves: true, inject: func(fc *faultCluster, _ *phase, node int) func() {
			orig := fc.shards[node].Replicas
			moved := append([]int{orig[1], orig[0]}, orig[2:]...)
			for o := range fc.c.nodes {
				if fc.c.nodes > fc.c.replicas && !slices.Contains(orig, (node+o)%fc.c.nodes) {
					moved[len(moved)-1] = (node + o) % fc.c.nodes
					break
				}
			}
			fc.place(node, moved)
			return func() { fc.place(node, orig) }
		}},
		// No fault: the baseline, in which even everysec loses nothing.
		{name: "none", inject: func(*faultCluster, *phase, int) func() { return func() {} }},
	}
}

// jumpClock moves node's clock faultJump forward once every bucket is
// drained, with the load held, and reads each bucket once: the buckets
// of the shard node leads get one whole refill, faultLimit tokens (the
// leader decides on its clock), those of the shards it follows none
// (their leaders decide; a follower writes their bytes). The repair sets
// the clock back, which refills nothing: time before a bucket's anchor
// gives no tokens.
func jumpClock(fc *faultCluster, ph *phase, node int) func() {
	deadline := time.Now().Add(faultPhaseLimit)
	ph.waitDrained(deadline)
	ph.gate.Lock()
	defer ph.gate.Unlock()
	before := ph.startTerms
	fc.debug(node, "CLOCK-OFFSET", faultJump.Milliseconds())
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	all := make([]int, len(ph.keys))
	for b := range all {
		all[b] = b
	}
	var got []int64
	for b := 0; b < len(all); b += 64 {
		got = append(got, ph.take(ctx, all[b:min(b+64, len(all))])...)
	}
	after := fc.terms()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	moved := map[int]bool{}
	for b, n := range got {
		s := ph.shard[b]
		want := int64(0)
		if s == node {
			want = faultLimit
			ph.mu.allow[b] += faultLimit
		}
		switch {
		case before[s] != after[s]:
			// Leadership moved during the phase: either is right.
			ph.mu.allow[b] = 2 * faultLimit
			if !moved[s] {
				moved[s] = true
				fc.t.Logf("%s: shard %d changed leaders during the phase (term %d to %d): its buckets may or may not refill", ph.name, s, before[s], after[s])
			}
		case n != want:
			fc.t.Errorf("%s: bucket %s of shard %d had %d tokens after node %d's clock jumped %v; want %d", ph.name, ph.keys[b], s, n, node, faultJump, want)
		}
	}
	return func() { fc.debug(node, "CLOCK-OFFSET", 0) }
}

// faultStats is what a case's phases found, for the test's log.
type faultStats struct {
	faults, requests, failures, acked, allowed int
	overBuckets, overTotal, overMax            int
	failover                                   []time.Duration // fault to the shard's first decision seen by a client
}

// runPhase runs one fault on shard target under load and checks the
// admissions of its buckets.
func (fc *faultCluster) runPhase(f fault, round, target, buckets int, st *faultStats) {
	fc.t.Helper()
	deadline := time.Now().Add(faultPhaseLimit)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	fc.waitHomeLeaders(deadline)
	ph := fc.newPhase(fmt.Sprintf("%s-%d-%s", fc.c, round, f.name), target, buckets)
	ph.startTerms = fc.terms()
	ph.run(ctx)
	defer ph.end()
	want := buckets * faultLimit / 4
	fc.waitFor(deadline, ph.name+": a quarter of the tokens taken", func() bool { return ph.ackedTotal() >= want })
	faultAt := time.Now()
	ph.faultAt.Store(faultAt.UnixNano())
	heal := f.inject(fc, ph, target)
	if f.moves {
		fc.waitLeaderElsewhere(target, target, deadline)
	}
	heal()
	healedAt := time.Now()
	ph.resetDrain()
	fc.waitHomeLeaders(deadline)
	homeAt := time.Now()
	ph.waitDrained(deadline)
	ph.end()
	for s, term := range fc.terms() {
		if term != ph.startTerms[s] && s != target {
			fc.t.Logf("%s: shard %d, not the one the fault hit, changed leaders during the phase (term %d to %d)", ph.name, s, ph.startTerms[s], term)
		}
	}
	st.faults++
	if fa := ph.firstAfter.Load(); fa != 0 && f.moves {
		st.failover = append(st.failover, time.Duration(fa-faultAt.UnixNano()))
	}
	ph.mu.Lock()
	defer ph.mu.Unlock()
	overBuckets, overTotal := st.overBuckets, st.overTotal
	defer func() {
		fc.t.Logf("%s: %d requests, %d failed; %d buckets over their limit, by %d in all", ph.name, ph.requests.Load(), ph.failures.Load(), st.overBuckets-overBuckets, st.overTotal-overTotal)
	}()
	st.requests += int(ph.requests.Load())
	st.failures += int(ph.failures.Load())
	for b, n := range ph.mu.acked {
		st.acked += n
		st.allowed += ph.mu.allow[b]
		over := n - ph.mu.allow[b]
		if over <= 0 {
			continue
		}
		st.overBuckets++
		st.overTotal += over
		st.overMax = max(st.overMax, over)
		if fc.c.fsync == "always" {
			fc.t.Errorf("%s: bucket %s (shard %d) admitted %d; its limit allows %d; %s", ph.name, ph.keys[b], ph.shard[b], n, ph.mu.allow[b], ph.describeAcks(b, faultAt, healedAt, homeAt))
			continue
		}
		// everysec: a change of leader loses at most what the old leader
		// decided in the last interval (a second) and the election
		// timeout before it saw it had lost its leadership. The fault
		// changes leaders between it and the return home; a change the
		// test did not cause shows as a run of acks by one node that
		// another node's follows.
		w := time.Second + faultElection
		if in := lossWindowAcks(ph.mu.ackAt[b], w, faultAt.Add(-w), homeAt); over > in {
			fc.t.Errorf("%s: bucket %s (shard %d) admitted %d over its limit of %d, more than its %d admissions in the loss windows of its leader changes; %s", ph.name, ph.keys[b], ph.shard[b], over, ph.mu.allow[b], in, ph.describeAcks(b, faultAt, healedAt, homeAt))
		}
	}
	for e, n := range ph.mu.errs {
		fc.t.Logf("%s: %d× %s", ph.name, n, e)
	}
	fc.phases = append(fc.phases, ph)
}

// lossWindowAcks counts the acks that a change of leader may have lost:
// those from from to to, and those within window before the end of each
// run of acks by one node that another node's run follows (an ack by an
// unknown node counts).
func lossWindowAcks(acks []ack, window time.Duration, from, to time.Time) int {
	lost := make([]bool, len(acks))
	for i, a := range acks {
		lost[i] = a.node < 0 || !a.at.Before(from) && !a.at.After(to)
	}
	for i := 0; i < len(acks); {
		j := i
		for j+1 < len(acks) && acks[j+1].node == acks[i].node {
			j++
		}
		if j+1 < len(acks) {
			for k := i; k <= j; k++ {
				lost[k] = lost[k] || !acks[k].at.Before(acks[j].at.Add(-window))
			}
		}
		i = j + 1
	}
	n := 0
	for _, l := range lost {
		if l {
			n++
		}
	}
	return n
}

// describeAcks says when each admission of bucket b was acknowledged,
// from the fault on, and by which node, with the fault's repair.
func (ph *phase) describeAcks(b int, faultAt, healedAt, homeAt time.Time) string {
	var w strings.Builder
	fmt.Fprintf(&w, "fault on node %d at %s, repaired at +%v, led from home again at +%v; acknowledged:", ph.target, faultAt.UTC().Format("15:04:05.000"), healedAt.Sub(faultAt).Round(time.Millisecond), homeAt.Sub(faultAt).Round(time.Millisecond))
	for _, a := range ph.mu.ackAt[b] {
		fmt.Fprintf(&w, " %+v by node %d,", a.at.Sub(faultAt).Round(time.Millisecond), a.node)
	}
	return strings.TrimSuffix(w.String(), ",")
}

// checkReplicas stops every node cleanly once each has applied its
// shards' commits, then reads each data directory: the replicas of a
// shard hold the same records, byte for byte, and every bucket's record
// on each of them keeps every admission acknowledged (its tokens at most
// what its allowance leaves after them).
func (fc *faultCluster) checkReplicas(deadline time.Time) {
	fc.t.Helper()
	fc.waitHomeLeaders(deadline)
	fc.waitApplied(deadline)
	for _, p := range fc.procs {
		p.stop(fc.t, syscall.SIGTERM)
	}
	shardOf := func(k []byte) int {
		slot, _ := keyspace.RecordSlot(k)
		for i, sh := range fc.shards {
			if slot >= sh.Slots.First && slot <= sh.Slots.Last {
				return i
			}
		}
		return -1
	}
	// held[node][shard]: the records of the shard on the node.
	held := make([][]map[string]string, fc.c.nodes)
	for i, dir := range fc.dirs {
		held[i] = make([]map[string]string, len(fc.shards))
		for s := range fc.shards {
			held[i][s] = map[string]string{}
		}
		err := storage.Inspect(dir, func(k, v []byte) bool {
			if s := shardOf(k); s >= 0 {
				held[i][s][string(k)] = string(v)
			}
			return true
		}, nil)
		if err != nil {
			fc.t.Fatalf("node %d: %v", i, err)
		}
	}
	for s, sh := range fc.shards {
		first := sh.Replicas[0]
		for _, r := range sh.Replicas {
			if len(held[r][s]) != len(held[first][s]) {
				fc.t.Errorf("shard %d: node %d holds %d records, node %d %d", s, r, len(held[r][s]), first, len(held[first][s]))
			}
			for k, v := range held[first][s] {
				if w, ok := held[r][s][k]; !ok || w != v {
					fc.t.Errorf("shard %d: record %q is %q on node %d, %q (found: %v) on node %d", s, k, v, first, w, ok, r)
				}
			}
		}
	}
	params := bucket.Params{Max: faultLimit, RefillAmount: faultLimit, RefillMs: faultRefill * 1000}
	checked := 0
	for _, ph := range fc.phases {
		for b, key := range ph.keys {
			rec := string(keyspace.AppendBucketKey(nil, params, []byte(key)))
			s, acked, allow := ph.shard[b], ph.mu.acked[b], ph.mu.allow[b]
			for _, r := range fc.shards[s].Replicas {
				v, ok := held[r][s][rec]
				if !ok {
					if acked > 0 {
						fc.t.Errorf("%s: bucket %s admitted %d, and node %d, a replica of its shard %d, has no record of it", ph.name, key, acked, r, s)
					}
					continue
				}
				state, err := bucket.DecodeState([]byte(v))
				if err != nil {
					fc.t.Fatalf("%s: bucket %s on node %d: %v", ph.name, key, r, err)
				}
				if state.Amount > int64(allow-acked) {
					fc.t.Errorf("%s: bucket %s admitted %d of %d, and node %d has %d tokens left in it: an acknowledged admission is missing", ph.name, key, acked, allow, r, state.Amount)
				}
				checked++
			}
		}
	}
	fc.t.Logf("%d bucket records checked on the replicas of their shards", checked)
}

// faultSetting reads the positive integer of the environment variable
// name, the long form's settings, or returns def when it is not set.
func faultSetting(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// TestReplicatedFaults is issue 29's fault-injection test: for 3 nodes
// with 3 replicas and 5 nodes with 3 and 5, every fault of faults in turn
// on the leader of the next shard, under load. With --fsync always no
// bucket admits more than its limit (plus a clock jump's refill) and the
// replicas' stores keep every acknowledged admission; with everysec
// (3 nodes) the over-admission found is logged, and stays within the
// documented loss window.
func TestReplicatedFaults(t *testing.T) {
	rounds := faultSetting(t, "SLUICE_FAULT_ROUNDS", 1)
	buckets := faultSetting(t, "SLUICE_FAULT_BUCKETS", 60)
	only := os.Getenv("SLUICE_FAULT_ONLY")
	for _, c := range []faultCase{{3, 3, "always"}, {5, 3, "always"}, {5, 5, "always"}, {3, 3, "everysec"}} {
		t.Run(c.String(), func(t *testing.T) {
			start := time.Now()
			fc := startFaultCluster(t, c)
			fc.waitHomeLeaders(time.Now().Add(faultPhaseLimit))
			fc.showAgrees()
			var st faultStats
			target := 0
			for round := range rounds {
				for _, f := range faultKinds() {
					if only != "" && f.name != only {
						continue
					}
					fc.runPhase(f, round, target%c.nodes, buckets, &st)
					target++
				}
			}
			if c.fsync == "always" {
				fc.checkReplicas(time.Now().Add(faultPhaseLimit))
			}
			slices.Sort(st.failover)
			med, worst := time.Duration(0), time.Duration(0)
			if len(st.failover) > 0 {
				med, worst = st.failover[len(st.failover)/2], st.failover[len(st.failover)-1]
			}
			t.Logf("%s: %d faults, %d requests (%d failed), %d admitted of %d allowed; over-admission: %d buckets, %d in all, %d at most in one; failover (fault to the shard's first decision seen): median %v, worst %v over %d; %v in all",
				c, st.faults, st.requests, st.failures, st.acked, st.allowed, st.overBuckets, st.overTotal, st.overMax, med, worst, len(st.failover), time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestHomeLedNeedsEveryReplica: a home node that still calls itself its
// shard's leader, after the other replicas elected another at a later
// term, is not taken for the shard's settled leader, as it was when only
// the home node's view was read (an everysec phase then began, or ended,
// while its decisions were still to be lost).
func TestHomeLedNeedsEveryReplica(t *testing.T) {
	shards := []cluster.Shard{{Replicas: []int{0, 1, 2}}, {Replicas: []int{1, 2, 0}}, {Replicas: []int{2, 0, 1}}}
	follow := func(leader int, term uint64) shardStatus {
		return shardStatus{role: "follower", leader: leader, term: term}
	}
	settled := func() []map[int]shardStatus {
		views := make([]map[int]shardStatus, 3)
		for i := range views {
			views[i] = map[int]shardStatus{}
		}
		for s, sh := range shards {
			for _, r := range sh.Replicas {
				if r == s {
					views[r][s] = shardStatus{role: "leader", serving: true, leader: s, term: 5}
				} else {
					views[r][s] = follow(s, 5)
				}
			}
		}
		return views
	}
	if !homeLed(shards, settled()) {
		t.Fatal("every shard led from home at one term, as every replica sees it: not taken as settled")
	}
	stale := settled()
	stale[1][0] = shardStatus{role: "leader", serving: true, leader: 1, term: 6} // node 1 won shard 0's term 6; node 0 has not heard
	stale[2][0] = follow(1, 6)
	if homeLed(shards, stale) {
		t.Error("node 0 still calls itself shard 0's leader at term 5 while nodes 1 and 2 are at term 6 under node 1: taken as settled")
	}
	behind := settled()
	behind[2][0] = follow(-1, 6) // node 2 voted in a new term, no leader yet
	if homeLed(shards, behind) {
		t.Error("a replica of shard 0 at a later term with no leader: taken as settled")
	}
}
