package storage

import "github.com/cockroachdb/pebble/v2"

// MaxCompactionConcurrency is the most compactions a store runs at once.
const MaxCompactionConcurrency = 64

// Pebble's table sizes for level 0 and for the base level (the level that
// level 0 is compacted into) where more than two compactions run at once,
// smaller than its defaults (2 and 4 MiB): see compactionOptions. The
// levels below the base keep Pebble's defaults.
const (
	l0TargetFileSize   = 512 << 10
	baseTargetFileSize = 1 << 20
)

// compactionOptions lets Pebble run k compactions at once, and cuts the
// work of level 0 into pieces that can run at once. Under uniform writes
// every flush spans the whole key space, so each compaction out of level
// 0 rewrites the base level under the key range it takes; one at a time
// (Pebble's default), they are a stage that one core runs for the whole
// server (issue 28). Pebble's picker (pickL0, then
// l0Sublevels.PickBaseCompaction) takes a column of level 0, the tables
// of every sublevel over one key range, with the base tables under it,
// and while a slot is free starts another over a range whose tables are
// not compacting. What bounds the pieces is the width of the tables: a
// flush cuts its output at TargetFileSizes[0] (and at the flush split
// keys, every FlushSplitBytes of level 0 per sublevel), and the base
// tables under a column are rewritten whole. Over a million buckets
// (about 3.3 MiB of level 0 tables per 16 MiB memtable, 9 MiB of base
// tables) Pebble's default sizes make 3 compactions of level 0, the
// biggest half the work: enough for two at once. For more, tables of
// l0TargetFileSize and baseTargetFileSize make 8, the biggest a quarter
// of the work (docs/benchmarks.md); smaller ones would make more, but
// every piece costs CPU (files, iterators, more compactions, a flush cut
// into more tables), which only cores running them at once repay, so
// they are smaller only past two. The range is k, k: Pebble raises the
// concurrency from the lower bound only past 10 sublevels of level 0
// (L0CompactionConcurrency), too late for a store whose compactions must
// keep up with every core's writes.
func compactionOptions(po *pebble.Options, k int) {
	po.CompactionConcurrencyRange = func() (int, int) { return k, k }
	if k <= 2 {
		return
	}
	po.TargetFileSizes[0] = l0TargetFileSize
	po.TargetFileSizes[1] = baseTargetFileSize
	for i := 2; i < len(po.TargetFileSizes); i++ {
		po.TargetFileSizes[i] = 4 << 20 << (i - 1) // Pebble's default
	}
	po.FlushSplitBytes = 2 * l0TargetFileSize
}
