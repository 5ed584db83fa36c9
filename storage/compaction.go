package storage

import "github.com/cockroachdb/pebble/v2"

// MaxCompactionConcurrency is the most compactions a store runs at once.
const MaxCompactionConcurrency = 64

// Pebble's table sizes for level 0 and for the base level (the level that
// level 0 is compacted into), smaller than its defaults (2 and 4 MiB): see
// compactionOptions. The levels below the base keep Pebble's defaults.
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
// flush cuts its output at l0TargetFileSize (and at the flush split keys,
// every FlushSplitBytes of level 0 per sublevel), so a 16 MiB memtable of
// uniform keys, about 3.3 MiB of tables, becomes about 7 tables; base
// tables of baseTargetFileSize keep a column's compaction to the base
// tables it overlaps (a million buckets take about 9 MiB there). Over a
// million buckets that makes about 8 compactions of level 0, the biggest
// a quarter of the work (docs/benchmarks.md). Smaller tables would make
// more, smaller pieces, but cost the flush, which runs one at a time,
// more per key. The range is k, k: Pebble raises the concurrency from the
// lower bound only past 10 sublevels of level 0 (L0CompactionConcurrency),
// too late for a store whose compactions must keep up with every core's
// writes.
func compactionOptions(po *pebble.Options, k int) {
	po.CompactionConcurrencyRange = func() (int, int) { return k, k }
	po.TargetFileSizes[0] = l0TargetFileSize
	po.TargetFileSizes[1] = baseTargetFileSize
	for i := 2; i < len(po.TargetFileSizes); i++ {
		po.TargetFileSizes[i] = 4 << 20 << (i - 1) // Pebble's default
	}
	po.FlushSplitBytes = 2 * l0TargetFileSize
}
