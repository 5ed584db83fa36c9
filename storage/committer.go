package storage

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// The store's writes to Pebble are divided among several committers, each
// the only writer of the records of its range of partitions
// (Options.Partition: the server's are the Redis Cluster hash slots, and
// committer i of K owns the slots from i×16384/K on), with its own queue,
// rounds, Pebble batch and counters.
// One committer, writing every key, cost about 1.1 µs of one core per
// changed key (issue 28): it capped a server at about 0.9M changed keys
// per second whatever its cores. Pebble applies the batches of concurrent
// commits to its memtable in parallel; only the WAL append is ordered.
//
// A key is written only by the committer of its partition, so its rounds,
// one after the other, give the log its values in the order they were
// made. The exception is a transaction (Batch.Hold) whose keys belong to
// several committers: it must reach the log in one Pebble batch, so it
// goes to the cross queue instead, and its round, the cross round, runs
// alone: no committer's round is in flight while it does (roundMu), none
// reads a value from the moment the transaction is released until the
// cross round has written it (crossPending), and no transaction starts
// meanwhile (Hold waits), so the cross round never reads a later
// transaction's value either. Cross transactions are rare (a MULTI of
// keys in different ranges); they pause every committer for one round.

// commitQueue is one committer's queue and the progress of its rounds;
// the cross queue is one too, whose rounds any committer runs.
type commitQueue struct {
	sync.Mutex
	work    sync.Cond // the committer waits here for keys
	done    sync.Cond // Commit waits here for rounds to finish
	keys    []byte    // keys handed over, back to back
	ends    []int     // end offset of each key in keys
	hints   []written // where each key's record was when it was queued
	bytes   int       // record bytes charged for the keys queued
	round   uint64    // the round that will take the keys now queued
	applied uint64    // every round <= applied is in Pebble
	synced  uint64    // every round <= synced is fsynced
	closing bool
	stopped bool
	// urge makes the committer take the keys queued now without
	// waiting for its write-behind deadline (see dueLocked): someone
	// waits for them (Flush, the periodic sync, a Commit waiting for
	// room).
	urge bool
	// fsyncReturned says the fsync of the committer's round applied
	// without waiting for it has returned (see awaitSync).
	fsyncReturned bool
	// held says a transaction's changes are queued (Batch.Release):
	// the round that takes them is applied whole, see commitSlice.
	held bool
	// lost are the rounds whose changes the Replicator did not commit
	// (see lose), oldest first: a reply waiting for one gets the error.
	lost []lostRounds
	// proposed is the last round handed to the Replicator: its fate, and
	// that of the rounds before it, is the Replicator's answer; a later
	// one has not been proposed yet (see DiscardDirty).
	proposed uint64
	// index is the committer's number, for the Replicator.
	index int
	// Cumulative keys written to Pebble up to round applied, and up
	// to round synced: their difference is what a crash can lose.
	appliedKeys int64
	syncedKeys  int64
	// syncingKeys are the keys of the rounds applied without waiting for
	// their fsync (syncLater), not settled yet: their records stay dirty
	// until then, yet they are in the log, not unwritten (Shutdown's
	// report).
	syncingKeys int64
	// maxKeys, maxBytes and behindKeys are this queue's share of
	// MaxQueued, MaxQueuedBytes and writeBehindKeys.
	maxKeys, maxBytes, behindKeys int
}

// newCommitQueue returns the queue of one of n committers (n+1: the
// cross queue): a committer's share of the bounds is 1/n of them, so
// that the dirty records waiting for every committer together, which
// stay in memory over the cache's share, are as many as with one.
func newCommitQueue(o *Options, n int) *commitQueue {
	q := &commitQueue{round: 1, maxKeys: max(o.MaxQueued/n, 1), maxBytes: max(o.MaxQueuedBytes/n, 1), behindKeys: max(writeBehindKeys/n, commitSlice)}
	q.work.L = &q.Mutex
	q.done.L = &q.Mutex
	return q
}

// MaxCommitters is the most committers a store runs.
const MaxCommitters = 64

// onePartition is the default Options.Partition.
func onePartition([]byte) int { return 0 }

// partitionOf returns the partition of key, 0 to Partitions-1.
func (s *Store) partitionOf(key []byte) int {
	p := s.opts.Partition(key)
	if n := s.opts.Partitions; p < 0 || p >= n {
		p = int(uint(p) % uint(n))
	}
	return p
}

// committerOf returns the committer that writes key.
func (s *Store) committerOf(key []byte) int {
	if len(s.queues) == 2 { // one committer and the cross queue
		return 0
	}
	return int(uint64(s.partitionOf(key)) * uint64(s.committers) / uint64(s.opts.Partitions))
}

// crossQueue is the queue of the transactions whose keys belong to
// several committers.
func (s *Store) crossQueue() *commitQueue { return s.queues[s.committers] }

// broadcastDone wakes every goroutine waiting for a round.
func (s *Store) broadcastDone() {
	for _, q := range s.queues {
		q.Lock()
		q.done.Broadcast()
		q.Unlock()
	}
}

// wakeCrossRunner has committer 0 run the cross round, whose queue it
// watches besides its own (any committer that starts a round meanwhile
// runs it first).
func (s *Store) wakeCrossRunner() {
	q := s.queues[0]
	q.Lock()
	q.work.Signal()
	q.Unlock()
}

// dueLocked reports whether the committer should take the keys queued now
// rather than wait: always in SyncAlways (a reply waits for them), else
// when someone waits for them (urge), or the queue holds its share of
// writeBehindKeys or half its bounds, so that Commit does not block and one
// round stays short. Otherwise the keys wait for the next tick of
// syncLoop (write-behind): a round writes a key once however often it was
// queued, so a hot key reaches Pebble about once per SyncInterval, or once
// per writeBehindKeys changes. q must be locked.
func (s *Store) dueLocked(q *commitQueue) bool {
	return s.opts.Sync == SyncAlways || q.urge || q.closing || len(q.ends) >= q.behindKeys ||
		2*len(q.ends) >= q.maxKeys || 2*q.bytes >= q.maxBytes
}

// writeBehindKeys bounds a write-behind round: the committer holds txMu and
// visits each key's stripe while it takes a round, then applies it, and on
// one core rounds of 32768 keys (half the default queue) kept commands
// waiting: in one run of the pipelined benchmark on a loaded machine, p99
// 260 ms, against 100 ms before write-behind and 59 ms with this bound.
const writeBehindKeys = 8192

// roundBufs is a committer's buffers, kept between its rounds.
type roundBufs struct {
	batch  *pebble.Batch
	keys   []byte
	ends   []int
	hints  []written
	order  []sortKey // positions in ends, in key order
	spread []sortKey // the same, in queue order
	done   []written
	// syncing is the SyncAlways round applied whose fsync is still
	// running (see settle), nil if none; spare is the batch the next
	// round takes in its place.
	syncing *syncingRound
	spare   syncingRound
	// syncs hands the syncing round to the goroutine that waits for its
	// fsync (awaitSyncs), started with the first: one per committer, not
	// one per round, which allocated with every round.
	syncs chan *syncingRound
	// rep is the round's changes for Options.Replicator.
	rep replicaRound
}

// syncingRound is a round of SyncAlways applied to Pebble whose fsync may
// still be running: its batch (Pebble's SyncWait waits for the fsync, and
// the batch may not be reused before), its queue and round, the records
// it wrote, and when it was applied.
type syncingRound struct {
	batch *pebble.Batch
	q     *commitQueue
	round uint64
	done  []written
	keys  int64 // q.appliedKeys once the round was applied
	t0    time.Time
	// returned says Pebble's SyncWait returned err at t1 (awaitSync);
	// under q's lock.
	returned bool
	err      error
	t1       time.Time
	// replicated, when not nil, is the Replicator's answer for the round,
	// which awaitSync waits for instead of an fsync: the round is not in
	// Pebble's log, and batch is unused.
	replicated <-chan error
}

// commitLoop is committer c, the only writer to Pebble of its partitions'
// records (see the top of this file). Each round takes every key queued
// so far and writes the overlay's current value of each: in one Pebble
// batch in SyncAlways and for a round holding a transaction, otherwise a
// slice of commitSlice keys at a time. Committer 0 also runs the cross
// rounds.
func (s *Store) commitLoop(c int) {
	defer s.committersDone.Done()
	r := &roundBufs{batch: s.db.NewBatch()}
	defer func() {
		r.batch.Close()
		if r.spare.batch != nil {
			r.spare.batch.Close()
		}
		if r.syncs != nil {
			close(r.syncs)
		}
	}()
	q := s.queues[c]
	for {
		q.Lock()
		// In SyncEverySec and SyncNo keys wait here until they are due
		// (write-behind, see dueLocked).
		for !q.closing && (len(q.ends) == 0 || !s.dueLocked(q)) && !(c == 0 && s.crossPending.Load()) {
			if r.syncing != nil && q.fsyncReturned {
				// Its fsync returned: acknowledge the round.
				q.Unlock()
				s.settle(r)
				q.Lock()
				continue
			}
			q.work.Wait()
		}
		if c == 0 && s.crossPending.Load() {
			q.Unlock()
			s.crossRound(r)
			continue
		}
		if len(q.ends) == 0 && q.closing {
			if r.syncing != nil {
				q.Unlock()
				s.settle(r)
				continue
			}
			if c == 0 && !s.stopCross() {
				q.Unlock()
				s.crossRound(r)
				continue
			}
			q.stopped = true
			q.done.Broadcast()
			q.Unlock()
			return
		}
		if s.opts.Sync == SyncAlways && !q.closing {
			// Let every goroutine that is ready to commit enqueue first,
			// so that one fsync covers them all. On one P (taskset -c 0,
			// a pod with cpu: 1) the Signal of the first Commit makes the
			// committer the next goroutine to run, ahead of the other
			// connections already runnable: without this yield it took a
			// round of that one Batch and synced it, and the fsync, a
			// blocking syscall, held the only P while the others waited
			// (measured: 39 fsyncs per 1000 commands pipelined from 50
			// connections, against 2.8 with it). Gosched puts the
			// committer behind them; with nothing else to run it returns
			// at once, so a lone client's write waits no longer.
			q.Unlock()
			runtime.Gosched()
			q.Lock()
		}
		q.Unlock()
		// The round is in flight, read to published, under roundMu
		// shared: a cross round waits for it. No transaction runs while
		// the round is taken and its values read (see Batch.Hold): a
		// transaction's changes are then either all in this round or all
		// after it. roundMu comes before txMu, txMu before q.
		s.roundMu.RLock()
		s.txMu.RLock()
		if s.crossPending.Load() {
			// A transaction of several committers' keys was released:
			// its values must reach Pebble in its own round first.
			s.txMu.RUnlock()
			s.roundMu.RUnlock()
			s.crossRound(r)
			continue
		}
		round, whole := s.takeRound(q, r)
		err := s.readRound(r, whole, false)
		s.txMu.RUnlock()
		s.finishRound(q, r, round, whole, err)
		s.roundMu.RUnlock()
	}
}

// stopCross marks the cross queue stopped unless a transaction waits in
// it, and reports whether it did. Committer 0 calls it last, closing.
func (s *Store) stopCross() bool {
	cq := s.crossQueue()
	cq.Lock()
	defer cq.Unlock()
	if len(cq.ends) > 0 {
		return false
	}
	cq.stopped = true
	cq.done.Broadcast()
	return true
}

// crossRound writes the transaction waiting in the cross queue, if any, in
// a round of its own, with no other round in flight (see the top of this
// file), then lets rounds and transactions go on.
func (s *Store) crossRound(r *roundBufs) {
	s.roundMu.Lock()
	defer s.roundMu.Unlock()
	cq := s.crossQueue()
	s.txMu.RLock()
	// Another committer may have run it already. Nothing enters the
	// cross queue while txMu is read-locked (Release locks it).
	cq.Lock()
	pending := len(cq.ends) > 0
	cq.Unlock()
	if pending {
		round, _ := s.takeRound(cq, r)
		err := s.readRound(r, true, true)
		s.txMu.RUnlock()
		s.finishRound(cq, r, round, true, err)
	} else {
		s.txMu.RUnlock()
	}
	cq.Lock()
	s.crossPending.Store(false)
	cq.done.Broadcast() // Hold waits here
	cq.Unlock()
}

// takeRound takes q's keys into r, and returns the round they are and
// whether it must be one Pebble batch: in SyncAlways (one fsync for the
// round) and when it holds a transaction, whose changes must reach the
// log together.
func (s *Store) takeRound(q *commitQueue, r *roundBufs) (round uint64, whole bool) {
	q.Lock()
	defer q.Unlock()
	r.keys, q.keys = q.keys, r.keys[:0]
	r.ends, q.ends = q.ends, r.ends[:0]
	r.hints, q.hints = q.hints, r.hints[:0]
	q.bytes = 0
	q.urge = false
	whole = s.opts.Sync == SyncAlways || q.held
	q.held = false
	round = q.round
	q.round++
	q.done.Broadcast() // room in the queue again
	return round, whole
}

// readRound writes the current value of each key of r's round into its
// batch, in key order, and notes the records written in r.done; a round
// not whole is applied a slice at a time meanwhile. It returns the error
// of such an apply. cross says it is the cross round's.
func (s *Store) readRound(r *roundBufs, whole, cross bool) error {
	batch, keys, ends := r.batch, r.keys, r.ends
	batch.Reset()
	r.done = r.done[:0]
	// The round is written in key order: Pebble inserts a batch's keys
	// into its memtable (a skiplist) one after the other, reusing the
	// place it found for the previous key when the next one follows
	// it, so sorted keys cost a fraction of the search that random
	// ones do (the memtable's inserts were a quarter of the server's
	// CPU with random bucket keys).
	// Each key is sorted by its first eight bytes, kept beside its
	// position so that most comparisons read no key. The keys are
	// first spread by their first byte (the high bits of the hash
	// slot, for record keys), then each group is sorted: a sort of a
	// whole round, 8192 keys, took about a millisecond, which a
	// one-core server's replies waited for; the groups leave room for
	// the yields of commitSlice.
	keyAt := func(i int32) []byte {
		if i == 0 {
			return keys[:ends[0]]
		}
		return keys[ends[i-1]:ends[i]]
	}
	byKey := func(a, b sortKey) int {
		if c := cmp.Compare(a.prefix, b.prefix); c != 0 {
			return c
		}
		return bytes.Compare(keyAt(a.i), keyAt(b.i))
	}
	var group [257]int32 // group[b] is where the keys of first byte b start
	r.spread = r.spread[:0]
	for i := range ends {
		var p [8]byte
		copy(p[:], keyAt(int32(i)))
		k := sortKey{prefix: binary.BigEndian.Uint64(p[:]), i: int32(i)}
		r.spread = append(r.spread, k)
		group[k.prefix>>56+1]++
	}
	for b := 1; b < len(group); b++ {
		group[b] += group[b-1]
	}
	r.order = slices.Grow(r.order[:0], len(r.spread))[:len(r.spread)]
	next := group
	for _, k := range r.spread {
		r.order[next[k.prefix>>56]] = k
		next[k.prefix>>56]++
	}
	sorted := 0
	for b := range 256 {
		g := r.order[group[b]:group[b+1]]
		slices.SortFunc(g, byKey)
		if sorted += len(g); !whole && sorted >= commitSlice {
			sorted = 0
			runtime.Gosched()
		}
	}
	var err error
	for n, o := range r.order {
		if !whole && n > 0 && n%commitSlice == 0 {
			if err == nil && !batch.Empty() {
				err = s.apply(batch, pebble.NoSync)
				batch.Reset()
			}
			runtime.Gosched()
		}
		key := keyAt(o.i)
		// The record is looked for where it was when its key was
		// queued (its stripe is the key's), the key compared: it is
		// there unless it was written, evicted and its key's record made
		// anew since, which a lookup by hash then finds. The lookup was
		// half of the committer's work (three cache misses: index,
		// record, key), with the hash.
		hint := r.hints[o.i]
		st := &s.stripe[hint.stripe]
		st.mu.Lock()
		t := &st.mu.t
		ri := int(hint.rec)
		if ri >= len(t.recs) || t.recs[ri].flags&fLive == 0 || t.recs[ri].gen != hint.gen || string(t.key(&t.recs[ri])) != string(key) {
			ri = t.find(maphash.Bytes(s.seed, key), key)
		}
		// A clean record's state went out in an earlier round; only
		// dirty records are written, and nothing removes a dirty one,
		// so every record in done stays in use, for its key, until the
		// loop after Apply has looked at it.
		// In SyncAlways a dirty record unchanged since a round read it
		// (no fMod) went out in that round, whose fsync (or group, when
		// replicated) has yet to answer: a later round of the same
		// committer is acknowledged only after that round (settle), and
		// that round's settle marks it clean. The cross round writes it
		// again: the record may be another committer's, whose fsync the
		// cross round does not wait for, and a cross round of reads only
		// would otherwise write nothing and acknowledge them with no fsync
		// at all.
		if ri >= 0 && t.recs[ri].flags&(fClean|fRound) == 0 && (!s.syncsLater() || cross || t.recs[ri].flags&fMod != 0) {
			rec := &t.recs[ri]
			var err error
			if s.opts.Replicator != nil {
				r.rep.add(t.key(rec), t.val(rec), rec.flags&fDel != 0, rec.flags&fStored != 0)
			} else if rec.flags&fDel != 0 {
				err = batch.Delete(t.key(rec), nil)
			} else {
				err = batch.Set(t.key(rec), t.val(rec), nil)
			}
			if err == nil {
				// From now on fMod says whether it changed after this
				// read, and fStored whether this round leaves it.
				stored := uint8(fStored)
				if rec.flags&fDel != 0 {
					stored = 0
				}
				rec.flags = rec.flags&^(fMod|fStored) | fRound | stored
				r.done = append(r.done, written{rec: uint32(ri), stripe: hint.stripe, gen: rec.gen})
			}
		}
		st.mu.Unlock()
		if s.opts.afterKey != nil {
			s.opts.afterKey(key)
		}
	}
	return err
}

// finishRound applies the rest of r's round (with its fsync in
// SyncAlways), marks the records it wrote clean unless they changed
// meanwhile, and publishes the round as applied, and synced in
// SyncAlways, to those waiting on q. err is readRound's.
//
// In SyncAlways with several committers a committer's round does not wait
// for its fsync (3.2 ms on the development machine's disk, during which
// the committer took no keys: issue 28): it is applied without waiting
// (Pebble's ApplyNoSyncWait), and acknowledged by settle once its fsync
// returned, after the committer applied its next round, if there was one.
// Pebble's log is written in order, and each round waits for its own
// fsync, so rounds are acknowledged in order, each only once an fsync
// covered it. A cross round waits for its fsync: it is rare, and runs
// alone. One committer waits for each fsync: on one core the overlap made
// rounds smaller and more numerous, and cost about 40% more CPU per
// unpipelined request (docs/benchmarks.md).
func (s *Store) finishRound(q *commitQueue, r *roundBufs, round uint64, whole bool, err error) {
	if s.opts.Replicator != nil {
		s.finishReplicated(q, r, round, err)
		return
	}
	batch := r.batch
	opt := pebble.NoSync
	if s.opts.Sync == SyncAlways {
		opt = pebble.Sync
	}
	async := opt == pebble.Sync && s.overlap && q != s.crossQueue() && err == nil && !batch.Empty()
	t0 := s.now()
	if async {
		if err = s.failedErr(); err == nil {
			err = s.db.ApplyNoSyncWait(batch, opt)
		}
		if err == nil {
			s.syncLater(q, r, round, t0, nil)
			s.awaitLater(r)
			return
		}
	} else if err == nil && !batch.Empty() {
		err = s.apply(batch, opt)
	}
	// Nothing is acknowledged as synced before the round before it.
	s.settle(r)
	// An empty round wrote nothing: its keys went out, synced in
	// SyncAlways, in earlier rounds (of this committer, or a cross round
	// before this round began).
	if err != nil {
		if !errors.Is(err, ErrFailed) {
			s.fail(fmt.Errorf("commit %d keys: %w", len(r.done), err))
		}
	} else {
		s.stats.rounds.Add(1)
		s.stats.keysWritten.Add(int64(len(r.done)))
	}
	var over [numStripes / 64]uint64 // stripes to trim
	for i, w := range r.done {
		if !whole && i > 0 && i%commitSlice == 0 {
			runtime.Gosched()
		}
		st := &s.stripe[w.stripe]
		st.mu.Lock()
		if s.wroteLocked(st, w, err == nil) {
			over[w.stripe/64] |= 1 << (w.stripe % 64)
		}
		st.mu.Unlock()
	}
	s.trimStripes(&over)
	// Keep no big buffers until the next round: Reset drops a Pebble
	// batch's over 1 MiB, and a round of long keys leaves its own.
	batch.Reset()
	if cap(r.keys) > maxKeptKeys {
		r.keys = nil
	}
	q.Lock()
	if err == nil {
		q.applied = round
		q.appliedKeys += int64(len(r.done))
		if opt == pebble.Sync && s.failedErr() == nil {
			q.synced = round
			q.syncedKeys = q.appliedKeys
		}
	}
	q.done.Broadcast()
	q.Unlock()
}

// syncLater publishes r's round, just applied without waiting for its
// fsync, as applied, acknowledges the round before it (settle), and keeps
// this one in r.syncing for settle, the next round taking the spare batch.
// Its records stay dirty until settle: a reply in SyncAlways that reads
// one waits for its fsync (see modify), so none is clean before.
func (s *Store) syncLater(q *commitQueue, r *roundBufs, round uint64, t0 time.Time, replicated <-chan error) {
	q.Lock()
	q.applied = round
	q.appliedKeys += int64(len(r.done))
	q.syncingKeys += int64(len(r.done))
	keys := q.appliedKeys
	q.done.Broadcast()
	q.Unlock()
	s.stats.rounds.Add(1)
	s.stats.keysWritten.Add(int64(len(r.done)))
	// Before the records are released below: settle tells a record that
	// this round read again (fRound still set) from one it did not.
	s.settle(r)
	for _, w := range r.done {
		st := &s.stripe[w.stripe]
		st.mu.Lock()
		if t := &st.mu.t; int(w.rec) < len(t.recs) && t.recs[w.rec].flags&fLive != 0 && t.recs[w.rec].gen == w.gen {
			// A later round may write it again from now on.
			t.recs[w.rec].flags &^= fRound
		}
		st.mu.Unlock()
	}
	if r.spare.batch == nil {
		r.spare.batch = s.db.NewBatch()
	}
	next := r.spare
	r.spare = syncingRound{batch: r.batch, q: q, round: round, done: r.done, keys: keys, t0: t0, replicated: replicated}
	r.syncing = &r.spare
	r.batch, r.done = next.batch, next.done[:0]
	if cap(r.keys) > maxKeptKeys {
		r.keys = nil
	}
}

// awaitSync waits for the fsync of p, a round of q's committer, and wakes
// the committer, which may meanwhile wait for keys (commitLoop) or apply
// its next round. It is the only caller of p's SyncWait.
func (s *Store) awaitSync(q *commitQueue, p *syncingRound) {
	var err error
	if p.replicated != nil {
		if rerr := <-p.replicated; rerr != nil {
			err = fmt.Errorf("%w: %w", ErrNotReplicated, rerr)
		}
	} else {
		err = p.batch.SyncWait()
	}
	t1 := s.now()
	q.Lock()
	p.err, p.returned, p.t1 = err, true, t1
	q.fsyncReturned = true
	q.work.Signal()
	q.Unlock()
}

// awaitLater has the committer's waiting goroutine wait for the fsync (or
// the Replicator's answer) of r.syncing, starting it with the first round.
func (s *Store) awaitLater(r *roundBufs) {
	if r.syncs == nil {
		r.syncs = make(chan *syncingRound, 1)
		go func() {
			for p := range r.syncs {
				s.awaitSync(p.q, p)
			}
		}()
	}
	r.syncs <- r.syncing
}

// settle waits for the fsync of r.syncing's round, if any, then marks
// the records it wrote clean unless a later round wrote them again or
// they changed since, and publishes the round as synced. After a failed
// fsync, or once the store failed, it publishes nothing: no round is
// acknowledged after a failed one.
func (s *Store) settle(r *roundBufs) {
	p := r.syncing
	if p == nil {
		return
	}
	r.syncing = nil
	q := p.q
	q.Lock()
	for !p.returned {
		q.work.Wait() // awaitSync signals it
	}
	err := p.err
	q.fsyncReturned = false
	q.Unlock()
	if err == nil {
		err = s.failedErr()
	}
	if errors.Is(err, ErrNotReplicated) {
		s.lose(q, p.done, p.round, err) // its records dropped: not dirty
		q.Lock()
		q.syncingKeys -= int64(len(p.done))
		q.Unlock()
		p.batch.Reset()
		return
	}
	if err != nil {
		if !errors.Is(err, ErrFailed) {
			s.fail(fmt.Errorf("sync %d keys: %w", len(p.done), err))
		}
		// The records stay dirty: nothing marks them clean, and the store
		// writes nothing more.
		p.batch.Reset()
		return
	}
	// Its time is the fsync's, from the apply to its return: the
	// committer may come back to it later.
	s.noteSync(p.t0, p.t1)
	var over [numStripes / 64]uint64 // stripes to trim
	for _, w := range p.done {
		st := &s.stripe[w.stripe]
		st.mu.Lock()
		// Written again by a later round (fRound), or clean already (a
		// cross round wrote it since, and synced), it is not this
		// round's to mark.
		if t := &st.mu.t; int(w.rec) < len(t.recs) && t.recs[w.rec].flags&(fRound|fClean) == 0 && s.wroteLocked(st, w, true) {
			over[w.stripe/64] |= 1 << (w.stripe % 64)
		}
		st.mu.Unlock()
	}
	s.trimStripes(&over)
	p.batch.Reset()
	q.Lock()
	q.syncingKeys -= int64(len(p.done))
	if s.failedErr() == nil {
		q.synced = p.round
		q.syncedKeys = p.keys
	}
	q.done.Broadcast()
	q.Unlock()
}

// trimStripes trims each stripe set in over back to its share.
func (s *Store) trimStripes(over *[numStripes / 64]uint64) {
	for i, m := range over {
		for ; m != 0; m &= m - 1 {
			st := &s.stripe[i*64+bits.TrailingZeros64(m)]
			st.mu.Lock()
			st.mu.t.trim(s.byteLimit)
			st.mu.Unlock()
		}
	}
}

// written names a record a round wrote by position, not by pointer (the
// table holds none): it stays in use, dirty, at least until the committer
// has looked at it after the round (nothing removes a dirty record), and
// gen tells a reuse if that ever changed.
type written struct {
	rec    uint32
	stripe uint16
	gen    uint16
}

const (
	// maxKeptKeys is the largest key buffer the committer and the queue
	// keep between rounds; with short keys a full queue fits.
	maxKeptKeys = 4 << 20
	// maxKeptBatch is the same for a Batch, which each connection keeps.
	maxKeptBatch = 64 << 10
)

// wroteLocked ends a round for the record of w: it may be written again
// by the next round, and if applied (Pebble has the value the round read)
// and not changed since, it is clean, and stays cached unless it is a
// delete or bigger than the stripe's share. It reports whether the stripe
// is over its share, for the committer to trim once the round is done.
// st must be locked.
func (s *Store) wroteLocked(st *stripe, w written, applied bool) (over bool) {
	t := &st.mu.t
	if int(w.rec) >= len(t.recs) {
		return false // never: see written
	}
	r := &t.recs[w.rec]
	if r.flags&fLive == 0 || r.gen != w.gen {
		return false // never: see written
	}
	r.flags &^= fRound
	if !applied || r.flags&fMod != 0 {
		return false // still dirty: its newer value is queued for a later round
	}
	r.flags |= fClean
	st.dirty.Add(-1)
	// A deleted record is not worth a cache slot: deletes come from the
	// sweep, for records nobody uses. A record bigger than the stripe's
	// share is never cached.
	if s.byteLimit <= 0 || r.flags&fDel != 0 || t.size(r) > s.byteLimit {
		t.remove(int(w.rec))
	}
	// Dirty records (the sweep's deletes too), or values that grew, may
	// have taken the stripe over its share: the committer trims it back
	// once per round and stripe (trimming per record compacted the stripe
	// once per record). The records the round wrote stay for the CLOCK
	// hand to choose from, so that those in use outlive those not used
	// since it last passed: removing each as it turned clean gave back no
	// capacity before the trim, so every record the round wrote to the
	// stripe went, hot ones included.
	return s.byteLimit > 0 && t.bytes() > s.byteLimit
}

// sortKey is a key of a round, for sorting: its first eight bytes
// (big-endian, zero-padded) and its position.
type sortKey struct {
	prefix uint64
	i      int32
}

// commitSlice is how many keys of a round the committer handles before it
// lets the connections run. On one core (taskset -c 0, a pod with
// cpu: 1) a write-behind round of writeBehindKeys keys, read, applied to
// Pebble and marked clean in one go, held the only P for milliseconds, and
// every connection's reply waited behind it: the unpipelined benchmark's
// p99 was twice the Lua bucket's. So a round that need not be one Pebble
// batch (see whole in commitLoop) is applied a slice at a time, with a
// yield between slices. A crash between slices loses no more than the mode
// allows: nothing in SyncEverySec and SyncNo is acknowledged as synced
// before the round's end.
const commitSlice = 256

// apply writes batch to Pebble, unless the store has failed.
func (s *Store) apply(batch *pebble.Batch, opt *pebble.WriteOptions) error {
	if err := s.failedErr(); err != nil {
		return err
	}
	t0 := s.now()
	err := s.db.Apply(batch, opt)
	if err == nil && opt == pebble.Sync {
		s.noteSync(t0, s.now())
	}
	return err
}

// fail makes the store refuse every change from now on, and tells Failed's
// channel.
func (s *Store) fail(err error) {
	s.stats.writeErrors.Add(1)
	if s.failed.CompareAndSwap(nil, &err) {
		if s.guard.armed.Load() { // while opening, Open reports it
			s.log.Error("store failed: nothing more is written or acknowledged; restart to replay the log", "dir", s.dir, "err", err)
		}
		close(s.failedC)
	}
	s.broadcastDone()
}

// noteSync counts an fsync of the log begun at t0 and returned at t1
// (FsyncTime adds up their durations), which covers what was
// written before t0: the time of the last fsync (lastSync) is t0, the
// latest of them, so that everything written before it survives a crash.
// Not the time the fsync returned: in SyncAlways a committer writes its
// next round while a round's fsync runs (finishRound), and another
// committer may write at any time.
func (s *Store) noteSync(t0, t1 time.Time) {
	s.stats.fsyncs.Add(1)
	s.stats.fsyncNanos.Add(int64(t1.Sub(t0)))
	ms := t0.UnixMilli()
	for {
		last := s.stats.lastSync.Load()
		if last >= ms || s.stats.lastSync.CompareAndSwap(last, ms) {
			return
		}
	}
}

// now is Options.now, or the wall clock.
func (s *Store) now() time.Time {
	if s.opts.now != nil {
		return s.opts.now()
	}
	return time.Now()
}

// syncLoop, once per SyncInterval, has the committer write what is queued
// (write-behind: between ticks, changed keys wait in the table, see
// dueLocked), then in SyncEverySec makes everything applied durable. It
// syncs only when something was applied since the last sync, so an idle
// server does no I/O. In SyncNo it only writes: sluice never syncs.
func (s *Store) syncLoop() {
	defer close(s.syncerDone)
	t := time.NewTicker(s.opts.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-s.syncerStop:
			return
		case <-t.C:
			// An error means the store is closing, failed or cannot write
			// now (the guard retries, and the next tick tries again):
			// nothing to sync that was not synced.
			if err := s.Flush(); err != nil {
				continue
			}
			if s.opts.Sync != SyncEverySec || s.opts.Replicator != nil {
				continue // replicated rounds are synced by their group
			}
			if err := s.syncApplied(); err != nil {
				s.fail(fmt.Errorf("sync log: %w", err))
			}
		}
	}
}

// syncApplied fsyncs the log if rounds were applied since the last sync.
// One fsync covers every committer's rounds: they share Pebble's log.
func (s *Store) syncApplied() error {
	type progress struct {
		applied uint64
		keys    int64
	}
	var (
		stack   [MaxCommitters + 1]progress
		seen    = stack[:len(s.queues)]
		pending bool
	)
	for i, q := range s.queues {
		q.Lock()
		seen[i] = progress{q.applied, q.appliedKeys}
		pending = pending || q.applied > q.synced
		q.Unlock()
	}
	if !pending || s.failedErr() != nil {
		return nil
	}
	t0 := s.now()
	if err := s.db.LogData(nil, pebble.Sync); err != nil {
		return err
	}
	s.noteSync(t0, s.now())
	for i, q := range s.queues {
		q.Lock()
		if p := seen[i]; p.applied > q.synced {
			q.synced = p.applied
			q.syncedKeys = p.keys
		}
		q.done.Broadcast()
		q.Unlock()
	}
	return nil
}
