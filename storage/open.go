package storage

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	pebblebloom "github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/sluicehq/sluice/internal/bloom"
)

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
	if o.CompactionConcurrency <= 0 {
		o.CompactionConcurrency = runtime.GOMAXPROCS(0)
	}
	o.CompactionConcurrency = min(o.CompactionConcurrency, MaxCompactionConcurrency)
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
	if o.CacheMemory < 0 || o.NoCache {
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
	s.overlap = s.committers > 1 || o.overlapSyncs
	for i := range s.committers + 1 {
		n := s.committers
		if i == s.committers {
			n = 1 // the cross queue
		}
		q := newCommitQueue(&s.opts, n)
		q.index = i
		s.queues = append(s.queues, q)
	}
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
	po.Levels[0].FilterPolicy = pebblebloom.FilterPolicy(10)
	// Most records sit in the last level, which Zstd compresses to about
	// two thirds of what the default does; upper levels stay fast.
	po.ApplyCompressionSettings(func() pebble.DBCompressionSettings { return pebble.DBCompressionBalanced })
	compactionOptions(po, o.CompactionConcurrency)
	if o.pebble != nil {
		o.pebble(po)
	}
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
	case o.NoKeyFilter:
	case o.KeyFilterSize == 0:
		s.filter = bloom.New(DefaultKeyFilter)
	case o.KeyFilterSize > 0:
		s.filter = bloom.New(o.KeyFilterSize)
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
			s.filter.Add(maphash.Bytes(s.seed, it.Key()))
		}
		s.openRecords[s.classOf(it.Key())]++
		n++
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("scan %s: %w", s.dir, err)
	}
	filterBytes := int64(0)
	if s.filter != nil {
		filterBytes = s.filter.Bytes()
	}
	s.log.Info("store scanned", "records", n, "key_filter_bytes", filterBytes, "took", time.Since(t0).Round(time.Millisecond))
	return nil
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
