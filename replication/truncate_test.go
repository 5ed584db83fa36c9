package replication

import (
	"fmt"
	"strings"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
)

// The log truncation by bytes (Config.LogKeepBytes): rounds of about
// 2.5 KB, a byte bound of 4 KiB, and the entry bound at its default
// (10000), which these few rounds never reach.
const truncKeepBytes = 4 << 10

func newBytesCluster(t *testing.T) *testCluster {
	return newTestClusterOfConfig(t, 3, &testCluster{keepBytes: truncKeepBytes})
}

// newBytesClusterWritten is newBytesCluster with a leader elected and
// five rounds applied everywhere; want holds their records.
func newBytesClusterWritten(t *testing.T) (c *testCluster, lead uint64, want map[string]string) {
	c = newBytesCluster(t)
	lead = c.electLeader()
	want = map[string]string{}
	c.writeRounds(lead, 0, 5, want)
	c.caughtUp(lead)
	return c, lead, want
}

// writeRounds proposes rounds from to to on lead, 20 keys of about 120
// bytes each, and records them in want.
func (c *testCluster) writeRounds(lead uint64, from, to int, want map[string]string) {
	c.t.Helper()
	for i := from; i < to; i++ {
		var ops []Op
		for j := range 20 {
			k := testKey(i*20%2000 + j)
			v := fmt.Sprintf("round %d %s", i, strings.Repeat("v", 100))
			ops = append(ops, put(k, v))
			want[string(k)] = v
		}
		c.propose(lead, ops...)
	}
}

// caughtUp ticks until every running node has applied what lead has.
func (c *testCluster) caughtUp(lead uint64) {
	c.t.Helper()
	c.tickUntil(100, "a replica did not catch up", func() bool {
		for _, id := range c.ids {
			if !c.down[id] && c.nodes[id].g.Status().Applied != c.nodes[lead].g.Status().Applied {
				return false
			}
		}
		return true
	})
}

// ticks ticks every running node n times, settling after each.
func (c *testCluster) ticks(n int) {
	c.t.Helper()
	i := 0
	c.tickUntil(n, "", func() bool { i++; return i > n })
}

func firstIndex(g *Group) uint64 {
	i, _ := g.log.FirstIndex()
	return i
}

// Every replica truncates its log by bytes: far fewer entries than
// LogKeep, and a log that stays within twice the bound (and a round).
func TestGroupTruncatesLogByBytes(t *testing.T) {
	c := newBytesCluster(t)
	lead := c.electLeader()
	want := map[string]string{}
	c.writeRounds(lead, 0, 60, want)
	c.caughtUp(lead)
	for _, id := range c.ids {
		l := c.nodes[id].g.log
		if first := firstIndex(c.nodes[id].g); first < 20 {
			t.Errorf("node %d: the log starts at %d after 60 rounds of 2.5 KB: not truncated by bytes", id, first)
		}
		if n := l.logBytes(); n > 2*truncKeepBytes+4<<10 {
			t.Errorf("node %d: the log holds %d bytes, past twice the bound of %d", id, n, truncKeepBytes)
		}
		if n := storedLogBytes(t, c.nodes[id].store, l); n < truncKeepBytes {
			t.Errorf("node %d: the log kept %d bytes, less than the bound of %d", id, n, truncKeepBytes)
		}
	}
	c.sameRecords(want)
}

// A follower cut off from its leader is not waited for: past an election
// timeout of silence the leader's log is truncated by bytes past what the
// follower has, and the follower catches up by snapshot once it is heard
// again, with the leader's records and counts.
func TestGroupSilentFollowerCatchesUpAfterTruncationByBytes(t *testing.T) {
	c, lead, want := newBytesClusterWritten(t)
	f := others(c.ids, lead)[0]
	c.cut[[2]uint64{lead, f}] = true
	c.ticks(DefaultElectionTicks + 1)
	c.writeRounds(lead, 5, 60, want)
	behind := c.nodes[f].g.Status().Applied
	if first := firstIndex(c.nodes[lead].g); first <= behind+1 {
		t.Fatalf("the leader's log starts at %d, the silent follower has %d: not truncated past it", first, behind)
	}
	delete(c.cut, [2]uint64{lead, f})
	c.caughtUp(lead)
	if c.snaps == 0 {
		t.Fatal("the follower caught up without a snapshot, past the log's start")
	}
	c.sameRecords(want)
}

// A follower the leader hears from, but whose appends are lost, keeps the
// leader's log from being truncated by bytes past what it acknowledged:
// it catches up from the log, without a snapshot (which streams the whole
// shard), while the other follower truncates its own log.
func TestGroupLaggingFollowerKeepsTheLeadersLog(t *testing.T) {
	c, lead, want := newBytesClusterWritten(t)
	lag := others(c.ids, lead)[0]
	other := others(c.ids, lead)[1]
	c.drop = func(m *pb.Message) bool { return m.GetTo() == lag && m.GetType() == pb.MsgApp }
	c.writeRounds(lead, 5, 30, want)
	c.ticks(2 * DefaultElectionTicks) // heartbeats, answered
	c.writeRounds(lead, 30, 60, want)
	behind := c.nodes[lag].g.Status().Applied
	if first := firstIndex(c.nodes[lead].g); first > behind+1 {
		t.Fatalf("the leader's log starts at %d, past the lagging follower's %d", first, behind)
	}
	if n := c.nodes[lead].g.log.logBytes(); n < 2*truncKeepBytes {
		t.Fatalf("the leader's log holds %d bytes: too few to be truncated, the test shows nothing", n)
	}
	if first := firstIndex(c.nodes[other].g); first <= behind+1 {
		t.Errorf("the follower that keeps up did not truncate its log by bytes: it starts at %d", first)
	}
	c.drop = nil
	c.caughtUp(lead)
	if c.snaps != 0 {
		t.Fatalf("%d snapshots sent to a follower the log still covered", c.snaps)
	}
	c.sameRecords(want)
	// Caught up, it no longer holds the leader's log back.
	c.writeRounds(lead, 60, 70, want)
	if first := firstIndex(c.nodes[lead].g); first <= behind+1 {
		t.Errorf("the leader's log still starts at %d once the follower caught up", first)
	}
}

// Config.LogMemory bounds the entries a log keeps in memory.
func TestGroupLogMemoryBound(t *testing.T) {
	const bound = 8 << 10
	c := newTestCluster(t, 3, 0)
	c.stop(2)
	c.logMemory = bound
	c.start(2, c.nodes[2].dir, c.ids)
	lead := c.electLeader()
	c.writeRounds(lead, 0, 60, map[string]string{})
	c.caughtUp(lead)
	l := c.nodes[2].g.log
	l.mu.Lock()
	n := l.mu.recentBytes
	l.mu.Unlock()
	if n > bound || n == 0 {
		t.Fatalf("the log keeps %d bytes of entries in memory, bound %d", n, bound)
	}
}
