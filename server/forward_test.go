package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// startClusterServers starts n in-process nodes of one cluster on loopback,
// each with its own store and cfg's other settings.
func startClusterServers(t *testing.T, n int, cfg Config) []*Server {
	t.Helper()
	lns := make([]net.Listener, n)
	addrs := make([]string, n)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i], addrs[i] = ln, ln.Addr().String()
	}
	srvs := make([]*Server, n)
	for i := range srvs {
		store, err := storage.Open(t.TempDir(), StoreOptions(storage.Options{Sync: storage.SyncEverySec}))
		if err != nil {
			t.Fatal(err)
		}
		c := cfg
		c.Store = store
		c.Cluster = &ClusterConfig{Nodes: addrs, Self: addrs[i]}
		srv, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(lns[i]) }()
		for srv.Addr() == nil {
			runtime.Gosched()
		}
		t.Cleanup(func() {
			srv.Close()
			<-done
			store.Close()
		})
		srvs[i] = srv
	}
	return srvs
}

// TestClusterHitCountsOnOwner is issue 17's third must-show: HIT sent to
// any node, over RESP or the line protocol, answers what a standalone
// server answers for the same sequence, and each counter is stored only
// on the node owning its slot.
func TestClusterHitCountsOnOwner(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "example-config.ini")
	clock := newTestClock(t0)
	cfg := Config{PolicyFile: path, Clock: clock.now}
	nodes := startClusterServers(t, 2, cfg)
	lines := []string{dialLineAddr(t, nodes[0]), dialLineAddr(t, nodes[1])}
	ref := startServer(t, cfg)
	for round := range 5 {
		clock.ms.Store(t0 + int64(round)*1000)
		for ip := range 40 {
			line := fmt.Sprintf("HIT method=GET path=/pantry/cookies/oatmeal ip=10.0.%d.%d", ip/8, ip%8)
			if ip%5 == 0 {
				line = "HIT method=GET path=/pantry/cookies/special-cookie ip=10.9.9.9"
			}
			want := hitRESP(t, ref, line)
			var got string
			switch (round + ip) % 3 {
			case 0, 1:
				got = hitRESP(t, nodes[(round+ip)%3], line)
			default:
				c := dialLine(t, lines[ip%2])
				c.send(line + "\n")
				got = c.line()
			}
			if got != want {
				t.Fatalf("round %d, %q: cluster %q, standalone %q", round, line, got, want)
			}
		}
	}
	// Every counter is on its owner, and the nodes hold what the
	// standalone server holds, once.
	var total int64
	for i, srv := range nodes {
		if err := srv.store.Flush(); err != nil {
			t.Fatal(err)
		}
		v := srv.clus.view.Load()
		err := srv.store.Scan(nil, nil, func(k, _ []byte) bool {
			if o := v.owner[binary.BigEndian.Uint16(k)]; o != v.self {
				t.Errorf("node %d holds a record of slot %d, owned by node %d", i, binary.BigEndian.Uint16(k), o-1)
			}
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		total += srv.store.Records()
	}
	if total != ref.store.Records() || total < 30 {
		t.Fatalf("the nodes hold %d records, the standalone server %d", total, ref.store.Records())
	}
}

func dialLineAddr(t *testing.T, srv *Server) string { return startDivvy(t, srv) }

// TestClusterHitOwnerDown: a HIT whose counter's owner is down gets an
// error naming the slot and the owner; HITs counted here still work.
func TestClusterHitOwnerDown(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "example-config.ini")
	clock := newTestClock(t0)
	nodes := startClusterServers(t, 2, Config{PolicyFile: path, Clock: clock.now})
	nodes[1].Close()
	var ok, down int
	for ip := range 40 {
		got := hitRESP(t, nodes[0], fmt.Sprintf("HIT method=GET path=/pantry/cookies/oatmeal ip=10.0.0.%d", ip))
		switch {
		case strings.HasPrefix(got, "OK true 2 "):
			ok++
		case strings.HasPrefix(got, "ERR ERR cluster: forwarding a counter of slot ") && strings.Contains(got, "to its owner "+nodes[1].cfg.Cluster.Self+" failed"):
			down++
		default:
			t.Fatalf("HIT: %q", got)
		}
	}
	if ok == 0 || down == 0 {
		t.Fatalf("%d hits counted here, %d refused; want some of each", ok, down)
	}
}

// TestCounterHitRefusesOtherRules: SLUICE.COUNTERHIT refuses a key that is
// not a counter's, and a rule position whose rule is not the key's.
func TestCounterHitRefusesOtherRules(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "example-config.ini")
	srv := startClusterServers(t, 1, Config{PolicyFile: path})[0]
	rdb := newClient(t, srv)
	ctx := context.Background()
	if err := rdb.Do(ctx, "SLUICE.COUNTERHIT", "nonsense", 1, t0).Err(); err == nil || !strings.Contains(err.Error(), "not a counter key") {
		t.Fatalf("%v", err)
	}
	lp := srv.pol.cur.Load()
	r := lp.p.Rules()[2]
	key := make([]byte, 2, 64)
	key = r.CounterKey(key, nil)
	binary.BigEndian.PutUint16(key, keyspace.Slot(key[keyspace.HeaderLen:]))
	if err := rdb.Do(ctx, "SLUICE.COUNTERHIT", key, 1, t0).Err(); err == nil || !strings.Contains(err.Error(), "every node must run the same rules") {
		t.Fatalf("%v", err)
	}
	if v, err := rdb.Do(ctx, "SLUICE.COUNTERHIT", key, 3, t0).Slice(); err != nil || v[0] != int64(1) || v[1] != int64(2) {
		t.Fatalf("%v %v", v, err)
	}
}
