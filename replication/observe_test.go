package replication

import (
	"fmt"
	"testing"
)

// A leader's Progress gives each follower's match index and how long it
// has been silent, in ticks: a follower that stops falls behind by the
// rounds proposed since and goes silent, one that runs stays level.
// Stats count the leader seen, the proposals applied on the leader and
// the snapshots sent and applied, with their bytes.
func TestGroupProgressAndStats(t *testing.T) {
	const keep = 5
	c := newTestCluster(t, 3, keep)
	lead := c.electLeader()
	for i := range 3 {
		c.propose(lead, put(testKey(i), "v"))
	}
	c.tickUntil(20, "followers behind", func() bool {
		p := c.nodes[lead].g.Progress()
		for _, peer := range p.Peers {
			if p.Lag(peer) != 0 || peer.State != "replicate" {
				return false
			}
		}
		return len(p.Peers) == 2
	})
	p := c.nodes[lead].g.Progress()
	if p.Role != "leader" || p.Last < 4 {
		t.Fatalf("leader's progress: %+v", p)
	}
	for _, peer := range p.Peers {
		if peer.Node == lead || peer.Silent > 1 || peer.Match != p.Last {
			t.Fatalf("leader's view of a running follower: %+v of %+v", peer, p)
		}
	}
	for _, id := range c.ids {
		if n := c.nodes[id].g.Stats().LeaderChanges; n != 1 {
			t.Errorf("node %d saw %d leader changes, want 1", id, n)
		}
	}
	if h := c.nodes[lead].g.Stats().Proposals; h.Count() != 3 || h.Sum <= 0 {
		t.Errorf("leader's proposal latencies: %d observed (sum %v), want 3", h.Count(), h.Sum)
	}

	// A follower's view: its leader was heard from lately, and it knows
	// no one's progress.
	f := others(c.ids, lead)
	fp := c.nodes[f[0]].g.Progress()
	for _, peer := range fp.Peers {
		switch {
		case peer.Node == lead && peer.Silent > 1:
			t.Errorf("follower %d: leader silent for %d ticks", f[0], peer.Silent)
		case peer.State != "":
			t.Errorf("follower %d knows the progress of %d: %+v", f[0], peer.Node, peer)
		}
	}

	// A follower stops: it goes silent, and falls behind.
	c.stop(f[0])
	for i := range 30 {
		c.propose(lead, put(testKey(100+i), fmt.Sprint(i)))
	}
	for range DefaultElectionTicks {
		c.nodes[lead].g.Tick()
		c.nodes[f[1]].g.Tick()
		c.settle()
	}
	p = c.nodes[lead].g.Progress()
	for _, peer := range p.Peers {
		switch {
		case peer.Node == f[0] && (peer.Silent < DefaultElectionTicks || p.Lag(peer) < 30):
			t.Errorf("stopped follower: silent %d ticks, %d behind: %+v", peer.Silent, p.Lag(peer), peer)
		case peer.Node == f[1] && (peer.Silent > 1 || p.Lag(peer) != 0):
			t.Errorf("running follower: silent %d ticks, %d behind: %+v", peer.Silent, p.Lag(peer), peer)
		}
	}

	// It comes back past the log's truncation: a snapshot brings it level.
	if first, _ := c.nodes[lead].g.log.FirstIndex(); first <= 5 {
		t.Fatalf("the leader's log starts at %d: not truncated", first)
	}
	c.start(f[0], c.nodes[f[0]].dir, c.ids)
	c.tickUntil(100, "the follower did not catch up", func() bool {
		return c.nodes[f[0]].g.Status().Applied == c.nodes[lead].g.Status().Applied
	})
	sent, got := c.nodes[lead].g.Stats(), c.nodes[f[0]].g.Stats()
	if sent.SnapshotsSent != int64(c.snaps) || got.SnapshotsReceived != int64(c.snaps) || c.snaps == 0 {
		t.Errorf("%d snapshots delivered; the leader counts %d sent, the follower %d received", c.snaps, sent.SnapshotsSent, got.SnapshotsReceived)
	}
	if sent.SnapshotsSentBytes <= 0 || got.SnapshotsReceivedBytes != sent.SnapshotsSentBytes {
		t.Errorf("snapshot bytes: %d sent, %d received", sent.SnapshotsSentBytes, got.SnapshotsReceivedBytes)
	}

	// Leadership moves: every running node counts one more leader.
	to := f[1]
	before := map[uint64]int64{}
	for _, id := range c.ids {
		before[id] = c.nodes[id].g.Stats().LeaderChanges
	}
	c.nodes[lead].g.TransferLeadership(to)
	c.tickUntil(100, "leadership did not move", func() bool { return c.leader() == to })
	for _, id := range c.ids {
		if n := c.nodes[id].g.Stats().LeaderChanges; n != before[id]+1 {
			t.Errorf("node %d: %d leader changes after a transfer, want %d", id, n, before[id]+1)
		}
	}
}
