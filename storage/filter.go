package storage

import "sync/atomic"

// keyFilter is a blocked Bloom filter over every key the store holds or has
// held since it was opened. It answers "certainly absent" for keys never
// written, which lets Modify skip a Pebble lookup (memtable skiplists and a
// filter probe per level) for new buckets, the common case of a rate
// limiter. A false "maybe present" only costs that lookup. Deleted keys stay
// in the filter until the store is reopened; the filter is rebuilt from a
// scan of the keys at every Open.
//
// Each key sets and tests filterProbes bits within one 64-byte block, so a
// test costs one cache miss. Words are updated with atomic OR, so adds and
// tests need no lock.
type keyFilter struct {
	words  []atomic.Uint64
	blocks uint64 // len(words)/8, below 2^32
}

const filterProbes = 6

// newKeyFilter returns a filter of sizeBytes rounded down to whole 64-byte
// blocks (at most 256 GiB), or nil for sizeBytes < 64.
func newKeyFilter(sizeBytes int64) *keyFilter {
	if sizeBytes < 64 {
		return nil
	}
	blocks := min(uint64(sizeBytes/64), 1<<32-1)
	return &keyFilter{words: make([]atomic.Uint64, blocks*8), blocks: blocks}
}

// block returns the 64-byte block of a key hash, chosen by its high bits.
func (f *keyFilter) block(h uint64) []atomic.Uint64 {
	b := (h >> 32) * f.blocks >> 32 // maps the high 32 bits onto [0, blocks)
	return f.words[b*8 : b*8+8]
}

func (f *keyFilter) add(h uint64) {
	blk := f.block(h)
	m := h * 0x9e3779b97f4a7c15 // mix, so probes do not follow the stripe bits
	for i := range filterProbes {
		bit := (m >> (55 - 9*i)) & 511 // one of the block's 512 bits
		// A load first: most adds are of keys held already (a bucket
		// changed again), and a locked OR of a word no cache holds stalls
		// the core; it was 7% of a follower's CPU.
		if w := &blk[bit>>6]; w.Load()&(1<<(bit&63)) == 0 {
			w.Or(1 << (bit & 63))
		}
	}
}

// mayContain reports false only for keys never added.
func (f *keyFilter) mayContain(h uint64) bool {
	blk := f.block(h)
	m := h * 0x9e3779b97f4a7c15
	for i := range filterProbes {
		bit := (m >> (55 - 9*i)) & 511
		if blk[bit>>6].Load()&(1<<(bit&63)) == 0 {
			return false
		}
	}
	return true
}
