package storage

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Replicated records: with Options.Replicator set, a committer does not
// write its rounds to Pebble. It hands each round's changes to the
// Replicator (the replication package: its shard's Raft group), which
// writes them on every replica, this one included, once the group has
// committed them (ReplicaBatch's own records, here). The round is then
// acknowledged as synced: a quorum of replicas has it in their fsynced
// logs. A round the group will not commit on this node's word (it lost
// its leadership) is lost: its records are dropped from the table (they
// show decisions the group never took), and the replies waiting for it
// get ErrNotReplicated.

// ErrNotReplicated is wrapped by the error of a change whose round its
// group did not commit on this node's word: it may or may not be
// committed, by the group's new leader; it was not acknowledged.
var ErrNotReplicated = errors.New("storage: the round was not replicated")

// ReplicaOp is one change of a replicated round: a record key and its new
// value, or its deletion, and whether the record existed before.
type ReplicaOp struct {
	Key, Value []byte
	Delete     bool
	Prior      Prior
}

// Prior says whether a change's record existed before the change, as the
// leader that made the round knew it: the state the rounds before it left,
// which is what a replica applying them in order holds. A replica keeps
// its record counts (DBSIZE, the counts per kind) from it, without
// reading the record before writing it.
type Prior uint8

const (
	// PriorUnknown makes the replica read whether the record exists: the
	// rounds of older versions, and changes that do not come from a
	// committer's round.
	PriorUnknown Prior = iota
	PriorAbsent        // the record did not exist
	PriorPresent       // the record existed
)

// Replicator takes the committers' rounds when the store's records are
// replicated.
type Replicator interface {
	// Replicate takes the changes of one round of committer c, in key
	// order; it must not keep ops or their bytes past the call. The
	// channel receives nil once the round is committed by its group and
	// written to this store (as ReplicaBatch's own records), or an error
	// once it never will be on this node's word; an error returned at once
	// says the same. The committer's next round waits for the answer, so
	// a round's keys are acknowledged in order.
	Replicate(c int, ops []ReplicaOp) (<-chan error, error)
}

// replicaRound is the changes of a committer's round kept for the
// Replicator: ops point into buf.
type replicaRound struct {
	ops []ReplicaOp
	buf []byte
}

func (r *replicaRound) reset() {
	clear(r.ops) // no pointers into an old buf kept
	r.ops, r.buf = r.ops[:0], r.buf[:0]
	if cap(r.buf) > maxKeptKeys {
		r.buf = nil
	}
}

// add copies a change into the round, of a record that existed before it
// if stored. An op keeps pointing at its bytes when buf grows: the old
// array stays as it was.
func (r *replicaRound) add(key, val []byte, del, stored bool) {
	start := len(r.buf)
	r.buf = append(r.buf, key...)
	op := ReplicaOp{Key: r.buf[start:len(r.buf):len(r.buf)], Delete: del, Prior: PriorAbsent}
	if stored {
		op.Prior = PriorPresent
	}
	if !del {
		start = len(r.buf)
		r.buf = append(r.buf, val...)
		op.Value = r.buf[start:len(r.buf):len(r.buf)]
	}
	r.ops = append(r.ops, op)
}

// DiscardDirty drops from the table every record in [lower, upper) that
// is not clean: changes this node made as its group's leader that the
// group has not committed, once it is no longer the leader (the
// replication package calls it on losing leadership). A reader then finds
// what the store holds: the group's committed state. The record counts
// follow what Pebble holds. It returns how many records it dropped.
//
// The changes to those records that their committer has not proposed yet
// are lost with them: their round would find the records gone and write
// nothing, and an empty round is acknowledged at once. Each reply waiting
// for such a round gets ErrNotReplicated (see loseUnproposed); the rounds
// already proposed get the Replicator's answer.
func (s *Store) DiscardDirty(lower, upper []byte) (int, error) {
	unlock, err := s.readLock()
	if err != nil {
		return 0, err
	}
	defer unlock()
	// Before and after: a Batch that noted a change meanwhile, or before,
	// sees the count move (Batch.Commit).
	s.dropped.Add(1)
	defer s.dropped.Add(1)
	touched := make([]bool, len(s.queues))
	defer func() {
		for c, t := range touched {
			if t {
				s.loseUnproposed(s.queues[c])
			}
		}
	}()
	n := 0
	for i := range s.stripe {
		st := &s.stripe[i]
		st.mu.Lock()
		t := &st.mu.t
		for ri := len(t.recs) - 1; ri >= 0; ri-- {
			if ri >= len(t.recs) {
				continue // the table emptied with its last record
			}
			r := &t.recs[ri]
			if r.flags&fLive == 0 || r.flags&fClean != 0 {
				continue
			}
			key := t.key(r)
			if bytes.Compare(key, lower) < 0 || bytes.Compare(key, upper) >= 0 {
				continue
			}
			touched[s.committerOf(key)] = true
			touched[len(touched)-1] = true // the cross queue's transactions
			if err := s.discardLocked(st, ri); err != nil {
				st.mu.Unlock()
				return n, err
			}
			n++
		}
		st.mu.Unlock()
	}
	return n, nil
}

// lostRounds is a range of a committer's rounds, first to last, that the
// Replicator did not commit, and why.
type lostRounds struct {
	first, last uint64
	err         error
}

// maxLostRanges bounds a queue's lost ranges: past it the two oldest
// merge, which may refuse a reply whose round was in fact replicated
// (the client retries), never acknowledge one that was not.
const maxLostRanges = 8

// lostLocked returns the error for a change of round ticket if its round
// was lost. q must be locked.
func lostLocked(q *commitQueue, ticket uint64) error {
	for _, l := range q.lost {
		if ticket >= l.first && ticket <= l.last {
			return l.err
		}
	}
	return nil
}

// syncsLater reports whether a committer's round is acknowledged after it
// is handed on (an fsync, or the Replicator's answer, that the committer
// does not wait for), rather than when it is written.
func (s *Store) syncsLater() bool {
	return s.opts.Sync == SyncAlways || s.opts.Replicator != nil
}

// finishReplicated hands r's round to the Replicator and keeps it in
// r.syncing until the answer comes (settle), as finishRound does with a
// round of SyncAlways whose fsync runs. A round that was not handed on
// is lost at once. An empty round is published as applied and synced
// once the round before it is settled.
func (s *Store) finishReplicated(q *commitQueue, r *roundBufs, round uint64, err error) {
	var answer <-chan error
	if err == nil {
		err = s.failedErr()
	}
	if err == nil && len(r.rep.ops) > 0 {
		answer, err = s.opts.Replicator.Replicate(q.index, r.rep.ops)
		if err != nil && !errors.Is(err, ErrFailed) {
			err = fmt.Errorf("%w: %w", ErrNotReplicated, err)
		}
		if err == nil {
			q.Lock()
			q.proposed = round
			q.Unlock()
		}
	}
	r.rep.reset()
	if err == nil && answer != nil {
		s.syncLater(q, r, round, time.Now(), answer)
		s.awaitLater(r)
		return
	}
	s.settle(r) // the round before first: rounds are answered in order
	if err != nil {
		if errors.Is(err, ErrNotReplicated) {
			s.lose(q, r.done, round, err)
		} else {
			for _, w := range r.done { // the store failed: they stay dirty
				st := &s.stripe[w.stripe]
				st.mu.Lock()
				s.wroteLocked(st, w, false)
				st.mu.Unlock()
			}
		}
		r.done = r.done[:0]
		q.Lock()
		q.done.Broadcast()
		q.Unlock()
		return
	}
	q.Lock()
	q.applied = round
	if s.failedErr() == nil {
		q.synced = round
		q.syncedKeys = q.appliedKeys
	}
	q.done.Broadcast()
	q.Unlock()
}

// lose ends a round the Replicator did not commit: its records are
// dropped from the table, with any later change made to them (they show
// decisions the group may never have taken; a reader then finds the
// committed state), and the replies waiting for this round, or for any
// change queued now, get err: those changes may rest on the lost ones.
// The changes queued from now on go to a round of their own.
func (s *Store) lose(q *commitQueue, done []written, round uint64, err error) {
	s.dropped.Add(1) // before and after: see DiscardDirty
	defer s.dropped.Add(1)
	for _, w := range done {
		st := &s.stripe[w.stripe]
		st.mu.Lock()
		t := &st.mu.t
		if int(w.rec) < len(t.recs) && t.recs[w.rec].flags&fLive != 0 && t.recs[w.rec].gen == w.gen && t.recs[w.rec].flags&fClean == 0 {
			if derr := s.discardLocked(st, int(w.rec)); derr != nil {
				st.mu.Unlock()
				s.fail(fmt.Errorf("drop a record of a round not replicated: %w", derr))
				break
			}
		}
		st.mu.Unlock()
	}
	q.Lock()
	s.loseRoundsLocked(q, round, err)
	q.Unlock()
}

// loseUnproposed marks q's rounds after the last it proposed lost: the
// round it may be reading now and the one its queued changes wait for.
// The changes queued from now on go to a round of their own.
func (s *Store) loseUnproposed(q *commitQueue) {
	q.Lock()
	defer q.Unlock()
	err := fmt.Errorf("%w: its records were dropped when this node lost its group's leadership", ErrNotReplicated)
	s.loseRoundsLocked(q, q.proposed+1, err)
}

// loseRoundsLocked marks q's rounds from first to the one its queued
// changes wait for lost with err, and starts a new round for the changes
// queued from now on. q must be locked.
func (s *Store) loseRoundsLocked(q *commitQueue, first uint64, err error) {
	l := lostRounds{first: first, last: q.round, err: err}
	q.round++ // the changes queued from now on are not lost
	if n := len(q.lost); n > 0 && q.lost[n-1].last+1 >= l.first {
		// Adjacent or overlapping: one range.
		q.lost[n-1].first = min(q.lost[n-1].first, l.first)
		q.lost[n-1].last = max(q.lost[n-1].last, l.last)
	} else {
		q.lost = append(q.lost, l)
	}
	if len(q.lost) > maxLostRanges {
		q.lost[1].first = q.lost[0].first
		q.lost = append(q.lost[:0], q.lost[1:]...)
	}
	q.done.Broadcast()
}

// discardLocked drops record ri, dirty, from st's table, the record counts
// brought in line with what Pebble holds. st must be locked.
func (s *Store) discardLocked(st *stripe, ri int) error {
	t := &st.mu.t
	r := &t.recs[ri]
	key := t.key(r)
	_, closer, err := s.db.Get(key)
	inStore := err == nil
	if inStore {
		closer.Close()
	} else if !errors.Is(err, pebble.ErrNotFound) {
		s.stats.readErrors.Add(1)
		return fmt.Errorf("storage: read: %w", err)
	}
	switch live := r.flags&fDel == 0; {
	case live && !inStore:
		st.mu.records[s.classOf(key)]--
	case !live && inStore:
		st.mu.records[s.classOf(key)]++
	}
	t.remove(ri)
	st.dirty.Add(-1)
	return nil
}
