// Package engine runs limit operations against the store: the one place
// every front end (RESP commands, the divvy line protocol, GET /check,
// Envoy's rate limit service) goes through to change a limit's state.
//
// A front end parses a request, then runs its operations in a Round: a
// limiter's mutation (Round.Limit: RL.*, CL.*, FW.*, ROLL.*, whose
// mutators package limitcmd builds), a hit of the rules that match a
// request (Round.Hit, Round.HitRule) or a read-modify-write that decides
// no limit (Round.Apply). Round.Commit then commits what they queued by
// the store's durability mode, applies --on-store-error, notes the keys
// written in slots being moved, and settles the metrics of the round's
// rule hits. Operations return typed outcomes (a mutator's fields, a
// policy.Outcome) and typed errors (package errs); the front end renders
// both in its own protocol.
//
// In a cluster, a rule counter owned by another node is forwarded to its
// owner through Cluster, which the cluster code implements; the engine
// calls nothing of the server's otherwise.
//
// An Engine is safe for concurrent use; a Round belongs to one connection
// or goroutine at a time.
package engine

import (
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// OnStoreError is what a limit operation does when the store cannot take
// or give its state (--on-store-error).
type OnStoreError uint8

const (
	// Refuse fails the operation with the store's error: clients of a
	// rate limiter usually treat an error as a denial. The default.
	Refuse OnStoreError = iota
	// Allow lets the answer computed from the state the store could give
	// (or from a missing record when it gave none) stand; the change is
	// not stored.
	Allow
)

// DefaultMaxKeySize is the longest client key when Tuning.MaxKeySize is
// zero: past it the costs that grow with each key (its copies on the way
// to the disk, Pebble's first and last key of every table) dominate;
// 4000 commands with 512 KiB keys took peak RSS to 785-950 MiB, with
// 16 KiB keys to 247-265 MiB.
const DefaultMaxKeySize = 16 << 10

// Tuning is what an operator sets of an Engine. A zero field means the
// default given.
type Tuning struct {
	// MaxKeySize is the longest key a request may name (--max-key-size):
	// the key of an RL.* command, the actor value of a HIT. A longer one
	// is refused with an error naming both lengths (CheckKeySize), and
	// the store is not touched. Default DefaultMaxKeySize.
	MaxKeySize int
	// OnStoreError is what an operation does when the store cannot take
	// or give its state (--on-store-error); default Refuse.
	OnStoreError OnStoreError
}

// Config configures an Engine. A zero field means the default given.
type Config struct {
	Store *storage.Store   // required
	Clock func() time.Time // default time.Now
	// Tuning is the operator's settings.
	Tuning Tuning
	// Cluster is cluster mode's side of the engine; nil for a standalone
	// server.
	Cluster Cluster
	// MaxOverrides is the most per-actor overrides (POLICY OVERRIDE) kept
	// (--policy-max-overrides); default DefaultMaxOverrides.
	MaxOverrides int64
	// StatsDays is the days of threshold data (POLICY STATS) kept
	// (--policy-stats-days); default DefaultStatsDays, at most
	// MaxStatsDays.
	StatsDays int
	// StatsFlush is how long after a window ends the threshold data in
	// memory are stored, at most; default StatsFlushInterval.
	StatsFlush time.Duration
}

// Cluster is what the engine asks of cluster mode. The cluster code
// implements it; a test may implement it to stand for other nodes.
type Cluster interface {
	// ForwardCounter has the node owning the slot of the rule counter key
	// key (keyspace.AppendRuleKey's) apply hits of r under limit at now
	// (unix ns), when that is another node, and returns its outcome with
	// forwarded true, its Rate the limit the owner applied (limit, or the
	// actor's override there). Otherwise it returns forwarded false, and
	// the engine applies the hit here.
	ForwardCounter(key []byte, r *policy.Rule, limit, hits, now int64) (forwarded bool, out policy.Outcome, err error)
	// NoteWrites notes the keys of b's changes that are in slots being
	// moved off this node, before b's changes are committed or handed
	// over.
	NoteWrites(b *storage.Batch)
}

// Engine runs limit operations against one store.
type Engine struct {
	store        *storage.Store
	clock        func() time.Time
	maxKeySize   int
	onStoreError OnStoreError
	cluster      Cluster
	gate         writeGate
	storeAllowed atomic.Int64
	dials        dials     // POLICY LIMIT and ENFORCE (dials.go)
	ov           overrides // POLICY OVERRIDE (overrides.go)
	stats        stats     // POLICY STATS (stats.go)
	// afterOverrideRead, set by tests only, runs between a new counter's
	// read of its override and its creation.
	afterOverrideRead func()
	// onNodeRead, set by tests only, runs at each store read of a hit's
	// override on a cluster node (nodeLookup).
	onNodeRead func()
	// beforeNodeWrite, set by tests only, runs in a cluster node's
	// change of an override just before its store write.
	beforeNodeWrite func()
}

// New returns an Engine for cfg.
func New(cfg Config) *Engine {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Tuning.MaxKeySize <= 0 {
		cfg.Tuning.MaxKeySize = DefaultMaxKeySize
	}
	if cfg.MaxOverrides <= 0 {
		cfg.MaxOverrides = DefaultMaxOverrides
	}
	e := &Engine{store: cfg.Store, clock: cfg.Clock, maxKeySize: cfg.Tuning.MaxKeySize, onStoreError: cfg.Tuning.OnStoreError, cluster: cfg.Cluster}
	if cfg.StatsDays <= 0 {
		cfg.StatsDays = DefaultStatsDays
	}
	cfg.StatsDays = min(cfg.StatsDays, MaxStatsDays)
	if cfg.StatsFlush <= 0 {
		cfg.StatsFlush = StatsFlushInterval
	}
	e.ov.max, e.ov.local = cfg.MaxOverrides, cfg.Cluster != nil
	if e.ov.local {
		e.ov.cache = &nodeCache{seed: maphash.MakeSeed()}
	}
	e.stats.days, e.stats.every = int64(cfg.StatsDays), cfg.StatsFlush
	return e
}

// Now is the engine's time, which requests without their own are
// evaluated at.
func (e *Engine) Now() time.Time { return e.clock() }

// MaxKeySize is the longest key a request may name.
func (e *Engine) MaxKeySize() int { return e.maxKeySize }

// CheckKeySize refuses a key of n bytes when it is longer than
// MaxKeySize; what names the key in the error. It is checked before the
// store is touched, on the client's own key: the store key adds a few
// bytes of prefix the client did not send. Every front end's key check is
// this one, with this one wording (errs.KeyTooLong).
func (e *Engine) CheckKeySize(what string, n int) error {
	if n <= e.maxKeySize {
		return nil
	}
	return errs.KeyTooLong(what, n, e.maxKeySize)
}

// Degraded reports whether answers stand now without being stored:
// --on-store-error allow while the store refuses changes or has failed.
func (e *Engine) Degraded() bool {
	return e.onStoreError == Allow && (e.store.Unavailable() != nil || e.store.Failed() != nil)
}

// StoreAllowed is how many answers stood despite a store error
// (--on-store-error allow), since the start.
func (e *Engine) StoreAllowed() int64 { return e.storeAllowed.Load() }

// allowDespite reports whether n answers computed despite store error err
// stand, as --on-store-error allow asks, and counts them.
func (e *Engine) allowDespite(err error, n int) bool {
	if e.onStoreError != Allow || !Typed(err).Kind.StoreDown() {
		return false
	}
	e.storeAllowed.Add(int64(n))
	return true
}

// Typed returns err's typed error: its own, or the store's conditions
// (storage.ErrClosed, ErrUnavailable, ErrFailed), else Internal.
func Typed(err error) *errs.Error {
	var e *errs.Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, storage.ErrClosed):
		return &errs.Error{Kind: errs.Shutdown, Err: err}
	case errors.Is(err, storage.ErrUnavailable):
		return &errs.Error{Kind: errs.StoreUnavailable, Err: err}
	case errors.Is(err, storage.ErrFailed):
		return &errs.Error{Kind: errs.StoreFailed, Err: err}
	case errors.Is(err, storage.ErrNotReplicated):
		// The shard's leadership moved on before its group committed the
		// change: the cluster's condition, not the request's, and one a
		// cluster client retries (TRYAGAIN), on the new leader.
		return &errs.Error{Kind: errs.Forward, Code: "TRYAGAIN", Msg: "the shard's leader changed before its replicas took this change: it may or may not have been applied; retry", Err: err}
	}
	return &errs.Error{Kind: errs.Internal, Err: err}
}

// StoreErr types an error of the store's records (a Modify, a read): a
// record that does not decode is Corrupt, any other failure to read one
// StoreRead; the store's own conditions and errors typed already pass as
// they are.
func StoreErr(err error) error {
	if Typed(err).Kind != errs.Internal {
		return err
	}
	if errors.Is(err, bucket.ErrCorrupt) || errors.Is(err, policy.ErrCorrupt) {
		return &errs.Error{Kind: errs.Corrupt, Err: err}
	}
	return &errs.Error{Kind: errs.StoreRead, Err: err}
}

// writeGate counts the rounds under way that Begin counted in: a
// line-protocol batch, a GET /check, a ShouldRateLimit, from before their
// first operation to after their commit. A slot move's pause waits for
// those begun before it (WaitWriters). A round counts itself in the phase
// it reads; WaitWriters flips the phase and waits for the old one to
// drain, so rounds beginning meanwhile do not hold it up.
type writeGate struct {
	phase atomic.Uint32
	n     [2]atomic.Int64
	wait  sync.Mutex // one WaitWriters at a time
}

// WaitWriters returns once every round Begin counted in before it was
// called has committed, or false at deadline. The caller has paused the
// slots already, so a round beginning now forwards its hits of them and
// gets TRYAGAIN: waiting for it too is harmless.
func (e *Engine) WaitWriters(deadline time.Time) bool {
	g := &e.gate
	g.wait.Lock()
	defer g.wait.Unlock()
	drained := func(p uint32) bool {
		for g.n[p].Load() > 0 {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(100 * time.Microsecond)
		}
		return true
	}
	// Rounds may linger in the other phase (a previous wait gave up on
	// them): they began before now, so drain it first, then flip.
	cur := g.phase.Load() & 1
	if !drained(cur ^ 1) {
		return false
	}
	g.phase.Add(1)
	return drained(cur)
}
