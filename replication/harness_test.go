package replication

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/storage"
)

// The in-process cluster of the group tests: each node has its own store
// in t.TempDir(), messages go through a queue the test delivers, and time
// is the test's ticks. No network, no goroutine of the group's own, no
// sleep: every step is the test's.

const testGroup = 7

var (
	testLower = []byte{0x00, 0x00}
	testUpper = []byte{0x40, 0x00} // every slot
)

type testNode struct {
	id    uint64
	dir   string
	store *storage.Store
	g     *Group
}

type testCluster struct {
	t     *testing.T
	nodes map[uint64]*testNode
	ids   []uint64
	down  map[uint64]bool
	cut   map[[2]uint64]bool // links that drop messages, both ways
	queue []*pb.Message
	keep  uint64
	// keepBytes and logMemory are each group's Config.LogKeepBytes and
	// LogMemory; 0 their default.
	keepBytes uint64
	logMemory int
	snaps     int // snapshots delivered
	// lenient lets a node's group fail (its Process errors are skipped
	// over) instead of failing the test.
	lenient bool
	// replicated opens each store with the group as its Replicator: the
	// store's own writes (Batch.Commit) go through the group; everysec in
	// SyncEverySec, with writes left in the table for an hour (the
	// committer takes them on Flush), instead of SyncAlways.
	replicated, everysec bool
	// drop, if set, drops the messages it is true for.
	drop func(m *pb.Message) bool
}

func newTestCluster(t *testing.T, n int, keep uint64) *testCluster {
	return newTestClusterOf(t, n, keep, false, false)
}

func newTestClusterOf(t *testing.T, n int, keep uint64, replicated, everysec bool) *testCluster {
	return newTestClusterOfConfig(t, n, &testCluster{keep: keep, replicated: replicated, everysec: everysec})
}

// newTestClusterOfConfig starts n nodes configured as c says (keep,
// keepBytes, replicated, everysec).
func newTestClusterOfConfig(t *testing.T, n int, c *testCluster) *testCluster {
	c.t, c.nodes, c.down, c.cut = t, map[uint64]*testNode{}, map[uint64]bool{}, map[[2]uint64]bool{}
	for i := 1; i <= n; i++ {
		c.ids = append(c.ids, uint64(i))
	}
	for _, id := range c.ids {
		c.start(id, filepath.Join(t.TempDir(), fmt.Sprintf("n%d", id)), c.ids)
	}
	t.Cleanup(func() {
		for _, id := range c.ids {
			if !c.down[id] {
				c.stop(id)
			}
		}
	})
	return c
}

func (c *testCluster) start(id uint64, dir string, bootstrap []uint64) {
	c.t.Helper()
	opts := storage.Options{Sync: storage.SyncAlways}
	if c.everysec {
		opts.Sync, opts.SyncInterval = storage.SyncEverySec, time.Hour
	}
	var committers *Committers
	if c.replicated {
		committers = &Committers{}
		opts.Replicator, opts.Committers = committers, 1
	}
	s, err := storage.Open(dir, opts)
	if err != nil {
		c.t.Fatal(err)
	}
	g, err := NewGroup(Config{
		Group: testGroup, Node: id, Bootstrap: bootstrap,
		Lower: testLower, Upper: testUpper, Store: s,
		Send:    c.send,
		LogKeep: c.keep, LogKeepBytes: c.keepBytes, LogMemory: c.logMemory,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	if committers != nil {
		committers.Set(0, g)
	}
	c.nodes[id] = &testNode{id: id, dir: dir, store: s, g: g}
	delete(c.down, id)
}

// stop stops a node as a crash would, as far as Raft can tell: it hears
// nothing more, and its store is closed.
func (c *testCluster) stop(id uint64) {
	n := c.nodes[id]
	n.g.Stop()
	if err := n.store.Close(); err != nil {
		c.t.Fatal(err)
	}
	c.down[id] = true
}

func (c *testCluster) send(group uint64, msgs []*pb.Message) {
	if group != testGroup {
		c.t.Errorf("message of group %d", group)
	}
	for _, m := range msgs {
		c.queue = append(c.queue, proto.Clone(m).(*pb.Message))
	}
}

func (c *testCluster) blocked(from, to uint64) bool {
	return c.down[from] || c.down[to] || c.cut[[2]uint64{from, to}] || c.cut[[2]uint64{to, from}]
}

// settle processes every Ready and delivers every message until there is
// nothing left to do.
func (c *testCluster) settle() {
	c.t.Helper()
	for range 10000 {
		busy := false
		for _, id := range c.ids {
			if c.down[id] {
				continue
			}
			for {
				ok, err := c.nodes[id].g.Process()
				if err != nil && c.lenient {
					break
				}
				if err != nil {
					c.t.Fatalf("node %d: %v", id, err)
				}
				if !ok {
					break
				}
				busy = true
			}
		}
		q := c.queue
		c.queue = nil
		for _, m := range q {
			busy = true
			from, to := m.GetFrom(), m.GetTo()
			if c.blocked(from, to) || (c.drop != nil && c.drop(m)) {
				if m.GetType() == pb.MsgSnap && !c.down[from] {
					c.nodes[from].g.ReportSnapshot(to, false)
				}
				continue
			}
			if m.GetType() == pb.MsgSnap {
				var buf bytes.Buffer
				if err := c.nodes[from].g.WriteSnapshot(&buf, m); err != nil {
					c.t.Fatal(err)
				}
				err := c.nodes[to].g.ReadSnapshot(&buf)
				if err != nil && !errors.Is(err, ErrStaleSnapshot) {
					c.t.Fatalf("node %d: read snapshot: %v", to, err)
				}
				if err == nil {
					c.snaps++
				}
				c.nodes[from].g.ReportSnapshot(to, err == nil)
				continue
			}
			if err := c.nodes[to].g.Step(m); err != nil && !c.lenient {
				c.t.Fatalf("node %d: step %v: %v", to, m.GetType(), err)
			}
		}
		if !busy {
			return
		}
	}
	c.t.Fatal("the cluster never settled")
}

// tickUntil ticks every running node and settles, until cond holds; at
// most max ticks.
func (c *testCluster) tickUntil(max int, what string, cond func() bool) {
	c.t.Helper()
	c.settle()
	for i := 0; !cond(); i++ {
		if i == max {
			c.t.Fatalf("after %d ticks: %s", max, what)
		}
		for _, id := range c.ids {
			if !c.down[id] {
				c.nodes[id].g.Tick()
			}
		}
		c.settle()
	}
}

// leader returns the node that every running node agrees leads, once it
// serves (Status.Serving), or 0.
func (c *testCluster) leader(among ...uint64) uint64 {
	if len(among) == 0 {
		among = c.ids
	}
	var lead uint64
	for _, id := range among {
		if c.down[id] {
			continue
		}
		st := c.nodes[id].g.Status()
		if st.Leader == 0 || (lead != 0 && st.Leader != lead) {
			return 0
		}
		lead = st.Leader
	}
	if lead == 0 || c.down[lead] || !c.nodes[lead].g.Status().Serving {
		return 0
	}
	return lead
}

func (c *testCluster) electLeader(among ...uint64) uint64 {
	c.t.Helper()
	var lead uint64
	c.tickUntil(500, "no leader", func() bool { lead = c.leader(among...); return lead != 0 })
	return lead
}

// propose proposes a round on node id and waits until it is applied there.
func (c *testCluster) propose(id uint64, ops ...Op) {
	c.t.Helper()
	ch, err := c.nodes[id].g.Propose(ops)
	if err != nil {
		c.t.Fatalf("propose on node %d: %v", id, err)
	}
	c.settle()
	select {
	case err := <-ch:
		if err != nil {
			c.t.Fatalf("proposal on node %d: %v", id, err)
		}
	default:
		c.t.Fatalf("proposal on node %d not applied after the cluster settled", id)
	}
}

// records returns every record of node id's store in the group's range.
func (c *testCluster) records(id uint64) map[string]string {
	c.t.Helper()
	m := map[string]string{}
	if err := c.nodes[id].store.Flush(); err != nil {
		c.t.Fatal(err)
	}
	err := c.nodes[id].store.Scan(testLower, testUpper, func(k, v []byte) bool {
		m[string(k)] = string(v)
		return true
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return m
}

// sameRecords fails unless every running node (and want, if not nil)
// holds the same records.
func (c *testCluster) sameRecords(want map[string]string) {
	c.t.Helper()
	for _, id := range c.ids {
		if c.down[id] {
			continue
		}
		got := c.records(id)
		if want == nil {
			want = got
			continue
		}
		if len(got) != len(want) {
			c.t.Fatalf("node %d holds %d records, want %d", id, len(got), len(want))
		}
		for k, v := range want {
			if got[k] != v {
				c.t.Fatalf("node %d: record %q = %q, want %q", id, k, got[k], v)
			}
		}
		if n := c.nodes[id].store.Records(); n != int64(len(want)) {
			c.t.Fatalf("node %d counts %d records, holds %d", id, n, len(want))
		}
	}
}

func (c *testCluster) wipe(id uint64) {
	c.t.Helper()
	if err := os.RemoveAll(c.nodes[id].dir); err != nil {
		c.t.Fatal(err)
	}
}

// testKey is a record key in the group's range.
func testKey(i int) []byte { return fmt.Appendf([]byte{0x01, 0x02, 'b'}, "key%05d", i) }

func put(k []byte, v string) Op { return Op{Key: k, Value: []byte(v)} }

func others(ids []uint64, not uint64) []uint64 {
	return slices.DeleteFunc(slices.Clone(ids), func(id uint64) bool { return id == not })
}

func (c *testCluster) reopenStore(id uint64) *storage.Store {
	c.t.Helper()
	s, err := storage.Open(c.nodes[id].dir, storage.Options{Sync: storage.SyncAlways})
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

// reapply leaves node id, a follower of lead, as a crash can (applying is
// not synced): its applied index back at applied, and its records as
// undo puts them back, those of the state at that index. It then restarts
// the node and lets it apply its own log again, without the leader's help,
// up to where it was.
func (c *testCluster) reapply(id, lead, applied uint64, undo func(b *storage.ReplicaBatch) error) {
	c.t.Helper()
	was := c.nodes[id].g.Status().Applied
	c.stop(id)
	s := c.reopenStore(id)
	b := s.NewReplicaBatch()
	l, err := OpenLog(s, testGroup)
	if err != nil {
		c.t.Fatal(err)
	}
	var lc logChange
	if err := l.stageApplied(b, &lc, applied, l.confState()); err != nil {
		c.t.Fatal(err)
	}
	if err := undo(b); err != nil {
		c.t.Fatal(err)
	}
	if err := b.Commit(true); err != nil {
		c.t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		c.t.Fatal(err)
	}
	c.start(id, c.nodes[id].dir, c.ids)
	if got := c.nodes[id].g.Status().Applied; got != applied {
		c.t.Fatalf("node %d restarted at applied %d, want %d", id, got, applied)
	}
	c.down[lead] = true
	c.settle()
	delete(c.down, lead)
	if got := c.nodes[id].g.Status().Applied; got != was {
		c.t.Fatalf("node %d applied %d after its restart, want %d", id, got, was)
	}
}
