package storage

import (
	"errors"
	"fmt"
	"hash/maphash"
	"io"

	"github.com/cockroachdb/pebble/v2"
)

// Op is what a Mutator wants done with its key.
type Op int

const (
	Keep   Op = iota // leave the record as it is
	Put              // store the returned value
	Delete           // remove the record
)

// A Mutator computes a record's new value from its current one. Mutate runs
// with the key's lock held, so it must be quick and must not call the Store.
// old is valid only during the call. The returned value is copied.
type Mutator interface {
	Mutate(old []byte, found bool) (val []byte, op Op, err error)
}

// Batch collects the keys one goroutine changes between Commits. Reuse it:
// its buffers are kept.
type Batch struct {
	s     *Store
	keys  []byte
	ends  []int
	notes []noted // beside ends: each key's committer and record size
	bytes int     // the noted records' sizes, charged to the queues
	// mixed says the keys belong to more than one committer.
	mixed bool
	// hold is the stripes a held Batch has locked (see Hold); nil when
	// not held.
	hold *held
	// queued is how many changes Release handed to the committers that
	// Commit has not waited for yet; tickets[i] is the round of queue i
	// that takes the last of them (0: none), a committer's or the cross
	// queue.
	queued  int
	tickets []uint64
	// count is scratch for Commit: keys per committer.
	count []int
	// lost is the error Commit owes for a transaction Release dropped
	// (see modify).
	lost error
	// dropped is the store's count of record drops (Store.dropped) when
	// the Batch noted its first change: with replicated records, a change
	// made before a drop and queued after it may have been dropped with
	// its record, which its round then finds gone and acknowledges.
	// stale says the Batch queued a change after such a drop.
	dropped uint64
	stale   bool
}

// held is the stripes a held Batch has locked: a bit per stripe, and their
// indexes in the order taken.
type held struct {
	bits [numStripes / 64]uint64
	idx  []uint16
	// closed says a change was refused because the store closed while
	// the transaction ran: Release drops the changes made before it.
	closed bool
}

// noted is a noted key's committer, the bytes its record is charged, and
// where its record was (see readRound).
type noted struct {
	committer int
	size      int
	hint      written
}

// hint names the record at ri of table t, of the stripe of hash h.
func (s *Store) hint(h uint64, t *table, ri int) written {
	return written{rec: uint32(ri), stripe: uint16(h % numStripes), gen: t.recs[ri].gen}
}

// NewBatch returns an empty Batch.
func (s *Store) NewBatch() *Batch {
	return &Batch{s: s, tickets: make([]uint64, len(s.queues))}
}

// Modify runs m on key's current value under key's lock and applies its
// result. The change is visible to every reader at once; it is handed to the
// committer by Commit. An error from m, or from reading the store, is
// returned and nothing changes.
func (b *Batch) Modify(key []byte, m Mutator) error {
	_, err := b.modify(key, m, true)
	return err
}

// modify is Modify. With cache false, as for the sweep, a record read from
// Pebble is not kept in memory and a change evicts nothing: a delete, all
// the sweep writes, goes once written, and the trims meanwhile evict no
// clean record to make room for it (see wroteLocked and trim), so a pass
// over cold records leaves the hot ones cached.
func (b *Batch) modify(key []byte, m Mutator, cache bool) (Op, error) {
	s := b.s
	if b.hold != nil {
		// A transaction is refused only when the store is closed, which
		// Shutdown does only between transactions unless its deadline
		// passed (then Release drops the changes made before). A failure
		// or a disk refusing writes does not stop it midway: its changes
		// are queued with the rest, and Commit's error answers for all.
		if s.closed.Load() {
			b.hold.closed = true
			return Keep, ErrClosed
		}
	} else if err := s.usable(); err != nil {
		return Keep, err
	}
	if len(key) > 0 && key[0] == recordsEnd[0] {
		return Keep, fmt.Errorf("%w: key %q", ErrReservedKey, key)
	}
	h := maphash.Bytes(s.seed, key)
	st := s.stripeOf(h)
	if b.hold == nil {
		st.mu.Lock()
		defer st.mu.Unlock()
	} else {
		b.lockStripe(h % numStripes)
	}
	t := &st.mu.t
	ri := t.find(h, key)
	var (
		val     []byte
		op      Op
		err     error
		existed bool
	)
	fill := cache && s.byteLimit > 0
	if ri >= 0 {
		st.mu.hits++
		r := &t.recs[ri]
		r.flags |= fRef
		existed = r.flags&fDel == 0
		val, op, err = m.Mutate(t.val(r), existed)
	} else {
		st.mu.misses++
		var (
			old    []byte
			closer io.Closer
			gerr   error
		)
		if s.filter != nil && !s.filter.MayContain(h) {
			st.mu.skips++
			gerr = pebble.ErrNotFound
		} else {
			old, closer, gerr = s.db.Get(key)
		}
		switch {
		case gerr == nil:
			// val may alias old: release Pebble's buffer only after val
			// has been copied.
			defer closer.Close()
			existed = true
			val, op, err = m.Mutate(old, true)
			if err == nil && op == Keep && fill && t.makeRoom(s.byteLimit, len(key), len(old)) {
				ri = t.insert(h, key, len(old))
				t.setVal(ri, old)
				t.recs[ri].flags |= fClean | fStored
			}
		case errors.Is(gerr, pebble.ErrNotFound):
			val, op, err = m.Mutate(nil, false)
			if err == nil && op == Keep && fill && t.makeRoom(s.byteLimit, len(key), 0) {
				ri = t.insert(h, key, 0)
				t.recs[ri].flags |= fDel | fClean
			}
		default:
			s.stats.readErrors.Add(1)
			return Keep, fmt.Errorf("storage: read: %w", gerr)
		}
	}
	if err != nil {
		return Keep, err
	}
	if op == Keep {
		// In SyncAlways a reply may only reflect fsynced state: a read of a
		// change not yet synced waits for it, like the write's own reply.
		if ri >= 0 && t.recs[ri].flags&fClean == 0 && s.opts.Sync == SyncAlways {
			b.note(key, t.size(&t.recs[ri]), s.hint(h, t, ri))
		}
		return Keep, nil
	}
	if op == Delete && !existed {
		return Keep, nil // nothing to delete
	}
	if b.hold == nil {
		if err := s.guard.unavailable(); err != nil {
			return op, err
		}
	}
	vlen := len(val)
	if op == Delete {
		vlen = 0
	}
	if ri < 0 {
		if fill {
			// If there is no room the record is kept only until its write
			// is done, as with the cache off.
			t.makeRoom(s.byteLimit, len(key), vlen)
		}
		ri = t.insert(h, key, vlen)
		t.recs[ri].flags |= fClean // turned dirty just below
		if existed {
			// Pebble holds it: read just above.
			t.recs[ri].flags |= fStored
		}
	}
	if t.recs[ri].flags&fClean != 0 {
		t.recs[ri].flags &^= fClean
		st.dirty.Add(1)
	}
	// Under the stripe lock, so that a transaction holding every stripe
	// sees every write that has begun (see Watch).
	if s.watching.Load() != 0 {
		s.partitionMods[s.partitionOf(key)].Add(1)
	}
	switch {
	case op == Put && !existed:
		st.mu.records[s.classOf(key)]++
	case op == Delete:
		st.mu.records[s.classOf(key)]--
	}
	if op == Put && s.filter != nil {
		s.filter.Add(h) // before the committer can write it
	}
	if op == Delete {
		t.recs[ri].flags |= fDel | fMod
		t.recs[ri].vlen = 0
	} else {
		t.setVal(ri, val) // may move the value: after it, no r from before
		t.recs[ri].flags = t.recs[ri].flags&^fDel | fMod
	}
	b.note(key, t.size(&t.recs[ri]), s.hint(h, t, ri))
	return op, nil
}

// Hold starts a transaction on the Batch: from now until Release, each
// Modify keeps its key's stripe locked instead of unlocking it, so no other
// goroutine reads or changes a key the transaction has touched until it is
// over (two-phase locking), and the committer takes none of the Batch's
// changes before Release hands them over, all in one round. Transactions
// run one at a time; the store's other users hold one stripe at a time and
// wait for nothing while they do, so the locks cannot deadlock. With all
// set, Hold also locks every stripe at once, for a transaction that must
// see no write in flight (WatchChanged).
//
// A held Batch must not be used otherwise (Stats, Records, Flush, Scan,
// Checkpoint) by the goroutine holding it, before Release: those wait for
// stripe locks it holds, or for the committer, which waits for the
// transaction. Commit refuses a held Batch (ErrHeld) rather than wait.
func (b *Batch) Hold(all bool) {
	s := b.s
	for {
		s.txMu.Lock()
		if !s.crossPending.Load() {
			break
		}
		// The last cross transaction is not written yet: its round must
		// not read this one's values (see committer.go).
		s.txMu.Unlock()
		cq := s.crossQueue()
		cq.Lock()
		for s.crossPending.Load() {
			cq.done.Wait()
		}
		cq.Unlock()
	}
	if b.hold == nil {
		b.hold = &held{}
	}
	if all {
		for i := range uint64(numStripes) {
			b.lockStripe(i)
		}
	}
}

// lockStripe locks stripe i for the held Batch unless it holds it already.
func (b *Batch) lockStripe(i uint64) {
	h := b.hold
	if h.bits[i/64]&(1<<(i%64)) != 0 {
		return
	}
	b.s.stripe[i].mu.Lock()
	h.bits[i/64] |= 1 << (i % 64)
	h.idx = append(h.idx, uint16(i))
}

// Release ends the transaction Hold began: it hands the Batch's changes to
// the committer as one unit, which the next round takes whole, and unlocks
// the stripes. It does not wait for durability: Commit does, as for any
// change. Release does not wait for room in the commit queue (the
// committer may need a stripe the Batch holds to make room), so a
// transaction may overfill the queue by its own size, which the server
// bounds.
func (b *Batch) Release() {
	s := b.s
	if b.hold == nil {
		return
	}
	if b.hold.closed {
		// Part of the transaction was refused: none of it goes to the
		// log. Its changes stay in memory, dirty, never acknowledged;
		// they count in Len until Commit reports their loss.
		b.queued += len(b.ends)
		b.reset()
		b.lost = ErrClosed
	}
	if len(b.ends) > 0 {
		// A transaction of one committer's keys is that committer's
		// like any change; one of several committers' goes to the cross
		// queue, and no committer reads a round until it is written.
		c := b.notes[0].committer
		if b.mixed {
			c = s.committers
		}
		q := s.queues[c]
		q.Lock()
		b.queued += len(b.ends)
		if q.stopped {
			b.lost = ErrClosed // Commit reports it
		} else {
			b.tickets[c] = b.enqueueLocked(q, c)
			q.held = true
			if b.mixed {
				s.crossPending.Store(true)
			}
		}
		q.Unlock()
		b.reset()
		if c == s.committers {
			s.wakeCrossRunner()
		}
	}
	h := b.hold
	for _, i := range h.idx {
		s.stripe[i].mu.Unlock()
	}
	h.idx = h.idx[:0]
	clear(h.bits[:])
	h.closed = false
	b.hold = nil
	s.txMu.Unlock()
}

// Watch starts counting the writes of every partition (see
// PartitionWrites);
// each call needs an Unwatch. Writes are counted only while someone
// watches, so the cost of WATCH falls on its users: other writes pay one
// atomic load.
func (s *Store) Watch() { s.watching.Add(1) }

// Unwatch undoes one Watch.
func (s *Store) Unwatch() { s.watching.Add(-1) }

// PartitionWrites returns the number of writes counted for partition p
// (Options.Partition's) while anyone watched. A watcher compares two
// readings: between a Watch and a Hold(true), a write to a record of the
// partition that began after the Watch changes the count.
func (s *Store) PartitionWrites(p int) uint64 {
	return s.partitionMods[uint(p)%uint(len(s.partitionMods))].Load()
}

// note records that key must be committed before Commit returns, and
// charges the queue size bytes, its record's size (see table.size).
//
// Every change is noted, even of a key another Batch has noted already:
// a change must not depend on another Batch's commit (that Batch may not
// commit for a while, or ever), and each note charges the queue, which
// bounds its memory. Write-behind is the committer's: in SyncEverySec and
// SyncNo it takes the queue once per tick, and a round writes each key
// once, with its newest value (fRound).
func (b *Batch) note(key []byte, size int64, hint written) {
	if len(b.notes) == 0 && b.queued == 0 {
		b.dropped = b.s.dropped.Load()
	}
	c := b.s.committerOf(key)
	if len(b.notes) > 0 && b.notes[0].committer != c {
		b.mixed = true
	}
	b.keys = append(b.keys, key...)
	b.ends = append(b.ends, len(b.keys))
	b.notes = append(b.notes, noted{committer: c, size: int(size), hint: hint})
	b.bytes += int(size)
}

// Keys calls fn with the key of each change the Batch holds, in order;
// fn must not keep it.
func (b *Batch) Keys(fn func(key []byte)) {
	start := 0
	for _, end := range b.ends {
		fn(b.keys[start:end])
		start = end
	}
}

// Pending reports whether the Batch holds changes not yet committed.
func (b *Batch) Pending() bool {
	return len(b.ends) > 0 || b.queued > 0 || b.lost != nil
}

// Len returns how many changes the Batch holds, counting those Release
// handed over that Commit has not waited for.
func (b *Batch) Len() int { return len(b.ends) + b.queued }

// Full reports whether the Batch holds a quarter of the commit queue's
// bounds (MaxQueued, MaxQueuedBytes) or more: a caller that keeps adding to
// it, as a long pipeline does, should commit it now, so that what waits in
// memory for the committer stays near the bounds however large the values.
func (b *Batch) Full() bool {
	o := &b.s.opts
	return len(b.ends) >= o.MaxQueued/4 || b.bytes >= o.MaxQueuedBytes/4
}

// Commit hands the Batch's changes to the committers and returns when they
// are as durable as the mode promises: fsynced for SyncAlways; queued for the
// others, blocking only while a queue is full. It empties the Batch.
func (b *Batch) Commit() error {
	if b.hold != nil {
		return ErrHeld
	}
	if b.lost != nil {
		err := b.lost
		b.lost, b.queued, b.stale = nil, 0, false
		clear(b.tickets)
		return err
	}
	if len(b.ends) == 0 && b.queued == 0 {
		return nil
	}
	b.queued = 0
	err := b.enqueue()
	b.reset()
	if err != nil {
		clear(b.tickets)
		b.stale = false
		return err
	}
	err = b.wait()
	if b.stale {
		b.stale = false
		if err == nil {
			err = errDroppedMeanwhile
		}
	}
	return err
}

// errDroppedMeanwhile is Commit's error for a Batch whose changes were
// made before records were dropped (DiscardDirty, lose) and queued after:
// they may have been dropped with their records.
var errDroppedMeanwhile = fmt.Errorf("%w: records were dropped while its changes were made, when this node lost its group's leadership", ErrNotReplicated)

// enqueue hands the Batch's changes to their committers' queues, each once
// they fit there, and notes the round of each in tickets.
func (b *Batch) enqueue() error {
	if len(b.ends) == 0 {
		return nil // Release queued them
	}
	s := b.s
	if !b.mixed {
		c := b.notes[0].committer
		return b.enqueueTo(c, len(b.ends), b.bytes)
	}
	if len(b.count) < 2*s.committers {
		b.count = make([]int, 2*s.committers)
	}
	n, bytes := b.count[:s.committers], b.count[s.committers:]
	clear(b.count)
	for _, nt := range b.notes {
		n[nt.committer]++
		bytes[nt.committer] += nt.size
	}
	for c := range n {
		if n[c] == 0 {
			continue
		}
		if err := b.enqueueTo(c, n[c], bytes[c]); err != nil {
			return err
		}
	}
	return nil
}

// enqueueTo hands committer c the Batch's changes of its keys, n keys of
// bytes in all, once they fit in its queue.
func (b *Batch) enqueueTo(c, n, bytes int) error {
	s := b.s
	q := s.queues[c]
	q.Lock()
	defer q.Unlock()
	// While writes to the disk fail, or after the store failed, the
	// committer cannot drain the queue: queue anyway rather than wait, since
	// the changes are already visible and modify refuses new ones, and tell
	// the caller.
	// A batch waits until it fits beside what is queued; one that does not
	// fit even an empty queue goes in once the queue is empty.
	for len(q.ends) > 0 && (len(q.ends)+n > q.maxKeys || q.bytes+bytes > q.maxBytes) && !q.closing && s.guard.failing.Load() == 0 && s.failed.Load() == nil {
		q.urge = true
		q.work.Signal()
		q.done.Wait()
	}
	if q.stopped {
		return ErrClosed
	}
	b.tickets[c] = b.enqueueLocked(q, c)
	return nil
}

// enqueueLocked hands the Batch's changes of committer c's keys (every
// change, for the cross queue) to q, and returns the round that will take
// them. q must be locked and not stopped.
func (b *Batch) enqueueLocked(q *commitQueue, c int) uint64 {
	s := b.s
	// Under q's lock, as a drop marks q's queued rounds lost: a change
	// queued before that is failed by it, one queued after a drop that
	// began since the change was made is failed by Commit.
	if s.opts.Replicator != nil && s.dropped.Load() != b.dropped {
		b.stale = true
	}
	if c == s.committers || !b.mixed {
		// Every change: the keys in one copy.
		base := len(q.keys)
		q.keys = append(q.keys, b.keys...)
		for i, e := range b.ends {
			q.ends = append(q.ends, base+e)
			q.hints = append(q.hints, b.notes[i].hint)
		}
		q.bytes += b.bytes
	} else {
		start := 0
		for i, e := range b.ends {
			if nt := b.notes[i]; nt.committer == c {
				q.keys = append(q.keys, b.keys[start:e]...)
				q.ends = append(q.ends, len(q.keys))
				q.hints = append(q.hints, nt.hint)
				q.bytes += nt.size
			}
			start = e
		}
	}
	if s.dueLocked(q) && c < s.committers {
		q.work.Signal()
	}
	return q.round
}

// wait waits until the rounds in tickets are as durable as the mode
// promises, and clears them.
func (b *Batch) wait() error {
	s := b.s
	if s.opts.Sync != SyncAlways {
		clear(b.tickets)
		if err := s.failedErr(); err != nil {
			return err
		}
		return s.guard.unavailable()
	}
	var err error
	for c, ticket := range b.tickets {
		if ticket == 0 {
			continue
		}
		b.tickets[c] = 0
		if err == nil {
			err = s.waitSynced(s.queues[c], ticket)
		}
	}
	return err
}

// waitSynced waits until round ticket of q is fsynced.
func (s *Store) waitSynced(q *commitQueue, ticket uint64) error {
	q.Lock()
	defer q.Unlock()
	for {
		// A failure first: after one, synced no longer moves, and a round
		// that failed must never be reported as synced.
		if err := s.failedErr(); err != nil {
			return err
		}
		if q.synced < ticket {
			if err := s.guard.unavailable(); err != nil {
				return err // the change stays queued and is written later
			}
		}
		if err := lostLocked(q, ticket); err != nil {
			return err
		}
		if q.synced >= ticket {
			return nil
		}
		if q.stopped {
			return ErrClosed
		}
		q.done.Wait()
	}
}

func (b *Batch) reset() {
	if cap(b.keys) > maxKeptBatch {
		b.keys = nil // long keys: a connection does not keep their buffer
	}
	b.keys = b.keys[:0]
	b.ends = b.ends[:0]
	b.notes = b.notes[:0]
	b.bytes = 0
	b.mixed = false
}
