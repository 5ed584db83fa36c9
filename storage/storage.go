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
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
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
	// the default, DefaultCacheMemory; negative turns the cache off,
	// keeping only records whose write is on its way. A positive value
	// below MinCacheMemory is raised to it (Stats.CacheMemory reports the
	// bound in force): below it a stripe's share would not hold the first
	// record with its index, and the cache would hold nothing.
	CacheMemory int64
	// KeyFilterSize is the bytes of the in-memory filter of stored keys,
	// which answers lookups of buckets that do not exist without reading
	// Pebble; about 10 bits per key keep its false positives near 1%.
	// Zero means the default, 16 MiB (about 13M keys); negative turns it off.
	KeyFilterSize int64
	Logger        *slog.Logger // default: discard
	// MaxOpenFiles is Pebble's soft limit on the files it keeps open
	// (tables, logs, lock); zero means Pebble's default, 1000.
	MaxOpenFiles int
	// Committers is how many goroutines write changes to Pebble, each
	// the only writer of its range of partitions (see committer.go).
	// Zero means GOMAXPROCS at Open; at most MaxCommitters, and at most
	// Partitions. MaxQueued and MaxQueuedBytes are shared among them.
	Committers int
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
	// afterKey, if set, runs in the committer after it has read each key
	// of a round: tests in this package interleave a transaction there.
	afterKey func(key []byte)
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

// formatKey marks a directory as a sluice store, and says which format it
// holds. Keys from 0xff on are the store's own; every record key sorts
// below recordsEnd.
var formatKey = []byte("\xffsluice.format")

// formatVersion 2 is the layout of record keys that Options.Upgrade moves
// the records of a format 1 store to (keyspace's, which puts a key's hash
// slot first). Format 1's marker, legacyFormatKey, sorted before its
// records.
const formatVersion = "2"

var legacyFormatKey = []byte("\x00sluice.format")

const legacyFormatVersion = "1"

// upgradingVersion replaces legacyFormatVersion, synced, before the upgrade
// moves any record: a store whose records are partly moved is still to be
// upgraded, and an older sluice, which reads only format "1", refuses it
// instead of serving it without the records already moved.
const upgradingVersion = "1-upgrading"

// recordsEnd is the exclusive upper bound of every record key; the lower
// bound is the empty key.
var recordsEnd = []byte{0xff}

// Upgrade batches: big enough that a Pebble commit per batch costs little,
// small enough to bound the memory of one batch.
const (
	upgradeChunkRecords = 1 << 16
	upgradeChunkBytes   = 4 << 20
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
	filter    *keyFilter // nil when off
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
	// watching counts the watchers (see Watch); while it is not zero,
	// every write bumps its partition's counter in partitionMods.
	watching      atomic.Int64
	partitionMods []atomic.Uint64 // one per partition

	// committers is how many committers run (see committer.go); queues
	// holds their queues, then the cross queue.
	committers int
	queues     []*commitQueue
	failed     atomic.Pointer[error]
	failedC    chan struct{} // closed when failed is set
	guard      *guard        // retries writes that fail for a while, see diskguard.go

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

type counters struct {
	rounds      atomic.Int64
	keysWritten atomic.Int64
	fsyncs      atomic.Int64
	fsyncNanos  atomic.Int64
	lastSync    atomic.Int64 // unix ms
	readErrors  atomic.Int64
	writeErrors atomic.Int64
	swept       atomic.Int64 // records examined by Sweep
	sweptOut    atomic.Int64 // records Sweep deleted
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

// Open opens or creates the store in dir. See OpenContext.
func Open(dir string, o Options) (*Store, error) {
	return OpenContext(context.Background(), dir, o)
}

// OpenContext opens or creates the store in dir, and gives up when ctx is
// done. Opening replays the log and may write (flush it, create files); a
// write that fails, as on a full disk, fails the open at once instead of
// being retried. After an error other than a refused directory (ErrLocked,
// ErrNotStore) Pebble may still hold the directory or a goroutine: the
// process should exit.
func OpenContext(ctx context.Context, dir string, o Options) (*Store, error) {
	if o.SyncInterval <= 0 {
		o.SyncInterval = DefaultSyncInterval
	}
	if o.CacheSize <= 0 {
		o.CacheSize = DefaultCacheSize
	}
	if o.MemTableSize <= 0 {
		o.MemTableSize = DefaultMemTableSize
	}
	if o.MaxQueued <= 0 {
		o.MaxQueued = DefaultMaxQueued
	}
	if o.MaxQueuedBytes <= 0 {
		o.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Partition == nil {
		o.Partition, o.Partitions = onePartition, 1
	}
	if o.Partitions <= 0 {
		o.Partitions = 1
	}
	if o.Committers <= 0 {
		o.Committers = runtime.GOMAXPROCS(0)
	}
	o.Committers = min(o.Committers, MaxCommitters, o.Partitions)
	if o.CacheMemory == 0 {
		switch {
		case o.CacheEntries > 0:
			o.CacheMemory = int64(min(int64(o.CacheEntries), MaxCacheEntries)) * CacheBucketCharge
		case o.CacheEntries < 0:
			o.CacheMemory = -1
		default:
			o.CacheMemory = DefaultCacheMemory
		}
	}
	o.CacheEntries = 0
	if o.CacheMemory < 0 {
		o.CacheMemory = 0 // off
	}
	if o.CacheMemory > 0 && o.CacheMemory < MinCacheMemory {
		o.CacheMemory = MinCacheMemory
	}
	s := &Store{opts: o, log: o.Logger, dir: dir, seed: maphash.MakeSeed(), guard: newGuard(dir, o.Logger), failedC: make(chan struct{})}
	s.guard.fatal = s.fail
	s.partitionMods = make([]atomic.Uint64, o.Partitions)
	s.byteLimit = o.CacheMemory / numStripes
	base := o.fs
	if base == nil && o.Disk != nil {
		base = o.Disk.fs
	}
	if base == nil {
		base = vfs.Default
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("create data directory %s: %w", dir, err)
		}
	}
	if err := checkDir(base, dir); err != nil {
		return nil, err
	}
	s.base = base

	// Pebble opens in a goroutine, so that a failed write (which parks the
	// writer, see diskguard.go), a Fatalf (which parks its caller) or a
	// signal ends the wait. state says who finished first: 1 the opener,
	// 2 the waiter, which then leaves the opener to close what it opened.
	var state atomic.Int32
	opened := make(chan error, 1)
	go func() {
		err := s.openPebble(ctx, base)
		if !state.CompareAndSwap(0, 1) {
			if s.db != nil {
				s.db.Close()
			}
			return
		}
		opened <- err
	}()
	var err error
	select {
	case err = <-opened:
	case <-s.failedC:
		if !state.CompareAndSwap(0, 2) {
			err = <-opened
			break
		}
		return nil, openError(dir, *s.failed.Load())
	case <-ctx.Done():
		if !state.CompareAndSwap(0, 2) {
			err = <-opened
			break
		}
		return nil, fmt.Errorf("open store in %s: interrupted: %w", dir, ctx.Err())
	}
	if p := s.failed.Load(); err == nil && p != nil {
		err = *p // a Fatalf that Pebble survived
	}
	if err != nil {
		if s.db != nil && s.failedErr() == nil {
			s.db.Close()
		}
		return nil, openError(dir, err)
	}

	// The queues' bounds are shares of MaxQueued and MaxQueuedBytes; the
	// cross queue's are never waited for (see Release).
	s.committers = o.Committers
	for range s.committers {
		s.queues = append(s.queues, newCommitQueue(&s.opts, s.committers))
	}
	s.queues = append(s.queues, newCommitQueue(&s.opts, 1))
	s.guard.wake = s.broadcastDone
	s.guard.armed.Store(true)
	s.committerDone = make(chan struct{})
	s.committersDone.Add(s.committers)
	for c := range s.committers {
		go s.commitLoop(c)
	}
	go func() {
		s.committersDone.Wait()
		close(s.committerDone)
	}()
	if o.Sync != SyncAlways {
		s.syncerStop = make(chan struct{})
		s.syncerDone = make(chan struct{})
		go s.syncLoop()
	}
	return s, nil
}

// openPebble opens Pebble, checks the format marker, upgrades a format 1
// store and scans the records. A panic inside Pebble (some kinds of
// corruption) becomes an error.
func (s *Store) openPebble(ctx context.Context, base vfs.FS) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: pebble panicked: %v", ErrCorrupt, r)
		}
	}()
	o, dir := s.opts, s.dir
	cache := pebble.NewCache(o.CacheSize)
	defer cache.Unref()
	po := &pebble.Options{
		Cache:              cache,
		MemTableSize:       uint64(o.MemTableSize),
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{l: o.Logger, fail: s.fail},
		FS:                 guardFS{base, s.guard},
		EventListener:      &pebble.EventListener{DataCorruption: s.corruption},
		MaxOpenFiles:       o.MaxOpenFiles,
	}
	// Lookups of buckets that do not exist yet are common; a Bloom filter
	// answers most of them without reading a block.
	po.Levels[0].FilterPolicy = bloom.FilterPolicy(10)
	// Most records sit in the last level, which Zstd compresses to about
	// two thirds of what the default does; upper levels stay fast.
	po.ApplyCompressionSettings(func() pebble.DBCompressionSettings { return pebble.DBCompressionBalanced })
	db, err := pebble.Open(dir, po)
	if err != nil {
		if lockHeld(err) {
			return fmt.Errorf("%w: %s (is another sluice serving it?): %w", ErrLocked, dir, err)
		}
		return err
	}
	s.db = db
	format, err := checkFormat(db, dir)
	if err != nil {
		return err
	}
	if format == legacyFormatVersion {
		if o.Upgrade == nil {
			return legacyFormatError(dir)
		}
		if err := s.upgrade(ctx); err != nil {
			return err
		}
	}
	switch {
	case o.KeyFilterSize == 0:
		s.filter = newKeyFilter(DefaultKeyFilter)
	case o.KeyFilterSize > 0:
		s.filter = newKeyFilter(o.KeyFilterSize)
	}
	return s.scanRecords()
}

// openError says why a store could not be opened, and what to do about it.
func openError(dir string, err error) error {
	switch {
	case errors.Is(err, ErrLocked), errors.Is(err, ErrNotStore):
		return err
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("open store in %s: the disk is full (%w); free space or grow the volume, then start again", dir, err)
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return fmt.Errorf("open store in %s: out of file descriptors (%w); raise the limit (ulimit -n), then start again", dir, err)
	case errors.Is(err, ErrCorrupt) || pebble.IsCorruptionError(err) || tableFileBroken(err):
		return fmt.Errorf("open store in %s: %w: %v; %s, or restore a CHECKPOINT copy", dir, ErrCorrupt, err, repairHint(dir))
	case errors.Is(err, syscall.EIO), errors.Is(err, syscall.EROFS):
		return fmt.Errorf("open store in %s: a write failed: %w; check the device and its kernel log", dir, err)
	}
	return fmt.Errorf("open store in %s: %w", dir, err)
}

// repairHint says what to do about a store with unreadable tables.
func repairHint(dir string) string {
	return fmt.Sprintf("run `sluice repair --data %s` to move the unreadable tables aside (the limits stored in them start afresh)", dir)
}

// tableFileBroken reports whether err is Pebble's refusal to open a store
// whose MANIFEST names a table file that is missing or has another size
// (truncated): damage as much as a bad checksum is, though Pebble's check
// does not mark it as corruption, so only its words tell.
func tableFileBroken(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "object size mismatch") || strings.Contains(msg, "unknown to the objstorage provider")
}

// corruption is Pebble's DataCorruption event. Pebble's default calls
// Fatalf; the read that found it returns an error anyway, which is enough.
func (s *Store) corruption(info pebble.DataCorruptionInfo) {
	s.log.Error("on-disk corruption found", "dir", s.dir, "file", info.Path, "keys", info.Bounds.String(), "err", info.Details)
}

// lockHeld reports whether Pebble could not take the store's lock file: held
// by another process (EAGAIN from fcntl), or by this one, which Pebble
// reports only in words.
func lockHeld(err error) bool {
	return errors.Is(err, syscall.EAGAIN) || strings.Contains(err.Error(), "lock held by current process")
}

// checkDir refuses a directory that holds files but no Pebble store, such
// as a home directory given to --data by mistake: Pebble would create its
// files among them. A new volume's lost+found is not a reason to refuse.
func checkDir(fs vfs.FS, dir string) error {
	names, err := fs.List(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read data directory %s: %w", dir, err)
	}
	other := ""
	for _, n := range names {
		switch {
		case n == "CURRENT", strings.HasPrefix(n, "MANIFEST-"), strings.HasPrefix(n, "marker.manifest."):
			return nil // a Pebble store; checkFormat tells whose
		case n != "lost+found" && other == "":
			other = n
		}
	}
	if other != "" {
		return fmt.Errorf("%w: %s holds other files (%s, ...) and no store; give --data a new or empty directory", ErrNotStore, dir, other)
	}
	return nil
}

// checkFormat refuses a Pebble store that sluice did not create, marks a
// new, empty one, and returns the store's format version: formatVersion,
// or legacyFormatVersion for a store to upgrade.
func checkFormat(db *pebble.DB, dir string) (string, error) {
	format, err := readFormat(db, dir)
	if err != nil || format != "" {
		return format, err
	}
	it, err := db.NewIter(nil)
	if err != nil {
		return "", fmt.Errorf("scan %s: %w", dir, err)
	}
	nonEmpty := it.First()
	if err := it.Close(); err != nil {
		return "", fmt.Errorf("scan %s: %w", dir, err)
	}
	if nonEmpty {
		return "", fmt.Errorf("%w: %s holds a Pebble store without sluice's format marker", ErrNotStore, dir)
	}
	if err := db.Set(formatKey, []byte(formatVersion), pebble.Sync); err != nil {
		return "", fmt.Errorf("initialise %s: %w", dir, err)
	}
	return formatVersion, nil
}

// readFormat returns the format version of the store in db: formatVersion
// or legacyFormatVersion, or "" when it has no sluice format marker. It
// refuses a marker of another version. The current marker is read first: in
// a format 2 store, legacyFormatKey could be a record's key.
func readFormat(db *pebble.DB, dir string) (string, error) {
	v, err := getString(db, formatKey)
	switch {
	case err != nil:
		return "", fmt.Errorf("read format marker in %s: %w", dir, err)
	case v == formatVersion:
		return v, nil
	case v != "":
		return "", fmt.Errorf("%w: %s has format %q, this build reads format %q (and upgrades format %q)", ErrNotStore, dir, v, formatVersion, legacyFormatVersion)
	}
	v, err = getString(db, legacyFormatKey)
	switch {
	case err != nil:
		return "", fmt.Errorf("read format marker in %s: %w", dir, err)
	case v == "" || v == legacyFormatVersion:
		return v, nil
	case v == upgradingVersion:
		return legacyFormatVersion, nil
	}
	return "", fmt.Errorf("%w: %s has format %q, this build reads format %q (and upgrades format %q)", ErrNotStore, dir, v, formatVersion, legacyFormatVersion)
}

// getString returns key's value, "" if it is missing. A marker is never
// empty.
func getString(db *pebble.DB, key []byte) (string, error) {
	v, closer, err := db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer closer.Close()
	return string(v), nil
}

// legacyFormatError refuses a format 1 store where it cannot be upgraded.
func legacyFormatError(dir string) error {
	return fmt.Errorf("%w: %s holds a store of format %s, written by an older sluice; this build reads format %s. Start a sluice server with --data %s once: it upgrades the store in place before serving (sluice inspect only reads, and cannot upgrade it)",
		ErrNotStore, dir, legacyFormatVersion, formatVersion, dir)
}

// upgrade moves every record of a format 1 store to the key Upgrade gives
// it, then replaces the format marker. Each batch of moves is atomic, and
// the marker changes last, in a synced batch of its own: a crash at any
// point leaves a store of format 1 whose records are partly moved, which
// the next Open finishes upgrading (Upgrade reports moved keys as such).
// The batches themselves need no sync: the last one makes them durable.
func (s *Store) upgrade(ctx context.Context) error {
	t0 := time.Now()
	o := s.opts
	maxRecords, maxBytes := o.upgradeChunk, o.upgradeChunkBytes
	if maxRecords <= 0 {
		maxRecords = upgradeChunkRecords
	}
	if maxBytes <= 0 {
		maxBytes = upgradeChunkBytes
	}
	s.log.Info("upgrading store", "dir", s.dir, "from_format", legacyFormatVersion, "to_format", formatVersion)
	if err := s.db.Set(legacyFormatKey, []byte(upgradingVersion), pebble.Sync); err != nil {
		return fmt.Errorf("upgrade %s: mark the upgrade as begun: %w", s.dir, err)
	}
	batch := s.db.NewBatch()
	defer batch.Close()
	var (
		moved, kept int64
		lower       []byte // the next key to look at; nil: the first
		newKey      []byte
	)
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("upgrade %s: interrupted after moving %d records: %w", s.dir, moved, err)
		}
		// A fresh iterator for each batch, so that one pass does not pin
		// every table and memtable of the store until it ends. It does not
		// see the batch it feeds, which is applied only after it closes.
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: recordsEnd})
		if err != nil {
			return fmt.Errorf("upgrade %s: %w", s.dir, err)
		}
		n := 0
		more := false
		for ok := it.First(); ok; ok = it.Next() {
			if n >= maxRecords || int(batch.Len()) >= maxBytes {
				more = true
				lower = slices.Clone(it.Key()) // it still uses the old bound
				break
			}
			key := it.Key()
			if string(key) == string(legacyFormatKey) {
				continue
			}
			// A key that stays may come back as key itself, which aliases
			// the iterator's buffer: newKey keeps only keys that moved, so
			// that the next call never appends into the iterator's key.
			nk, ok, err := o.Upgrade(newKey[:0], key)
			ok = ok && err == nil && string(nk) != string(key)
			if ok {
				newKey = nk
			}
			if ok && len(newKey) > 0 && newKey[0] == recordsEnd[0] {
				err = fmt.Errorf("new key %q is reserved (starts with 0xff)", newKey)
			}
			if err != nil {
				it.Close()
				return fmt.Errorf("upgrade %s from format %s to %s: key %q: %w; the store was left as it was, except for the %d records already moved to the new layout, and is still of format %s",
					s.dir, legacyFormatVersion, formatVersion, key, err, moved, legacyFormatVersion)
			}
			if !ok {
				kept++
				continue
			}
			val, err := it.ValueAndErr()
			if err == nil {
				err = batch.Set(newKey, val, nil)
			}
			if err == nil {
				err = batch.Delete(key, nil)
			}
			if err != nil {
				it.Close()
				return fmt.Errorf("upgrade %s: key %q: %w", s.dir, key, err)
			}
			n++
		}
		if err := it.Close(); err != nil {
			return fmt.Errorf("upgrade %s: %w", s.dir, err)
		}
		if n > 0 {
			if err := s.db.Apply(batch, pebble.NoSync); err != nil {
				return fmt.Errorf("upgrade %s: after moving %d records: %w", s.dir, moved, err)
			}
			moved += int64(n)
			batch.Reset()
			if o.afterUpgradeChunk != nil {
				o.afterUpgradeChunk(s.db, moved)
			}
		}
		if !more {
			break
		}
	}
	batch.Reset()
	err := batch.Delete(legacyFormatKey, nil)
	if err == nil {
		err = batch.Set(formatKey, []byte(formatVersion), nil)
	}
	if err == nil {
		err = s.db.Apply(batch, pebble.Sync)
	}
	if err != nil {
		return fmt.Errorf("upgrade %s: replace the format marker, after moving every record: %w", s.dir, err)
	}
	s.log.Info("store upgraded", "dir", s.dir, "from_format", legacyFormatVersion, "to_format", formatVersion,
		"records_moved", moved, "records_kept", kept, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// scanRecords counts the records and adds every key to the key filter,
// before the store serves anything. Reading only keys, it takes about a
// second per 5M records on a warm disk.
func (s *Store) scanRecords() error {
	t0 := time.Now()
	it, err := s.db.NewIter(&pebble.IterOptions{UpperBound: recordsEnd})
	if err != nil {
		return fmt.Errorf("scan %s: %w", s.dir, err)
	}
	n := int64(0)
	for ok := it.First(); ok; ok = it.Next() {
		if s.filter != nil {
			s.filter.add(maphash.Bytes(s.seed, it.Key()))
		}
		s.openRecords[s.classOf(it.Key())]++
		n++
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("scan %s: %w", s.dir, err)
	}
	filterBytes := 0
	if s.filter != nil {
		filterBytes = len(s.filter.words) * 8
	}
	s.log.Info("store scanned", "records", n, "key_filter_bytes", filterBytes, "took", time.Since(t0).Round(time.Millisecond))
	return nil
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
		if s.filter != nil && !s.filter.mayContain(h) {
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
				t.recs[ri].flags |= fClean
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
		s.filter.add(h) // before the committer can write it
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
		b.lost, b.queued = nil, 0
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
		return err
	}
	return b.wait()
}

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
	t0 := time.Now()
	err := s.db.Apply(batch, opt)
	if err == nil && opt == pebble.Sync {
		s.noteSync(t0)
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

func (s *Store) noteSync(t0 time.Time) {
	s.stats.fsyncs.Add(1)
	s.stats.fsyncNanos.Add(int64(time.Since(t0)))
	s.stats.lastSync.Store(time.Now().UnixMilli())
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
			if s.opts.Sync != SyncEverySec {
				continue
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
	t0 := time.Now()
	if err := s.db.LogData(nil, pebble.Sync); err != nil {
		return err
	}
	s.noteSync(t0)
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

// DefaultCloseTimeout bounds Close.
const DefaultCloseTimeout = 10 * time.Second

// Close is Shutdown bounded by DefaultCloseTimeout.
func (s *Store) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultCloseTimeout)
	defer cancel()
	return s.Shutdown(ctx)
}

// Shutdown writes everything queued, syncs the log and closes Pebble, and
// gives up when ctx is done or the store fails, whichever comes first: a
// write still being retried then stops (the store fails), and Pebble is
// left to the process exit. It returns nil when everything was written,
// synced and closed; otherwise a *CloseError, which says what may be lost.
// Callers must stop calling Modify and Commit first; Commits still waiting
// return when their writes are done or the store gives up. Only the first
// call does anything; later ones return its result.
func (s *Store) Shutdown(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closeErr = s.shutdown(ctx) })
	return s.closeErr
}

func (s *Store) shutdown(ctx context.Context) error {
	// A checkpoint in progress stops now. A write that fails while the
	// queue drains is still retried (a disk that is full for a moment must
	// not lose what was acknowledged) until ctx is done; then it is given
	// up and the store fails.
	s.guard.closing.Store(true)
	// A transaction under way finishes first, so that the log gets all
	// of it or none (see Batch.Hold); past ctx's deadline the store
	// closes anyway and Release drops what a transaction had changed.
	between := make(chan struct{})
	go func() {
		s.txMu.Lock()
		s.closed.Store(true)
		s.txMu.Unlock()
		close(between)
	}()
	select {
	case <-between:
	case <-ctx.Done():
		s.closed.Store(true)
	}
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-ctx.Done():
			s.guard.expired.Store(true)
		case <-finished:
		}
	}()
	wait := func(done <-chan struct{}) bool {
		select {
		case <-done:
			return true
		case <-s.failedC:
			return false
		case <-ctx.Done():
			return false
		}
	}
	ok := true
	if s.syncerStop != nil {
		close(s.syncerStop)
		ok = wait(s.syncerDone)
	}
	for _, q := range s.queues {
		q.Lock()
		q.closing = true
		q.work.Broadcast()
		q.done.Broadcast()
		q.Unlock()
	}
	ok = ok && wait(s.committerDone)
	if ok {
		synced := make(chan struct{})
		var err error
		go func() {
			err = s.syncApplied()
			close(synced)
		}()
		if ok = wait(synced); ok && err != nil {
			s.fail(fmt.Errorf("final sync: %w", err))
			ok = false
		}
	}
	var closeErr error
	if ok {
		closed := make(chan struct{})
		go func() {
			// A checkpoint holds closeMu for reading; its writes fail now.
			s.closeMu.Lock()
			s.dbClosed = true
			closeErr = s.db.Close()
			s.closeMu.Unlock()
			close(closed)
		}()
		ok = wait(closed)
	}
	if ok && closeErr == nil && s.failed.Load() == nil {
		return nil
	}
	ce := &CloseError{Dir: s.dir, Mode: s.opts.Sync, Unwritten: s.dirtyRecords()}
	for _, q := range s.queues {
		q.Lock()
		ce.Unsynced += q.appliedKeys - q.syncedKeys
		q.Unlock()
	}
	if ms := s.stats.lastSync.Load(); ms != 0 {
		ce.LastSync = time.UnixMilli(ms)
	}
	switch {
	case s.failed.Load() != nil:
		ce.Err = s.failedErr()
	case ok:
		// Pebble closed with an error, after the final sync succeeded.
		ce.Err, ce.Unsynced = fmt.Errorf("close Pebble: %w", closeErr), 0
	default:
		ce.Err = fmt.Errorf("not closed in time (%w)", ctx.Err())
		if err := s.guard.unavailable(); err != nil {
			ce.Err = fmt.Errorf("%w, while %w", ce.Err, err)
		}
	}
	return ce
}

// CloseError is Shutdown's error when the store could not be closed
// cleanly: it says what the next start will not find.
type CloseError struct {
	Dir  string
	Mode SyncMode
	Err  error // why
	// Unwritten is how many buckets have a change that never reached
	// Pebble: lost.
	Unwritten int64
	// Unsynced is how many keys were written to Pebble's log after its last
	// successful fsync: lost unless Pebble had handed them to the operating
	// system and the machine stays up.
	Unsynced int64
	LastSync time.Time // zero if never
}

func (e *CloseError) Unwrap() error { return e.Err }

func (e *CloseError) Error() string {
	last := "none since the start"
	if !e.LastSync.IsZero() {
		last = e.LastSync.UTC().Format(time.RFC3339Nano)
	}
	if e.Mode == SyncAlways {
		// Nothing unsynced was acknowledged in this mode.
		return fmt.Sprintf("store in %s not closed cleanly: %v; no acknowledged change is lost (--fsync always); buckets with changes not yet in the log: %d, keys written to the log since the last fsync (%s): %d; these were never acknowledged and may be lost",
			e.Dir, e.Err, e.Unwritten, last, e.Unsynced)
	}
	return fmt.Sprintf("store in %s not closed cleanly: %v; lost: acknowledged changes of %d buckets not yet in the log; may be lost (--fsync %s): %d keys written to the log since the last fsync (%s); everything else is replayed at the next start",
		e.Dir, e.Err, e.Unwritten, e.Mode, e.Unsynced, last)
}

// Stats is a snapshot of the store's counters.
type Stats struct {
	Mode         SyncMode
	Rounds       int64 // committer rounds applied
	KeysWritten  int64 // keys written by the committer
	Fsyncs       int64
	FsyncTime    time.Duration // total time spent in fsyncs
	LastSync     time.Time     // zero if never
	Queued       int           // keys waiting for the committers
	Committers   int           // committers writing to Pebble
	Dirty        int64         // keys whose newest value is not in Pebble yet
	CacheEntries int64         // records held, dirty and clean
	CacheBytes   int64         // what the table holds, garbage included, against CacheMemory
	CacheMemory  int64         // the byte bound of the table; 0 when the cache is off
	CacheHits    int64         // reads and writes answered from memory
	CacheMisses  int64         // ... that were not in memory
	FilterSkips  int64         // misses answered by the key filter without a Pebble read
	// AppliedRound and SyncedRound are the rounds applied and synced,
	// summed over the committers (and cross rounds).
	AppliedRound uint64
	SyncedRound  uint64
	ReadErrors   int64
	WriteErrors  int64
	Failed       error // the write error that stopped writes, if any
	// Records is the number of records: those found at Open plus those
	// created since, minus those deleted. Exact unless a write failed.
	Records int64
	// RecordsByClass splits Records by Options.Class.
	RecordsByClass [MaxClasses]int64
	SweepScanned   int64 // records examined by Sweep since Open
	SweepDeleted   int64 // records Sweep deleted since Open
	// Unavailable is ErrUnavailable with the failing write's error while
	// writes to the disk fail, and nil otherwise; UnavailableSince says
	// since when.
	Unavailable      error
	UnavailableSince time.Time
	WriteRetries     int64 // failed disk writes retried since Open
	UnavailableTimes int64 // times the store became unavailable since Open

	// From Pebble; zero once the store is closed.
	DiskBytes        uint64 // every file of the store
	TableBytes       uint64 // sorted tables: the records, once flushed
	WALBytes         uint64 // the write-ahead log, recycled files included
	MemTableBytes    uint64 // memtables, flushing ones included
	BlockCacheBytes  int64
	BlockCacheHits   int64
	BlockCacheMisses int64
	CompactionDebt   uint64 // estimated bytes compactions still have to rewrite
	Compactions      int64
}

// dirtyRecords returns the number of records whose newest value is not in
// Pebble yet.
func (s *Store) dirtyRecords() int64 {
	n := int64(0)
	for i := range s.stripe {
		n += s.stripe[i].dirty.Load()
	}
	return n
}

// Records returns the number of records, as Stats does.
func (s *Store) Records() int64 {
	n := int64(0)
	for _, c := range s.RecordsByClass() {
		n += c
	}
	return n
}

// RecordsByClass returns the number of records of each class
// (Options.Class), as Stats does.
func (s *Store) RecordsByClass() [MaxClasses]int64 {
	n := s.openRecords
	for i := range s.stripe {
		sp := &s.stripe[i]
		sp.mu.Lock()
		for c, d := range sp.mu.records {
			n[c] += d
		}
		sp.mu.Unlock()
	}
	return n
}

// Stats returns the current counters.
func (s *Store) Stats() Stats {
	st := Stats{
		Mode:           s.opts.Sync,
		CacheMemory:    s.opts.CacheMemory,
		Rounds:         s.stats.rounds.Load(),
		KeysWritten:    s.stats.keysWritten.Load(),
		Fsyncs:         s.stats.fsyncs.Load(),
		FsyncTime:      time.Duration(s.stats.fsyncNanos.Load()),
		Dirty:          s.dirtyRecords(),
		ReadErrors:     s.stats.readErrors.Load(),
		WriteErrors:    s.stats.writeErrors.Load(),
		RecordsByClass: s.openRecords,
		SweepScanned:   s.stats.swept.Load(),
		SweepDeleted:   s.stats.sweptOut.Load(),

		Unavailable:      s.guard.unavailable(),
		UnavailableSince: s.guard.since(),
		WriteRetries:     s.guard.retries.Load(),
		UnavailableTimes: s.guard.spells.Load(),
	}
	for i := range s.stripe {
		sp := &s.stripe[i]
		sp.mu.Lock()
		st.CacheEntries += int64(sp.mu.t.live)
		st.CacheBytes += sp.mu.t.bytes()
		st.CacheHits += sp.mu.hits
		st.CacheMisses += sp.mu.misses
		st.FilterSkips += sp.mu.skips
		for c, d := range sp.mu.records {
			st.RecordsByClass[c] += d
		}
		sp.mu.Unlock()
	}
	for _, n := range st.RecordsByClass {
		st.Records += n
	}
	if ms := s.stats.lastSync.Load(); ms != 0 {
		st.LastSync = time.UnixMilli(ms)
	}
	if p := s.failed.Load(); p != nil {
		st.Failed = *p
	}
	st.Committers = s.committers
	for _, q := range s.queues {
		q.Lock()
		st.Queued += len(q.ends)
		st.AppliedRound += q.applied
		st.SyncedRound += q.synced
		q.Unlock()
	}
	// Once the store failed, a goroutine may be parked inside Pebble with
	// its mutex held (see diskguard.go), and while Shutdown closes Pebble
	// closeMu is held: Metrics would block in both cases.
	if st.Failed != nil || !s.closeMu.TryRLock() {
		return st
	}
	defer s.closeMu.RUnlock()
	if !s.dbClosed {
		m := s.db.Metrics()
		st.DiskBytes = m.DiskSpaceUsage()
		st.TableBytes = m.Table.Local.LiveSize
		st.WALBytes = m.WAL.PhysicalSize + m.WAL.ObsoletePhysicalSize
		st.MemTableBytes = m.MemTable.Size
		st.BlockCacheBytes = m.BlockCache.Size
		st.BlockCacheHits, st.BlockCacheMisses = m.BlockCache.Hits, m.BlockCache.Misses
		st.CompactionDebt = m.Compact.EstimatedDebt
		st.Compactions = m.Compact.Count
	}
	return st
}

// pebbleLogger sends Pebble's log lines to slog. Pebble's Fatalf must not
// return. Pebble calls it when it cannot go on (a log write failed, an
// invariant broke), sometimes with its mutexes held, so panicking would
// unwind through them into an unrecoverable runtime error: instead Fatalf
// makes the store fail, so that main shuts down and exits, and parks the
// calling goroutine until then. Without fail (Inspect, read-only) it panics
// for Inspect to recover.
type pebbleLogger struct {
	l    *slog.Logger
	fail func(error)
}

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...), "component", "pebble")
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error(msg, "component", "pebble", "fatal", true)
	if p.fail == nil {
		panic("pebble: " + msg)
	}
	p.fail(errors.New("pebble: " + msg))
	park()
}
