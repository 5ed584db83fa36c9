package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// SweepResult counts what one Sweep call did.
type SweepResult struct {
	Scanned int // records examined
	Deleted int // records deleted
}

// sweepMutator deletes the record if it is still idle under its lock,
// keeping its value in old when asked to.
type sweepMutator struct {
	key  []byte
	idle func(key, val []byte) bool
	keep bool
	old  []byte
}

func (m *sweepMutator) Mutate(old []byte, found bool) ([]byte, Op, error) {
	if found && m.idle(m.key, old) {
		if m.keep {
			m.old = append(m.old[:0], old...)
		}
		return nil, Delete, nil
	}
	return nil, Keep, nil
}

// Sweep examines up to limit records in key order, starting at cursor (nil
// for the first record), and deletes each record for which idle reports
// true. idle sees the value Pebble holds and then, for a candidate, the
// record's current value again under the record's lock, so a record changed
// meanwhile is kept; deletes take the same ordered path as every write and
// are as durable as the mode promises when Sweep returns. idle must not keep
// its arguments. Records read by the sweep do not displace cached ones.
//
// Sweep returns the cursor to pass next time, or nil once the last record
// has been examined.
func (s *Store) Sweep(cursor []byte, limit int, idle func(key, val []byte) bool) (next []byte, res SweepResult, err error) {
	return s.SweepThen(cursor, limit, idle, nil)
}

// SweepThen is Sweep, then, once the deletes are committed, calls deleted
// (unless nil) with the key and the last value of each record deleted:
// what the records held when they went, for who keeps account of them.
// deleted must not keep its arguments.
func (s *Store) SweepThen(cursor []byte, limit int, idle func(key, val []byte) bool, deleted func(key, val []byte)) (next []byte, res SweepResult, err error) {
	if err := s.usable(); err != nil {
		return cursor, res, err
	}
	var lower []byte // the first record
	if len(cursor) > 0 {
		lower = cursor
	}
	s.closeMu.RLock()
	if s.dbClosed {
		s.closeMu.RUnlock()
		return cursor, res, ErrClosed
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: recordsEnd})
	if err != nil {
		s.closeMu.RUnlock()
		return cursor, res, fmt.Errorf("storage: sweep: %w", err)
	}
	var (
		cands []byte
		ends  []int
		last  []byte
	)
	for ok := it.First(); ok && res.Scanned < limit; ok = it.Next() {
		res.Scanned++
		last = append(last[:0], it.Key()...)
		v, verr := it.ValueAndErr()
		if verr != nil {
			err = verr
			break
		}
		if idle(it.Key(), v) {
			cands = append(cands, it.Key()...)
			ends = append(ends, len(cands))
		}
	}
	more := it.Valid() && res.Scanned >= limit
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	s.closeMu.RUnlock()
	s.stats.swept.Add(int64(res.Scanned))
	if err != nil {
		return cursor, res, fmt.Errorf("storage: sweep: %w", err)
	}
	b := s.NewBatch()
	m := &sweepMutator{idle: idle, keep: deleted != nil}
	var gone, goneVals []byte // the deleted keys and values, for deleted
	var goneEnds [][2]int
	start := 0
	for _, end := range ends {
		m.key = cands[start:end]
		start = end
		op, err := b.modify(m.key, m, false)
		if err != nil {
			b.Commit()
			return cursor, res, err
		}
		if op == Delete {
			// Counted with the record count, which the delete has just
			// lowered, so that no reader sees one without the other.
			res.Deleted++
			s.stats.sweptOut.Add(1)
			if deleted != nil {
				gone, goneVals = append(gone, m.key...), append(goneVals, m.old...)
				goneEnds = append(goneEnds, [2]int{len(gone), len(goneVals)})
			}
		}
	}
	if err := b.Commit(); err != nil {
		return cursor, res, err
	}
	k, v := 0, 0
	for _, e := range goneEnds {
		deleted(gone[k:e[0]], goneVals[v:e[1]])
		k, v = e[0], e[1]
	}
	if !more {
		return nil, res, nil
	}
	// The next record is the first key greater than last.
	return append(last, 0), res, nil
}

// Scan calls fn with each record Pebble holds in [lower, upper), in key
// order, until fn returns false; nil bounds mean from the first record, to
// the last. It sees what Pebble holds, which lags behind Modify: call Flush
// first to include every change committed before. The store's own keys are
// never listed. fn must not keep its arguments, and must not call Close or
// Shutdown, which wait for Scan to return.
func (s *Store) Scan(lower, upper []byte, fn func(key, val []byte) bool) error {
	if err := s.usable(); err != nil {
		return err
	}
	if upper == nil || bytes.Compare(upper, recordsEnd) > 0 {
		upper = recordsEnd
	}
	if bytes.Compare(lower, upper) >= 0 {
		return nil
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.dbClosed {
		return ErrClosed
	}
	return scan(s.db, lower, upper, fn)
}

// Flush returns once every change committed before the call has been
// written to Pebble (not necessarily synced, but for SyncAlways, where it
// waits for the fsync too).
func (s *Store) Flush() error {
	var stack [MaxCommitters + 1]uint64
	tickets := stack[:len(s.queues)]
	for i, q := range s.queues {
		q.Lock()
		// The queued keys go out in round q.round; with none queued, the
		// last round taken may still be on its way.
		tickets[i] = q.round - 1
		if lostLocked(q, tickets[i]) != nil {
			// Lost (replicated): nothing of it will be written, and the
			// rounds before it are settled.
			tickets[i] = 0
		}
		if len(q.ends) > 0 {
			tickets[i] = q.round
			q.urge = true // do not wait for the write-behind deadline
			q.work.Signal()
		}
		q.Unlock()
	}
	// The cross queue's rounds are due at once, and committer 0 runs
	// them (wakeCrossRunner).
	for i, q := range s.queues {
		if err := s.waitApplied(q, tickets[i]); err != nil {
			return err
		}
	}
	return nil
}

// waitApplied waits until round ticket of q is in Pebble.
func (s *Store) waitApplied(q *commitQueue, ticket uint64) error {
	q.Lock()
	defer q.Unlock()
	for {
		if err := s.failedErr(); err != nil {
			return err
		}
		// A round applied may still wait for its fsync in SyncAlways, or
		// for its group (replicated; it is in Pebble only then): Flush
		// waits for it too.
		if err := lostLocked(q, ticket); err != nil {
			return err
		}
		if q.applied >= ticket && (!s.syncsLater() || q.synced >= ticket) {
			return nil
		}
		// The committer is stuck on a failing write: answer now.
		if err := s.guard.unavailable(); err != nil {
			return err
		}
		if q.stopped {
			return ErrClosed
		}
		q.done.Wait()
	}
}

// Checkpoint writes a consistent copy of the store into dir, which must not
// exist, and returns when the copy is complete and synced: every change
// committed before the call is in it. A server started with --data dir
// serves the copy. Files are hard-linked where the filesystem allows, so a
// checkpoint on the same filesystem costs little space until the store
// compacts away from it.
//
// dir's writes are not the data directory's: one that fails (a full backup
// disk) fails the checkpoint at once, and never makes the store refuse
// changes. A failed checkpoint leaves no directory behind. Once the store
// closes, a checkpoint in progress fails.
func (s *Store) Checkpoint(dir string) error {
	if inside(s.dir, dir) {
		// Its files would count as the store's: a failure writing them
		// would fail the store, and later checkpoints would copy it.
		return fmt.Errorf("storage: checkpoint %s: inside the data directory %s; write checkpoints to another directory", dir, s.dir)
	}
	// One at a time: two into the same directory would each see it free,
	// and the one that failed would remove the other's finished copy.
	s.checkpointMu.Lock()
	defer s.checkpointMu.Unlock()
	return s.flushed(func(db *pebble.DB) error {
		if _, err := s.base.Stat(dir); err == nil {
			return fmt.Errorf("storage: checkpoint %s: %w", dir, os.ErrExist)
		}
		err := db.Checkpoint(dir, pebble.WithFlushedWAL())
		if err == nil {
			return nil
		}
		// Pebble removes its partial copy too; a leftover must never pass
		// for a backup.
		if rerr := s.base.RemoveAll(dir); rerr != nil {
			s.log.Error("removing a failed checkpoint", "dir", dir, "err", rerr)
		}
		if errors.Is(err, errCheckpointClosing) {
			return fmt.Errorf("storage: checkpoint %s: %w", dir, ErrClosed)
		}
		return fmt.Errorf("storage: checkpoint %s: %w", dir, err)
	})
}

// inside reports whether path is dir or lies below it, by their absolute
// names (symbolic links are not followed).
func inside(dir, path string) bool {
	d, err1 := filepath.Abs(dir)
	p, err2 := filepath.Abs(path)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// Compact writes every change made so far to Pebble and compacts the
// whole key space, dropping deleted records from disk. It can take long on
// a large store; ctx stops it early.
func (s *Store) Compact(ctx context.Context) error {
	return s.flushed(func(db *pebble.DB) error {
		// Compact's end bound is exclusive, like recordsEnd.
		if err := db.Compact(ctx, []byte{}, recordsEnd, true); err != nil {
			return fmt.Errorf("storage: compact: %w", err)
		}
		return nil
	})
}

// flushed runs fn on Pebble once every change committed so far is in it,
// keeping Close from closing Pebble meanwhile.
func (s *Store) flushed(fn func(db *pebble.DB) error) error {
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.Flush(); err != nil {
		return err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.dbClosed {
		return ErrClosed
	}
	return fn(s.db)
}

// Corruption is a part of a store Inspect could not read: a table, the keys
// it holds, and the error.
type Corruption struct {
	File       string
	Start, End []byte // the table's keys: [Start, End]
	Err        error
}

// Inspect calls fn with every record of the store in dir, in key order,
// until fn returns false. It opens the store read-only and writes nothing
// but the lock file Pebble takes, and not even that where the directory is
// read-only (see readOnlyFS); a store another process has open is refused
// with ErrLocked. key and val are valid only during the call.
//
// A table that cannot be read is reported to corrupt, which may be nil,
// and skipped: the records in its key range that Inspect had not listed yet
// are left out, the rest is listed. Inspect then returns an error wrapping
// ErrCorrupt. When the table holding the format marker is the one that
// cannot be read, the store is listed all the same, the marker's failure
// reported first.
func Inspect(dir string, fn func(key, val []byte) bool, corrupt func(Corruption)) (err error) {
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("inspect %s: %w", dir, err)
	}
	if err := checkDir(vfs.Default, dir); err != nil {
		return err
	}
	defer func() {
		// Some corruption makes Pebble call Fatalf, which panics here.
		if r := recover(); r != nil {
			err = fmt.Errorf("inspect %s: %w: pebble panicked: %v", dir, ErrCorrupt, r)
		}
	}()
	var (
		mu   sync.Mutex
		last *pebble.DataCorruptionInfo
	)
	db, err := pebble.Open(dir, &pebble.Options{
		ReadOnly: true,
		FS:       readOnlyFS{vfs.Default},
		Logger:   pebbleLogger{l: slog.New(slog.DiscardHandler)},
		EventListener: &pebble.EventListener{DataCorruption: func(info pebble.DataCorruptionInfo) {
			mu.Lock()
			last = &info
			mu.Unlock()
		}},
	})
	if err != nil {
		if lockHeld(err) {
			return fmt.Errorf("%w: %s (is a sluice serving it? stop it, or inspect a CHECKPOINT copy): %w", ErrLocked, dir, err)
		}
		if pebble.IsCorruptionError(err) || tableFileBroken(err) {
			return fmt.Errorf("open store in %s: %w: %w; %s", dir, ErrCorrupt, err, repairHint(dir))
		}
		return fmt.Errorf("open store in %s: %w", dir, err)
	}
	defer db.Close()
	// takeLast returns the corruption Pebble reported since the last call.
	takeLast := func() *pebble.DataCorruptionInfo {
		mu.Lock()
		defer mu.Unlock()
		info := last
		last = nil
		return info
	}
	bad := 0
	markerFile := "" // the table holding an unreadable format marker
	format, err := readFormat(db, dir)
	switch {
	case err != nil && pebble.IsCorruptionError(err):
		// The marker's table is damaged, not necessarily the rest: say that
		// the store could not be checked, and list what can be read.
		bad++
		c := Corruption{Err: fmt.Errorf("the sluice format marker could not be checked, listing the store anyway: %w", err)}
		if info := takeLast(); info != nil {
			c.File, c.Start, c.End = info.Path, info.Bounds.Start, info.Bounds.End.Key
			markerFile = info.Path
		}
		if corrupt != nil {
			corrupt(c)
		}
	case err != nil:
		return err
	case format == legacyFormatVersion:
		// Its keys are not the ones the caller decodes.
		return legacyFormatError(dir)
	case format == "":
		return fmt.Errorf("%w: %s has no sluice format marker", ErrNotStore, dir)
	}
	var lower []byte // the first record
	for {
		err := inspectFrom(db, lower, fn)
		if err == nil {
			break
		}
		info := takeLast()
		if info == nil {
			return fmt.Errorf("inspect %s: %w", dir, err)
		}
		end := info.Bounds.End.Key
		next := end
		if info.Bounds.End.IsUpperBoundFor(bytes.Compare, end) { // inclusive
			next = append(slices.Clip(end), 0)
		}
		if bytes.Compare(next, lower) <= 0 {
			return fmt.Errorf("inspect %s: %w: %w", dir, ErrCorrupt, err)
		}
		// A table that reaches recordsEnd holds the last records.
		last := bytes.Compare(next, recordsEnd) >= 0
		if info.Path != markerFile { // reported already
			bad++
			if corrupt != nil {
				corrupt(Corruption{File: info.Path, Start: info.Bounds.Start, End: end, Err: err})
			}
		}
		if last {
			break
		}
		lower = next
	}
	if bad > 0 {
		return fmt.Errorf("inspect %s: %w: %d tables could not be read; the records listed are the rest; %s", dir, ErrCorrupt, bad, repairHint(dir))
	}
	return nil
}

// inspectFrom lists records from lower on, until fn returns false or a
// read fails.
func inspectFrom(db *pebble.DB, lower []byte, fn func(key, val []byte) bool) error {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: recordsEnd})
	if err != nil {
		return err
	}
	for valid := it.First(); valid; valid = it.Next() {
		val, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return err
		}
		if !fn(it.Key(), val) {
			break
		}
	}
	return it.Close()
}

// metaPrefix starts the keys of Meta and SetMeta: from 0xff, with the
// format marker, among the store's own keys, which no scan, sweep or
// inspect lists.
const metaPrefix = "\xffsluice.meta."

// Meta returns the value SetMeta last stored under name, or nil when there
// is none. The value is the caller's.
func (s *Store) Meta(name string) ([]byte, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.dbClosed {
		return nil, ErrClosed
	}
	v, closer, err := s.db.Get([]byte(metaPrefix + name))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("storage: read %s: %w", name, err)
	}
	defer closer.Close()
	return bytes.Clone(v), nil
}

// AppendMetaKey appends to dst what the store key of every value SetMeta
// stores starts with; the name follows. A caller that keeps the key's
// room reads with MetaAt without allocating.
func AppendMetaKey(dst []byte) []byte { return append(dst, metaPrefix...) }

// MetaAt appends to dst the value stored under key (AppendMetaKey's,
// then the name), and reports whether there is one.
func (s *Store) MetaAt(dst, key []byte) (val []byte, found bool, err error) {
	err = s.withDB(func(db *pebble.DB) error {
		v, closer, err := db.Get(key)
		if errors.Is(err, pebble.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("storage: read %q: %w", key[len(metaPrefix):], err)
		}
		val, found = append(dst, v...), true
		return closer.Close()
	})
	return val, found, err
}

// SetMeta stores val under name, among the store's own keys, and returns
// once it is synced: a small value the server keeps across restarts (the
// cluster topology), not a record. It goes straight to Pebble, beside the
// commit queue, so it is not ordered with records.
func (s *Store) SetMeta(name string, val []byte) error {
	return s.UpdateMeta(map[string][]byte{name: val}, nil)
}

// ScanMeta calls fn with the name (without prefix) and value of each
// value SetMeta or UpdateMeta stored under a name starting with prefix,
// in name order, until fn returns false. fn must not keep val.
func (s *Store) ScanMeta(prefix string, fn func(name string, val []byte) bool) error {
	return s.ScanMetaFrom(prefix, prefix, fn)
}

// ScanMetaFrom is ScanMeta from the name from on (a name starting with
// prefix, or prefix itself): a listing that continues where a page ended.
func (s *Store) ScanMetaFrom(prefix, from string, fn func(name string, val []byte) bool) error {
	return s.scanMeta(prefix, from, func(name, val []byte) bool { return fn(string(name), val) })
}

// ScanMetaBytes is ScanMeta with the name as bytes, which fn must not
// keep either: a scan of many names that allocates none.
func (s *Store) ScanMetaBytes(prefix string, fn func(name, val []byte) bool) error {
	return s.scanMeta(prefix, prefix, fn)
}

func (s *Store) scanMeta(prefix, from string, fn func(name, val []byte) bool) error {
	return s.withDB(func(db *pebble.DB) error {
		lower := []byte(metaPrefix + prefix)
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte(metaPrefix + max(from, prefix)), UpperBound: prefixEnd(lower)})
		if err != nil {
			return fmt.Errorf("storage: read %s*: %w", prefix, err)
		}
		for ok := it.First(); ok; ok = it.Next() {
			v, err := it.ValueAndErr()
			if err != nil {
				it.Close()
				return fmt.Errorf("storage: read %s: %w", it.Key()[len(metaPrefix):], err)
			}
			if !fn(it.Key()[len(lower):], v) {
				break
			}
		}
		if err := it.Close(); err != nil {
			return fmt.Errorf("storage: read %s*: %w", prefix, err)
		}
		return nil
	})
}

// withDB runs fn on Pebble, keeping Close from closing it meanwhile.
func (s *Store) withDB(fn func(db *pebble.DB) error) error {
	if err := s.usable(); err != nil {
		return err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.dbClosed {
		return ErrClosed
	}
	return fn(s.db)
}

// prefixEnd is the first key after every key starting with p.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// UpdateMeta stores each value of set under its name and deletes the
// values named in del, as SetMeta does but all at once: one synced write.
func (s *Store) UpdateMeta(set map[string][]byte, del []string) error {
	return s.withDB(func(db *pebble.DB) error {
		b := db.NewBatch()
		defer b.Close()
		for name, v := range set {
			if err := b.Set([]byte(metaPrefix+name), v, nil); err != nil {
				return fmt.Errorf("storage: write %s: %w", name, err)
			}
		}
		for _, name := range del {
			if err := b.Delete([]byte(metaPrefix+name), nil); err != nil {
				return fmt.Errorf("storage: delete %s: %w", name, err)
			}
		}
		if err := b.Commit(pebble.Sync); err != nil {
			return fmt.Errorf("storage: write %d values and delete %d: %w", len(set), len(del), err)
		}
		return nil
	})
}
