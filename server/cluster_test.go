package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// keyIn returns a key whose slot is in [first, last].
func keyIn(first, last uint16) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("key:%d", i)
		if s := keyspace.Slot([]byte(k)); s >= first && s <= last {
			return k
		}
	}
}

var threeNodes = []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}

// TestClusterDisabled: standalone, CLUSTER and ASKING answer as Redis
// does without cluster support, HELLO says standalone and INFO
// cluster_enabled:0.
func TestClusterDisabled(t *testing.T) {
	srv := startServer(t, Config{})
	rdb := newClient(t, srv)
	ctx := context.Background()
	for _, cmd := range [][]any{{"CLUSTER", "INFO"}, {"CLUSTER", "SLOTS"}, {"ASKING"}, {"READONLY"}} {
		if err := rdb.Do(ctx, cmd...).Err(); err == nil || err.Error() != "ERR This instance has cluster support disabled" {
			t.Errorf("%v: %v", cmd, err)
		}
	}
	info, _ := rdb.Info(ctx, "cluster").Result()
	if !strings.Contains(info, "cluster_enabled:0") {
		t.Errorf("INFO cluster: %q", info)
	}
	hello, err := rdb.Do(ctx, "HELLO", "2").Slice()
	if err != nil || hello[9] != "standalone" || hello[3] != respserver.RedisCompatVersion {
		t.Errorf("HELLO: %v %v", hello, err)
	}
}

// TestClusterMode: the second of three nodes owns 5461-10921, serves keys
// there, answers MOVED for the others and CROSSSLOT for a DEL across
// slots; its CLUSTER replies parse in go-redis.
func TestClusterMode(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: threeNodes, Self: threeNodes[1]}}})
	rdb := newClient(t, srv)
	ctx := context.Background()
	mine, other := keyIn(5461, 10921), keyIn(0, 5460)
	if err := rdb.Do(ctx, "RL.REDUCE", mine, 10, 60).Err(); err != nil {
		t.Fatalf("own key: %v", err)
	}
	slot := keyspace.Slot([]byte(other))
	err := rdb.Do(ctx, "RL.REDUCE", other, 10, 60).Err()
	if want := fmt.Sprintf("MOVED %d 127.0.0.1:7000", slot); err == nil || err.Error() != want {
		t.Fatalf("other's key: %v, want %s", err, want)
	}
	if err := rdb.Do(ctx, "DEL", mine, other).Err(); err == nil || err.Error() != "CROSSSLOT Keys in request don't hash to the same slot" {
		t.Fatalf("DEL across slots: %v", err)
	}
	if n, err := rdb.Do(ctx, "DEL", "{"+mine+"}a", "{"+mine+"}b").Int(); err != nil || n != 0 {
		t.Fatalf("DEL in one slot: %v %v", n, err)
	}
	if id, _ := rdb.Do(ctx, "CLUSTER", "MYID").Text(); id != cluster.NodeID(threeNodes[1]) {
		t.Fatalf("MYID %q", id)
	}
	if n, _ := rdb.Do(ctx, "CLUSTER", "KEYSLOT", "somekey").Int(); n != 11058 {
		t.Fatalf("KEYSLOT somekey = %d, want 11058 as Redis", n)
	}
	slots, err := rdb.ClusterSlots(ctx).Result()
	if err != nil || len(slots) != 3 || slots[1].Start != 5461 || slots[1].End != 10921 || slots[1].Nodes[0].Addr != "127.0.0.1:7001" || slots[1].Nodes[0].ID != cluster.NodeID(threeNodes[1]) {
		t.Fatalf("CLUSTER SLOTS: %+v %v", slots, err)
	}
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil || len(shards) != 3 || shards[2].Slots[0].Start != 10922 || shards[2].Nodes[0].Port != 7002 || shards[2].Nodes[0].Role != "master" {
		t.Fatalf("CLUSTER SHARDS: %+v %v", shards, err)
	}
	nodes, _ := rdb.ClusterNodes(ctx).Result()
	lines := strings.Split(strings.TrimSpace(nodes), "\n")
	if len(lines) != 3 || lines[1] != cluster.NodeID(threeNodes[1])+" 127.0.0.1:7001@0 myself,master - 0 0 0 connected 5461-10921" {
		t.Fatalf("CLUSTER NODES: %q", nodes)
	}
	info, _ := rdb.ClusterInfo(ctx).Result()
	for _, want := range []string{"cluster_state:ok\r\n", "cluster_slots_assigned:16384\r\n", "cluster_known_nodes:3\r\n", "cluster_size:3\r\n", "cluster_current_epoch:0\r\n"} {
		if !strings.Contains(info, want) {
			t.Fatalf("CLUSTER INFO lacks %q: %q", want, info)
		}
	}
	if s, _ := rdb.Info(ctx, "server", "cluster").Result(); !strings.Contains(s, "redis_mode:cluster") || !strings.Contains(s, "cluster_enabled:1") {
		t.Fatalf("INFO: %q", s)
	}
	hello, err := rdb.Do(ctx, "HELLO", "2").Slice()
	if err != nil || hello[9] != "cluster" {
		t.Fatalf("HELLO: %v %v", hello, err)
	}
	for _, cmd := range []string{"ASKING", "READONLY", "READWRITE"} {
		if err := rdb.Do(ctx, cmd).Err(); err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
	}
	keys, err := rdb.Do(ctx, "COMMAND", "GETKEYS", "DEL", "a", "b", "c").StringSlice()
	if err != nil || strings.Join(keys, ",") != "a,b,c" {
		t.Fatalf("COMMAND GETKEYS DEL: %v %v", keys, err)
	}
	keys, err = rdb.Do(ctx, "COMMAND", "GETKEYS", "RL.REDUCE", "k", "10", "60", "TAKE", "2").StringSlice()
	if err != nil || strings.Join(keys, ",") != "k" {
		t.Fatalf("COMMAND GETKEYS RL.REDUCE: %v %v", keys, err)
	}
	// Keyless commands are not redirected.
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestSetTopology: a pushed topology with a higher epoch replaces the one
// in use and survives a restart; a lower epoch is refused, the same one
// accepted again; a slot nobody owns answers CLUSTERDOWN.
func TestSetTopology(t *testing.T) {
	dir := t.TempDir()
	open := func() (*Server, *storage.Store) {
		store, err := storage.Open(dir, StoreOptions(storage.Options{}))
		if err != nil {
			t.Fatal(err)
		}
		srv, err := New(Config{Store: store, Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: threeNodes, Self: threeNodes[0]}}})
		if err != nil {
			t.Fatal(err)
		}
		return srv, store
	}
	srv, store := open()
	serveOn(t, srv, store)
	rdb := newClient(t, srv)
	ctx := context.Background()
	push := []any{"CLUSTER", "SETTOPOLOGY", 5, "127.0.0.1:7000", "0-99", "127.0.0.1:7001", "200-16383"}
	if err := rdb.Do(ctx, push...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, push...).Err(); err != nil {
		t.Fatalf("same push again: %v", err)
	}
	if err := rdb.Do(ctx, "CLUSTER", "SETTOPOLOGY", 4, "127.0.0.1:7000", "0-16383").Err(); err == nil || !strings.Contains(err.Error(), "not above the current epoch 5") {
		t.Fatalf("lower epoch: %v", err)
	}
	if err := rdb.Do(ctx, "CLUSTER", "SETTOPOLOGY", 6, "127.0.0.1:7000", "0-100", "127.0.0.1:7001", "100-200").Err(); err == nil || !strings.Contains(err.Error(), "slot 100") {
		t.Fatalf("slot twice: %v", err)
	}
	if err := rdb.Do(ctx, "RL.REDUCE", keyIn(100, 199), 10, 60).Err(); err == nil || err.Error() != "CLUSTERDOWN Hash slot not served" {
		t.Fatalf("unowned slot: %v", err)
	}
	if err := rdb.Do(ctx, "RL.REDUCE", keyIn(300, 16383), 10, 60).Err(); err == nil || !strings.HasPrefix(err.Error(), "MOVED ") || !strings.HasSuffix(err.Error(), " 127.0.0.1:7001") {
		t.Fatalf("moved slot: %v", err)
	}
	info, _ := rdb.ClusterInfo(ctx).Result()
	if !strings.Contains(info, "cluster_state:fail") || !strings.Contains(info, "cluster_slots_assigned:16284") || !strings.Contains(info, "cluster_current_epoch:5") {
		t.Fatalf("CLUSTER INFO: %q", info)
	}
	srv.Close()
	store.Close()

	srv2, store2 := open()
	serveOn(t, srv2, store2)
	rdb2 := newClient(t, srv2)
	top, err := rdb2.Do(ctx, "CLUSTER", "TOPOLOGY").Text()
	if err != nil || top != "5 127.0.0.1:7000 0-99 127.0.0.1:7001 200-16383" {
		t.Fatalf("after restart: %q %v", top, err)
	}
}

// TestClusterAddedNode: a node whose address is not among the initial
// nodes (a pod added by scaling up) is a member that owns no slot.
func TestClusterAddedNode(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: threeNodes, Self: "127.0.0.1:7003"}}})
	rdb := newClient(t, srv)
	ctx := context.Background()
	nodes, _ := rdb.ClusterNodes(ctx).Result()
	if !strings.Contains(nodes, " 127.0.0.1:7003@0 myself,master - 0 0 0 connected\n") {
		t.Fatalf("CLUSTER NODES: %q", nodes)
	}
	if err := rdb.Do(ctx, "RL.REDUCE", "k", 10, 60).Err(); err == nil || !strings.HasPrefix(err.Error(), "MOVED ") {
		t.Fatalf("%v", err)
	}
}

// TestClusterTransactions: in cluster mode a transaction's keys must share
// one slot owned here, as in Redis: a queued command for a key owned
// elsewhere answers MOVED and one for another slot CROSSSLOT, and either
// makes EXEC answer EXECABORT without running anything; HIT, whose
// counters other nodes may own, cannot be queued.
func TestClusterTransactions(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: threeNodes, Self: threeNodes[1]}}})
	mine, other := keyIn(5461, 10921), keyIn(0, 5460)
	mine2 := "{" + mine + "}2"
	slot := keyspace.Slot([]byte(other))
	abort := "-EXECABORT Transaction discarded because of previous errors.\r\n"
	cases := []struct{ name, in, want string }{
		{"one slot", "MULTI\r\nRL.REDUCE " + mine + " 5 60 AT 1\r\nRL.REDUCE " + mine2 + " 5 60 AT 1\r\nEXEC\r\n",
			"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:5\r\n:5\r\n"},
		{"moved", "MULTI\r\nRL.REDUCE " + mine + " 5 60 AT 1\r\nRL.REDUCE " + other + " 5 60 AT 1\r\nEXEC\r\nRL.GET " + mine + " 5 60 AT 1\r\n",
			fmt.Sprintf("+OK\r\n+QUEUED\r\n-MOVED %d 127.0.0.1:7000\r\n%s:4\r\n", slot, abort)},
		{"crossslot", "", ""},
		{"hit", "MULTI\r\nHIT path=/x\r\nEXEC\r\n",
			"+OK\r\n-ERR Command not allowed inside a transaction in cluster mode: hit's counters may be owned by other nodes, which an EXEC cannot change atomically\r\n" + abort},
	}
	for _, tc := range cases {
		if tc.want == "" {
			// Another key of this node in another slot.
			var k string
			for i := 0; ; i++ {
				k = fmt.Sprintf("other:%d", i)
				if s := keyspace.Slot([]byte(k)); s >= 5461 && s <= 10921 && s != keyspace.Slot([]byte(mine)) {
					break
				}
			}
			tc.in = "MULTI\r\nRL.REDUCE " + mine + " 5 60 AT 1\r\nRL.REDUCE " + k + " 5 60 AT 1\r\nEXEC\r\nRL.GET " + mine + " 5 60 AT 1\r\n"
			tc.want = "+OK\r\n+QUEUED\r\n-CROSSSLOT Keys in request don't hash to the same slot\r\n" + abort + ":4\r\n"
		}
		if got := rawExchange(t, srv, tc.in, tc.want); got != tc.want {
			t.Errorf("%s: %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

// TestClusterExecWritesMigrate: while a slot migrates, an EXEC's writes to
// it are noted for MIGRATE DIRTY like a pipeline's, so the target gets
// them (they were lost: Release emptied the batch before they were noted).
func TestClusterExecWritesMigrate(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: threeNodes, Self: threeNodes[1]}}})
	ctx := context.Background()
	rdb := newClient(t, srv)
	mine := keyIn(5461, 10921)
	if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "START", fmt.Sprint(keyspace.Slot([]byte(mine)))).Err(); err != nil {
		t.Fatal(err)
	}
	in := "MULTI\r\nRL.REDUCE {" + mine + "}tx 5 60\r\nEXEC\r\n"
	want := "+OK\r\n+QUEUED\r\n*1\r\n:5\r\n"
	if got := rawExchange(t, srv, in, want); got != want {
		t.Fatalf("%q", got)
	}
	dirty, err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "DIRTY", 100).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(dirty) != 2 || !strings.HasSuffix(fmt.Sprint(dirty[0]), "}tx") {
		t.Fatalf("MIGRATE DIRTY after an EXEC's write to a migrating slot: %q; want its key and value", dirty)
	}
}

// TestClusterExecRoutedAsWhole: EXEC checks the slot of its queued keys
// once, for the whole transaction, as Redis does: queued while the slot
// served, run after MIGRATE PAUSE, it answers TRYAGAIN alone and runs
// nothing, instead of an array of TRYAGAIN elements (which, with a pause
// landing midway, split a transaction).
func TestClusterExecRoutedAsWhole(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: threeNodes, Self: threeNodes[1]}}})
	ctx := context.Background()
	admin := newClient(t, srv)
	mine := keyIn(5461, 10921)
	nc, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(time.Minute))
	r := bufio.NewReader(nc)
	exchange := func(in, want string) {
		t.Helper()
		if _, err := io.WriteString(nc, in); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		if n, err := io.ReadFull(r, got); err != nil || string(got) != want {
			t.Fatalf("after %q: %q, %v; want %q", in, got[:n], err, want)
		}
	}
	exchange("MULTI\r\nRL.REDUCE {"+mine+"}a 5 60\r\nRL.REDUCE {"+mine+"}b 5 60\r\n", "+OK\r\n+QUEUED\r\n+QUEUED\r\n")
	if err := admin.Do(ctx, "CLUSTER", "MIGRATE", "START", fmt.Sprint(keyspace.Slot([]byte(mine)))).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "CLUSTER", "MIGRATE", "PAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	want := "-TRYAGAIN Slot is being handed over to another node; retry shortly\r\n"
	exchange("EXEC\r\nPING\r\n", want+"+PONG\r\n")
}

// newAt opens the store in dir and a server on it with cc (nil:
// standalone), without serving; close closes both. On an error from New,
// the store is closed and the error returned.
func newAt(t *testing.T, dir string, cc *clusternode.Config) (srv *Server, close func(), err error) {
	t.Helper()
	store, err := storage.Open(dir, StoreOptions(storage.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	srv, err = New(Config{Store: store, Cluster: clusternode.Mode{Node: cc}})
	if err != nil {
		store.Close()
		return nil, nil, err
	}
	return srv, func() { srv.Close(); store.Close() }, nil
}

// TestClusterIdentity: a data directory belongs to the node it first
// started as in cluster mode. Started as another node it is refused,
// naming both, and nothing is stored; started as its own (a pod
// rescheduled with its volume) it serves; --cluster-reassign-from
// re-assigns it on purpose. Started standalone it is refused while its
// node owns less than every slot.
func TestClusterIdentity(t *testing.T) {
	dir := t.TempDir()
	as := func(self, reassign string) (*Server, func(), error) {
		return newAt(t, dir, &clusternode.Config{Nodes: threeNodes, Self: self, ReassignFrom: reassign})
	}
	_, closeSrv, err := as(threeNodes[1], "")
	if err != nil {
		t.Fatalf("first start as node 1: %v", err)
	}
	closeSrv()

	_, _, err = as(threeNodes[0], "")
	if !errors.Is(err, clusternode.ErrClusterIdentity) {
		t.Fatalf("node 1's directory started as node 0: %v; want ErrClusterIdentity", err)
	}
	for _, want := range []string{"belongs to node " + threeNodes[1], "as node " + threeNodes[0], cluster.NodeID(threeNodes[1]), cluster.NodeID(threeNodes[0]), "--cluster-reassign-from " + threeNodes[1]} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	// A wrong --cluster-reassign-from changes nothing either.
	if _, _, err := as(threeNodes[0], threeNodes[2]); !errors.Is(err, clusternode.ErrClusterIdentity) {
		t.Fatalf("re-assigned from a node it was not: %v; want ErrClusterIdentity", err)
	}

	srv, closeSrv, err := as(threeNodes[1], "")
	if err != nil {
		t.Fatalf("restart as node 1 after the refusals: %v", err)
	}
	if srv.clus.ID() != cluster.NodeID(threeNodes[1]) {
		t.Errorf("restarted as node 1 with ID %s", srv.clus.ID())
	}
	closeSrv()

	_, _, err = newAt(t, dir, nil)
	if !errors.Is(err, clusternode.ErrClusterIdentity) || !strings.Contains(err.Error(), "owns 5461 of 16384 slots") {
		t.Fatalf("node 1's directory started standalone: %v; want ErrClusterIdentity naming its 5461 slots", err)
	}

	srv, closeSrv, err = as(threeNodes[0], threeNodes[1])
	if err != nil {
		t.Fatalf("re-assigned to node 0 with --cluster-reassign-from node 1: %v", err)
	}
	if srv.clus.ID() != cluster.NodeID(threeNodes[0]) {
		t.Errorf("re-assigned with ID %s, want node 0's", srv.clus.ID())
	}
	closeSrv()
	if _, _, err := as(threeNodes[1], ""); !errors.Is(err, clusternode.ErrClusterIdentity) {
		t.Fatalf("after the re-assignment to node 0, started as node 1: %v; want ErrClusterIdentity", err)
	}

	// A node owning every slot may leave cluster mode; a standalone
	// store may enter it, and then belongs to that node.
	one := t.TempDir()
	_, closeSrv, err = newAt(t, one, &clusternode.Config{Nodes: threeNodes[:1], Self: threeNodes[0]})
	if err != nil {
		t.Fatal(err)
	}
	closeSrv()
	if _, closeSrv, err = newAt(t, one, nil); err != nil {
		t.Fatalf("standalone on the directory of a node owning every slot: %v", err)
	}
	closeSrv()
	if _, _, err := newAt(t, one, &clusternode.Config{Nodes: threeNodes, Self: threeNodes[2]}); !errors.Is(err, clusternode.ErrClusterIdentity) {
		t.Fatalf("back in cluster mode as another node: %v; want ErrClusterIdentity", err)
	}
}
