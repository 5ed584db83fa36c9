package server

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// heldPolicy counts a canary rule (actor: the path) before the deciding
// rule (actor: the user), so a request's canary counter can be written here
// while its deciding counter is forwarded to another node and held there.
const heldPolicy = `[path=*]
creditLimit = 5
resetSeconds = 300
actorField = path
matchPolicy = canary

[user=*]
creditLimit = 5
resetSeconds = 300
actorField = user

[default]
creditLimit = 0
resetSeconds = 0
`

// holdingNode is a fake second node: it answers each SLUICE.COUNTERHIT
// forwarded to it only once release is closed, after telling got.
type holdingNode struct {
	addr    string
	got     chan struct{}
	release chan struct{}
	once    sync.Once
}

// free answers the held hits, and every later one at once.
func (h *holdingNode) free() { h.once.Do(func() { close(h.release) }) }

func startHoldingNode(t *testing.T) *holdingNode {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &holdingNode{addr: ln.Addr().String(), got: make(chan struct{}, 16), release: make(chan struct{})}
	t.Cleanup(func() { h.free(); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					// *6, then six $len and value lines.
					for range 13 {
						if _, err := r.ReadString('\n'); err != nil {
							return
						}
					}
					h.got <- struct{}{}
					<-h.release
					if _, err := c.Write([]byte("*6\r\n:1\r\n:4\r\n:300\r\n:5\r\n:-1\r\n:300000\r\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	return h
}

// heldSetup starts a cluster node whose peer is a holdingNode, and finds a
// path whose canary counter this node owns and a user whose counter the
// peer owns. It returns the node, the peer, the path, the user and the
// canary counter's key.
func heldSetup(t *testing.T) (*Server, *holdingNode, string, string, []byte) {
	return heldSetupPause(t, 0)
}

// heldSetupPause is heldSetup with MIGRATE PAUSE's wait (0: the default).
func heldSetupPause(t *testing.T, pauseWait time.Duration) (*Server, *holdingNode, string, string, []byte) {
	peer := startHoldingNode(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	self := ln.Addr().String()
	ln.Close()
	clock := newTestClock(t0)
	srv := startServerOn(t, Config{Policy: policycmd.Config{File: policyFile(t, "held.ini", heldPolicy)}, Clock: clock.now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()},
		Check:   check.Config{IdentityHeader: "X-User"},
		Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: []string{self, peer.addr}, Self: self, ForwardTimeout: time.Minute, PauseWait: pauseWait}}}, self)
	rules := srv.pol.Current().Policy.Rules()
	owner := func(r *policy.Rule, actor string) (bool, []byte) {
		k := keyspace.AppendRuleKey(nil, r, r.CreditLimit, append(r.AppendCounterID(nil, nil), actor...))
		slot := uint16(k[0])<<8 | uint16(k[1])
		_, mine := srv.clus.Owner(slot)
		return mine, k
	}
	var path, user string
	var key []byte
	for i := 0; path == ""; i++ {
		if mine, k := owner(rules[0], "/p"+strconv.Itoa(i)); mine {
			path, key = "/p"+strconv.Itoa(i), k
		}
	}
	for i := 0; user == ""; i++ {
		if mine, _ := owner(rules[1], "u"+strconv.Itoa(i)); !mine {
			user = "u" + strconv.Itoa(i)
		}
	}
	return srv, peer, path, user, key
}

func dirtyKeys(t *testing.T, srv *Server) map[string]bool {
	t.Helper()
	a, err := newClient(t, srv).Do(context.Background(), "CLUSTER", "MIGRATE", "DIRTY", 1000).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for i := 0; i < len(a); i += 2 {
		m[a[i]] = true
	}
	return m
}

// TestMigrateNotesCheckWrites: a GET /check whose canary counter was
// written here before MIGRATE START, and committed after the first DUMP
// page, is handed over by MIGRATE DIRTY (it went through neither before:
// /check committed without noting its keys).
func TestMigrateNotesCheckWrites(t *testing.T) {
	srv, peer, path, user, key := heldSetup(t)
	base := startCheck(t, srv)
	rdb := newClient(t, srv)
	ctx := context.Background()
	done := make(chan *http.Response, 1)
	go func() { done <- checkGet(t, "GET", base+"/check", "X-Forwarded-Uri: "+path, "X-User: "+user) }()
	<-peer.got // the canary counter is in the batch, the deciding one held
	slot := strconv.Itoa(int(key[0])<<8 | int(key[1]))
	if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "START", slot).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "CLUSTER", "DUMP", slot, slot, "", 100).Err(); err != nil {
		t.Fatal(err)
	}
	peer.free()
	if r := <-done; r.StatusCode != http.StatusOK {
		t.Fatalf("/check: %s", r.Status)
	}
	if !dirtyKeys(t, srv)[string(key)] {
		t.Fatalf("the /check's canary counter, committed after MIGRATE START, is not in MIGRATE DIRTY: the move would lose it")
	}
}

// TestMigratePauseWaitsForLineAndCheckWrites: MIGRATE PAUSE does not
// answer OK while a GET /check or a line-protocol batch that wrote here
// before the pause has not committed (it would commit after the hand-over,
// on the source only); once they have, PAUSE succeeds and DIRTY has their
// keys.
func TestMigratePauseWaitsForLineAndCheckWrites(t *testing.T) {
	for _, front := range []string{"check", "line protocol"} {
		t.Run(front, func(t *testing.T) {
			// A short wait, so that the refused PAUSE answers soon.
			srv, peer, path, user, key := heldSetupPause(t, 50*time.Millisecond)
			rdb := newClient(t, srv)
			ctx := context.Background()
			done := make(chan string, 1)
			if front == "check" {
				base := startCheck(t, srv)
				go func() {
					done <- checkGet(t, "GET", base+"/check", "X-Forwarded-Uri: "+path, "X-User: "+user).Status
				}()
			} else {
				lc := dialLine(t, startDivvy(t, srv))
				go func() {
					lc.send(fmt.Sprintf("HIT path=%s user=%s\n", path, user))
					done <- lc.line()
				}()
			}
			<-peer.got
			slot := strconv.Itoa(int(key[0])<<8 | int(key[1]))
			if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "START", slot).Err(); err != nil {
				t.Fatal(err)
			}
			err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "PAUSE").Err()
			if err == nil || !strings.Contains(err.Error(), "did not finish") {
				t.Fatalf("MIGRATE PAUSE with a %s write under way: %v; want it refused until that write is committed", front, err)
			}
			peer.free()
			if r := <-done; !strings.Contains(r, "200") && !strings.HasPrefix(r, "OK") {
				t.Fatalf("%s: %s", front, r)
			}
			if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "PAUSE").Err(); err != nil {
				t.Fatalf("MIGRATE PAUSE once the write is committed: %v", err)
			}
			if !dirtyKeys(t, srv)[string(key)] {
				t.Fatalf("the %s write committed before PAUSE's OK is not in MIGRATE DIRTY", front)
			}
		})
	}
}

// TestMigrateOneMoveAtATime: a second MIGRATE START while a move is under
// way is refused (the dirty set, PAUSE and CANCEL are the node's: two moves
// would hand over each other's keys and cancel each other); after CANCEL,
// or the hand-over, a new move starts.
func TestMigrateOneMoveAtATime(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: []string{"127.0.0.1:7000", "127.0.0.1:7001"}, Self: "127.0.0.1:7000"}}})
	rdb := newClient(t, srv)
	ctx := context.Background()
	if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "START", "100-199").Err(); err != nil {
		t.Fatal(err)
	}
	err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "START", "300-399").Err()
	if err == nil || !strings.Contains(err.Error(), "slots 100-199 are being moved off this node already; one move at a time") {
		t.Fatalf("a second MIGRATE START during a move: %v; want it refused, naming the move under way", err)
	}
	if srv.clus.SlotMigrating(300) {
		t.Fatal("the refused START left slot 300 migrating")
	}
	if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "CANCEL").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "START", "300-399").Err(); err != nil {
		t.Fatalf("START after CANCEL: %v", err)
	}
}

// TestCounterHitTrust: SLUICE.COUNTERHIT is refused by a standalone server,
// and a cluster node clamps the sender's clock to its own ± the allowed
// skew: a counter hit a day ahead reads as one 5 s ahead.
func TestCounterHitTrust(t *testing.T) {
	path := "../policy/testdata/algorithms.ini"
	clock := newTestClock(t0)
	ctx := context.Background()
	standalone := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: clock.now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	r := standalone.pol.Current().Policy.Rules()[0] // fixedWindow
	key := keyspace.AppendRuleKey(nil, r, 2, append(r.AppendCounterID(nil, nil), "ann"...))
	now := strconv.FormatInt(clock.now().UnixNano(), 10)
	err := newClient(t, standalone).Do(ctx, "SLUICE.COUNTERHIT", string(key), 1, now, 2, 1).Err()
	if err == nil || !strings.Contains(err.Error(), "this node is standalone") {
		t.Errorf("SLUICE.COUNTERHIT on a standalone server: %v; want it refused", err)
	}

	node := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: clock.now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()},
		Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: []string{"127.0.0.1:7000"}, Self: "127.0.0.1:7000", MaxClockSkew: 5 * time.Second}}})
	rdb := newClient(t, node)
	hit := func(actor string, at int64, hits int) []any {
		k := keyspace.AppendRuleKey(nil, r, 2, append(r.AppendCounterID(nil, nil), actor...))
		v, err := rdb.Do(ctx, "SLUICE.COUNTERHIT", string(k), 1, strconv.FormatInt(at, 10), 2, hits).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	own := clock.now().UnixNano()
	hit("ann", own+86400e9, 1) // a day ahead
	hit("bob", own+5e9, 1)     // at the bound
	ann, bob := hit("ann", own, 0), hit("bob", own, 0)
	if fmt.Sprint(ann) != fmt.Sprint(bob) {
		t.Errorf("read now: ann (hit with a clock a day ahead) %v, bob (5 s ahead) %v; want the same: a clock beyond --cluster-max-clock-skew is clamped", ann, bob)
	}
}

// TestClusterInitialTopologyStored: the topology of the first start is
// stored, so a restart with other flags (--cluster-size edited before any
// push) keeps the epoch-0 topology the other nodes use.
func TestClusterInitialTopologyStored(t *testing.T) {
	dir := t.TempDir()
	four := append(append([]string(nil), threeNodes...), "127.0.0.1:7003")
	topo := func(nodes []string) string {
		store, err := storage.Open(dir, StoreOptions(storage.Options{}))
		if err != nil {
			t.Fatal(err)
		}
		srv, err := New(Config{Store: store, Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: nodes, Self: threeNodes[1]}}})
		if err != nil {
			t.Fatal(err)
		}
		serveOn(t, srv, store)
		defer func() { srv.Close(); store.Close() }()
		s, err := newClient(t, srv).Do(context.Background(), "CLUSTER", "TOPOLOGY").Text()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := topo(threeNodes)
	if after := topo(four); after != before {
		t.Fatalf("after a restart with --cluster-size 4: %s; before: %s; want the stored one", after, before)
	}
}

// TestClusterEpochCap: a topology with an epoch above 2^53 is refused (the
// tools' next epoch, +1, would wrap at 2^64−1 and freeze the topology), and
// a node at the cap takes a pushed topology of any epoch (renumbering).
func TestClusterEpochCap(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: threeNodes, Self: threeNodes[0]}}})
	rdb := newClient(t, srv)
	ctx := context.Background()
	for _, e := range []string{"18446744073709551615", strconv.FormatUint(cluster.MaxEpoch+1, 10)} {
		err := rdb.Do(ctx, "CLUSTER", "SETTOPOLOGY", e, threeNodes[0], "0-16383").Err()
		if err == nil || !strings.Contains(err.Error(), "want at most 2^53") {
			t.Errorf("SETTOPOLOGY at epoch %s: %v; want it refused", e, err)
		}
	}
	if err := rdb.Do(ctx, "CLUSTER", "SETTOPOLOGY", strconv.FormatUint(cluster.MaxEpoch, 10), threeNodes[0], "0-16383").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "CLUSTER", "SETTOPOLOGY", 7, threeNodes[0], "0-8191", threeNodes[1], "8192-16383").Err(); err != nil {
		t.Fatalf("a push to a node at the epoch cap: %v; want it taken (renumbering)", err)
	}
}

// TestClusterRestoreValidates: CLUSTER RESTORE takes only records as DUMP
// gives them: a key of no kind, or a value its kind does not decode, is
// refused and nothing of the command is written.
func TestClusterRestoreValidates(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: []string{"127.0.0.1:7000", "127.0.0.1:7001"}, Self: "127.0.0.1:7000"}}})
	rdb := newClient(t, srv)
	ctx := context.Background()
	key := keyIn(9000, 9999)
	slot := keyspace.Slot([]byte(key))
	good := string(keyspace.AppendGCRAKey(nil, []byte(key)))
	noKind := string([]byte{byte(slot >> 8), byte(slot), 'Z'}) + "junk"
	for _, pair := range [][2]string{{good, "garbage-not-a-gcra-record"}, {noKind, "x"}} {
		err := rdb.Do(ctx, "CLUSTER", "RESTORE", pair[0], pair[1]).Err()
		if err == nil || !strings.HasPrefix(err.Error(), "ERR CLUSTER RESTORE: pair 1: ") {
			t.Errorf("RESTORE %q %q: %v; want it refused", pair[0], pair[1], err)
		}
	}
	if n, _ := rdb.DBSize(ctx).Result(); n != 0 {
		t.Errorf("DBSIZE %d after refused RESTOREs; want 0", n)
	}
	// A real record, as another node's DUMP gives it, is taken.
	other := startServer(t, Config{})
	ro := newClient(t, other)
	if err := ro.Do(ctx, "CL.THROTTLE", key, 15, 30, 60, 1).Err(); err != nil {
		t.Fatal(err)
	}
	var val string
	if err := other.store.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := other.store.Scan(nil, []byte{0xff}, func(k, v []byte) bool {
		if string(k) == good {
			val = string(v)
		}
		return true
	}); err != nil || val == "" {
		t.Fatalf("the GCRA record on the other node: %q %v", val, err)
	}
	if err := rdb.Do(ctx, "CLUSTER", "IMPORT", "START", slot).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Do(ctx, "CLUSTER", "RESTORE", good, val).Int64(); err != nil || n != 1 {
		t.Fatalf("RESTORE of a real record: %d %v", n, err)
	}
}

// TestClusterDumpCountBounded: a DUMP count above 10000 is refused (2^63−1
// overflowed the page bound and dumped every record in one reply).
func TestClusterDumpCountBounded(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: []string{"127.0.0.1:7000"}, Self: "127.0.0.1:7000"}}})
	rdb := newClient(t, srv)
	ctx := context.Background()
	for _, n := range []string{"10001", "9223372036854775807"} {
		err := rdb.Do(ctx, "CLUSTER", "DUMP", 0, 16383, "", n).Err()
		if err == nil || !strings.Contains(err.Error(), "count 1 to 10000") {
			t.Errorf("DUMP count %s: %v; want it refused", n, err)
		}
	}
	if err := rdb.Do(ctx, "CLUSTER", "DUMP", 0, 16383, "", 10000).Err(); err != nil {
		t.Errorf("DUMP count 10000: %v", err)
	}
}

// TestClusterShardsHostname: CLUSTER SHARDS leaves hostname out for a node
// announced by IP address, as Redis does for a node with no hostname, and
// gives it for one announced by name.
func TestClusterShardsHostname(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: []string{"127.0.0.1:7000", "sluice-1.sluice:7001"}, Self: "127.0.0.1:7000"}}})
	shards, err := newClient(t, srv).ClusterShards(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			got[n.Endpoint] = n.Hostname
		}
	}
	if got["127.0.0.1"] != "" || got["sluice-1.sluice"] != "sluice-1.sluice" {
		t.Errorf("hostnames by endpoint: %q; want none for 127.0.0.1, sluice-1.sluice for sluice-1.sluice", got)
	}
}

// TestClusterImportInterrupted: a target's copy of slots becomes its own
// only whole. Restarted while copying, it drops the copy as it starts and
// takes neither RESTORE, IMPORT DONE nor a topology giving it the slots,
// until a DROP or a new IMPORT START; a copy marked done survives a
// restart, and only the topology of its epoch gives it the slots.
func TestClusterImportInterrupted(t *testing.T) {
	dir := t.TempDir()
	nodes := []string{"127.0.0.1:7000", "127.0.0.1:7001"}
	start := func() (*redis.Client, func()) {
		t.Helper()
		srv, closeSrv, err := newAt(t, dir, &clusternode.Config{Nodes: nodes, Self: nodes[1]})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(ln)
		rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, ReadTimeout: 2 * time.Minute, WriteTimeout: 2 * time.Minute})
		return rdb, func() { rdb.Close(); closeSrv() }
	}
	ctx := context.Background()
	// Records of slots 0-99 (node 0's), as DUMP gives them.
	src := startServer(t, Config{})
	rs := newClient(t, src)
	keys := []string{keyIn(0, 49), keyIn(50, 99)}
	for _, k := range keys {
		if err := rs.Do(ctx, "RL.REDUCE", k, 10, 60, "TAKE", 3, "AT", 1000).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.store.Flush(); err != nil {
		t.Fatal(err)
	}
	dump := []any{""} // as DUMP's reply: cursor, then keys and values
	if err := src.store.Scan(nil, []byte{0xff}, func(k, v []byte) bool {
		dump = append(dump, string(k), string(v))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(dump) != 5 {
		t.Fatalf("source records: %q", dump)
	}
	restore := append([]any{"CLUSTER", "RESTORE"}, dump[1:]...)
	expectErr := func(rdb *redis.Client, want string, args ...any) {
		t.Helper()
		if err := rdb.Do(ctx, args...).Err(); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%q: %v; want an error containing %q", args, err, want)
		}
	}
	give := func(epoch int) []any {
		return []any{"CLUSTER", "SETTOPOLOGY", epoch, nodes[0], "100-8191", nodes[1], "0-99,8192-16383"}
	}

	rdb, stop := start()
	expectErr(rdb, "not being copied to this node (none)", restore...)
	if err := rdb.Do(ctx, "CLUSTER", "IMPORT", "START", "0-99").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, restore[:4]...).Err(); err != nil {
		t.Fatalf("RESTORE of the first record: %v", err)
	}
	expectErr(rdb, "its copy here is not complete", give(1)...)
	stop()

	rdb, stop = start()
	if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE after a restart while copying: %d %v; want 0: the partial copy dropped", n, err)
	}
	expectErr(rdb, "not being copied to this node (interrupted)", restore...)
	expectErr(rdb, "not being copied to this node (interrupted)", "CLUSTER", "IMPORT", "DONE", "0-99", 1)
	expectErr(rdb, "its copy here was cut short", give(1)...)

	// The move run again: a whole copy, done for epoch 1.
	if err := rdb.Do(ctx, "CLUSTER", "IMPORT", "START", "0-99").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, restore...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "CLUSTER", "IMPORT", "DONE", "0-99", 1).Err(); err != nil {
		t.Fatal(err)
	}
	stop()

	rdb, stop = start()
	defer stop()
	if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 2 {
		t.Fatalf("DBSIZE after a restart with the copy done: %d %v; want 2", n, err)
	}
	expectErr(rdb, "complete for the topology of epoch 1, not this one", give(2)...)
	if err := rdb.Do(ctx, give(1)...).Err(); err != nil {
		t.Fatalf("the topology of epoch 1 giving the slots: %v", err)
	}
	for _, k := range keys {
		if n, err := rdb.Do(ctx, "RL.GET", k, 10, 60, "AT", 1000).Int64(); err != nil || n != 7 {
			t.Errorf("RL.GET %s on the target: %d %v; want 7", k, n, err)
		}
	}
}

// TestClusterDropOutlastsAKill: CLUSTER DROP ends an import only once the
// records it deletes are in the log with the end: a target killed just
// after it answered DROP (the write-behind queue lost, as SIGKILL loses it
// with --fsync everysec) must not start again with its partial copy back
// and no import to drop it, ready to serve it once a topology gives it
// the slots. The kill is a copy of the data directory taken at that
// instant, with the sync loop held off.
func TestClusterDropOutlastsAKill(t *testing.T) {
	nodes := []string{"127.0.0.1:7000", "127.0.0.1:7001"}
	ctx := context.Background()
	src := startServer(t, Config{})
	rs := newClient(t, src)
	for _, k := range []string{keyIn(0, 49), keyIn(50, 99)} {
		if err := rs.Do(ctx, "RL.REDUCE", k, 10, 60, "TAKE", 3, "AT", 1000).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.store.Flush(); err != nil {
		t.Fatal(err)
	}
	restore := []any{"CLUSTER", "RESTORE"}
	if err := src.store.Scan(nil, []byte{0xff}, func(k, v []byte) bool {
		restore = append(restore, string(k), string(v))
		return true
	}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	store, err := storage.Open(dir, StoreOptions(storage.Options{Sync: storage.SyncEverySec, SyncInterval: time.Hour}))
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := New(Config{Store: store, Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: nodes, Self: nodes[1]}}})
	if err != nil {
		store.Close()
		t.Fatal(err)
	}
	serveOn(t, tgt, store)
	rdb := newClient(t, tgt)
	for _, cmd := range [][]any{{"CLUSTER", "IMPORT", "START", "0-99"}, restore, {"CLUSTER", "DROP", "0-99"}} {
		if err := rdb.Do(ctx, cmd...).Err(); err != nil {
			t.Fatalf("%q: %v", cmd[:3], err)
		}
	}
	killed := t.TempDir()
	if err := os.CopyFS(killed, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}

	srv, closeSrv, err := newAt(t, killed, &clusternode.Config{Nodes: nodes, Self: nodes[1]})
	if err != nil {
		t.Fatal(err)
	}
	defer closeSrv()
	if n := srv.store.Stats().Records; n != 0 {
		t.Fatalf("%d records after DROP and a kill; want 0: the partial copy is back with its import ended", n)
	}
}
