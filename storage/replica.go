package storage

import (
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"

	"github.com/cockroachdb/pebble/v2"
)

// The hook of the replication package into the store: keys of its own, in
// the same Pebble database as the records, and batches that write them
// together with records.
//
// Its keys start with ReplicaPrefix, which is among the store's own keys
// (from 0xff on, after recordsEnd), so that nothing that walks the records
// (the sweep, Scan, Inspect, the count and key filter at Open, the upgrade,
// a cluster migration's paging, DEL of a key's records) ever sees one. A
// ReplicaBatch writes such keys and records in one atomic Pebble batch:
// the Raft log with its hard state, synced (one fsync per Raft Ready), or
// the records of an applied round with the group's applied index, not
// synced, since the log is the record and a restart applies it again.

// ReplicaPrefix starts every key of the replication package.
const ReplicaPrefix = "\xffsluice.raft."

// replicaEnd bounds the keys starting with ReplicaPrefix.
var replicaEnd = []byte("\xffsluice.raft/") // '/' follows '.'

// ErrNotReplicaKey refuses a key outside the range a call works on: a
// replication key that does not start with ReplicaPrefix, or a record key
// that starts with 0xff.
var ErrNotReplicaKey = errors.New("storage: key outside the range of the call")

// readLock keeps Pebble open until unlock is called, or returns why the
// store cannot be used.
func (s *Store) readLock() (unlock func(), err error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	s.closeMu.RLock()
	if s.dbClosed {
		s.closeMu.RUnlock()
		return nil, ErrClosed
	}
	return s.closeMu.RUnlock, nil
}

// replicaKey reports whether k starts with ReplicaPrefix.
func replicaKey(k []byte) bool { return bytes.HasPrefix(k, []byte(ReplicaPrefix)) }

// ReplicaBatch is an atomic write of replication keys and records. It
// belongs to one goroutine; reuse it after Reset.
type ReplicaBatch struct {
	s *Store
	b *pebble.Batch
	// The records it writes, back to back, for the hot-state table and
	// the record counts once the batch is in Pebble.
	keys []byte
	recs []replicaRec
}

type replicaRec struct {
	end   int    // end of its key in keys
	h     uint64 // its key's hash
	put   bool   // else a delete
	own   bool   // a round of this node's committer (see Record)
	prior Prior
}

// NewReplicaBatch returns an empty batch.
func (s *Store) NewReplicaBatch() *ReplicaBatch {
	return &ReplicaBatch{s: s, b: s.db.NewBatch()}
}

// Set writes val under the replication key key.
func (b *ReplicaBatch) Set(key, val []byte) error {
	if !replicaKey(key) {
		return fmt.Errorf("%w: %q does not start with ReplicaPrefix", ErrNotReplicaKey, key)
	}
	return b.b.Set(key, val, nil)
}

// Delete removes the replication key key.
func (b *ReplicaBatch) Delete(key []byte) error {
	if !replicaKey(key) {
		return fmt.Errorf("%w: %q does not start with ReplicaPrefix", ErrNotReplicaKey, key)
	}
	return b.b.Delete(key, nil)
}

// DeleteRange removes the replication keys in [lower, upper).
func (b *ReplicaBatch) DeleteRange(lower, upper []byte) error {
	if !replicaKey(lower) || (!replicaKey(upper) && !bytes.Equal(upper, replicaEnd)) {
		return fmt.Errorf("%w: [%q, %q) is not within ReplicaPrefix", ErrNotReplicaKey, lower, upper)
	}
	return b.b.DeleteRange(lower, upper, nil)
}

// PutRecord writes the record key with value val, as a snapshot installs
// it; whether it existed before is read when the batch is committed.
func (b *ReplicaBatch) PutRecord(key, val []byte) error {
	return b.Record(ReplicaOp{Key: key, Value: val}, false)
}

// DeleteRecord removes the record key, if there is one.
func (b *ReplicaBatch) DeleteRecord(key []byte) error {
	return b.Record(ReplicaOp{Key: key, Delete: true}, false)
}

// Record writes a change of a round as a replica applies it: the bytes
// the leader decided, never recomputed. The record counts follow op.Prior
// (a change of PriorUnknown reads whether the record exists when the batch
// is committed). If own, the change is of a round that this node's
// committer handed to the Replicator and still waits for: the table's
// record, if there is one, is left as it is (it holds that value, or a
// later change of its own), and the record counts too (the change counted
// them when it was made).
func (b *ReplicaBatch) Record(op ReplicaOp, own bool) error {
	if len(op.Key) == 0 || op.Key[0] == recordsEnd[0] {
		return fmt.Errorf("%w: record key %q", ErrNotReplicaKey, op.Key)
	}
	var err error
	if op.Delete {
		err = b.b.Delete(op.Key, nil)
	} else {
		err = b.b.Set(op.Key, op.Value, nil)
	}
	if err != nil {
		return err
	}
	b.keys = append(b.keys, op.Key...)
	b.recs = append(b.recs, replicaRec{end: len(b.keys), h: maphash.Bytes(b.s.seed, op.Key), put: !op.Delete, own: own, prior: op.Prior})
	return nil
}

// Len returns the bytes the batch holds.
func (b *ReplicaBatch) Len() int { return b.b.Len() }

// Empty reports whether the batch holds nothing.
func (b *ReplicaBatch) Empty() bool { return b.b.Empty() }

// Reset empties the batch for reuse.
func (b *ReplicaBatch) Reset() {
	b.b.Reset()
	b.keys, b.recs = b.keys[:0], b.recs[:0]
}

// Close releases the batch; it must not be used afterwards.
func (b *ReplicaBatch) Close() error { return b.b.Close() }

// Commit writes the batch to Pebble at once, all of it or nothing, synced
// if sync is set, and leaves it empty. The records it writes are then what
// every reader sees: the key filter learns new keys, a cached copy is
// replaced, and the record counts follow. The store's own writes of the same
// records (Modify) are not ordered with it: a follower applies rounds and
// runs no commands, and whichever reaches Pebble last stays.
func (b *ReplicaBatch) Commit(sync bool) error {
	s := b.s
	unlock, err := s.readLock()
	if err != nil {
		return err
	}
	defer unlock()
	// Whether each record of unknown Prior existed before, for the
	// counts: read before the batch lands. The leader's rounds say it.
	start := 0
	for i := range b.recs {
		r := &b.recs[i]
		key := b.keys[start:r.end]
		start = r.end
		if r.prior != PriorUnknown {
			continue
		}
		ok, err := s.exists(key, r.h)
		if err != nil {
			return err
		}
		r.prior = PriorAbsent
		if ok {
			r.prior = PriorPresent
		}
	}
	if s.filter != nil {
		// The key filter learns the new keys before a reader can find
		// them in Pebble, in a pass of their own: a key's words are
		// mostly in no cache, and their loads overlap.
		for _, r := range b.recs {
			if r.put {
				s.filter.Add(r.h)
			}
		}
	}
	opt := pebble.NoSync
	if sync {
		opt = pebble.Sync
	}
	if err := s.db.Apply(b.b, opt); err != nil {
		s.stats.writeErrors.Add(1)
		return fmt.Errorf("storage: replica write: %w", err)
	}
	if sync {
		s.stats.fsyncs.Add(1)
	}
	start = 0
	for _, r := range b.recs {
		key := b.keys[start:r.end]
		start = r.end
		s.replicated(key, r.h, r.put, r.own, r.prior == PriorPresent)
	}
	b.Reset()
	return nil
}

// exists reports whether the record key, of hash h, exists, as a reader
// would see it.
func (s *Store) exists(key []byte, h uint64) (bool, error) {
	st := s.stripeOf(h)
	st.mu.Lock()
	if ri := st.mu.t.find(h, key); ri >= 0 {
		ok := st.mu.t.recs[ri].flags&fDel == 0
		st.mu.Unlock()
		return ok, nil
	}
	st.mu.Unlock()
	if s.filter != nil && !s.filter.MayContain(h) {
		return false, nil
	}
	_, closer, err := s.db.Get(key)
	switch {
	case err == nil:
		closer.Close()
		return true, nil
	case errors.Is(err, pebble.ErrNotFound):
		return false, nil
	}
	s.stats.readErrors.Add(1)
	return false, fmt.Errorf("storage: read: %w", err)
}

// replicated brings the hot-state table and the record counts in line
// with a record, of hash h, that Pebble now holds (put) or no longer
// holds, and held before if existed. A change of this node's own round
// (own) leaves a record of the table alone: it holds the change, or a
// later one.
func (s *Store) replicated(key []byte, h uint64, put, own, existed bool) {
	st := s.stripeOf(h)
	st.mu.Lock()
	defer st.mu.Unlock()
	t := &st.mu.t
	ri := t.find(h, key)
	if own && ri >= 0 {
		return
	}
	if ri >= 0 {
		// The counts follow what readers saw: the table's record.
		existed = t.recs[ri].flags&fDel == 0
	}
	switch {
	case put && !existed:
		st.mu.records[s.classOf(key)]++
	case !put && existed:
		st.mu.records[s.classOf(key)]--
	}
	if ri < 0 {
		return
	}
	if t.recs[ri].flags&fClean != 0 {
		// A clean copy is dropped: the next read finds Pebble's value.
		t.remove(ri)
		return
	}
	// A dirty one is on its way to the committer, which writes whatever
	// the record holds when it takes it: make that the replicated state.
	if !put {
		t.recs[ri].flags = t.recs[ri].flags&^fStored | fDel | fMod
		t.recs[ri].vlen = 0
		return
	}
	v, closer, err := s.db.Get(key)
	if err != nil {
		t.remove(ri) // cannot be: the batch has just put it
		return
	}
	t.setVal(ri, v)
	closer.Close()
	t.recs[ri].flags = t.recs[ri].flags&^fDel | fMod | fStored
}

// ReplicaGet returns a copy of the value of the replication key key, and
// whether it exists.
func (s *Store) ReplicaGet(key []byte) ([]byte, bool, error) {
	if !replicaKey(key) {
		return nil, false, fmt.Errorf("%w: %q does not start with ReplicaPrefix", ErrNotReplicaKey, key)
	}
	unlock, err := s.readLock()
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	return get(s.db, key)
}

func get(r pebble.Reader, key []byte) ([]byte, bool, error) {
	v, closer, err := r.Get(key)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("storage: read: %w", err)
	}
	defer closer.Close()
	return bytes.Clone(v), true, nil
}

// ReplicaScan calls fn with each replication key in [lower, upper) and its
// value, in key order, until fn returns false. fn must not keep its
// arguments.
func (s *Store) ReplicaScan(lower, upper []byte, fn func(key, val []byte) bool) error {
	if !replicaKey(lower) || (!replicaKey(upper) && !bytes.Equal(upper, replicaEnd)) {
		return fmt.Errorf("%w: [%q, %q) is not within ReplicaPrefix", ErrNotReplicaKey, lower, upper)
	}
	unlock, err := s.readLock()
	if err != nil {
		return err
	}
	defer unlock()
	return scan(s.db, lower, upper, fn)
}

func scan(r pebble.Reader, lower, upper []byte, fn func(key, val []byte) bool) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("storage: scan: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, verr := it.ValueAndErr()
		if verr != nil {
			err = verr
			break
		}
		if !fn(it.Key(), v) {
			break
		}
	}
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("storage: scan: %w", err)
	}
	return nil
}

// ReplicaSnapshot is a consistent view of the store at one instant, for
// sending a shard's records with the applied index they belong to.
type ReplicaSnapshot struct {
	s    *Store
	snap *pebble.Snapshot
}

// NewReplicaSnapshot returns a view of the store as it is now. Close it:
// it keeps Pebble from dropping what it sees.
func (s *Store) NewReplicaSnapshot() (*ReplicaSnapshot, error) {
	unlock, err := s.readLock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return &ReplicaSnapshot{s: s, snap: s.db.NewSnapshot()}, nil
}

// Get returns a copy of the value of key in the view, and whether it
// exists: a replication key or a record key.
func (v *ReplicaSnapshot) Get(key []byte) ([]byte, bool, error) {
	v.s.closeMu.RLock()
	defer v.s.closeMu.RUnlock()
	if v.s.dbClosed {
		return nil, false, ErrClosed
	}
	return get(v.snap, key)
}

// Scan calls fn with each key of the view in [lower, upper) and its value,
// in key order, until fn returns false; fn must not keep its arguments.
// The range is either records (below 0xff) or replication keys.
func (v *ReplicaSnapshot) Scan(lower, upper []byte, fn func(key, val []byte) bool) error {
	records := len(upper) > 0 && bytes.Compare(upper, recordsEnd) <= 0
	replica := replicaKey(lower) && (replicaKey(upper) || bytes.Equal(upper, replicaEnd))
	if !records && !replica {
		return fmt.Errorf("%w: [%q, %q) is neither records nor replication keys", ErrNotReplicaKey, lower, upper)
	}
	v.s.closeMu.RLock()
	defer v.s.closeMu.RUnlock()
	if v.s.dbClosed {
		return ErrClosed
	}
	return scan(v.snap, lower, upper, fn)
}

// Close releases the view.
func (v *ReplicaSnapshot) Close() error {
	v.s.closeMu.RLock()
	defer v.s.closeMu.RUnlock()
	if v.s.dbClosed {
		return nil // closing Pebble released it
	}
	return v.snap.Close()
}
