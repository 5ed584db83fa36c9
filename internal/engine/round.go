package engine

import (
	"time"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// Round is one connection's (or goroutine's) run of operations between
// two commits: a RESP pipeline or a chunk of one, a round of line-protocol
// lines, a /check request, a ShouldRateLimit call. Its operations' changes
// are visible to other rounds at once and queued in its batch until
// Commit, and no front end sends a reply that shows a change before
// Commit has told it whether the reply may stand. A Round is reused from
// one commit to the next, so that an operation allocates nothing.
type Round struct {
	e *Engine
	b *storage.Batch
	// wrote counts the operations since the last Commit that queued a
	// change (a rule hit is one, whatever rules it counted): the answers
	// that stand despite a store error are counted by operation.
	wrote  int
	gated  bool // counted in the write gate, in phase
	phase  uint32
	failed bool // Fail: the round's answers were not told

	// Req is room for a request's fields: front ends parse into it.
	Req policy.Request
	hits
}

// NewRound returns a Round with its own batch.
func (e *Engine) NewRound() *Round { return &Round{e: e, b: e.store.NewBatch()} }

// Now is the engine's time.
func (r *Round) Now() time.Time { return r.e.clock() }

// CheckKeySize is Engine.CheckKeySize.
func (r *Round) CheckKeySize(what string, n int) error { return r.e.CheckKeySize(what, n) }

// Begin counts the round in the engine's write gate until Commit or End,
// for a front end whose rounds are not RESP pipelines (which the server
// counts itself): a slot move's pause waits for the commit of the changes
// the round may make in the slots it pauses (Engine.WaitWriters).
func (r *Round) Begin() {
	g := &r.e.gate
	r.phase = g.phase.Load() & 1
	g.n[r.phase].Add(1)
	r.gated = true
}

// End ends the round's count in the write gate if Commit has not: a front
// end defers it after Begin, so that a round that panics before its
// Commit does not hold up every later slot move's pause (WaitWriters)
// until it times out. The changes such a round made stay in its batch,
// for its next Commit if it is reused.
func (r *Round) End() {
	if r.gated {
		r.e.gate.n[r.phase].Add(-1)
		r.gated = false
	}
}

// Limit runs m on key's record: the operation of a limiter (its
// mutation, built by package limitcmd). A store error is returned typed,
// unless --on-store-error allow lets the answer stand: then m has computed
// it from the last state the store could give, or, when the state could
// not be read, from a missing record (a full bucket, a new window), and
// nothing is stored.
func (r *Round) Limit(key []byte, m storage.Mutator) error {
	defer r.count(r.b.Len())
	return r.limit(key, m)
}

// limit is Limit without the count of operations, for the steps of a
// rule hit.
func (r *Round) limit(key []byte, m storage.Mutator) error {
	err := r.b.Modify(key, m)
	if err == nil {
		return nil
	}
	err = StoreErr(err)
	if !r.e.allowDespite(err, 1) {
		return err
	}
	if errs.KindOf(err) == errs.StoreRead {
		if _, _, err := m.Mutate(nil, false); err != nil {
			return err
		}
	}
	return nil
}

// Apply runs m on key's record without --on-store-error's leniency, for
// an operation that decides no limit (ROLL.CLEAR, DEL, a slot's restore);
// a store error is returned typed.
func (r *Round) Apply(key []byte, m storage.Mutator) error {
	defer r.count(r.b.Len())
	if err := r.b.Modify(key, m); err != nil {
		return StoreErr(err)
	}
	return nil
}

// count counts an operation that began with before changes in the batch,
// if it queued one.
func (r *Round) count(before int) {
	if r.b.Len() > before {
		r.wrote++
	}
}

// Len is how many changes the round holds (storage.Batch.Len).
func (r *Round) Len() int { return r.b.Len() }

// Full reports whether the round holds enough to commit now, before more
// operations (storage.Batch.Full): a long pipeline commits in chunks.
func (r *Round) Full() bool { return r.b.Full() }

// Hold starts a transaction on the round's batch (storage.Batch.Hold):
// each key an operation touches stays locked until Release.
func (r *Round) Hold(exclusive bool) { r.b.Hold(exclusive) }

// Release ends the transaction Hold began: it notes for the cluster the
// changes made in slots being moved, then hands them to the committer
// (storage.Batch.Release); Commit waits for them.
func (r *Round) Release() {
	if r.e.cluster != nil {
		r.e.cluster.NoteWrites(r.b)
	}
	r.b.Release()
}

// Fail says the round's answers were not told (the request failed after
// some of its operations): Commit still commits their changes, since
// they are visible, but the metrics count its rule hits as not told.
func (r *Round) Fail() { r.failed = true }

// Commit commits the changes queued since the last Commit, as durable as
// the store's mode promises, first noting for the cluster those in slots
// being moved; ends the round's count in the write gate (Begin); and
// settles the metrics of its rule hits, which count only what clients
// were told. It returns the store's error, nil when the changes were
// stored, and ok, whether the answers that show the changes stand: stored,
// or let stand despite err by --on-store-error allow (and counted).
// Otherwise the front end answers err in their place.
func (r *Round) Commit() (ok bool, err error) {
	ok = true
	if r.b.Pending() {
		if r.e.cluster != nil {
			r.e.cluster.NoteWrites(r.b)
		}
		if err = r.b.Commit(); err != nil {
			ok = r.e.allowDespite(err, r.wrote)
		}
	}
	r.wrote = 0
	r.End()
	r.settle(ok && !r.failed)
	r.settleEnds(err == nil)
	r.failed = false
	return ok, err
}

// Reset lets go of the round's batch, which keeps room for the keys of the
// largest round it held, for a new one. The round must have no changes
// pending.
func (r *Round) Reset() { r.b = r.e.store.NewBatch() }

// Trim lets go of what the round's buffers grew beyond keep bytes. Req's
// fields point into the caller's buffers of the last request, so its
// whole capacity is cleared: a slice header left beyond len would keep a
// dropped multi-MiB command reachable for the life of the connection.
func (r *Round) Trim(keep int) {
	if cap(r.Req)*FieldSize > keep {
		r.Req = nil
	} else {
		clear(r.Req[:cap(r.Req)])
		r.Req = r.Req[:0]
	}
	r.hits.trim(keep)
}

// Footprint is the bytes of the round's buffers, counted with the
// connection's.
func (r *Round) Footprint() int { return FieldSize*cap(r.Req) + r.hits.footprint() }

// FieldSize is the bytes of one of a request's fields (policy.Field: two
// slice headers), for a Round's footprint.
const FieldSize = 48
