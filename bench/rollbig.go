package main

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// Filling a log of max 100000 through ROLL.LIMIT takes 100001 calls that
// each rewrite the whole log: about 5·10⁹ entry copies and a few hundred
// GB of log writes per key. The rollbig scenario writes the full logs
// straight into a fresh store instead, with sluice's own key layout and
// codec, before sluice opens it; the measured calls then each work on a
// full log, which is what the memory bound must survive.

// A prefilled log's gaps are drawn from [bigLogGapMin, bigLogGapMax): 36
// ms on average, 100000 per hour, each taking the 3 bytes of gaps between
// 8 ms and 1 s as a stream at that rate would, and the values compress on
// disk as real ones do (equal gaps would compress to almost nothing).
const (
	bigLogGapMin = 9 * time.Millisecond
	bigLogGapMax = 63 * time.Millisecond
)

// prefillLogs writes w.Keys logs, k:0 to k:<Keys-1> as the workload names
// them, each holding w.Max+1 entries with gaps of bigLogGapMin to bigLogGapMax, the newest a second
// ago, with interval w.RefillMs, into a new store at dir, and closes it.
// It returns the bytes of one log's value (every gap takes 3 bytes, so
// all are the same size).
func prefillLogs(dir string, w workload) (int, error) {
	st, err := storage.Open(dir, storage.Options{Partition: keyspace.Partition, Partitions: keyspace.Partitions})
	if err != nil {
		return 0, fmt.Errorf("prefill: %w", err)
	}
	n := int(w.Max) + 1
	if span := time.Duration(n) * bigLogGapMax; span >= time.Duration(w.RefillMs)*time.Millisecond {
		st.Close()
		return 0, fmt.Errorf("prefill: %d entries up to %v apart may span %v, not within the interval of %d ms: the logs would not be live", n, bigLogGapMax, span, w.RefillMs)
	}
	entries := make([]int64, n)
	rng := rand.New(rand.NewPCG(1, 2))
	newest := time.Now().Add(-time.Second).UnixMicro()
	var key, val []byte
	for i := range w.Keys {
		t := newest
		for j := n - 1; j >= 0; j-- {
			entries[j] = t
			t -= bigLogGapMin.Microseconds() + rng.Int64N((bigLogGapMax - bigLogGapMin).Microseconds())
		}
		val = bucket.AppendLogState(val[:0], bucket.LogState{Interval: w.RefillMs, Entries: entries})
		key = keyspace.AppendLogKey(key[:0], strconv.AppendInt([]byte("k:"), i, 10))
		b := st.NewBatch()
		if err := b.Modify(key, putValue(val)); err != nil {
			st.Close()
			return 0, fmt.Errorf("prefill: %w", err)
		}
		if err := b.Commit(); err != nil {
			st.Close()
			return 0, fmt.Errorf("prefill: %w", err)
		}
	}
	if err := st.Close(); err != nil {
		return 0, fmt.Errorf("prefill: close the store: %w", err)
	}
	return len(val), nil
}

// putValue is a storage.Mutator that stores its bytes.
type putValue []byte

func (v putValue) Mutate([]byte, bool) ([]byte, storage.Op, error) { return v, storage.Put, nil }
