package storage

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/sstable/block"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/keyspace"
)

// The benchmarks of this file measure, one at a time, the stages of the
// write path that run on one goroutine for the whole server (issue 28):
// what one core can do there caps the server whatever GOMAXPROCS is. Run
// them on one core, as docs/benchmarks.md ("Issue 28: the serial stages")
// does:
//
//	go test -run '^$' -bench 'Committer|Pebble|WAL' -cpu 1 -count 5 ./storage
//
// Each reports ns/key, the cost per changed key, from which the stage's
// ceiling is 1e9/(ns/key) keys per second on one core. Their records are
// those of RL.PREDUCE over a million keys (k:0 to k:999999, as bench sends
// them), chosen uniformly, so that a round's keys are spread over the key
// space as in production.

// stageKeys is the number of distinct buckets the benchmarks write.
const stageKeys = 1_000_000

// stageRecords is the record keys of RL.PREDUCE k:<n> 100 60000, in a
// random order, and a bucket's value.
type stageRecords struct {
	keys [][]byte
	val  []byte
}

func newStageRecords() *stageRecords { return newStageRecordsOf(stageKeys) }

// newStageRecordsOf is newStageRecords of n buckets.
func newStageRecordsOf(n int) *stageRecords {
	p := bucket.Params{Max: 100, RefillAmount: 100, RefillMs: 60_000}
	r := &stageRecords{keys: make([][]byte, n)}
	for i := range r.keys {
		r.keys[i] = keyspace.AppendBucketKey(nil, p, fmt.Appendf(nil, "k:%d", i))
	}
	rng := rand.New(rand.NewPCG(28, 28))
	rng.Shuffle(len(r.keys), func(i, j int) { r.keys[i], r.keys[j] = r.keys[j], r.keys[i] })
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	r.val = bucket.AppendState(nil, bucket.State{Amount: 99, Anchor: now, LastReduce: now})
	return r
}

// round returns the i-th round of n distinct keys, in the shuffled order:
// uniform over the key space.
func (r *stageRecords) round(i, n int) [][]byte {
	start := i * n % len(r.keys)
	if start+n <= len(r.keys) {
		return r.keys[start : start+n]
	}
	return append(slices.Clip(r.keys[start:]), r.keys[:start+n-len(r.keys)]...)
}

// sorted returns keys sorted, as the committer writes a round.
func sorted(keys [][]byte) [][]byte {
	s := slices.Clone(keys)
	slices.SortFunc(s, bytes.Compare)
	return s
}

// putValue is a Mutator that stores v.
type putValue struct{ v []byte }

func (p putValue) Mutate([]byte, bool) ([]byte, Op, error) { return p.v, Put, nil }

// openStage opens a store on the real filesystem, as a server does, with
// a write-behind deadline of an hour: only the benchmark starts rounds.
func openStage(b *testing.B, mode SyncMode) *Store {
	return openStageWith(b, Options{Sync: mode})
}

// openStageWith is openStage with other options.
func openStageWith(b *testing.B, o Options) *Store {
	b.Helper()
	o.SyncInterval = time.Hour
	o.Partition, o.Partitions = keyspace.Partition, keyspace.Partitions
	s, err := Open(b.TempDir(), o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// stageFlushKeys is how many keys a stage benchmark writes to a memtable
// before it flushes it itself: about half of the default 16 MiB, so that
// Pebble never flushes or compacts on its own while the timer runs (on one
// core that work would be counted against the stage), and the memtable is
// as big as a server's, whose inserts get slower as it grows.
const stageFlushKeys = 100_000

// settle flushes the memtable and compacts everything into one level, with
// the timer stopped, once stageFlushKeys keys or more have been written
// since the last time; written counts them.
func settle(b *testing.B, s *Store, written *int, n int) {
	b.Helper()
	if *written += n; *written < stageFlushKeys {
		return
	}
	*written = 0
	if err := s.db.Flush(); err != nil {
		b.Fatal(err)
	}
	compactAll(b, s)
}

// compactAll compacts every record into the last level, as a store that
// has settled.
func compactAll(b testing.TB, s *Store) {
	b.Helper()
	if err := s.db.Compact(context.Background(), nil, recordsEnd, false); err != nil {
		b.Fatal(err)
	}
}

// stageClock stops and starts a benchmark's timer and adds up the CPU time
// the process used while it ran (user and system, every thread): on a
// shared machine a stage's wall time grows with the load of others, its
// CPU time much less.
type stageClock struct {
	b   *testing.B
	cpu time.Duration
	t0  time.Duration
}

func newStageClock(b *testing.B) *stageClock {
	return &stageClock{b: b, t0: processCPU(b)}
}

func (c *stageClock) stop() {
	c.b.StopTimer()
	c.cpu += processCPU(c.b) - c.t0
}

func (c *stageClock) start() {
	c.t0 = processCPU(c.b)
	c.b.StartTimer()
}

// report reports the wall and CPU time per unit of a benchmark whose every
// iteration handles n of them (changed keys, syncs); the timer must be
// running.
func (c *stageClock) report(n int, unit string) {
	c.stop()
	keys := float64(c.b.N) * float64(n)
	c.b.ReportMetric(float64(c.b.Elapsed().Nanoseconds())/keys, "ns/"+unit)
	c.b.ReportMetric(float64(c.cpu.Nanoseconds())/keys, "cpu-ns/"+unit)
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var roundSizes = []int{256, 1000, 8192}

// eachRoundSize runs fn as a sub-benchmark per round size, each on a
// store of its own.
func eachRoundSize(b *testing.B, fn func(b *testing.B, s *Store, n int)) {
	for _, n := range roundSizes {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) { fn(b, openStage(b, SyncEverySec), n) })
	}
}

// BenchmarkCommitterRound is the committer's whole work for a round of n
// changed keys, measured through the committer goroutine itself: the
// round's keys are changed with Modify (timer stopped), then Commit hands
// them over and, in everysec, Flush waits for the round to be in Pebble;
// in always Commit waits for its fsync too. It is everything one round
// costs: taking the queue, sorting, reading each record under its stripe
// lock, encoding the Pebble batch, Pebble's commit (WAL append, memtable
// insert) and marking the records clean. 256 is commitSlice, 1000 the hot
// scenario's keys in a round, 8192 a full write-behind round
// (writeBehindKeys).
func BenchmarkCommitterRound(b *testing.B) {
	recs := newStageRecords()
	for _, mode := range []SyncMode{SyncEverySec, SyncAlways} {
		for _, n := range roundSizes {
			b.Run(fmt.Sprintf("%s/keys=%d", mode, n), func(b *testing.B) {
				s := openStage(b, mode)
				keys0 := s.stats.keysWritten.Load()
				committerRounds(b, s, recs, n)
				// Every round wrote n keys: none was dropped or merged.
				if got := s.stats.keysWritten.Load() - keys0; got != int64(b.N*n) {
					b.Fatalf("the committer wrote %d keys in %d rounds of %d", got, b.N, n)
				}
			})
		}
	}
}

// committerRounds times b.N rounds of n keys through s's committers and
// reports their time per changed key; it returns the clock.
func committerRounds(b *testing.B, s *Store, recs *stageRecords, n int) *stageClock {
	bt := s.NewBatch()
	put := putValue{recs.val}
	var written int
	b.ReportAllocs()
	clk := newStageClock(b)
	for i := 0; b.Loop(); i++ {
		clk.stop()
		settle(b, s, &written, n)
		for _, k := range recs.round(i, n) {
			if err := bt.Modify(k, put); err != nil {
				b.Fatal(err)
			}
		}
		clk.start()
		if err := bt.Commit(); err != nil {
			b.Fatal(err)
		}
		if s.opts.Sync != SyncAlways {
			if err := s.Flush(); err != nil {
				b.Fatal(err)
			}
		}
	}
	clk.report(n, "key")
	return clk
}

// BenchmarkCommittersRound is BenchmarkCommitterRound's write-behind
// round of 8192 keys on a store of K committers, each taking the keys of
// its range of hash slots (about 8192/K), as a server of GOMAXPROCS K
// does. With -cpu 1 the committers run one after the other on one core:
// cpu-ns/key is the work of them all per changed key, and serial-ns/key
// that of the busiest alone, per changed key of the whole round (its
// share of the keys × cpu-ns/key): the cost of the one stage that no core
// shares, against the proxy's 250 ns.
func BenchmarkCommittersRound(b *testing.B) {
	recs := newStageRecords()
	const n = 8192
	for _, k := range []int{1, 2, 4, 8, 16} {
		b.Run(fmt.Sprintf("committers=%d/keys=%d", k, n), func(b *testing.B) {
			s := openStageWith(b, Options{Sync: SyncEverySec, Committers: k})
			keys0 := make([]int64, k)
			for c := range k {
				keys0[c] = s.queues[c].appliedKeys
			}
			clk := committerRounds(b, s, recs, n)
			busiest := int64(0)
			for c := range k {
				q := s.queues[c]
				q.Lock()
				busiest = max(busiest, q.appliedKeys-keys0[c])
				q.Unlock()
			}
			share := float64(busiest) / float64(b.N*n)
			b.ReportMetric(share, "busiest-share")
			b.ReportMetric(share*float64(clk.cpu.Nanoseconds())/float64(b.N*n), "serial-ns/key")
		})
	}
}

// stageBatch is a round's Pebble batch as the committer builds it: its
// keys in order, each set to a bucket's value.
func stageBatch(s *Store, keys [][]byte, val []byte) *pebble.Batch {
	batch := s.db.NewBatch()
	for _, k := range keys {
		batch.Set(k, val, nil)
	}
	return batch
}

// BenchmarkPebbleBatchSet is the encoding part of a round: the committer's
// batch.Set of each key of a round, in key order, into a reused batch.
func BenchmarkPebbleBatchSet(b *testing.B) {
	recs := newStageRecords()
	eachRoundSize(b, func(b *testing.B, s *Store, n int) {
		batch := s.db.NewBatch()
		defer batch.Close()
		rounds := make([][][]byte, 64)
		for i := range rounds {
			rounds[i] = sorted(recs.round(i, n))
		}
		b.ReportAllocs()
		clk := newStageClock(b)
		for i := 0; b.Loop(); i++ {
			batch.Reset()
			for _, k := range rounds[i%len(rounds)] {
				if err := batch.Set(k, recs.val, nil); err != nil {
					b.Fatal(err)
				}
			}
		}
		clk.report(n, "key")
	})
}

// BenchmarkPebbleApplyBatch is Pebble's commit of a round's batch through
// the committer's apply, without sync (everysec): the commit pipeline's
// WAL append (a copy into the log's block, under the pipeline's mutex), the
// memtable inserts, and the publication of the sequence number.
func BenchmarkPebbleApplyBatch(b *testing.B) {
	recs := newStageRecords()
	eachRoundSize(b, func(b *testing.B, s *Store, n int) {
		var written int
		b.ReportAllocs()
		clk := newStageClock(b)
		for i := 0; b.Loop(); i++ {
			clk.stop()
			settle(b, s, &written, n)
			batch := stageBatch(s, sorted(recs.round(i, n)), recs.val)
			clk.start()
			if err := s.apply(batch, pebble.NoSync); err != nil {
				b.Fatal(err)
			}
			clk.stop()
			batch.Close()
			clk.start()
		}
		clk.report(n, "key")
	})
}

// BenchmarkPebbleApplyParallel measures whether Pebble's commits run on
// several cores at once: each round of 8192 keys, sorted, is cut into
// appliers=G ranges of neighbouring keys, as G committers own, and each
// range is committed by a goroutine of its own in batches of commitSlice
// keys, as a committer applies a write-behind round. Pebble's commit
// pipeline (commit.go) writes each batch to the log under its mutex, then
// inserts it into the memtable outside it, then publishes it in order;
// if the inserts run at once, with -cpu G and a core free for each,
// appliers=G takes about 1/G of the wall time per key of appliers=1, and
// cores (CPU time over wall time) is near G.
func BenchmarkPebbleApplyParallel(b *testing.B) {
	recs := newStageRecords()
	const n = 8192
	for _, g := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("appliers=%d", g), func(b *testing.B) {
			s := openStage(b, SyncEverySec)
			var written int
			batches := make([][]*pebble.Batch, g)
			b.ReportAllocs()
			clk := newStageClock(b)
			for i := 0; b.Loop(); i++ {
				clk.stop()
				settle(b, s, &written, n)
				keys := sorted(recs.round(i, n))
				for j := range g {
					share := keys[j*n/g : (j+1)*n/g]
					batches[j] = batches[j][:0]
					for len(share) > 0 {
						m := min(len(share), commitSlice)
						batches[j] = append(batches[j], stageBatch(s, share[:m], recs.val))
						share = share[m:]
					}
				}
				errs := make(chan error, g)
				clk.start()
				for j := range g {
					go func() {
						var err error
						for _, batch := range batches[j] {
							if err == nil {
								err = s.apply(batch, pebble.NoSync)
							}
						}
						errs <- err
					}()
				}
				for range g {
					if err := <-errs; err != nil {
						b.Fatal(err)
					}
				}
				clk.stop()
				for _, bs := range batches {
					for _, batch := range bs {
						batch.Close()
					}
				}
				clk.start()
			}
			clk.report(n, "key")
			b.ReportMetric(float64(clk.cpu)/float64(b.Elapsed()), "cores")
		})
	}
}

// BenchmarkWALAppend is the WAL's part of BenchmarkPebbleApplyBatch: the
// same bytes as a round's batch, committed as a LogData record, which goes
// through Pebble's commit pipeline and into the log but not into the
// memtable. The log's writes to the file run on Pebble's flush goroutine
// for the log, another serial stage; they are counted here too, since
// LogData waits for a free block when that goroutine falls behind.
func BenchmarkWALAppend(b *testing.B) {
	recs := newStageRecords()
	eachRoundSize(b, func(b *testing.B, s *Store, n int) {
		batch := stageBatch(s, sorted(recs.round(0, n)), recs.val)
		payload := slices.Clone(batch.Repr())
		batch.Close()
		var written int
		b.ReportAllocs()
		clk := newStageClock(b)
		for b.Loop() {
			if err := s.db.LogData(payload, pebble.NoSync); err != nil {
				b.Fatal(err)
			}
			clk.stop()
			// Keep the log as long as a server's: its memtable
			// flushes move to a new log.
			if written += n; written >= stageFlushKeys {
				written = 0
				if err := s.apply(stageBatch(s, recs.round(0, 1), recs.val), pebble.NoSync); err != nil {
					b.Fatal(err)
				}
				if err := s.db.Flush(); err != nil {
					b.Fatal(err)
				}
			}
			clk.start()
		}
		clk.report(n, "key")
		b.ReportMetric(float64(len(payload))/float64(n), "WAL-B/key")
	})
}

// BenchmarkWALSync is the syncer's fsync of the log (syncApplied, once a
// second in everysec; in always the committer's Apply with Sync waits for
// the same fsync), after one round of 8192 keys was written without sync.
// Its cost is per sync, not per key: in always it is shared by the keys of
// a round.
func BenchmarkWALSync(b *testing.B) {
	recs := newStageRecords()
	s := openStage(b, SyncEverySec)
	var written int
	b.ReportAllocs()
	clk := newStageClock(b)
	for i := 0; b.Loop(); i++ {
		clk.stop()
		settle(b, s, &written, 8192)
		batch := stageBatch(s, sorted(recs.round(i, 8192)), recs.val)
		if err := s.apply(batch, pebble.NoSync); err != nil {
			b.Fatal(err)
		}
		batch.Close()
		q := s.queues[0]
		q.Lock()
		q.applied++
		q.Unlock()
		clk.start()
		if err := s.syncApplied(); err != nil {
			b.Fatal(err)
		}
	}
	clk.report(1, "sync")
}

// BenchmarkPebbleFlush is Pebble's flush of a memtable holding flushKeys changed
// keys into tables of level 0. Pebble runs one flush at a time, on one
// goroutine: what it costs per key caps the keys the server can write.
// compactions=K opens the store as a server of GOMAXPROCS K does
// (Options.CompactionConcurrency K): past two, level 0's tables are
// smaller (compactionOptions), and a flush writes more of them.
//
// split=8 is what a store split into 8 Pebble stores, one per committer
// group, would flush (not built: docs/benchmarks.md): each store holds an
// eighth of the buckets and flushes a memtable of an eighth of the keys,
// on a flush goroutine of its own, so what caps the server is one store's
// flush of its share: serial-ns/key, cpu-ns/key / 8 per changed key of the
// whole server.
func BenchmarkPebbleFlush(b *testing.B) {
	recs := newStageRecords()
	for _, k := range []int{1, 8} {
		b.Run(fmt.Sprintf("compactions=%d", k), func(b *testing.B) {
			pebbleFlush(b, recs, Options{Sync: SyncEverySec, CompactionConcurrency: k}, flushKeys)
		})
	}
	// A 64 MiB memtable (docs/operations.md advises it from 8 cores)
	// holds about 700000 changes: over a million buckets, some of them
	// change the same bucket again, which the flush writes once. Its
	// time is per change, repeats included.
	b.Run("memtable=64MiB", func(b *testing.B) {
		const changes = 700_000
		rng := rand.New(rand.NewPCG(64, 28))
		keys := make([][]byte, changes)
		o := Options{Sync: SyncEverySec, CompactionConcurrency: 8, MemTableSize: 64 << 20}
		pebbleFlushOf(b, recs, o, changes, func(int) [][]byte {
			for j := range keys {
				keys[j] = recs.keys[rng.IntN(len(recs.keys))]
			}
			return keys
		})
	})
	b.Run("split=8", func(b *testing.B) {
		const split = 8
		clk := pebbleFlush(b, newStageRecordsOf(stageKeys/split), Options{Sync: SyncEverySec}, flushKeys/split)
		b.ReportMetric(float64(clk.cpu.Nanoseconds())/float64(b.N*flushKeys), "serial-ns/key")
	})
}

// flushKeys is the changed keys of BenchmarkPebbleFlush's memtable: a 16
// MiB memtable holds about 180000.
const flushKeys = 131072

// BenchmarkPebbleFlushLevel0 is BenchmarkPebbleFlush/compactions=8 with
// level 0's tables written otherwise, to show what a flush's time per key
// is made of: without compression, without the Bloom filter, with data
// blocks of 32 KiB rather than 4, and all three. The levels below keep the
// store's settings.
func BenchmarkPebbleFlushLevel0(b *testing.B) {
	recs := newStageRecords()
	noCompression := func(po *pebble.Options) {
		po.Levels[0].Compression = func() *block.CompressionProfile { return block.NoCompression }
	}
	noFilter := func(po *pebble.Options) {
		// Level 1 and below take level 0's filter unless given their own.
		for l := 1; l < len(po.Levels); l++ {
			po.Levels[l].FilterPolicy = po.Levels[0].FilterPolicy
		}
		po.Levels[0].FilterPolicy = nil
	}
	bigBlocks := func(po *pebble.Options) {
		for l := 1; l < len(po.Levels); l++ {
			po.Levels[l].BlockSize = 4 << 10
		}
		po.Levels[0].BlockSize = 32 << 10
	}
	// Pebble's row-oriented tables (TableFormatPebblev4) instead of its
	// columnar ones, at every level: the format is the store's.
	rowBlocks := func(po *pebble.Options) {
		po.Experimental.EnableColumnarBlocks = func() bool { return false }
	}
	for _, v := range []struct {
		name string
		set  []func(*pebble.Options)
	}{
		{"as-is", nil},
		{"compression=none", []func(*pebble.Options){noCompression}},
		{"filter=none", []func(*pebble.Options){noFilter}},
		{"block=32KiB", []func(*pebble.Options){bigBlocks}},
		{"all", []func(*pebble.Options){noCompression, noFilter, bigBlocks}},
		{"format=rows", []func(*pebble.Options){rowBlocks}},
	} {
		b.Run(v.name, func(b *testing.B) {
			o := Options{Sync: SyncEverySec, CompactionConcurrency: 8}
			o.pebble = func(po *pebble.Options) {
				for _, set := range v.set {
					set(po)
				}
			}
			pebbleFlush(b, recs, o, flushKeys)
		})
	}
}

// pebbleFlush times b.N flushes of n changed keys on a store opened with
// o, the records compacted below before each, and returns the clock.
func pebbleFlush(b *testing.B, recs *stageRecords, o Options, n int) *stageClock {
	return pebbleFlushOf(b, recs, o, n, func(i int) [][]byte { return recs.round(i, n) })
}

// pebbleFlushOf is pebbleFlush of the n changed keys that changes(i)
// returns for the i-th flush.
func pebbleFlushOf(b *testing.B, recs *stageRecords, o Options, n int, changes func(i int) [][]byte) *stageClock {
	s := openStageWith(b, o)
	b.ReportAllocs()
	clk := newStageClock(b)
	for i := 0; b.Loop(); i++ {
		clk.stop()
		compactAll(b, s)
		applyRounds(b, s, recs, changes(i))
		clk.start()
		if err := s.db.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	clk.report(n, "key")
	b.ReportMetric(float64(s.db.Metrics().Levels[0].TablesCount), "l0-tables")
	return clk
}

// applyRounds applies keys to Pebble through the committer's apply, in
// sorted rounds of 8192 as the committer writes them.
func applyRounds(b testing.TB, s *Store, recs *stageRecords, keys [][]byte) {
	b.Helper()
	for len(keys) > 0 {
		n := min(len(keys), 8192)
		batch := stageBatch(s, sorted(keys[:n]), recs.val)
		if err := s.apply(batch, pebble.NoSync); err != nil {
			b.Fatal(err)
		}
		batch.Close()
		keys = keys[n:]
	}
}

// BenchmarkPebbleCompaction is Pebble's compaction of the changed keys of
// four 16 MiB memtables (4 × 180000 keys, uniform), flushed to level 0 as
// four sublevels, with the million records below them in the base level
// (about 9 MiB of tables: the last level, below LBaseMaxBytes), as Pebble
// compacts a store of a million buckets under uniform writes: every
// flush spans the whole key space. Pebble's own picker does the work,
// with up to compactions=K of them at once (Options.CompactionConcurrency,
// and the table sizes that go with it, as a server of GOMAXPROCS K runs;
// see compactionOptions): a gate (compactionGate) holds its
// compactions back while the memtables are flushed, and the timer runs
// from its opening until level 0 is compacted. With -cpu 1 the
// compactions share one core: cpu-ns/key is the work of them all per
// changed key. It also reports how many compactions each round took,
// the most that ran at once (in-flight), the biggest one's share of
// the bytes they read (largest-share), and serial-ns/key, cpu-ns/key ×
// max(1/K, largest-share): with K cores the stage takes at least the
// longer of its work spread over K and its biggest compaction, so its
// ceiling is 1e9/serial-ns/key, K × the one-core rate when the pieces
// are even. serial-ns/key counts only the changed keys whose tables were
// compacted (l0-done, the share of level 0's bytes: Pebble leaves the
// last sublevel's stragglers for the next flush).
func BenchmarkPebbleCompaction(b *testing.B) {
	recs := newStageRecords()
	for _, k := range []int{1, 2, 4, 8, 16} {
		b.Run(fmt.Sprintf("compactions=%d", k), func(b *testing.B) { pebbleCompactions(b, recs, k) })
	}
}

// compactionMemtables and compactionMemtableKeys are the level 0 that
// BenchmarkPebbleCompaction compacts: L0CompactionThreshold's worth of
// default memtables, each flushed by itself.
const (
	compactionMemtables    = 4
	compactionMemtableKeys = 180_000
)

func pebbleCompactions(b *testing.B, recs *stageRecords, k int) {
	const n = compactionMemtables * compactionMemtableKeys
	g := &compactionGate{}
	// A big memtable, so that Pebble never flushes on its own: the
	// benchmark flushes every compactionMemtableKeys.
	o := Options{Sync: SyncEverySec, MemTableSize: 64 << 20, CompactionConcurrency: k}
	g.options(&o)
	s := openStageWith(b, o)
	g.setOpen(true)
	applyRounds(b, s, recs, recs.keys)
	if err := s.db.Flush(); err != nil {
		b.Fatal(err)
	}
	var total compactionStats
	var l0Bytes uint64
	b.ReportAllocs()
	clk := newStageClock(b)
	for i := 0; b.Loop(); i++ {
		clk.stop()
		compactAll(b, s) // what the last round left in level 0, if any
		g.setOpen(false)
		for j := range compactionMemtables {
			applyRounds(b, s, recs, recs.round(1+i*compactionMemtables+j, compactionMemtableKeys))
			if err := s.db.Flush(); err != nil {
				b.Fatal(err)
			}
		}
		l0Bytes += uint64(s.db.Metrics().Levels[0].TablesSize)
		g.take()
		clk.start()
		g.setOpen(true)
		waitLevel0(b, s, g)
		clk.stop()
		st := g.take()
		total.compactions += st.compactions
		total.maxInFlight = max(total.maxInFlight, st.maxInFlight)
		total.inputBytes += st.inputBytes
		total.fromL0Bytes += st.fromL0Bytes
		total.largest = max(total.largest, st.largest)
		clk.start()
	}
	clk.report(n, "key")
	// Level 0 tables left for the next round (a sublevel's edges) are
	// counted as keys not compacted.
	done := float64(total.fromL0Bytes) / float64(l0Bytes)
	cpuKey := float64(clk.cpu.Nanoseconds()) / (float64(b.N) * n * done)
	share := float64(total.largest) / (float64(total.inputBytes) / float64(b.N))
	b.ReportMetric(done, "l0-done")
	b.ReportMetric(float64(total.compactions)/float64(b.N), "compactions")
	b.ReportMetric(float64(total.maxInFlight), "in-flight")
	b.ReportMetric(share, "largest-share")
	b.ReportMetric(cpuKey*max(1/float64(k), share), "serial-ns/key")
}

// waitLevel0 waits until Pebble has no compaction running or to start:
// level 0 is down to one sublevel, which Pebble leaves until the next
// flush (L0CompactionThreshold), and the gate has none running. It looks
// at Pebble's metrics, which take a while to gather, only once the gate
// has none running, and otherwise when a compaction ends or every 10 ms.
func waitLevel0(b *testing.B, s *Store, g *compactionGate) {
	b.Helper()
	for {
		g.mu.Lock()
		running := g.mu.running
		g.mu.Unlock()
		if running == 0 {
			if m := s.db.Metrics(); m.Compact.NumInProgress == 0 && m.Levels[0].Sublevels < 2 {
				return
			}
		}
		select {
		case <-g.ended:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// BenchmarkStoreUniform is the whole store in its steady state under
// uniform writes, with the default options (a 16 MiB memtable, Pebble's
// own flushes and compactions), on whatever cores -cpu gives it: one
// changed key per operation, committed 16 at a time as a pipeline of 16
// does, over a million buckets that all exist (written and compacted
// before the timer starts). On one core its time per key is the sum of
// every stage, the connection's Modify included; a CPU profile of it
// (-cpuprofile) splits that time between the committer, Pebble's flushes
// and its compactions, which run on their own goroutines (one flush at a
// time, and by default one compaction). It reports Pebble's bytes
// written by flushes and compactions per changed key, and the compactions'
// time per key as Pebble measures it (wall time, so on one core it
// includes the time other goroutines ran in between).
func BenchmarkStoreUniform(b *testing.B) {
	storeUniform(b, newStageRecords(), Options{Sync: SyncEverySec})
}

// BenchmarkStoreUniformMemtable is BenchmarkStoreUniform with Pebble's
// memtable at 16 MiB (the default) and 64 MiB: a bigger memtable absorbs
// repeated writes of a key before its flush, and each compaction, which
// with uniform keys rewrites the whole base level, brings more changed
// keys, so flushes and compactions cost less per changed key.
func BenchmarkStoreUniformMemtable(b *testing.B) {
	recs := newStageRecords()
	for _, mib := range []int64{16, 64} {
		b.Run(fmt.Sprintf("memtable=%dMiB", mib), func(b *testing.B) {
			storeUniform(b, recs, Options{Sync: SyncEverySec, MemTableSize: mib << 20})
		})
	}
}

// BenchmarkStoreUniformCompactions is BenchmarkStoreUniform with 1, 2 and
// 4 compactions at once (Options.CompactionConcurrency; a server's is
// GOMAXPROCS). With -cpu 1 it shows what running them at once costs in
// all: a range compacted while another is, rather than after it, may
// have gathered fewer sublevels, so that the base tables it rewrites
// bring fewer changed keys (compacted-B/key).
func BenchmarkStoreUniformCompactions(b *testing.B) {
	recs := newStageRecords()
	for _, k := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("compactions=%d", k), func(b *testing.B) {
			storeUniform(b, recs, Options{Sync: SyncEverySec, CompactionConcurrency: k})
		})
	}
}

// storeUniform is BenchmarkStoreUniform on a store opened with o.
func storeUniform(b *testing.B, recs *stageRecords, o Options) {
	s, err := Open(b.TempDir(), o)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	bt := s.NewBatch()
	put := putValue{recs.val}
	for i, k := range recs.keys {
		if err := bt.Modify(k, put); err != nil {
			b.Fatal(err)
		}
		if i%16 == 15 {
			if err := bt.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := bt.Commit(); err != nil {
		b.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		b.Fatal(err)
	}
	compactAll(b, s)
	m0 := s.db.Metrics()
	rng := rand.New(rand.NewPCG(1, 28))
	b.ReportAllocs()
	clk := newStageClock(b)
	for i := 0; b.Loop(); i++ {
		if err := bt.Modify(recs.keys[rng.IntN(len(recs.keys))], put); err != nil {
			b.Fatal(err)
		}
		if i%16 == 15 {
			if err := bt.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	}
	clk.report(1, "key")
	if err := bt.Commit(); err != nil {
		b.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		b.Fatal(err)
	}
	m1 := s.db.Metrics()
	perKey := func(v float64) float64 { return v / float64(b.N) }
	var flushed, compacted uint64
	for l := range m1.Levels {
		flushed += m1.Levels[l].TableBytesFlushed - m0.Levels[l].TableBytesFlushed
		compacted += m1.Levels[l].TableBytesCompacted - m0.Levels[l].TableBytesCompacted
	}
	b.ReportMetric(perKey(float64(flushed)), "flushed-B/key")
	b.ReportMetric(perKey(float64(compacted)), "compacted-B/key")
	b.ReportMetric(perKey(float64(m1.Compact.Duration-m0.Compact.Duration)), "compact-ns/key")
	b.ReportMetric(float64(m1.Compact.Count-m0.Compact.Count), "compactions")
	b.ReportMetric(float64(m1.Flush.Count-m0.Flush.Count), "flushes")
}

// BenchmarkDirtyCounter is the count of dirty records that every change
// touches from both sides: Modify adds a dirty record from the
// connection's goroutine, the committer takes it off once the record is
// written. It was one atomic for the store, a cache line that the cores
// passed around; it is one per stripe, on the stripe's own line, which
// the same change locks anyway. With -cpu 2 or more this shows what each
// change pays for it when the sides run on different cores; each
// goroutine here goes over the stripes as uniform keys do.
func BenchmarkDirtyCounter(b *testing.B) {
	s := &Store{}
	var seed atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		i := seed.Add(7919)
		for pb.Next() {
			st := s.stripeOf(i)
			st.dirty.Add(1)
			st.dirty.Add(-1)
			i++
		}
	})
}
