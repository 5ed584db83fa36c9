package main

import (
	"fmt"
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

// bigLogGap is the spacing of a prefilled log's entries: 100000 per hour,
// so each gap takes the 3 bytes of gaps between 8 ms and 1 s, as a
// steady stream at that rate would.
const bigLogGap = 36 * time.Millisecond

// prefillLogs writes w.Keys logs, k:0 to k:<Keys-1> as the workload names
// them, each holding w.Max+1 entries bigLogGap apart, the newest a second
// ago, with interval w.RefillMs, into a new store at dir, and closes it.
// It returns the bytes of one log's value.
func prefillLogs(dir string, w workload) (int, error) {
	st, err := storage.Open(dir, storage.Options{})
	if err != nil {
		return 0, fmt.Errorf("prefill: %w", err)
	}
	n := int(w.Max) + 1
	if span := time.Duration(n) * bigLogGap; span >= time.Duration(w.RefillMs)*time.Millisecond {
		st.Close()
		return 0, fmt.Errorf("prefill: %d entries %v apart span %v, not within the interval of %d ms: the logs would not be live", n, bigLogGap, span, w.RefillMs)
	}
	entries := make([]int64, n)
	newest := time.Now().Add(-time.Second).UnixMicro()
	for i := range entries {
		entries[i] = newest - int64(n-1-i)*bigLogGap.Microseconds()
	}
	val := bucket.AppendLogState(nil, bucket.LogState{Interval: w.RefillMs, Entries: entries})
	var key []byte
	for i := range w.Keys {
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
