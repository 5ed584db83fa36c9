// Package bloom is a blocked Bloom filter of 64-bit hashes, safe for
// concurrent use without a lock: the store's filter of its keys, and a
// cluster node's filter of its per-actor overrides. It answers "certainly
// absent" for a hash never added; a false "maybe present" costs the
// caller only the lookup the filter would have spared. Nothing is ever
// removed: the owner builds a new filter to forget.
//
// Each hash sets and tests Probes bits within one 64-byte block, so a
// test costs one cache miss. Words are updated with atomic OR, so adds
// and tests need no lock, and an add is seen by every test that begins
// after it.
package bloom

import "sync/atomic"

// Probes is the bits a hash sets in its block: with 10 bits per hash
// added, about 1% of the hashes never added are reported present.
const Probes = 6

// BlockBytes is the size of a block, the unit a filter's size is rounded
// down to.
const BlockBytes = 64

// Filter is a blocked Bloom filter of 64-bit hashes. The callers choose
// the hash (hash/maphash with a seed of their own).
type Filter struct {
	words  []atomic.Uint64
	blocks uint64 // len(words)/8, below 2^32
}

// New returns a filter of sizeBytes rounded down to whole blocks (at most
// 256 GiB), or nil for sizeBytes below BlockBytes.
func New(sizeBytes int64) *Filter {
	if sizeBytes < BlockBytes {
		return nil
	}
	blocks := min(uint64(sizeBytes/BlockBytes), 1<<32-1)
	return &Filter{words: make([]atomic.Uint64, blocks*8), blocks: blocks}
}

// Bytes is the memory the filter's bits take.
func (f *Filter) Bytes() int64 { return int64(len(f.words)) * 8 }

// block returns the 64-byte block of a hash, chosen by its high bits.
func (f *Filter) block(h uint64) []atomic.Uint64 {
	b := (h >> 32) * f.blocks >> 32 // maps the high 32 bits onto [0, blocks)
	return f.words[b*8 : b*8+8]
}

// Add adds h.
func (f *Filter) Add(h uint64) {
	blk := f.block(h)
	m := h * 0x9e3779b97f4a7c15 // mix, so probes do not follow the stripe bits
	for i := range Probes {
		bit := (m >> (55 - 9*i)) & 511 // one of the block's 512 bits
		// A load first: most adds are of keys held already (a bucket
		// changed again), and a locked OR of a word no cache holds stalls
		// the core; it was 7% of a follower's CPU.
		if w := &blk[bit>>6]; w.Load()&(1<<(bit&63)) == 0 {
			w.Or(1 << (bit & 63))
		}
	}
}

// MayContain reports false only for hashes never added.
func (f *Filter) MayContain(h uint64) bool {
	blk := f.block(h)
	m := h * 0x9e3779b97f4a7c15
	for i := range Probes {
		bit := (m >> (55 - 9*i)) & 511
		if blk[bit>>6].Load()&(1<<(bit&63)) == 0 {
			return false
		}
	}
	return true
}
