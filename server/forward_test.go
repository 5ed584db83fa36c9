package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// startClusterServers starts n in-process nodes of one cluster on loopback,
// each with its own store and cfg's other settings.
func startClusterServers(t testing.TB, n int, cfg Config) []*Server {
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
		c.Cluster.Node = &clusternode.Config{Nodes: addrs, Self: addrs[i]}
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
// any node, over RESP or the line protocol (and the rules engine's Hit, for every
// algorithm and a per-request quota), answers what a standalone
// server answers for the same sequence, and each counter is stored only
// on the node owning its slot.
func TestClusterHitCountsOnOwner(t *testing.T) {
	t.Run("divvy", testClusterHitDivvy)
	t.Run("algorithms and quota", testClusterHitAlgorithms)
}

func testClusterHitDivvy(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "example-config.ini")
	clock := newTestClock(t0)
	cfg := Config{Policy: policycmd.Config{File: path}, Clock: clock.now}
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
	checkOnOwners(t, nodes, ref, 30)
}

func dialLineAddr(t *testing.T, srv *Server) string { return startDivvy(t, srv) }

// TestClusterHitOwnerDown: a HIT whose counter's owner is down gets an
// error naming the slot and the owner; HITs counted here still work.
func TestClusterHitOwnerDown(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "example-config.ini")
	clock := newTestClock(t0)
	nodes := startClusterServers(t, 2, Config{Policy: policycmd.Config{File: path}, Clock: clock.now})
	nodes[1].Close()
	var ok, down int
	for ip := range 40 {
		got := hitRESP(t, nodes[0], fmt.Sprintf("HIT method=GET path=/pantry/cookies/oatmeal ip=10.0.0.%d", ip))
		switch {
		case strings.HasPrefix(got, "OK true 2 "):
			ok++
		case strings.HasPrefix(got, "ERR ERR cluster: forwarding a counter of slot ") && strings.Contains(got, "to its owner "+nodes[1].cfg.Cluster.Node.Self+" failed"):
			down++
		default:
			t.Fatalf("HIT: %q", got)
		}
	}
	if ok == 0 || down == 0 {
		t.Fatalf("%d hits counted here, %d refused; want some of each", ok, down)
	}
}

// hitDirect evaluates the request of line's fields on srv as the front
// ends do (engine.Round.Hit with hits, at the server's clock), commits, and
// returns the outcome with its Rule replaced by the rule's position, so
// that outcomes of two servers compare.
func hitDirect(t *testing.T, srv *Server, line string, hits int64) (policy.Outcome, int, error) {
	t.Helper()
	req, err := policy.ParseArgs(bytesFields(line), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := srv.eng.NewRound()
	out, err := r.Hit(srv.pol.Current(), req, hits, srv.clock().UnixNano())
	if _, cerr := r.Commit(); cerr != nil {
		t.Fatal(cerr)
	}
	pos := 0
	if out.Rule != nil {
		pos = out.Rule.Pos
	}
	out.Rule = nil
	return out, pos, err
}

func bytesFields(line string) [][]byte {
	var out [][]byte
	for _, f := range strings.Fields(line) {
		out = append(out, []byte(f))
	}
	return out
}

// checkOnOwners fails t unless every record of nodes is on the node owning
// its slot, and the nodes hold as many records as ref, at least min.
func checkOnOwners(t *testing.T, nodes []*Server, ref *Server, min int64) {
	t.Helper()
	var total int64
	for i, srv := range nodes {
		if err := srv.store.Flush(); err != nil {
			t.Fatal(err)
		}
		err := srv.store.Scan(nil, nil, func(k, _ []byte) bool {
			if o, mine := srv.clus.Owner(binary.BigEndian.Uint16(k)); !mine {
				t.Errorf("node %d holds a record of slot %d, owned by node %d", i, binary.BigEndian.Uint16(k), o)
			}
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		total += srv.store.Records()
	}
	if err := ref.store.Flush(); err != nil {
		t.Fatal(err)
	}
	if total != ref.store.Records() || total < min {
		t.Fatalf("the nodes hold %d records, the standalone server %d; want the same, at least %d", total, ref.store.Records(), min)
	}
}

// testClusterHitAlgorithms: rules of every algorithm, with and
// without a per-request quota, hit with a cost of 1 or 0 (a read) through
// either node of a cluster, give the whole Outcome a standalone server
// gives (limit, retry and reset times included): the owner applies the
// rule's algorithm, the quota the receiving node resolved and the hit
// count, not its own idea of them.
func testClusterHitAlgorithms(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "algorithms.ini")
	clock := newTestClock(t0)
	cfg := Config{Policy: policycmd.Config{File: path}, Clock: clock.now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}}
	nodes := startClusterServers(t, 2, cfg)
	ref := startServer(t, cfg)
	var forwarded int
	for round := range 4 {
		clock.ms.Store(t0 + int64(round)*1500)
		for u := range 12 {
			for j, line := range []string{
				"path=/fw user=u%d", "path=/fws user=u%d", "path=/tb user=u%d", "path=/gcra user=u%d", "path=/log user=u%d",
				"path=/quota user=u%d quota=4", "path=/quota user=u%d quota=50", "path=/gcra-quota user=u%d quota=7", "path=/divvy x=%d",
			} {
				line = fmt.Sprintf(line, u)
				hits := int64(1)
				if (round+u+j)%4 == 3 {
					hits = 0
				}
				want, wpos, werr := hitDirect(t, ref, line, hits)
				n := (round + u + j) % 2
				got, gpos, gerr := hitDirect(t, nodes[n], line, hits)
				if fmt.Sprint(got, gpos, gerr) != fmt.Sprint(want, wpos, werr) {
					t.Fatalf("round %d, %q, hits %d, via node %d: cluster %+v rule %d err %v; standalone %+v rule %d err %v",
						round, line, hits, n, got, gpos, gerr, want, wpos, werr)
				}
				if werr == nil && wpos > 0 {
					r := ref.pol.Current().Policy.Rules()[wpos-1]
					req, _ := policy.ParseArgs(bytesFields(line), nil)
					lim, _ := r.Limit(req)
					key := keyspace.AppendRuleKey(nil, r, lim, r.AppendCounterID(nil, req))
					if _, mine := nodes[n].clus.Owner(binary.BigEndian.Uint16(key)); !mine {
						forwarded++
					}
				}
			}
		}
	}
	if forwarded < 50 {
		t.Fatalf("%d hits were forwarded; want many", forwarded)
	}
	checkOnOwners(t, nodes, ref, 80)
}

// TestClusterCheckCountsOnOwner: GET /check sent to either node of a
// cluster counts on the counter's owner (through the same hook as HIT)
// and answers what a standalone server answers, quota headers included.
func TestClusterCheckCountsOnOwner(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "algorithms.ini")
	clock := newTestClock(t0)
	cfg := Config{Policy: policycmd.Config{File: path}, Clock: clock.now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}, Check: check.Config{
		FieldHeaders: []check.FieldHeader{{Field: "quota", Header: "X-Quota"}, {Field: "user", Header: "X-User"}},
	}}
	nodes := startClusterServers(t, 2, cfg)
	ref := startServer(t, cfg)
	bases := []string{startCheck(t, nodes[0]), startCheck(t, nodes[1])}
	refBase := startCheck(t, ref)
	show := func(r *http.Response) string {
		return fmt.Sprintf("%d limit=%q remaining=%q reset=%q retry=%q quota=%q", r.StatusCode, r.Header.Get("X-Ratelimit-Limit"),
			r.Header.Get("X-Ratelimit-Remaining"), r.Header.Get("X-Ratelimit-Reset"), r.Header.Get("Retry-After"), r.Header.Get("X-Sluice-Quota"))
	}
	for u := range 16 {
		for i, hdr := range [][]string{
			{"X-Forwarded-Uri: /quota", "X-Quota: 4"},
			{"X-Forwarded-Uri: /gcra-quota", "X-Quota: 3"},
			{"X-Forwarded-Uri: /tb"},
		} {
			h := append([]string{fmt.Sprintf("X-User: u%d", u)}, hdr...)
			for k := range 6 {
				want := show(checkGet(t, "GET", refBase+"/check", h...))
				got := show(checkGet(t, "GET", bases[(u+i+k)%2]+"/check", h...))
				if got != want {
					t.Fatalf("user %d, %v, hit %d: cluster %s, standalone %s", u, hdr, k+1, got, want)
				}
			}
		}
	}
	checkOnOwners(t, nodes, ref, 40)
}

// TestCounterHitRefusesBadArguments: SLUICE.COUNTERHIT refuses a key that
// is not a rule counter's, a rule position whose rule is not the key's, a
// key of another kind, parameters or slot than the rule makes, a limit
// the rule cannot resolve and a negative hit count, and applies a good
// one.
func TestCounterHitRefusesBadArguments(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "algorithms.ini")
	srv := startClusterServers(t, 1, Config{Policy: policycmd.Config{File: path}})[0]
	rdb := newClient(t, srv)
	ctx := context.Background()
	rules := srv.pol.Current().Policy.Rules()
	ruleKey := func(pos int, limit int64, actor string) []byte {
		r := rules[pos-1]
		return keyspace.AppendRuleKey(nil, r, limit, append(r.AppendCounterID(nil, nil), actor...))
	}
	// Rule 3 is tokenBucket (creditLimit 2), 6 divvy with quota (max 5),
	// 7 gcra with quota (max 100), 1 fixedWindow.
	tb := ruleKey(3, 2, "ann")
	otherSlot := append([]byte(nil), tb...)
	otherSlot[1]++
	windowAsLog := keyspace.AppendLogKey(nil, append(rules[0].AppendCounterID(nil, nil), "ann"...)) // fixedWindow's ID, in a log key
	for _, tc := range []struct {
		name string
		args []any
		want string
	}{
		{"not a key", []any{"nonsense", 3, t0, 2, 1}, "not a rule counter key"},
		{"short ID", []any{keyspace.AppendGCRAKey(nil, []byte("abc")), 4, t0, 2, 1}, "not a rule counter key"},
		{"not integers", []any{tb, "x", t0, 2, 1}, "not an integer"},
		{"limit not integer", []any{tb, 3, t0, "2.5", 1}, "not an integer"},
		{"no such rule", []any{tb, 99, t0, 2, 1}, "has no rule 99"},
		{"rule 0", []any{tb, 0, t0, 2, 1}, "has no rule 0"},
		{"other rule", []any{tb, 4, t0, 2, 1}, "every node must run the same rules"},
		{"never-counting rule", []any{ruleKey(9, 2, ""), 9, t0, 2, 1}, "not the sender's"},
		{"other slot", []any{otherSlot, 3, t0, 2, 1}, "is not rule 3's counter"},
		{"other kind", []any{windowAsLog, 1, t0, 2, 1}, "is not rule 1's counter"},
		{"bucket of another limit", []any{ruleKey(3, 3, "ann"), 3, t0, 2, 1}, "is not rule 3's counter"},
		{"limit without quota", []any{tb, 3, t0, 3, 1}, "limit 3 is not one rule 3 can apply"},
		{"limit 0", []any{ruleKey(6, 2, "ann"), 6, t0, 0, 1}, "limit 0 is not one rule 6 can apply"},
		{"negative limit", []any{ruleKey(6, 2, "ann"), 6, t0, -1, 1}, "limit -1 is not one rule 6"},
		{"over maxQuota", []any{ruleKey(6, 6, "ann"), 6, t0, 6, 1}, "limit 6 is not one rule 6"},
		{"negative hits", []any{tb, 3, t0, 2, -1}, "hits -1; expected 0 or more"},
		{"slidingLog takes one", []any{ruleKey(5, 2, "ann"), 5, t0, 2, 2}, "one hit at a time"},
	} {
		if err := rdb.Do(ctx, append([]any{"SLUICE.COUNTERHIT"}, tc.args...)...).Err(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error containing %q", tc.name, err, tc.want)
		}
	}
	if err := rdb.Do(ctx, "SLUICE.COUNTERHIT", tb, 3, t0).Err(); err == nil || !strings.Contains(err.Error(), "wrong number of arguments") {
		t.Errorf("the old three arguments: %v", err)
	}
	// Good ones: a quota within maxQuota, and creditLimit above maxQuota's
	// range on a quota rule, answer the six fields.
	for _, tc := range []struct {
		key         []byte
		pos         int
		limit, hits int64
		want        []any
	}{
		{ruleKey(6, 4, "ann"), 6, 4, 3, []any{int64(1), int64(1), int64(60), int64(4), int64(-1), int64(60000)}},
		{ruleKey(7, 100, "ann"), 7, 100, 0, []any{int64(1), int64(100), int64(0), int64(100), int64(-1), int64(0)}},
		// A denied take drains a bucket (RL.REDUCE's rule); more than the
		// burst can never pass, so no retry time.
		{ruleKey(3, 2, "bob"), 3, 2, 3, []any{int64(0), int64(0), int64(10), int64(2), int64(-1), int64(10000)}},
	} {
		v, err := rdb.Do(ctx, "SLUICE.COUNTERHIT", tc.key, tc.pos, t0*1e6, tc.limit, tc.hits).Slice()
		if err != nil || fmt.Sprint(v) != fmt.Sprint(tc.want) {
			t.Errorf("rule %d, limit %d, hits %d: %v %v; want %v", tc.pos, tc.limit, tc.hits, v, err, tc.want)
		}
	}
}
