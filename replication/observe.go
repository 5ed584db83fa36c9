package replication

import (
	"io"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/tracker"
)

// What a replica tells of its group besides Status: its followers'
// progress and silence, for INFO replication and CLUSTER SHARDS, and its
// counters, for the metrics. None of it is on a command's path: Progress
// and Stats are read when asked.

// Peer is what a replica knows of another replica of its group.
type Peer struct {
	Node uint64
	// Learner: the replica does not vote (it is catching up).
	Learner bool
	// Silent is how many ticks have passed since this replica last took
	// a message from it, or since this replica started if none came.
	// Followers send to their leader only, and a leader to its followers.
	Silent uint64
	// On a leader only: Match is the last index the peer is known to
	// hold, and State how the leader sends to it: "replicate" (entries
	// as they come), "probe" (looking for where its log ends, as after
	// a failed send or a restart) or "snapshot" (being sent the shard).
	Match uint64
	State string
}

// Progress is a replica's view of its group with its peers.
type Progress struct {
	Status
	Last  uint64 // the last index of this replica's log
	Peers []Peer // the group's other members, by node
}

// Progress returns the replica's view of its group and its peers.
func (g *Group) Progress() Progress {
	p := Progress{Status: g.Status()}
	// Through raft(): a replica the library gave up on (ErrReplicaLost)
	// answers no peers rather than panic again.
	g.raft(func(rn *raft.RawNode) error {
		st := rn.Status()
		for _, set := range []map[uint64]struct{}{st.Config.Voters.IDs(), st.Config.Learners} {
			for id := range set {
				if id == g.cfg.Node {
					continue
				}
				_, learner := st.Config.Learners[id]
				peer := Peer{Node: id, Learner: learner, Silent: g.mu.ticks - g.mu.heard[id]}
				if pr, ok := st.Progress[id]; ok {
					peer.Match, peer.State = pr.Match, progressState(pr.State)
				}
				p.Peers = append(p.Peers, peer)
			}
		}
		return nil
	})
	p.Last, _ = g.log.LastIndex()
	slices.SortFunc(p.Peers, func(a, b Peer) int { return int(a.Node) - int(b.Node) })
	return p
}

// Lag is how many entries of the leader's log the peer lacks: Last −
// Match, on a leader.
func (p Progress) Lag(peer Peer) uint64 {
	if peer.Match >= p.Last {
		return 0
	}
	return p.Last - peer.Match
}

// ApplyLag is how many committed entries the replica has not applied.
func (p Progress) ApplyLag() uint64 { return p.Commit - min(p.Applied, p.Commit) }

// MaxLag is, on a leader, the most entries a peer lacks; 0 elsewhere.
func (p Progress) MaxLag() uint64 {
	var most uint64
	for _, peer := range p.Peers {
		if peer.State != "" {
			most = max(most, p.Lag(peer))
		}
	}
	return most
}

func progressState(s tracker.StateType) string {
	switch s {
	case tracker.StateReplicate:
		return "replicate"
	case tracker.StateSnapshot:
		return "snapshot"
	}
	return "probe"
}

// Stats are a replica's counters since it opened.
type Stats struct {
	// LeaderChanges counts the leaders this replica came to know of: the
	// first one, and each other one after it (itself included).
	LeaderChanges int64
	// Proposals is the time from a proposal on the leader to its round
	// being applied there.
	Proposals Histogram
	// SnapshotsSent and SnapshotsReceived count the snapshots this
	// replica streamed to another whole, and those it applied;
	// the Bytes fields their sizes on the wire.
	SnapshotsSent, SnapshotsSentBytes         int64
	SnapshotsReceived, SnapshotsReceivedBytes int64
}

// Stats returns the replica's counters.
func (g *Group) Stats() Stats {
	s := &g.stats
	return Stats{
		LeaderChanges:          s.leaderChanges.Load(),
		Proposals:              s.proposals.snapshot(),
		SnapshotsSent:          s.snapSent.Load(),
		SnapshotsSentBytes:     s.snapSentBytes.Load(),
		SnapshotsReceived:      s.snapReceived.Load(),
		SnapshotsReceivedBytes: s.snapReceivedBytes.Load(),
	}
}

type groupStats struct {
	leaderChanges                   atomic.Int64
	proposals                       histogram
	snapSent, snapSentBytes         atomic.Int64
	snapReceived, snapReceivedBytes atomic.Int64
}

// ProposalBuckets are the upper bounds of Histogram's buckets: 100µs to
// about 3.3s, doubling, as a commit takes a round trip and an fsync on a
// quorum.
var ProposalBuckets = func() [16]time.Duration {
	var b [16]time.Duration
	for i := range b {
		b[i] = 100 * time.Microsecond << i
	}
	return b
}()

// Histogram is a distribution of durations over ProposalBuckets: Counts[i]
// is how many were at most ProposalBuckets[i] (not cumulative), Over how
// many were above the last; Sum their total.
type Histogram struct {
	Counts [len(ProposalBuckets)]uint64
	Over   uint64
	Sum    time.Duration
}

// Count is the number of durations observed.
func (h Histogram) Count() uint64 {
	n := h.Over
	for _, c := range h.Counts {
		n += c
	}
	return n
}

// histogram is Histogram's atomic form.
type histogram struct {
	counts [len(ProposalBuckets) + 1]atomic.Uint64
	sum    atomic.Int64
}

func (h *histogram) observe(d time.Duration) {
	i, _ := slices.BinarySearch(ProposalBuckets[:], d)
	h.counts[i].Add(1)
	h.sum.Add(int64(min(d, math.MaxInt64/1024)))
}

func (h *histogram) snapshot() Histogram {
	var s Histogram
	for i := range s.Counts {
		s.Counts[i] = h.counts[i].Load()
	}
	s.Over = h.counts[len(ProposalBuckets)].Load()
	s.Sum = time.Duration(h.sum.Load())
	return s
}

// countReader counts the bytes read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}
