package storage

import (
	"sync/atomic"
	"time"
)

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
