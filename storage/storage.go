// Package storage keeps records in an embedded Pebble store and gives the
// server one primitive: a read-modify-write of one key under that key's
// lock, made durable according to the configured mode.
//
// How a write travels: Batch.Modify runs the caller's Mutator under a
// striped lock, puts the new value in an in-memory table of records (so the
// next reader sees it at once) and notes the key in the Batch.
// Batch.Commit hands the noted keys to the committer goroutines, each the
// only writer of its range of partitions (Options.Partition; see
// committer.go),
// and waits as the durability mode requires: in SyncAlways a committer
// takes them at once; in SyncEverySec and SyncNo they wait for the next tick of
// the sync loop (write-behind), and a round writes each key once however
// often it was queued, so a hot key costs Pebble about one write per tick.
// The committer writes, for each noted key, the value the overlay holds at
// that moment, so the log always receives the newest
// in-memory state of a key whatever order connections hand over their keys;
// once Pebble has the value, the record is marked clean unless it changed
// meanwhile.
//
// The same table caches hot state: clean records, and the results of Pebble
// reads (found or not), stay until a CLOCK sweep evicts them, so a bucket
// used again soon costs no Pebble read. The table holds no Go pointer per
// record (see table.go), so the garbage collector does not scan it. Memory
// is bounded: clean records by CacheMemory bytes (everything the table
// allocates: records, index, keys, values, garbage and unused capacity),
// plus the dirty ones
// whose write is on its way, which Commit bounds by blocking while too many
// keys, or too many bytes of records, are queued.
//
// A Store is safe for concurrent use. A Batch belongs to one goroutine.
package storage

import (
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/sluicehq/sluice/internal/bloom"
)

// SyncMode says when a write counts as done, like Redis' appendfsync.
type SyncMode int

const (
	// SyncEverySec acknowledges a write once it is on its way to the log and
	// syncs the log every SyncInterval: a crash loses about the last second.
	SyncEverySec SyncMode = iota
	// SyncAlways acknowledges a write only after the log holding it has been
	// fsynced. One fsync covers every connection's pending writes.
	SyncAlways
	// SyncNo never syncs on its own: the operating system and Pebble decide.
	SyncNo
)

// String returns the flag spelling of m.
func (m SyncMode) String() string {
	switch m {
	case SyncAlways:
		return "always"
	case SyncEverySec:
		return "everysec"
	case SyncNo:
		return "no"
	}
	return fmt.Sprintf("SyncMode(%d)", int(m))
}

// ParseSyncMode parses the flag spelling of a SyncMode.
func ParseSyncMode(s string) (SyncMode, error) {
	switch s {
	case "always":
		return SyncAlways, nil
	case "everysec":
		return SyncEverySec, nil
	case "no":
		return SyncNo, nil
	}
	return 0, fmt.Errorf("fsync mode %q: want always, everysec or no", s)
}

// Options configure a Store. A zero field means the default given.
type Options struct {
	Sync SyncMode
	// SyncInterval is the everysec fsync period, and in SyncEverySec and
	// SyncNo the write-behind period: how long a changed key may wait in
	// the table before the committer writes it (see dueLocked). Default 1s.
	SyncInterval time.Duration
	CacheSize    int64 // Pebble block cache bytes; default 64 MiB
	MemTableSize int64 // Pebble memtable bytes; default 16 MiB
	// MaxQueued is how many written keys may wait for the committer before
	// Commit blocks; it bounds the dirty records. Default 65536.
	MaxQueued int
	// MaxQueuedBytes bounds the same queue by the bytes of the records it
	// holds (key, value room and recordOverhead each), so that long keys or values
	// cannot grow the dirty records, the queue or one Pebble batch without
	// limit. Default 16 MiB.
	MaxQueuedBytes int
	// CacheEntries is deprecated: the cache is bounded in bytes only
	// (CacheMemory). When CacheMemory is zero, a positive CacheEntries sets
	// it to CacheEntries × CacheBucketCharge (at least MinCacheMemory, at
	// most MaxCacheEntries buckets' worth), and a negative one turns the
	// cache off, as it used to.
	CacheEntries int
	// CacheMemory bounds the hot-state cache in bytes of memory:
	// everything its tables allocate (the capacity of their records, free
	// ones included, index and arena of keys, value room, garbage and
	// unused tail), dirty records included, and the cache evicts clean
	// records rather than grow past it. Each of the 1024 stripes gets an
	// equal share, so a record bigger than CacheMemory/1024 is never
	// cached (it is kept only while its write is on its way). Zero means
	// the default, DefaultCacheMemory (NoCache turns the cache off; a
	// negative value still does, as it used to). A positive value below
	// MinCacheMemory is raised to it (Stats.CacheMemory reports the bound
	// in force): below it a stripe's share would not hold the first
	// record with its index, and the cache would hold nothing.
	CacheMemory int64
	// NoCache turns the hot-state cache off, whatever CacheMemory says:
	// only records whose write is on its way are kept.
	NoCache bool
	// KeyFilterSize is the bytes of the in-memory filter of stored keys,
	// which answers lookups of buckets that do not exist without reading
	// Pebble; about 10 bits per key keep its false positives near 1%.
	// Zero means the default, 16 MiB (about 13M keys); NoKeyFilter turns
	// it off (a negative value still does, as it used to).
	KeyFilterSize int64
	// NoKeyFilter turns the key filter off, whatever KeyFilterSize says:
	// every lookup of a bucket not cached reads Pebble.
	NoKeyFilter bool
	Logger      *slog.Logger // default: discard
	// MaxOpenFiles is Pebble's soft limit on the files it keeps open
	// (tables, logs, lock); zero means Pebble's default, 1000.
	MaxOpenFiles int
	// Committers is how many goroutines write changes to Pebble, each
	// the only writer of its range of partitions (see committer.go).
	// Zero means GOMAXPROCS at Open; at most MaxCommitters, and at most
	// Partitions. MaxQueued and MaxQueuedBytes are shared among them.
	Committers int
	// CompactionConcurrency is how many compactions Pebble runs at once,
	// each over its own range of keys (see compactionOptions). Zero means
	// GOMAXPROCS at Open; at most MaxCompactionConcurrency.
	CompactionConcurrency int
	// Partition maps a record key to its partition, 0 to Partitions-1
	// (others are taken modulo Partitions); committer i of K writes the
	// partitions from i×Partitions/K to (i+1)×Partitions/K - 1, and
	// PartitionWrites counts writes by partition. It runs for every
	// change, so it must be quick, and must give a key the same partition
	// for as long as the store is open. The server's is its hash slot
	// (keyspace.Partition), so that a transaction on the keys of one slot
	// stays with one committer and WATCH counts the writes of a slot. Nil
	// puts every key in one partition, which one committer writes: the
	// store knows no key layout.
	Partition func(key []byte) int
	// Partitions is how many partitions Partition has; zero means 1.
	Partitions int
	// Replicator, when set, takes every committer's rounds instead of
	// Pebble's log: the records are replicated (see replicate.go), and
	// written to the store by the replicas' ReplicaBatch once their group
	// committed them. A transaction over several committers' keys is then
	// refused by it. Nil writes rounds to Pebble.
	Replicator Replicator

	// Disk, for tests, holds the store in memory instead of in the
	// directory; nil for the real filesystem.
	Disk *MemDisk

	// Upgrade maps a record key of a format 1 store to its key in the
	// current layout. Open calls it for every record of a format 1 store,
	// before serving anything, and moves each record for which it reports
	// moved to newKey (appended to dst, which it may reuse); moved false
	// means the key is in the current layout already (an upgrade was
	// interrupted) and stays. It must map distinct keys to distinct new
	// keys, below 0xff, that it reports as not moved; an error refuses the
	// open. Nil refuses a format 1 store, as Inspect does.
	Upgrade func(dst, key []byte) (newKey []byte, moved bool, err error)
	// Class sorts a record key into one of MaxClasses classes, counted
	// apart (RecordsByClass). It runs when a record is created or deleted,
	// under the record's lock, and for every record at Open: it must be
	// quick and must not keep key. Nil puts every record in class 0, and so
	// does a result outside 0..MaxClasses-1.
	Class func(key []byte) int

	fs vfs.FS // tests in this package: any Pebble filesystem
	// pebble, if set, changes Pebble's options before Open: tests in this
	// package hold back its compactions or watch them.
	pebble func(*pebble.Options)
	// afterKey, if set, runs in the committer after it has read each key
	// of a round: tests in this package interleave a transaction there.
	afterKey func(key []byte)
	// overlapSyncs, for tests in this package, makes one committer apply
	// its next round while its round's fsync runs, as several do.
	overlapSyncs bool
	// now, if set, is the clock of the fsync statistics (see noteSync):
	// tests in this package set the time of each round.
	now func() time.Time
	// Tests in this package: the most records and bytes of one upgrade
	// batch (zero: upgradeChunkRecords, upgradeChunkBytes), and a function
	// called after each batch is applied.
	upgradeChunk      int
	upgradeChunkBytes int
	afterUpgradeChunk func(db *pebble.DB, moved int64)
}

// CacheBucketCharge is the bytes one cached bucket is counted as where a
// count of buckets is turned into bytes (the deprecated CacheEntries). An
// RL.* bucket with a 16-byte key (a 23-byte record key and an 11-byte
// value) takes about 70 bytes of CacheMemory, everything the table
// allocates counted (TestTableBytesPerBucket), and 78 to 86 under churn
// with cached misses of absent keys, which leaves free records and room:
// DefaultCacheMemory holds about 2.2M buckets created by writes, about
// 1.9M under such churn (docs/operations.md, "Sizing").
const CacheBucketCharge = 88

// MinCacheMemory is the least positive CacheMemory: 1 KiB per stripe,
// which holds a dozen RL.* buckets with their index. A stripe's first
// record needs the table's first slices, 960 bytes.
const MinCacheMemory = numStripes << 10

// MaxCacheEntries is the most buckets CacheEntries converts to bytes
// without overflow; more is taken as that many.
const MaxCacheEntries = math.MaxInt64 / CacheBucketCharge

// MaxClasses is how many classes of records Options.Class may tell apart.
const MaxClasses = 16

// Defaults for Options.
const (
	DefaultSyncInterval   = time.Second
	DefaultCacheSize      = 64 << 20
	DefaultMemTableSize   = 16 << 20
	DefaultMaxQueued      = 1 << 16
	DefaultCacheMemory    = 160 << 20
	DefaultKeyFilter      = 16 << 20
	DefaultMaxQueuedBytes = 16 << 20
)

// Errors returned by the store.
var (
	ErrClosed = errors.New("storage: closed")
	// ErrHeld is Commit's error on a Batch between Hold and Release.
	ErrHeld     = errors.New("storage: batch held by a transaction: Release it before Commit")
	ErrFailed   = errors.New("storage: a write to the store failed; the server refuses writes until it is restarted")
	ErrNotStore = errors.New("storage: not a sluice data directory")
	ErrLocked   = errors.New("storage: data directory in use by another process")
	ErrCorrupt  = errors.New("storage: the store is corrupt")
	// ErrReservedKey refuses a record key that starts with 0xff: such keys
	// are the store's own, such as its format marker.
	ErrReservedKey = errors.New("storage: keys starting with byte 0xff are reserved for the store")
)

const numStripes = 1024

// Store is a Pebble database with striped read-modify-write and ordered
// committers.
type Store struct {
	db   *pebble.DB
	opts Options
	log  *slog.Logger
	// byteLimit is the most bytes of a stripe's table (CacheMemory/1024);
	// 0 when the cache is off, which keeps only dirty records.
	byteLimit int64
	filter    *bloom.Filter // nil when off
	// openRecords is the number of records of each class found by the
	// scan at Open.
	openRecords [MaxClasses]int64
	dir         string
	base        vfs.FS // the filesystem under the guard
	seed        maphash.Seed
	stripe      [numStripes]stripe

	// txMu makes a held Batch (a transaction, see Batch.Hold, which
	// locks it) and a committer's collection of a round (which read-locks
	// it) exclusive, so that a round holds all of a transaction's keys or
	// none; transactions also run one at a time under it, which is what
	// keeps their stripe locks deadlock-free.
	txMu sync.RWMutex
	// roundMu is read-locked by a committer's round from the moment it
	// takes its keys until it has published them, and locked by a cross
	// round, which so runs alone (see committer.go).
	roundMu sync.RWMutex
	// crossPending says a transaction waits in the cross queue: no
	// committer reads a round, and no transaction starts, until the cross
	// round has written it. Set under txMu locked, cleared under roundMu
	// locked.
	crossPending atomic.Bool
	// dropped counts the drops of dirty records of a replicated store,
	// twice each, at its start and its end (DiscardDirty, lose): see
	// Batch.dropped.
	dropped atomic.Uint64
	// watching counts the watchers (see Watch); while it is not zero,
	// every write bumps its partition's counter in partitionMods.
	watching      atomic.Int64
	partitionMods []atomic.Uint64 // one per partition

	// committers is how many committers run (see committer.go); queues
	// holds their queues, then the cross queue.
	committers int
	// overlap: in SyncAlways a committer applies its next round while
	// its round's fsync runs (finishRound), with more than one committer.
	overlap bool
	queues  []*commitQueue
	failed  atomic.Pointer[error]
	failedC chan struct{} // closed when failed is set
	guard   *guard        // retries writes that fail for a while, see diskguard.go

	closed  atomic.Bool
	closeMu sync.RWMutex // held for writing while Pebble closes
	// checkpointMu makes checkpoints one at a time.
	checkpointMu sync.Mutex
	dbClosed     bool // guarded by closeMu

	committersDone sync.WaitGroup
	committerDone  chan struct{} // closed once every committer has stopped
	syncerStop     chan struct{}
	syncerDone     chan struct{}
	closeOnce      sync.Once
	closeErr       error

	stats counters
}

type stripe struct {
	mu struct {
		sync.Mutex
		t      table // see table.go
		hits   int64
		misses int64
		skips  int64 // misses the key filter answered without Pebble
		// records is the change in the number of records of each class
		// made through this stripe since Open.
		records [MaxClasses]int64
	}
	// dirty is the stripe's records whose newest value is not in Pebble
	// yet, changed under mu (by a command, and by the committer once
	// written) and read without it (Stats). One counter for the store
	// was a cache line that every core and every committer passed
	// around, twice per changed key.
	dirty atomic.Int64
	_     [64]byte // keep stripes on separate cache lines
}

// Dir returns the data directory.
func (s *Store) Dir() string { return s.dir }

// Mode returns the durability mode.
func (s *Store) Mode() SyncMode { return s.opts.Sync }

func (s *Store) stripeOf(h uint64) *stripe { return &s.stripe[h%numStripes] }

// classOf returns key's class, 0 without Options.Class.
func (s *Store) classOf(key []byte) int {
	if s.opts.Class == nil {
		return 0
	}
	if c := s.opts.Class(key); c >= 0 && c < MaxClasses {
		return c
	}
	return 0
}

func (s *Store) usable() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return s.failedErr()
}

// Unavailable returns ErrUnavailable, wrapping the failing write's error,
// while writes to the disk fail and changes are refused; nil otherwise.
func (s *Store) Unavailable() error { return s.guard.unavailable() }

// Failed returns the write error that made the store refuse writes, or nil.
func (s *Store) Failed() error { return s.failedErr() }

// FailedC returns a channel closed when the store fails (see Failed). A
// failed store acknowledges nothing more and cannot be closed cleanly: the
// process should shut down and exit non-zero, so that a restart replays the
// log.
func (s *Store) FailedC() <-chan struct{} { return s.failedC }

func (s *Store) failedErr() error {
	if p := s.failed.Load(); p != nil {
		return fmt.Errorf("%w: %w", ErrFailed, *p)
	}
	return nil
}
