package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/keyspace"
)

// What proxy does with a chunk a client sends.
type proxyAction int

const (
	proxyForward   proxyAction = iota
	proxyDrop                  // close the connection, the chunk unsent
	proxyLoseReply             // send it, then close the connection as its reply comes
)

// proxy forwards connections from ln to target, each chunk a client sends
// as decide says.
func proxy(t *testing.T, ln net.Listener, target string, decide func(chunk []byte) proxyAction) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer s.Close()
				var cut atomic.Bool
				go func() {
					buf := make([]byte, 64<<10)
					for {
						n, err := s.Read(buf)
						if n > 0 && cut.Load() {
							c.Close() // the reply is lost
							return
						}
						if n > 0 {
							if _, werr := c.Write(buf[:n]); werr != nil {
								return
							}
						}
						if err != nil {
							return
						}
					}
				}()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						switch decide(buf[:n]) {
						case proxyDrop:
							return
						case proxyLoseReply:
							cut.Store(true)
						}
						if _, werr := s.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
}

// pushCutter proxies ln to target, except the first client chunk
// containing "SETTOPOLOGY": with applied false it is dropped and the
// connection closed (the push never arrives); with applied true it is
// forwarded and its reply dropped before the connection is closed (the
// push took effect, the tool cannot know).
func pushCutter(t *testing.T, ln net.Listener, target string, applied bool) *atomic.Int32 {
	var cuts atomic.Int32
	proxy(t, ln, target, func(chunk []byte) proxyAction {
		if !bytes.Contains(chunk, []byte("SETTOPOLOGY")) || cuts.Add(1) != 1 {
			return proxyForward
		}
		if applied {
			return proxyLoseReply
		}
		return proxyDrop
	})
	return &cuts
}

// moveWithCut runs `sluice cluster move` of slots 0-99 from node 0 to node
// 1 with node cutAt's announced address behind a pushCutter, and returns
// the move's error and output, clients of both nodes and a key of slot
// 0-99 with one hit counted on the source.
func moveWithCut(t *testing.T, cutAt int, applied bool) (error, string, *redis.Client, *redis.Client, string) {
	ports := freePorts(t, 2)
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	announced := []string{ports[0], ports[1]}
	announced[cutAt] = proxyLn.Addr().String()
	nodes := strings.Join(announced, ",")
	src := startProc(t, t.TempDir(), "--addr", ports[0], "--cluster-nodes", nodes, "--cluster-ordinal", "0")
	dst := startProc(t, t.TempDir(), "--addr", ports[1], "--cluster-nodes", nodes, "--cluster-ordinal", "1")
	cuts := pushCutter(t, proxyLn, ports[cutAt], applied)
	ctx := context.Background()
	rs, rt := src.client(t), dst.client(t)
	key := "a"
	for i := 0; keyspace.Slot([]byte(key)) > 99; i++ {
		key = "k" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
	}
	if err := rs.Do(ctx, "RL.REDUCE", key, 10, 60, "TAKE", 1, "AT", clusterAt).Err(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = runReloading(ctx, nil, []string{"cluster", "move", "--nodes", nodes, "--slots", "0-99", "--to", announced[1]}, noEnvLookup, nil, &out, &out)
	if cuts.Load() == 0 {
		t.Fatal("no push went through the cutter")
	}
	return err, out.String(), rs, rt, key
}

// servedBy reports which of the clients accept a write to key.
func servedBy(t *testing.T, key string, cs ...*redis.Client) []bool {
	t.Helper()
	ok := make([]bool, len(cs))
	for i, c := range cs {
		err := c.Do(context.Background(), "RL.REDUCE", key, 10, 60, "TAKE", 1, "AT", clusterAt).Err()
		ok[i] = err == nil
		if err != nil && !strings.HasPrefix(err.Error(), "MOVED ") && !strings.HasPrefix(err.Error(), "TRYAGAIN") {
			t.Fatalf("RL.REDUCE %s: %v", key, err)
		}
	}
	return ok
}

// TestClusterMoveNeverTwoOwners: whichever push of a move fails, exactly
// one node serves the moved slots afterwards. A failed push to the source
// once the target took the topology is retried (the source is never
// cancelled: it would serve the slots at the old epoch while the target
// owns them at the new one); a push to the target whose reply was lost is
// recognised as taken; a push to the target that never arrived is fenced
// and undone.
func TestClusterMoveNeverTwoOwners(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cutAt   int
		applied bool
		moved   bool // the move completes
	}{
		{"push to the source lost", 0, false, true},
		{"push to the target applied, its reply lost", 1, true, true},
		{"push to the target lost", 1, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err, out, rs, rt, key := moveWithCut(t, tc.cutAt, tc.applied)
			t.Logf("move: %v\n%s", err, out)
			ok := servedBy(t, key, rs, rt)
			if ok[0] && ok[1] {
				t.Fatalf("both the source and the target serve slot %d after the move: two diverging states of %q", keyspace.Slot([]byte(key)), key)
			}
			if (err == nil) != tc.moved {
				t.Fatalf("move: %v; want it to complete: %v", err, tc.moved)
			}
			if tc.moved && !ok[1] || !tc.moved && !ok[0] {
				t.Fatalf("served by source, target: %v; want only the %s", ok, map[bool]string{true: "target", false: "source"}[tc.moved])
			}
			if tc.moved {
				if got, _ := rt.Do(context.Background(), "RL.GET", key, 10, 60, "AT", clusterAt).Int64(); got != 8 {
					t.Errorf("RL.GET on the target: %v; want the source's hit and this one (8 left)", got)
				}
			}
		})
	}
}

// TestClusterShowRevealsEpochs: `sluice cluster show` names the nodes
// whose topology is not the highest one (a source that restarted before a
// move's push reached it) and fails, giving the push that repairs it;
// `sluice cluster push` then brings them level.
func TestClusterShowRevealsEpochs(t *testing.T) {
	addrs := freePorts(t, 2)
	procs := startCluster(t, addrs)
	ctx := context.Background()
	r0 := procs[0].client(t)
	if err := r0.Do(ctx, "CLUSTER", "SETTOPOLOGY", 1, addrs[0], "0-8191", addrs[1], "8192-16383").Err(); err != nil {
		t.Fatal(err)
	}
	nodes := strings.Join(addrs, ",")
	var out bytes.Buffer
	err := runReloading(ctx, nil, []string{"cluster", "show", "--nodes", nodes}, noEnvLookup, nil, &out, &out)
	t.Logf("show: %v\n%s", err, out.String())
	if err == nil || !strings.Contains(out.String(), "node "+addrs[1]+": epoch 0, not 1") {
		t.Fatalf("show with a node behind: %v; want an error naming %s at epoch 0", err, addrs[1])
	}
	top := "1 " + addrs[0] + " 0-8191 " + addrs[1] + " 8192-16383"
	if !strings.Contains(err.Error(), "sluice cluster push --nodes "+addrs[1]+" --topology '"+top+"'") {
		t.Errorf("show's error %q does not give the push that repairs it", err)
	}
	out.Reset()
	if err := runReloading(ctx, nil, []string{"cluster", "push", "--nodes", addrs[1], "--topology", top}, noEnvLookup, nil, &out, &out); err != nil {
		t.Fatalf("push: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := runReloading(ctx, nil, []string{"cluster", "show", "--nodes", nodes}, noEnvLookup, nil, &out, &out); err != nil {
		t.Fatalf("show after the push: %v\n%s", err, out.String())
	}
}

// TestClusterRenumber: at the epoch cap a move is refused, naming the way
// out; `sluice cluster renumber` pushes the topology under a low epoch to
// every node, after which moves work again.
func TestClusterRenumber(t *testing.T) {
	addrs := freePorts(t, 2)
	procs := startCluster(t, addrs)
	ctx := context.Background()
	for _, p := range procs {
		if err := p.client(t).Do(ctx, "CLUSTER", "SETTOPOLOGY", cluster.MaxEpoch, addrs[0], "0-8191", addrs[1], "8192-16383").Err(); err != nil {
			t.Fatal(err)
		}
	}
	nodes := strings.Join(addrs, ",")
	var out bytes.Buffer
	move := []string{"cluster", "move", "--nodes", nodes, "--slots", "0-9", "--to", addrs[1]}
	if err := runReloading(ctx, nil, move, noEnvLookup, nil, &out, &out); !errors.Is(err, cluster.ErrEpochCap) {
		t.Fatalf("move at the epoch cap: %v; want cluster.ErrEpochCap", err)
	}
	if err := runReloading(ctx, nil, []string{"cluster", "renumber", "--nodes", nodes}, noEnvLookup, nil, &out, &out); err != nil {
		t.Fatalf("renumber: %v\n%s", err, out.String())
	}
	for _, p := range procs {
		if s, _ := p.client(t).Do(ctx, "CLUSTER", "TOPOLOGY").Text(); !strings.HasPrefix(s, "1 ") {
			t.Errorf("after renumber: %s; want epoch 1", s)
		}
	}
	if err := runReloading(ctx, nil, move, noEnvLookup, nil, &out, &out); err != nil {
		t.Fatalf("move after renumber: %v\n%s", err, out.String())
	}
}

// TestClusterShowFindsSlotsServedTwice is issue 29's add-a-node-by-list
// case: a fourth node started with four addresses in --cluster-nodes takes
// the initial topology of four, and serves slots 12288-16383 that the third
// node still serves by the topology of three, at the same epoch 0. `sluice
// cluster show` names the slots and both nodes and fails, as rebalance
// does; the push it proposes leaves one node serving each slot, after
// which rebalance adds the fourth node.
func TestClusterShowFindsSlotsServedTwice(t *testing.T) {
	addrs := freePorts(t, 4)
	startCluster(t, addrs[:3])
	d := startProc(t, t.TempDir(), "--addr", addrs[3], "--cluster-nodes", strings.Join(addrs, ","), "--cluster-ordinal", "3")
	ctx := context.Background()
	key := "foo"
	for ownerOf(key, 4) != 3 {
		key += "x"
	}
	if err := d.client(t).Do(ctx, "RL.REDUCE", key, 10, 60, "AT", clusterAt).Err(); err != nil {
		t.Fatalf("the fourth node on its initial slots: %v; want it to serve them", err)
	}
	nodes := strings.Join(addrs, ",")
	var out bytes.Buffer
	for _, sub := range []string{"show", "rebalance"} {
		out.Reset()
		err := runReloading(ctx, nil, []string{"cluster", sub, "--nodes", nodes}, noEnvLookup, nil, &out, &out)
		t.Logf("%s: %v\n%s", sub, err, out.String())
		line := "slots 12288-16383: served by both " + addrs[2] + " (epoch 0) and " + addrs[3] + " (epoch 0)"
		if err == nil || !strings.Contains(out.String(), line) {
			t.Fatalf("%s with a slot range served twice: %v; want an error and the line %q", sub, err, line)
		}
	}
	top := "1 " + strings.Join(cluster.Initial(addrs[:3]).Args()[1:], " ")
	out.Reset()
	if err := runReloading(ctx, nil, []string{"cluster", "push", "--nodes", nodes, "--topology", top}, noEnvLookup, nil, &out, &out); err != nil {
		t.Fatalf("push %q: %v\n%s", top, err, out.String())
	}
	if err := d.client(t).Do(ctx, "RL.REDUCE", key, 10, 60, "AT", clusterAt).Err(); err == nil || !strings.HasPrefix(err.Error(), "MOVED ") || !strings.HasSuffix(err.Error(), addrs[2]) {
		t.Fatalf("the fourth node after the push: %v; want MOVED to %s", err, addrs[2])
	}
	for _, sub := range []string{"show", "rebalance", "show"} {
		out.Reset()
		if err := runReloading(ctx, nil, []string{"cluster", sub, "--nodes", nodes}, noEnvLookup, nil, &out, &out); err != nil {
			t.Fatalf("%s after the push: %v\n%s", sub, err, out.String())
		}
	}
	after, err := cluster.Parse(strings.Fields(strings.SplitN(out.String(), "\n", 2)[0]))
	if err != nil {
		t.Fatal(err)
	}
	if i := after.Index(cluster.NodeID(addrs[3])); i < 0 || (cluster.Topology{Nodes: after.Nodes[i : i+1]}).Assigned() != cluster.Slots/4 || after.Assigned() != cluster.Slots {
		t.Errorf("show after the rebalance: %s; want every slot owned, a quarter by the fourth node", out.String())
	}
}
