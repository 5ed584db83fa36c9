package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/storage"
)

// The keys of a group's Raft state, after storage.ReplicaPrefix and the
// group's identity (8 bytes, big-endian):
//
//	'a'               applied state: uvarint index, then the ConfState at it
//	'e' index (8 B)   a log entry (raftpb.Entry)
//	'h'               hard state (raftpb.HardState)
//	't'               truncated state: uvarint index, uvarint term of the
//	                  last entry removed from the log
const (
	keyApplied   = 'a'
	keyEntry     = 'e'
	keyHard      = 'h'
	keyTruncated = 't'
)

// ErrCorruptLog is the error for Raft state in the store that does not
// decode, or a log with a hole.
var ErrCorruptLog = errors.New("replication: the stored Raft log is corrupt")

// groupKey returns the key of kind k of group g.
func groupKey(g uint64, k byte) []byte {
	b := make([]byte, 0, len(storage.ReplicaPrefix)+8+1+8)
	b = append(b, storage.ReplicaPrefix...)
	b = binary.BigEndian.AppendUint64(b, g)
	return append(b, k)
}

func entryKey(g, index uint64) []byte {
	return binary.BigEndian.AppendUint64(groupKey(g, keyEntry), index)
}

// Log is one group's Raft log and state in the store: it implements
// raft.Storage, and the runner writes it through a storage.ReplicaBatch
// together with whatever else a step changes, so that the hard state and
// the entries of a Ready are one synced write, and the applied index is
// written with the records it covers. It is safe for concurrent use.
type Log struct {
	store *storage.Store
	group uint64
	// enc is stageAppend's buffer for the entries it encodes (the batch
	// copies them): its callers run one at a time (the group's procMu).
	enc []byte
	// recentMax bounds the bytes of the entries kept in memory (recent);
	// set before the first append (Config.LogMemory).
	recentMax int

	mu struct {
		sync.Mutex
		hard      *pb.HardState
		truncIdx  uint64 // the log starts at truncIdx+1
		truncTerm uint64
		last      uint64 // truncIdx when the log is empty
		applied   uint64
		conf      *pb.ConfState // at applied
		// terms are the terms of the entries in (truncIdx, last], as runs
		// (a term changes only at an election), so that Term, which Raft
		// asks for every append, reads no entry.
		terms []termRun
		// recent are the last entries appended, from index recentFrom
		// on, of recentMax bytes at most: Raft asks for the entries it
		// applies once it learns they are committed, after they were
		// stored, and for those it sends a replica just behind; a read
		// from the store would decode them again.
		recent      []recentEntry
		recentFrom  uint64
		recentBytes int
		// marks count the bytes of the entries in the log (their size
		// in the store), so that it is truncated by bytes too: the
		// entries up to truncIdx took cumTrunc bytes, those up to last
		// cumLast, counted from the Log's opening.
		marks    []sizeMark
		cumTrunc uint64
		cumLast  uint64
	}
}

// sizeMark says that the entries up to end took cum bytes. A mark spans
// the entries after the previous one's end (or the log's start), of
// markBytes at least unless it is the last, so that a log of many small
// entries keeps few marks: the log is truncated by bytes at a mark's end.
type sizeMark struct{ end, cum uint64 }

const markBytes = 4 << 10

// recentEntry is an entry kept in memory, and its size in the store.
type recentEntry struct {
	e    *pb.Entry
	size int
}

// DefaultLogMemory is the default of Config.LogMemory: a few rounds,
// enough for those not yet applied.
const DefaultLogMemory = 1 << 20

// termRun says that the entries from start on, up to the next run's
// start, are of term.
type termRun struct{ start, term uint64 }

// addTerms appends runs to terms for entries from index from on (any
// later runs dropped: a new tail replaces them), merging equal terms.
func addTerms(terms []termRun, from uint64, add []termRun) []termRun {
	for len(terms) > 0 && terms[len(terms)-1].start >= from {
		terms = terms[:len(terms)-1]
	}
	for _, r := range add {
		if len(terms) > 0 && terms[len(terms)-1].term == r.term {
			continue
		}
		terms = append(terms, r)
	}
	return terms
}

// termAt returns the term of entry i, which runs covers.
func termAt(runs []termRun, i uint64) uint64 {
	j := sort.Search(len(runs), func(j int) bool { return runs[j].start > i })
	return runs[j-1].term
}

// OpenLog reads group's Raft state from store; a group never written has
// an empty log, no hard state and no members.
func OpenLog(store *storage.Store, group uint64) (*Log, error) {
	l := &Log{store: store, group: group, recentMax: DefaultLogMemory}
	l.mu.hard = &pb.HardState{}
	l.mu.conf = &pb.ConfState{}
	if v, ok, err := store.ReplicaGet(groupKey(group, keyHard)); err != nil {
		return nil, err
	} else if ok {
		if err := proto.Unmarshal(v, l.mu.hard); err != nil {
			return nil, fmt.Errorf("%w: group %d hard state: %w", ErrCorruptLog, group, err)
		}
	}
	if v, ok, err := store.ReplicaGet(groupKey(group, keyTruncated)); err != nil {
		return nil, err
	} else if ok {
		d := decoder{b: v}
		l.mu.truncIdx, l.mu.truncTerm = d.uvarint(), d.uvarint()
		if d.err != nil {
			return nil, fmt.Errorf("%w: group %d truncated state: %w", ErrCorruptLog, group, d.err)
		}
	}
	if v, ok, err := store.ReplicaGet(groupKey(group, keyApplied)); err != nil {
		return nil, err
	} else if ok {
		d := decoder{b: v}
		l.mu.applied = d.uvarint()
		if d.err == nil {
			d.err = proto.Unmarshal(d.b, l.mu.conf)
		}
		if d.err != nil {
			return nil, fmt.Errorf("%w: group %d applied state: %w", ErrCorruptLog, group, d.err)
		}
	}
	// The last entry, and a check that the log has no hole.
	l.mu.last = l.mu.truncIdx
	var derr error
	err := store.ReplicaScan(entryKey(group, l.mu.truncIdx+1), groupKey(group, keyEntry+1), func(k, v []byte) bool {
		i := binary.BigEndian.Uint64(k[len(k)-8:])
		if i != l.mu.last+1 {
			return false
		}
		e := &pb.Entry{}
		if err := proto.Unmarshal(v, e); err != nil || e.GetIndex() != i {
			derr = fmt.Errorf("%w: group %d entry %d", ErrCorruptLog, group, i)
			return false
		}
		l.mu.terms = addTerms(l.mu.terms, i, []termRun{{i, e.GetTerm()}})
		l.mu.last = i
		l.countLocked(i, len(v))
		return true
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return nil, err
	}
	var extra bool
	err = store.ReplicaScan(entryKey(group, l.mu.last+1), groupKey(group, keyEntry+1), func(k, _ []byte) bool {
		extra = true
		return false
	})
	if err != nil {
		return nil, err
	}
	if extra {
		return nil, fmt.Errorf("%w: group %d: the log has a hole after index %d", ErrCorruptLog, group, l.mu.last)
	}
	if l.mu.applied < l.mu.truncIdx {
		return nil, fmt.Errorf("%w: group %d: applied index %d before the log's start %d", ErrCorruptLog, group, l.mu.applied, l.mu.truncIdx+1)
	}
	return l, nil
}

// InitialState implements raft.Storage.
func (l *Log) InitialState() (*pb.HardState, *pb.ConfState, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return proto.Clone(l.mu.hard).(*pb.HardState), proto.Clone(l.mu.conf).(*pb.ConfState), nil
}

// Entries implements raft.Storage: the entries [lo, hi), at most maxSize
// bytes of them but at least one.
func (l *Log) Entries(lo, hi, maxSize uint64) ([]*pb.Entry, error) {
	l.mu.Lock()
	first, last := l.mu.truncIdx+1, l.mu.last
	l.mu.Unlock()
	if lo < first {
		return nil, raft.ErrCompacted
	}
	if hi > last+1 {
		return nil, raft.ErrUnavailable // raft compares it with ==
	}
	if ents := l.recentEntries(lo, hi, maxSize); ents != nil {
		return ents, nil
	}
	var (
		ents []*pb.Entry
		size uint64
		derr error
	)
	next := lo
	compacted := false
	err := l.store.ReplicaScan(entryKey(l.group, lo), entryKey(l.group, hi), func(k, v []byte) bool {
		if len(ents) == 0 && binary.BigEndian.Uint64(k[len(k)-8:]) > lo {
			// The start of the range went since first was read: the
			// Ready loop truncated the log meanwhile (it deletes only a
			// prefix). Raft sends a snapshot on ErrCompacted, and panics
			// on any other error.
			compacted = true
			return false
		}
		e := &pb.Entry{}
		if err := proto.Unmarshal(v, e); err != nil || e.GetIndex() != next {
			derr = fmt.Errorf("%w: group %d entry %d", ErrCorruptLog, l.group, next)
			return false
		}
		size += uint64(len(v))
		if len(ents) > 0 && size > maxSize {
			return false
		}
		ents = append(ents, e)
		next++
		return true
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return nil, err
	}
	if compacted || (len(ents) == 0 && lo < hi) {
		// Compacted meanwhile.
		return nil, raft.ErrCompacted
	}
	return ents, nil
}

// recentEntries returns the entries [lo, hi) as Entries does if the Log
// keeps them all in memory, else nil. The slice is the caller's; the
// entries are shared, and nobody changes them.
func (l *Log) recentEntries(lo, hi, maxSize uint64) []*pb.Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	from := l.mu.recentFrom
	if lo >= hi || lo < from || hi > from+uint64(len(l.mu.recent)) || lo <= l.mu.truncIdx {
		return nil
	}
	var (
		ents []*pb.Entry
		size uint64
	)
	for _, r := range l.mu.recent[lo-from : hi-from] {
		size += uint64(r.size)
		if len(ents) > 0 && size > maxSize {
			break
		}
		ents = append(ents, r.e)
	}
	return ents
}

// Term implements raft.Storage.
func (l *Log) Term(i uint64) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case i == l.mu.truncIdx:
		return l.mu.truncTerm, nil
	case i < l.mu.truncIdx:
		return 0, raft.ErrCompacted
	case i > l.mu.last:
		return 0, raft.ErrUnavailable
	}
	return termAt(l.mu.terms, i), nil
}

// LastIndex implements raft.Storage.
func (l *Log) LastIndex() (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.last, nil
}

// FirstIndex implements raft.Storage.
func (l *Log) FirstIndex() (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.truncIdx + 1, nil
}

// Snapshot implements raft.Storage: the state at the applied index. Its
// records are not in it: whoever sends it streams them from a Pebble
// snapshot taken then (see Group.WriteSnapshot), which holds the state at
// that index or a later one.
func (l *Log) Snapshot() (*pb.Snapshot, error) {
	l.mu.Lock()
	applied, conf := l.mu.applied, proto.Clone(l.mu.conf).(*pb.ConfState)
	l.mu.Unlock()
	term, err := l.Term(applied)
	if err != nil {
		return nil, err
	}
	return &pb.Snapshot{Metadata: &pb.SnapshotMetadata{
		Index: proto.Uint64(applied), Term: proto.Uint64(term), ConfState: conf,
	}}, nil
}

// Applied returns the applied index.
func (l *Log) Applied() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.applied
}

// logChange is a change to the log's state staged in a batch, made
// visible by settle once the batch is written.
type logChange struct {
	hard       *pb.HardState
	trunc      bool
	truncIdx   uint64
	truncTerm  uint64
	last       uint64
	setLast    bool
	termsFrom  uint64    // with setLast: the first index appended
	terms      []termRun // the runs of the entries appended
	clearTerms bool      // the log was emptied (a snapshot)
	appended   []recentEntry
	applied    uint64
	conf       *pb.ConfState
	setApplied bool
}

// maxKeptEnc bounds the buffer a Log keeps between appends.
const maxKeptEnc = 1 << 20

// stageAppend adds entries to b, removing any entries after them (a new
// leader's log replaces a conflicting tail), and the hard state if hs is
// not nil.
func (l *Log) stageAppend(b *storage.ReplicaBatch, c *logChange, ents []*pb.Entry, hs *pb.HardState) error {
	if hs != nil && !raft.IsEmptyHardState(hs) {
		v, err := proto.Marshal(hs)
		if err != nil {
			return err
		}
		if err := b.Set(groupKey(l.group, keyHard), v); err != nil {
			return err
		}
		c.hard = hs
	}
	if len(ents) == 0 {
		return nil
	}
	l.mu.Lock()
	last := l.mu.last
	if c.setLast {
		last = c.last
	}
	l.mu.Unlock()
	for _, e := range ents {
		v, err := proto.MarshalOptions{}.MarshalAppend(l.enc[:0], e)
		if err != nil {
			return err
		}
		l.enc = v
		if err := b.Set(entryKey(l.group, e.GetIndex()), v); err != nil {
			return err
		}
		c.appended = append(c.appended, recentEntry{e: e, size: len(v)})
	}
	if cap(l.enc) > maxKeptEnc {
		l.enc = nil
	}
	c.termsFrom = ents[0].GetIndex()
	c.terms = c.terms[:0]
	for _, e := range ents {
		c.terms = addTerms(c.terms, e.GetIndex(), []termRun{{e.GetIndex(), e.GetTerm()}})
	}
	newLast := ents[len(ents)-1].GetIndex()
	if newLast < last {
		if err := b.DeleteRange(entryKey(l.group, newLast+1), entryKey(l.group, last+1)); err != nil {
			return err
		}
	}
	c.last, c.setLast = newLast, true
	return nil
}

// stageSnapshot makes the log start after snap: every entry goes, and the
// applied state becomes snap's.
func (l *Log) stageSnapshot(b *storage.ReplicaBatch, c *logChange, snap *pb.Snapshot) error {
	m := snap.GetMetadata()
	if err := b.DeleteRange(groupKey(l.group, keyEntry), groupKey(l.group, keyEntry+1)); err != nil {
		return err
	}
	if err := l.stageTruncated(b, c, m.GetIndex(), m.GetTerm()); err != nil {
		return err
	}
	c.last, c.setLast, c.clearTerms = m.GetIndex(), true, true
	return l.stageApplied(b, c, m.GetIndex(), m.GetConfState())
}

func (l *Log) stageTruncated(b *storage.ReplicaBatch, c *logChange, index, term uint64) error {
	v := binary.AppendUvarint(binary.AppendUvarint(nil, index), term)
	if err := b.Set(groupKey(l.group, keyTruncated), v); err != nil {
		return err
	}
	c.trunc, c.truncIdx, c.truncTerm = true, index, term
	return nil
}

// stageApplied records the applied index and the ConfState at it, in the
// batch that applies what it covers.
func (l *Log) stageApplied(b *storage.ReplicaBatch, c *logChange, index uint64, conf *pb.ConfState) error {
	cv, err := proto.Marshal(conf)
	if err != nil {
		return err
	}
	if err := b.Set(groupKey(l.group, keyApplied), append(binary.AppendUvarint(nil, index), cv...)); err != nil {
		return err
	}
	c.applied, c.conf, c.setApplied = index, conf, true
	return nil
}

// stageCompact removes the entries up to index, which must be applied.
func (l *Log) stageCompact(b *storage.ReplicaBatch, c *logChange, index uint64) error {
	term, err := l.Term(index)
	if err != nil {
		return err
	}
	l.mu.Lock()
	first := l.mu.truncIdx + 1
	l.mu.Unlock()
	if err := b.DeleteRange(entryKey(l.group, first), entryKey(l.group, index+1)); err != nil {
		return err
	}
	return l.stageTruncated(b, c, index, term)
}

// settle makes a written change visible.
func (l *Log) settle(c *logChange) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.hard != nil {
		l.mu.hard = proto.Clone(c.hard).(*pb.HardState)
	}
	if c.trunc {
		l.mu.truncIdx, l.mu.truncTerm = c.truncIdx, c.truncTerm
	}
	if c.clearTerms {
		l.mu.terms = l.mu.terms[:0]
		l.keepRecentLocked(nil, 0)
		clear(l.mu.marks)
		l.mu.marks, l.mu.cumTrunc = l.mu.marks[:0], l.mu.cumLast
	} else if c.trunc {
		l.dropMarksLocked()
	}
	if len(c.appended) > 0 {
		l.keepRecentLocked(c.appended, c.termsFrom)
		l.cutMarksLocked(c.termsFrom)
		for i, r := range c.appended {
			l.countLocked(c.termsFrom+uint64(i), r.size)
		}
	}
	if c.setLast {
		l.mu.last = c.last
		if len(c.terms) > 0 {
			l.mu.terms = addTerms(l.mu.terms, c.termsFrom, c.terms)
		}
	}
	if c.trunc {
		// Runs wholly before the log's start go.
		for len(l.mu.terms) > 1 && l.mu.terms[1].start <= l.mu.truncIdx+1 {
			l.mu.terms = l.mu.terms[1:]
		}
	}
	if c.setApplied {
		l.mu.applied, l.mu.conf = c.applied, proto.Clone(c.conf).(*pb.ConfState)
	}
}

// keepRecentLocked adds the entries appended from index from on to the
// recent ones, in place of any from that index on (a new leader's log
// replaces a conflicting tail), and drops the oldest past recentMax. An
// empty ents forgets them all. l.mu must be locked.
func (l *Log) keepRecentLocked(ents []recentEntry, from uint64) {
	end := l.mu.recentFrom + uint64(len(l.mu.recent))
	if len(ents) == 0 || from < l.mu.recentFrom || from > end {
		clear(l.mu.recent)
		l.mu.recent, l.mu.recentFrom, l.mu.recentBytes = l.mu.recent[:0], from, 0
	}
	for _, r := range l.mu.recent[from-l.mu.recentFrom:] {
		l.mu.recentBytes -= r.size
	}
	clear(l.mu.recent[from-l.mu.recentFrom:])
	l.mu.recent = l.mu.recent[:from-l.mu.recentFrom]
	for _, r := range ents {
		l.mu.recent = append(l.mu.recent, r)
		l.mu.recentBytes += r.size
	}
	drop := 0
	for drop < len(l.mu.recent) && l.mu.recentBytes > l.recentMax {
		l.mu.recentBytes -= l.mu.recent[drop].size
		drop++
	}
	if drop > 0 {
		n := copy(l.mu.recent, l.mu.recent[drop:])
		clear(l.mu.recent[n:])
		l.mu.recent = l.mu.recent[:n]
		l.mu.recentFrom += uint64(drop)
	}
}

// countLocked counts entry i, of size bytes, appended after the last.
// l.mu must be locked.
func (l *Log) countLocked(i uint64, size int) {
	l.mu.cumLast += uint64(size)
	m := l.mu.marks
	if n := len(m); n > 0 && m[n-1].cum-l.prevCumLocked(n-1) < markBytes {
		m[n-1] = sizeMark{i, l.mu.cumLast}
		return
	}
	l.mu.marks = append(m, sizeMark{i, l.mu.cumLast})
}

// prevCumLocked returns the bytes up to where mark j starts.
func (l *Log) prevCumLocked(j int) uint64 {
	if j == 0 {
		return l.mu.cumTrunc
	}
	return l.mu.marks[j-1].cum
}

// cutMarksLocked forgets the entries from index from on, which a new
// leader's log replaces. A mark that spans entries on both sides keeps its
// bytes: the log's are overcounted by a little until it is truncated.
func (l *Log) cutMarksLocked(from uint64) {
	m := l.mu.marks
	for n := len(m); n > 0 && m[n-1].end >= from; n = len(m) {
		prevEnd := l.mu.truncIdx
		if n > 1 {
			prevEnd = m[n-2].end
		}
		if prevEnd+1 < from {
			m[n-1].end = from - 1
			break
		}
		m = m[:n-1]
	}
	l.mu.marks = m
	l.mu.cumLast = l.mu.cumTrunc
	if len(m) > 0 {
		l.mu.cumLast = m[len(m)-1].cum
	}
}

// dropMarksLocked forgets the marks of the entries truncated. A mark that
// spans the truncation point keeps its bytes (overcounted until the next).
func (l *Log) dropMarksLocked() {
	m := l.mu.marks
	i := 0
	for i < len(m) && m[i].end <= l.mu.truncIdx {
		i++
	}
	if i == 0 {
		return
	}
	l.mu.cumTrunc = m[i-1].cum
	n := copy(m, m[i:])
	clear(m[n:])
	l.mu.marks = m[:n]
}

// bytesCompactIndex returns where to truncate the log so that it keeps
// the keep bytes of its newest entries, at least, once they are twice as
// many, removing applied entries only (those up to applied); 0: not now.
func (l *Log) bytesCompactIndex(applied, keep uint64) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.cumLast-l.mu.cumTrunc < 2*keep {
		return 0
	}
	m, last := l.mu.marks, l.mu.cumLast
	j := sort.Search(len(m), func(j int) bool { return m[j].end > applied || last-m[j].cum < keep })
	if j == 0 {
		return 0
	}
	return m[j-1].end
}

// logBytes returns the bytes of the entries in the log (their size in the
// store), as counted for its truncation.
func (l *Log) logBytes() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.cumLast - l.mu.cumTrunc
}

// hasMembers reports whether the ConfState at the applied index names any
// voter or learner, without copying it.
func (l *Log) hasMembers() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.mu.conf.GetVoters()) > 0 || len(l.mu.conf.GetLearners()) > 0
}

// appliedConf returns the applied index and the ConfState at it.
func (l *Log) appliedConf() (uint64, *pb.ConfState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.applied, proto.Clone(l.mu.conf).(*pb.ConfState)
}

// conf returns the ConfState at the applied index.
func (l *Log) confState() *pb.ConfState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return proto.Clone(l.mu.conf).(*pb.ConfState)
}
