package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/storage"
)

// Defaults for Config.
const (
	DefaultElectionTicks  = 10
	DefaultHeartbeatTicks = 1
	DefaultLogKeep        = 10000
	DefaultLogKeepBytes   = 1 << 20
	DefaultMaxSizePerMsg  = 1 << 20
	DefaultMaxInflight    = 256
)

// Errors of a group.
var (
	// ErrNotLeader refuses a proposal on a replica that is not its group's
	// leader; see NotLeaderError for the leader it knows.
	ErrNotLeader = errors.New("replication: not the group's leader")
	// ErrProposalLost says a proposal's fate is unknown: leadership
	// changed before it was applied. It may yet be applied, by the new
	// leader's log, or never.
	ErrProposalLost = errors.New("replication: leadership changed before the proposal was applied; it may or may not be applied")
	// ErrStopped is returned once the group has stopped or failed.
	ErrStopped = errors.New("replication: group stopped")
	// ErrOutOfRange refuses a round with a key outside the group's range.
	ErrOutOfRange = errors.New("replication: key outside the group's key range")
)

// NotLeaderError is ErrNotLeader with the leader this replica knows of
// (0: none known), so that the caller can redirect.
type NotLeaderError struct {
	Group, Leader uint64
}

func (e *NotLeaderError) Error() string {
	return fmt.Sprintf("replication: group %d: not the leader (leader: node %d)", e.Group, e.Leader)
}

// Unwrap makes errors.Is(err, ErrNotLeader) hold.
func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// Config configures one replica of one group. A zero field means the
// default given.
type Config struct {
	Group uint64 // the group's identity, the same on every replica; not 0
	Node  uint64 // this replica's node; not 0
	// Bootstrap lists the voters of a group created now, this node among
	// them, on every one of its first replicas alike. It is ignored once
	// the store holds the group's state. Nil starts a replica that joins a
	// group that exists: it waits for the leader to send it a snapshot,
	// and cannot campaign before.
	Bootstrap []uint64
	// BootstrapLearners lists the learners of a group created now, as
	// Bootstrap does its voters.
	BootstrapLearners []uint64
	// Lower and Upper bound the record keys of the group's shard: [Lower,
	// Upper). Rounds carry keys in it only, and a snapshot carries it whole.
	// A range under storage.ReplicaPrefix holds keys of the replication
	// package's own instead of records: the placement group's.
	Lower, Upper []byte
	Store        *storage.Store
	// Send hands messages to the transport. It must not block (queue or
	// drop: Raft retries) and must not keep msgs past the call; a MsgSnap
	// is sent with WriteSnapshot, and its outcome reported with
	// ReportSnapshot.
	Send func(group uint64, msgs []*pb.Message)
	// ElectionTicks is how many Ticks without a word from the leader start
	// an election (randomized up to twice that); default 10.
	// HeartbeatTicks is the leader's heartbeat period; default 1.
	ElectionTicks, HeartbeatTicks int
	// LogKeep is how many applied entries the log keeps for followers
	// that lag; it is truncated to that once it holds twice as many.
	// Default 10000. A follower further behind gets a snapshot.
	LogKeep uint64
	// LogKeepBytes bounds the log by bytes as LogKeep does by entries:
	// once its entries take twice as many bytes in the store, the applied
	// ones before the newest LogKeepBytes go, most while still in
	// Pebble's memtable, whose flush then drops them: they are never
	// written to a table nor compacted.
	// The leader keeps what every follower it heard from within an
	// election timeout has yet to acknowledge (a follower that lags a
	// little catches up from the log); one that went silent gets a
	// snapshot. Default 1 MiB.
	LogKeepBytes uint64
	// LogMemory bounds the bytes of the newest entries the log keeps in
	// memory besides the store, to answer Raft without reading and
	// decoding them again; default 1 MiB (DefaultLogMemory). Less than
	// one round costs a read of the store per round, nothing else.
	LogMemory int
	// MaxSizePerMsg bounds the entries of one append message, in bytes;
	// default 1 MiB. MaxInflight bounds the appends in flight to one
	// follower; default 256.
	MaxSizePerMsg uint64
	MaxInflight   int
	Logger        *slog.Logger // default: discard
}

// Group runs one replica of one Raft group: the Ready loop of etcd's
// RawNode. Each Ready is persisted (entries and hard state in one synced
// write), its messages handed to Send, and its committed rounds applied to
// the store with the applied index in one write that is not synced: the
// log is the record, and a restart applies again from the applied index.
// CheckQuorum and PreVote are on, so a leader that cannot reach a quorum
// steps down and a partitioned replica that returns does not disturb the
// group; elections, quorums and failure detection are the library's.
//
// Time is Tick: the caller ticks every replica at its own pace (a ticker in
// production, the test itself in tests). A Group is safe for concurrent
// use; Process runs one Ready at a time.
type Group struct {
	cfg Config
	log *Log
	lg  *slog.Logger
	// own is set when the group's keys are the replication package's
	// own (Config.Lower), not records.
	own bool

	mu struct {
		sync.Mutex
		rn      *raft.RawNode
		seq     uint64
		waiters map[uint64]waiter
		leader  bool
		// ledTerm is the term in which this replica is the leader, 0 when
		// it is not: a change of it means the rounds of that term that
		// were not committed are lost (see Process).
		ledTerm uint64
		// servingTerm is the term in which this replica, as leader, has
		// applied an entry of its own term and everything before it: every
		// round committed before the term is in the store then, and the
		// leader may decide (Status.Serving).
		servingTerm uint64
		// handoff is set while this leader hands its leadership away
		// (Host's Handoff): it decides nothing new (Status.Serving is
		// false), and proposes what it decided before.
		handoff bool
		// joins are the nodes that asked to be added (requestJoin).
		joins map[uint64]struct{}
		// ticks counts Tick; heard holds, for each node a message came
		// from, the tick of its last one (Progress.Peers' Silent).
		ticks uint64
		heard map[uint64]uint64
		// lead is the last leader this replica knew of, to count changes.
		lead uint64
	}
	stats groupStats
	// procMu makes Process and ReadSnapshot one at a time, so that a
	// snapshot's records are never written between a Ready's rounds.
	procMu sync.Mutex
	batch  *storage.ReplicaBatch // under procMu
	ops    []Op                  // apply's decoded changes, under procMu

	kick    chan struct{}
	failed  atomic.Pointer[error]
	stopped chan struct{}
	stop    sync.Once
}

// waiter is a proposal waiting to be applied, proposed in term.
type waiter struct {
	ch    chan error
	term  uint64
	start time.Time // when proposed, for the proposal latency
}

// NewGroup opens the replica's state in the store and starts its Raft node;
// Run (or calls to Process) then drives it.
func NewGroup(cfg Config) (*Group, error) {
	if cfg.Group == 0 || cfg.Node == 0 {
		return nil, fmt.Errorf("replication: group %d, node %d: neither may be 0", cfg.Group, cfg.Node)
	}
	if cfg.Store == nil || cfg.Send == nil {
		return nil, errors.New("replication: Config needs a Store and Send")
	}
	if bytes.Compare(cfg.Lower, cfg.Upper) >= 0 {
		return nil, fmt.Errorf("replication: group %d: empty key range [%q, %q)", cfg.Group, cfg.Lower, cfg.Upper)
	}
	own := bytes.HasPrefix(cfg.Lower, []byte(storage.ReplicaPrefix))
	if own != bytes.HasPrefix(cfg.Upper, []byte(storage.ReplicaPrefix)) || (!own && cfg.Upper[0] == 0xff) {
		return nil, fmt.Errorf("replication: group %d: key range [%q, %q) is neither records nor under storage.ReplicaPrefix", cfg.Group, cfg.Lower, cfg.Upper)
	}
	if cfg.ElectionTicks <= 0 {
		cfg.ElectionTicks = DefaultElectionTicks
	}
	if cfg.HeartbeatTicks <= 0 {
		cfg.HeartbeatTicks = DefaultHeartbeatTicks
	}
	if cfg.ElectionTicks <= cfg.HeartbeatTicks {
		return nil, fmt.Errorf("replication: ElectionTicks %d must exceed HeartbeatTicks %d", cfg.ElectionTicks, cfg.HeartbeatTicks)
	}
	if cfg.LogKeep == 0 {
		cfg.LogKeep = DefaultLogKeep
	}
	if cfg.LogKeepBytes == 0 {
		cfg.LogKeepBytes = DefaultLogKeepBytes
	}
	if cfg.LogMemory <= 0 {
		cfg.LogMemory = DefaultLogMemory
	}
	if cfg.MaxSizePerMsg == 0 {
		cfg.MaxSizePerMsg = DefaultMaxSizePerMsg
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = DefaultMaxInflight
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l, err := OpenLog(cfg.Store, cfg.Group)
	if err != nil {
		return nil, err
	}
	l.recentMax = cfg.LogMemory
	g := &Group{
		cfg:     cfg,
		own:     own,
		log:     l,
		lg:      cfg.Logger.With("group", cfg.Group, "node", cfg.Node),
		batch:   cfg.Store.NewReplicaBatch(),
		kick:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
	}
	if err := g.bootstrap(); err != nil {
		return nil, err
	}
	rn, err := raft.NewRawNode(&raft.Config{
		ID:                        cfg.Node,
		ElectionTick:              cfg.ElectionTicks,
		HeartbeatTick:             cfg.HeartbeatTicks,
		Storage:                   l,
		Applied:                   l.Applied(),
		MaxSizePerMsg:             cfg.MaxSizePerMsg,
		MaxInflightMsgs:           cfg.MaxInflight,
		CheckQuorum:               true,
		PreVote:                   true,
		DisableProposalForwarding: true, // only the leader decides
		StepDownOnRemoval:         true,
		Logger:                    raftLogger{g.lg},
	})
	if err != nil {
		return nil, fmt.Errorf("replication: group %d: %w", cfg.Group, err)
	}
	g.mu.rn = rn
	g.mu.seq = rand.Uint64() // so that a restart's proposals are told from the last run's
	g.mu.waiters = map[uint64]waiter{}
	g.mu.heard = map[uint64]uint64{}
	return g, nil
}

// bootstrapIndex and bootstrapTerm are where the log of a bootstrapped
// group starts: after an entry that is in no log, whose state (the first
// members) every first replica writes alike. A replica added later has no
// such entry, so the leader cannot match its empty log at index 0 and
// replay the log to it: it sends a snapshot, which carries the members.
// Replaying on an empty membership would fail the replica, or make a voter
// added directly the only voter it knows of, electing itself alone.
const (
	bootstrapIndex = 1
	bootstrapTerm  = 1
)

// bootstrap writes the first members of a group the store has never held.
func (g *Group) bootstrap() error {
	hs, cs, _ := g.log.InitialState()
	last, _ := g.log.LastIndex()
	if len(g.cfg.Bootstrap) == 0 || len(cs.GetVoters()) > 0 || last > 0 || !raft.IsEmptyHardState(hs) {
		return nil
	}
	var c logChange
	conf := &pb.ConfState{Voters: append([]uint64(nil), g.cfg.Bootstrap...), Learners: append([]uint64(nil), g.cfg.BootstrapLearners...)}
	if err := g.log.stageTruncated(g.batch, &c, bootstrapIndex, bootstrapTerm); err != nil {
		return err
	}
	c.last, c.setLast = bootstrapIndex, true
	if err := g.log.stageApplied(g.batch, &c, bootstrapIndex, conf); err != nil {
		return err
	}
	hard := &pb.HardState{Term: proto.Uint64(bootstrapTerm), Commit: proto.Uint64(bootstrapIndex)}
	if err := g.log.stageAppend(g.batch, &c, nil, hard); err != nil {
		return err
	}
	if err := g.batch.Commit(true); err != nil {
		return fmt.Errorf("replication: group %d: bootstrap: %w", g.cfg.Group, err)
	}
	g.log.settle(&c)
	return nil
}

// Tick advances the replica's logical clock by one tick.
func (g *Group) Tick() {
	g.raft(func(rn *raft.RawNode) error { rn.Tick(); g.mu.ticks++; return nil })
	g.notify()
}

// Step hands the replica a message from another replica of its group.
func (g *Group) Step(m *pb.Message) error {
	if raft.IsLocalMsg(m.GetType()) {
		return fmt.Errorf("replication: group %d: %v is not a message between nodes", g.cfg.Group, m.GetType())
	}
	if m.GetTo() != g.cfg.Node {
		return fmt.Errorf("replication: group %d: a message for node %d reached node %d", g.cfg.Group, m.GetTo(), g.cfg.Node)
	}
	if m.GetType() == pb.MsgSnap {
		return fmt.Errorf("replication: group %d: a snapshot comes through ReadSnapshot", g.cfg.Group)
	}
	if err := g.checkMessage(m); err != nil {
		return err
	}
	err := g.raft(func(rn *raft.RawNode) error {
		err := rn.Step(m)
		if err == nil {
			g.mu.heard[m.GetFrom()] = g.mu.ticks
		}
		return err
	})
	g.notify()
	if err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
		return fmt.Errorf("replication: group %d: %w", g.cfg.Group, err)
	}
	return nil
}

// ErrBadMessage refuses a message from another node that Raft must not
// be given: Raft takes a message of term 0 for a local one (a proposal,
// which only this replica makes, or a heartbeat that names a leader of no
// term), and panics on appended entries that do not follow each other;
// neither comes from a replica that works.
var ErrBadMessage = errors.New("replication: message that no replica sends")

// checkMessage refuses what Raft would take wrongly, or panic on, in a
// message from another node, as raft's own validation of appended
// entries (logSlice.valid) does after the fact.
func (g *Group) checkMessage(m *pb.Message) error {
	from := m.GetFrom()
	if from == 0 || from == g.cfg.Node {
		return fmt.Errorf("%w: group %d: a %v from node %d", ErrBadMessage, g.cfg.Group, m.GetType(), from)
	}
	if m.GetTerm() == 0 {
		return fmt.Errorf("%w: group %d: a %v of term 0 from node %d", ErrBadMessage, g.cfg.Group, m.GetType(), from)
	}
	if m.GetType() != pb.MsgApp {
		return nil
	}
	prevTerm, prev := m.GetLogTerm(), m.GetIndex()
	for _, e := range m.GetEntries() {
		if e.GetTerm() < prevTerm || e.GetIndex() != prev+1 {
			return fmt.Errorf("%w: group %d: from node %d, entry %d of term %d after %d of term %d", ErrBadMessage, g.cfg.Group, from, e.GetIndex(), e.GetTerm(), prev, prevTerm)
		}
		prevTerm, prev = e.GetTerm(), e.GetIndex()
	}
	if prevTerm > m.GetTerm() {
		return fmt.Errorf("%w: group %d: from node %d of term %d, an entry of term %d", ErrBadMessage, g.cfg.Group, from, m.GetTerm(), prevTerm)
	}
	return nil
}

// ErrReplicaLost is the error of a replica whose Raft state contradicts
// its group's: most often a node whose data directory was lost and that
// came back under its old identity. etcd's raft stops there (it panics);
// the group fails instead, and the node must rejoin under a new identity
// (ChangeMembers), by snapshot.
var ErrReplicaLost = errors.New("replication: the replica's state contradicts its group's; it must rejoin under a new identity")

// raft runs f on the RawNode under the lock, and turns a panic of the
// library, which it raises on state it cannot reconcile, into a failed
// group instead of a crashed process.
func (g *Group) raft(f func(rn *raft.RawNode) error) (err error) {
	g.mu.Lock()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", ErrReplicaLost, p)
			g.mu.Unlock()
			g.lg.Error("replica lost", "err", err)
			g.fail(err)
			return
		}
		g.mu.Unlock()
	}()
	return f(g.mu.rn)
}

// ChangeMembers proposes a membership change on the leader: a learner
// added to catch up by snapshot, then promoted and the replica it replaces
// removed, in one joint change. It is applied like a round, on every
// replica, in log order.
func (g *Group) ChangeMembers(cc *pb.ConfChangeV2) error {
	if err := g.failedErr(); err != nil {
		return err
	}
	var lead uint64
	err := g.raft(func(rn *raft.RawNode) error {
		st := rn.BasicStatus()
		lead = st.Lead
		if st.RaftState != raft.StateLeader {
			return ErrNotLeader
		}
		return rn.ProposeConfChange(cc)
	})
	g.notify()
	if errors.Is(err, ErrNotLeader) {
		return &NotLeaderError{Group: g.cfg.Group, Leader: lead}
	}
	if err != nil {
		return fmt.Errorf("replication: group %d: change members: %w", g.cfg.Group, err)
	}
	return nil
}

// ReportUnreachable tells Raft that a message to node could not be sent.
func (g *Group) ReportUnreachable(node uint64) {
	g.mu.Lock()
	g.mu.rn.ReportUnreachable(node)
	g.mu.Unlock()
	g.notify()
}

// ReportSnapshot tells Raft whether the snapshot sent to node arrived.
func (g *Group) ReportSnapshot(node uint64, ok bool) {
	st := raft.SnapshotFailure
	if ok {
		st = raft.SnapshotFinish
	}
	g.mu.Lock()
	g.mu.rn.ReportSnapshot(node, st)
	g.mu.Unlock()
	g.notify()
}

// TransferLeadership asks the leader to hand leadership to node, as when a
// shard's home pod returns.
func (g *Group) TransferLeadership(node uint64) {
	g.mu.Lock()
	g.mu.rn.TransferLeader(node)
	g.mu.Unlock()
	g.notify()
}

// Status is a replica's view of its group.
type Status struct {
	Leader  uint64 // 0: none known
	Term    uint64
	Role    string // "leader", "follower", "candidate", "pre-candidate"
	Commit  uint64
	Applied uint64
	// Serving says the replica is the leader and has applied every round
	// committed before its term: it may decide, and its proposals are
	// taken. A new leader serves once its term's first entry is applied;
	// a leader handing its leadership away (HostConfig.Handoff) stops
	// serving first, while its proposals are still taken.
	Serving bool
}

// Status returns the replica's view of its group.
func (g *Group) Status() Status {
	g.mu.Lock()
	st := g.mu.rn.BasicStatus()
	serving := g.servingLocked(st) && !g.mu.handoff
	g.mu.Unlock()
	role := map[raft.StateType]string{
		raft.StateLeader: "leader", raft.StateFollower: "follower",
		raft.StateCandidate: "candidate", raft.StatePreCandidate: "pre-candidate",
	}[st.RaftState]
	return Status{Leader: st.Lead, Term: st.GetTerm(), Role: role, Commit: st.GetCommit(), Applied: g.log.Applied(), Serving: serving}
}

// setHandoff stops (on) or resumes the replica's serving as leader while
// it hands its leadership away: see Status.Serving.
func (g *Group) setHandoff(on bool) {
	g.mu.Lock()
	g.mu.handoff = on
	g.mu.Unlock()
}

// servingLocked: see Status.Serving. g.mu must be locked.
func (g *Group) servingLocked(st raft.BasicStatus) bool {
	return st.RaftState == raft.StateLeader && g.mu.servingTerm == st.GetTerm()
}

// Propose proposes a round on the leader. The returned channel receives
// nil once the round is committed and applied here, or ErrProposalLost if
// leadership changed first, or ErrStopped. A replica that is not the
// leader refuses at once with a *NotLeaderError.
func (g *Group) Propose(ops []Op) (<-chan error, error) {
	r := Round{Proposer: g.cfg.Node, Ops: ops}
	if err := r.check(g.own); err != nil {
		return nil, err
	}
	for _, op := range ops {
		if bytes.Compare(op.Key, g.cfg.Lower) < 0 || bytes.Compare(op.Key, g.cfg.Upper) >= 0 {
			return nil, fmt.Errorf("%w: %q, group %d holds [%q, %q)", ErrOutOfRange, op.Key, g.cfg.Group, g.cfg.Lower, g.cfg.Upper)
		}
	}
	if err := g.failedErr(); err != nil {
		return nil, err
	}
	g.mu.Lock()
	st := g.mu.rn.BasicStatus()
	if !g.servingLocked(st) {
		// A leader not yet serving made no decision worth proposing: what
		// it holds may predate rounds it has still to apply.
		g.mu.Unlock()
		return nil, &NotLeaderError{Group: g.cfg.Group, Leader: st.Lead}
	}
	g.mu.seq++
	r.Seq = g.mu.seq
	ch := make(chan error, 1)
	if err := g.mu.rn.Propose(r.Append(nil)); err != nil {
		g.mu.Unlock()
		return nil, &NotLeaderError{Group: g.cfg.Group, Leader: st.Lead}
	}
	g.mu.waiters[r.Seq] = waiter{ch: ch, term: st.GetTerm(), start: time.Now()}
	g.mu.Unlock()
	g.notify()
	return ch, nil
}

func (g *Group) notify() { signal(g.kick) }

// Run processes Readies as they come until ctx is done, the group is
// stopped or a write to the store fails (then it returns that error, and
// the group refuses everything: a replica that cannot persist its log must
// not take part).
func (g *Group) Run(ctx context.Context) error {
	for {
		for {
			ok, err := g.Process()
			if err != nil {
				return err
			}
			if !ok {
				break
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-g.stopped:
			return ErrStopped
		case <-g.kick:
		}
	}
}

// Stop stops the group: Run returns, waiting proposals get ErrStopped.
func (g *Group) Stop() {
	g.stop.Do(func() {
		close(g.stopped)
		g.fail(ErrStopped)
	})
}

func (g *Group) failedErr() error {
	if p := g.failed.Load(); p != nil {
		return *p
	}
	return nil
}

func (g *Group) fail(err error) {
	g.failed.CompareAndSwap(nil, &err)
	g.mu.Lock()
	g.failWaitersLocked(err, 0)
	g.mu.Unlock()
}

// failWaitersLocked answers err to the proposals made before term (all
// of them with term 0).
func (g *Group) failWaitersLocked(err error, term uint64) {
	for seq, w := range g.mu.waiters {
		if term == 0 || w.term < term {
			w.ch <- err
			delete(g.mu.waiters, seq)
		}
	}
}

// Process handles one Ready, if there is one, and reports whether there
// was. Tests drive a group with it and Tick alone, deterministically.
func (g *Group) Process() (bool, error) {
	g.procMu.Lock()
	defer g.procMu.Unlock()
	if err := g.failedErr(); err != nil {
		return false, err
	}
	var (
		rd  raft.Ready
		has bool
	)
	if err := g.raft(func(rn *raft.RawNode) error {
		if has = rn.HasReady(); has {
			rd = rn.Ready()
		}
		return nil
	}); err != nil || !has {
		return false, err
	}
	if err := g.handle(&rd); err != nil {
		err = fmt.Errorf("replication: group %d: %w", g.cfg.Group, err)
		g.lg.Error("replica failed", "err", err)
		g.fail(err)
		return false, err
	}
	// Only now, with this Ready's committed rounds applied and their
	// proposals answered: a round committed in the Ready in which the
	// leader steps down was applied, and is not lost. Of the others, those
	// of an older term may have been dropped from the log.
	var st raft.BasicStatus
	if err := g.raft(func(rn *raft.RawNode) error { st = rn.BasicStatus(); return nil }); err != nil {
		return false, err
	}
	g.mu.Lock()
	if rd.SoftState != nil {
		g.mu.leader = rd.SoftState.RaftState == raft.StateLeader
		if lead := rd.SoftState.Lead; lead != 0 && lead != g.mu.lead {
			g.mu.lead = lead
			g.stats.leaderChanges.Add(1)
		}
	}
	if !g.mu.leader {
		g.failWaitersLocked(ErrProposalLost, 0)
	} else if term := rd.HardState.GetTerm(); term != 0 {
		g.failWaitersLocked(ErrProposalLost, term)
	}
	deposed := g.mu.ledTerm != 0 && (st.RaftState != raft.StateLeader || st.GetTerm() != g.mu.ledTerm)
	if deposed {
		g.mu.handoff = false
	}
	g.mu.ledTerm = 0
	if st.RaftState == raft.StateLeader {
		g.mu.ledTerm = st.GetTerm()
		// Raft commits no entry of an earlier term before one of the
		// leader's own (its empty first entry): once that one is applied,
		// so is everything before it.
		if commit := st.GetCommit(); g.mu.servingTerm != st.GetTerm() && commit > 0 && g.log.Applied() >= commit {
			if term, err := g.log.Term(commit); err == nil && term == st.GetTerm() {
				g.mu.servingTerm = st.GetTerm()
			}
		}
	}
	g.mu.Unlock()
	if deposed && !g.own {
		// What this replica decided as leader and the group did not
		// commit shows in the store's table: drop it, so that the shard's
		// records are the group's again. Under procMu: no round is
		// applied meanwhile.
		n, err := g.cfg.Store.DiscardDirty(g.cfg.Lower, g.cfg.Upper)
		if err != nil {
			err = fmt.Errorf("replication: group %d: drop the changes not committed: %w", g.cfg.Group, err)
			g.fail(err)
			return false, err
		}
		if n > 0 {
			g.lg.Warn("no longer the leader: dropped changes the group did not commit", "records", n)
		}
	}
	if err := g.raft(func(rn *raft.RawNode) error { rn.Advance(rd); return nil }); err != nil {
		return false, err
	}
	return true, nil
}

// handle persists, sends and applies one Ready, in the order etcd's raft
// asks for.
func (g *Group) handle(rd *raft.Ready) error {
	b := g.batch
	var c logChange
	snap := !raft.IsEmptySnap(rd.Snapshot)
	if snap {
		if err := g.log.stageSnapshot(b, &c, rd.Snapshot); err != nil {
			return err
		}
	}
	prev, _, _ := g.log.InitialState()
	if err := g.log.stageAppend(b, &c, rd.Entries, rd.HardState); err != nil {
		return err
	}
	if !b.Empty() {
		sync := snap || raft.MustSync(hardOrEmpty(rd.HardState, prev), prev, len(rd.Entries))
		if err := b.Commit(sync); err != nil {
			b.Reset()
			return fmt.Errorf("persist the log: %w", err)
		}
		g.log.settle(&c)
	}
	if len(rd.Messages) > 0 {
		g.cfg.Send(g.cfg.Group, rd.Messages)
	}
	if err := g.apply(rd.CommittedEntries); err != nil {
		b.Reset()
		return err
	}
	return g.maybeCompact()
}

func hardOrEmpty(hs, prev *pb.HardState) *pb.HardState {
	if hs == nil {
		return prev
	}
	return hs
}

// apply writes committed entries' rounds into the store with the applied
// index, in one write without sync, then answers the proposals it covers.
func (g *Group) apply(ents []*pb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	b := g.batch
	conf := g.log.confState()
	var mine []uint64
	for _, e := range ents {
		switch e.GetType() {
		case pb.EntryNormal:
			if len(e.GetData()) == 0 {
				continue // a new leader's empty entry
			}
			r, err := decodeRound(e.GetData(), g.own, g.ops)
			if err != nil {
				return fmt.Errorf("entry %d: %w", e.GetIndex(), err)
			}
			g.ops = r.Ops
			// A round this replica proposed and still waits for: the
			// store's table holds its changes, or later ones.
			own := false
			if r.Proposer == g.cfg.Node {
				g.mu.Lock()
				_, own = g.mu.waiters[r.Seq]
				g.mu.Unlock()
			}
			for _, op := range r.Ops {
				if bytes.Compare(op.Key, g.cfg.Lower) < 0 || bytes.Compare(op.Key, g.cfg.Upper) >= 0 {
					return fmt.Errorf("entry %d: %w: %q", e.GetIndex(), ErrOutOfRange, op.Key)
				}
				switch {
				case g.own && op.Delete:
					err = b.Delete(op.Key)
				case g.own:
					err = b.Set(op.Key, op.Value)
				default:
					err = b.Record(op, own)
				}
				if err != nil {
					return err
				}
			}
			if r.Proposer == g.cfg.Node {
				mine = append(mine, r.Seq)
			}
		case pb.EntryConfChange:
			var cc pb.ConfChange
			if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
				return fmt.Errorf("entry %d: %w: %w", e.GetIndex(), ErrCorruptLog, err)
			}
			if err := g.raft(func(rn *raft.RawNode) error { conf = rn.ApplyConfChange(&cc); return nil }); err != nil {
				return err
			}
		case pb.EntryConfChangeV2:
			var cc pb.ConfChangeV2
			if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
				return fmt.Errorf("entry %d: %w: %w", e.GetIndex(), ErrCorruptLog, err)
			}
			if err := g.raft(func(rn *raft.RawNode) error { conf = rn.ApplyConfChange(&cc); return nil }); err != nil {
				return err
			}
		}
	}
	clear(g.ops[:cap(g.ops)]) // no entry's bytes kept past the apply
	var c logChange
	if err := g.log.stageApplied(b, &c, ents[len(ents)-1].GetIndex(), conf); err != nil {
		return err
	}
	if err := b.Commit(false); err != nil {
		return fmt.Errorf("apply entries %d-%d: %w", ents[0].GetIndex(), ents[len(ents)-1].GetIndex(), err)
	}
	g.log.settle(&c)
	g.mu.Lock()
	for _, seq := range mine {
		if w, ok := g.mu.waiters[seq]; ok {
			g.stats.proposals.observe(time.Since(w.start))
			w.ch <- nil
			delete(g.mu.waiters, seq)
		}
	}
	g.mu.Unlock()
	return nil
}

// maybeCompact truncates the log to LogKeep applied entries once it holds
// twice as many, and to LogKeepBytes once its entries take twice as many
// bytes (see Config.LogKeepBytes).
func (g *Group) maybeCompact() error {
	applied := g.log.Applied()
	first, _ := g.log.FirstIndex()
	var to uint64
	if keep := g.cfg.LogKeep; applied >= first+2*keep {
		to = applied - keep
	}
	if i := g.log.bytesCompactIndex(applied, g.cfg.LogKeepBytes); i > to {
		to = max(to, g.keptForFollowers(i))
	}
	if to < first {
		return nil
	}
	var c logChange
	if err := g.log.stageCompact(g.batch, &c, to); err != nil {
		return err
	}
	if err := g.batch.Commit(false); err != nil {
		return fmt.Errorf("truncate the log: %w", err)
	}
	g.log.settle(&c)
	return nil
}

// keptForFollowers returns index, or on the leader the lowest index that
// a follower heard from within an election timeout has not acknowledged
// after, if lower: truncating the log by bytes is not to send a snapshot,
// which streams the whole shard, to a follower that lags a little.
func (g *Group) keptForFollowers(index uint64) uint64 {
	g.raft(func(rn *raft.RawNode) error {
		if rn.BasicStatus().RaftState != raft.StateLeader {
			return nil
		}
		rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
			heard, ok := g.mu.heard[id]
			if id != g.cfg.Node && ok && g.mu.ticks-heard <= uint64(g.cfg.ElectionTicks) && pr.Match < index {
				index = pr.Match
			}
		})
		return nil
	})
	return index
}

// raftLogger sends the library's log lines to slog.
type raftLogger struct{ l *slog.Logger }

func (r raftLogger) Debug(v ...any)                 { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Debugf(format string, v ...any) { r.l.Debug(fmt.Sprintf(format, v...)) }
func (r raftLogger) Info(v ...any)                  { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Infof(format string, v ...any)  { r.l.Debug(fmt.Sprintf(format, v...)) }
func (r raftLogger) Warning(v ...any)               { r.l.Warn(fmt.Sprint(v...)) }
func (r raftLogger) Warningf(format string, v ...any) {
	r.l.Warn(fmt.Sprintf(format, v...))
}
func (r raftLogger) Error(v ...any)                 { r.l.Error(fmt.Sprint(v...)) }
func (r raftLogger) Errorf(format string, v ...any) { r.l.Error(fmt.Sprintf(format, v...)) }
func (r raftLogger) Fatal(v ...any)                 { r.l.Error(fmt.Sprint(v...)); panic(fmt.Sprint(v...)) }
func (r raftLogger) Fatalf(format string, v ...any) {
	r.l.Error(fmt.Sprintf(format, v...))
	panic(fmt.Sprintf(format, v...))
}
func (r raftLogger) Panic(v ...any) { r.l.Error(fmt.Sprint(v...)); panic(fmt.Sprint(v...)) }
func (r raftLogger) Panicf(format string, v ...any) {
	r.l.Error(fmt.Sprintf(format, v...))
	panic(fmt.Sprintf(format, v...))
}
