// Package peakstats summarises the peak usage of a rule's actor-windows,
// the threshold data of POLICY STATS (issue 30). A Day is one rule
// label's summary of one UTC day: how many actor-windows ended and how
// many of them were refused, a histogram of their peak used, HyperLogLog
// sketches of the distinct actors seen and refused, and a sample of the
// actors (the SampleSize smallest hashes, each with its largest peak)
// that estimates the share of distinct actors a candidate limit would
// have refused. A Day has a bounded size whatever the number of actors
// (at most MaxEncodedLen bytes encoded), and Days merge: the days of a
// period into one, a delta into the stored day.
//
// The package is pure: no clock, no store, no I/O. A Day is not safe for
// concurrent use.
package peakstats

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// The histogram of peak used: a value below 64 has a bucket of its own;
// above, each power of two is cut into 32 buckets, so that a bucket's
// values are within 1/32 (3.1%) of each other.
const (
	exactBelow = 64
	subBits    = 5
	subBuckets = 1 << subBits
	// Buckets is the number of histogram buckets, enough for any int64.
	Buckets = exactBelow + (63-6)*subBuckets
)

// RelativeWidth is the largest (high-low)/low of a histogram bucket above
// the exact ones: a quantile above 63 is reported as its bucket's highest
// value, at most that much above the true one.
const RelativeWidth = 1.0 / subBuckets

// bucketOf returns the histogram bucket of v >= 0.
func bucketOf(v int64) int {
	if v < exactBelow {
		return int(max(v, 0))
	}
	e := bits.Len64(uint64(v)) - 1 // 6..62
	sub := int(v>>(e-subBits)) & (subBuckets - 1)
	return exactBelow + (e-6)*subBuckets + sub
}

// bucketBounds returns the lowest and highest value of bucket i.
func bucketBounds(i int) (lo, hi int64) {
	if i < exactBelow {
		return int64(i), int64(i)
	}
	e := 6 + (i-exactBelow)/subBuckets
	sub := int64((i - exactBelow) % subBuckets)
	lo = (subBuckets + sub) << (e - subBits)
	return lo, lo + 1<<(e-subBits) - 1
}

// The distinct-actor sketches: HyperLogLog with 2^11 registers.
const (
	hllBits = 11
	// Registers is the number of registers of each HyperLogLog sketch.
	Registers = 1 << hllBits
)

// ActorsStdErr is the relative standard error of a distinct-actor count
// estimated by the HyperLogLog sketches: 1.04/sqrt(Registers), 2.3%. A
// count of fewer than SampleSize actors is exact: the sample holds them
// all.
var ActorsStdErr = 1.04 / math.Sqrt(Registers)

type hll [Registers]uint8

func (s *hll) add(h uint64) {
	i := h >> (64 - hllBits)
	// The remaining bits, with a sentinel so that the rank stays within
	// 64-hllBits+1.
	w := h<<hllBits | 1<<(hllBits-1)
	if r := uint8(bits.LeadingZeros64(w) + 1); r > s[i] {
		s[i] = r
	}
}

func (s *hll) merge(o *hll) {
	for i, r := range o {
		s[i] = max(s[i], r)
	}
}

// estimate is the HyperLogLog estimate (Flajolet et al. 2007), with linear
// counting for small cardinalities; the 64-bit hash needs no large-range
// correction.
func (s *hll) estimate() float64 {
	const m = float64(Registers)
	sum, zeros := 0.0, 0
	for _, r := range s {
		sum += math.Ldexp(1, -int(r))
		if r == 0 {
			zeros++
		}
	}
	e := 0.7213 / (1 + 1.079/m) * m * m / sum
	if e <= 2.5*m && zeros > 0 {
		return m * math.Log(m/float64(zeros))
	}
	return e
}

// SampleSize is the most actors the sample holds: those of the smallest
// hashes, a uniform sample of the distinct actors, each with its largest
// peak over the period. A share of distinct actors estimated from a full
// sample has a standard error of sqrt(p(1-p)/SampleSize), at most 1.6
// points; with fewer actors it is exact.
const SampleSize = 1024

type entry struct {
	hash    uint64
	peak    int64
	refused bool
}

// Day is one label's summary of one UTC day's actor-windows, or of a
// period when Days are merged.
type Day struct {
	// Windows are the actor-windows that ended; Refused those of them
	// whose peak used reached their limit.
	Windows, Refused uint64
	// Max is the largest peak; 0 with no window.
	Max           int64
	hist          [Buckets]uint64
	seen, refused hll
	sample        []entry // by hash, at most SampleSize
}

// NewDay returns an empty Day, with room for its sample: Add allocates
// nothing.
func NewDay() *Day { return &Day{sample: make([]entry, 0, SampleSize)} }

// Reset empties d, keeping its room.
func (d *Day) Reset() {
	s := d.sample[:0]
	*d = Day{sample: s}
}

// Empty reports whether d has no window.
func (d *Day) Empty() bool { return d.Windows == 0 }

// Add records one ended actor-window of the actor whose Hash is h: its
// peak used, and whether it was refused.
func (d *Day) Add(h uint64, peak int64, refused bool) {
	d.Windows++
	if refused {
		d.Refused++
		d.refused.add(h)
	}
	d.hist[bucketOf(peak)]++
	d.Max = max(d.Max, peak)
	d.seen.add(h)
	d.addSample(entry{hash: h, peak: peak, refused: refused})
}

func (d *Day) addSample(e entry) {
	i, found := slices.BinarySearchFunc(d.sample, e.hash, func(x entry, h uint64) int {
		switch {
		case x.hash < h:
			return -1
		case x.hash > h:
			return 1
		}
		return 0
	})
	switch {
	case found:
		x := &d.sample[i]
		x.peak = max(x.peak, e.peak)
		x.refused = x.refused || e.refused
	case len(d.sample) < SampleSize:
		d.sample = slices.Insert(d.sample, i, e)
	case i < SampleSize:
		// Full: the largest hash leaves for a smaller one. An actor that
		// leaves never comes back, as the bound only falls: the actors
		// sampled have every window of theirs recorded.
		copy(d.sample[i+1:], d.sample[i:SampleSize-1])
		d.sample[i] = e
	}
}

// Merge adds o's windows to d's.
func (d *Day) Merge(o *Day) {
	d.Windows += o.Windows
	d.Refused += o.Refused
	d.Max = max(d.Max, o.Max)
	for i, n := range o.hist {
		d.hist[i] += n
	}
	d.seen.merge(&o.seen)
	d.refused.merge(&o.refused)
	out := make([]entry, 0, SampleSize)
	a, b := d.sample, o.sample
	for len(out) < SampleSize && (len(a) > 0 || len(b) > 0) {
		switch {
		case len(b) == 0 || len(a) > 0 && a[0].hash < b[0].hash:
			out, a = append(out, a[0]), a[1:]
		case len(a) == 0 || b[0].hash < a[0].hash:
			out, b = append(out, b[0]), b[1:]
		default:
			e := a[0]
			e.peak = max(e.peak, b[0].peak)
			e.refused = e.refused || b[0].refused
			out, a, b = append(out, e), a[1:], b[1:]
		}
	}
	d.sample = out
}

// Actors estimates the distinct actors seen, and whether the count is
// exact (fewer than SampleSize: the sample holds them all); otherwise it
// is within ActorsStdErr (one standard error).
func (d *Day) Actors() (n float64, exact bool) {
	if len(d.sample) < SampleSize {
		return float64(len(d.sample)), true
	}
	return d.seen.estimate(), false
}

// RefusedActors estimates the distinct actors with a refused window, as
// Actors does.
func (d *Day) RefusedActors() (n float64, exact bool) {
	if len(d.sample) < SampleSize {
		k := 0
		for _, e := range d.sample {
			if e.refused {
				k++
			}
		}
		return float64(k), true
	}
	return d.refused.estimate(), false
}

// Quantile returns the peak used that a share q (0 < q <= 1) of the
// windows did not exceed: the smallest v such that at least ceil(q *
// Windows) windows peaked at v or less. Below 64 it is exact; above, it
// is the highest value of v's bucket or the largest peak, whichever is
// less, at most RelativeWidth above v. It returns -1 when d has no
// window.
func (d *Day) Quantile(q float64) (v int64, exact bool) {
	if d.Windows == 0 {
		return -1, true
	}
	rank := uint64(math.Ceil(q * float64(d.Windows)))
	rank = min(max(rank, 1), d.Windows)
	var cum uint64
	for i, n := range d.hist {
		if cum += n; cum >= rank {
			lo, hi := bucketBounds(i)
			return min(hi, d.Max), i < exactBelow || d.Max == lo
		}
	}
	return -1, true // unreachable: the buckets add up to Windows
}

// WhatIf is what a candidate limit would have refused.
type WhatIf struct {
	// Windows is the share of actor-windows whose peak used was over the
	// limit; WindowsErr the most it can be off: the share of windows in
	// the one histogram bucket that holds both values over and not over
	// the limit (0 when the limit is below 64, at a bucket's top, or at
	// or above the largest peak).
	Windows, WindowsErr float64
	// Actors is the share of distinct actors with a window over the
	// limit, ActorsStdErr its standard error: 0 when the sample holds
	// every actor, else sqrt(p(1-p)/SampleSize).
	Actors, ActorsStdErr float64
}

// WhatIf returns what limit would have refused: the windows whose peak
// used was over it, and the actors with such a window. A window the
// limit in force refused peaked at that limit, so for a candidate at or
// above it WhatIf counts nothing: the demand beyond a limit in force is
// not measured.
func (d *Day) WhatIf(limit int64) WhatIf {
	var w WhatIf
	if d.Windows == 0 {
		return w
	}
	var over, straddle float64
	for i, n := range d.hist {
		if n == 0 {
			continue
		}
		lo, hi := bucketBounds(i)
		hi = min(hi, d.Max) // no window peaked above
		switch {
		case lo > limit:
			over += float64(n)
		case hi > limit:
			// Part of the bucket is over: its values are taken as
			// spread evenly.
			over += float64(n) * float64(hi-limit) / float64(hi-lo+1)
			straddle = float64(n)
		}
	}
	total := float64(d.Windows)
	w.Windows, w.WindowsErr = over/total, straddle/total
	k := 0
	for _, e := range d.sample {
		if e.peak > limit {
			k++
		}
	}
	if n := len(d.sample); n > 0 {
		p := float64(k) / float64(n)
		w.Actors = p
		if n >= SampleSize {
			w.ActorsStdErr = math.Sqrt(p * (1 - p) / float64(n))
		}
	}
	return w
}

// Hash is the hash of an actor that Add takes: FNV-1a, then murmur3's
// finalizer, so that every bit of it depends on every byte (HyperLogLog
// reads its top bits). It is stored, so it never changes.
func Hash(actor []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range actor {
		h ^= uint64(c)
		h *= 1099511628211
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// version is the format of an encoded Day.
const version = 1

// MaxEncodedLen is the most bytes an encoded Day takes: the counts, every
// histogram bucket, both sketches and a full sample. A typical day takes
// far less: only the buckets used are written.
const MaxEncodedLen = 1 + 3*binary.MaxVarintLen64 + binary.MaxVarintLen64 + Buckets*(2+binary.MaxVarintLen64) +
	2*Registers + binary.MaxVarintLen64 + SampleSize*(8+binary.MaxVarintLen64+1)

// Append appends d's encoding: a version byte, the counts, the largest
// peak, the histogram's
// non-empty buckets (index step and count), the two sketches' registers,
// then the sample (hash, peak, refused).
func (d *Day) Append(dst []byte) []byte {
	dst = append(dst, version)
	dst = binary.AppendUvarint(dst, d.Windows)
	dst = binary.AppendUvarint(dst, d.Refused)
	dst = binary.AppendUvarint(dst, uint64(d.Max))
	n := 0
	for _, c := range d.hist {
		if c > 0 {
			n++
		}
	}
	dst = binary.AppendUvarint(dst, uint64(n))
	last := 0
	for i, c := range d.hist {
		if c > 0 {
			dst = binary.AppendUvarint(dst, uint64(i-last))
			dst = binary.AppendUvarint(dst, c)
			last = i
		}
	}
	dst = append(dst, d.seen[:]...)
	dst = append(dst, d.refused[:]...)
	dst = binary.AppendUvarint(dst, uint64(len(d.sample)))
	for _, e := range d.sample {
		dst = binary.BigEndian.AppendUint64(dst, e.hash)
		dst = binary.AppendUvarint(dst, uint64(e.peak))
		r := byte(0)
		if e.refused {
			r = 1
		}
		dst = append(dst, r)
	}
	return dst
}

// ErrCorrupt is a stored Day that does not decode.
var ErrCorrupt = errors.New("peakstats: stored summary is corrupt")

// Decode decodes a Day made by Append.
func Decode(b []byte) (*Day, error) {
	d := NewDay()
	if len(b) == 0 || b[0] != version {
		return nil, fmt.Errorf("%w: expected format version %d", ErrCorrupt, version)
	}
	r := reader{b: b[1:]}
	d.Windows, d.Refused = r.uvarint(), r.uvarint()
	mx := r.uvarint()
	if mx > math.MaxInt64 {
		return nil, fmt.Errorf("%w: largest peak %d", ErrCorrupt, mx)
	}
	d.Max = int64(mx)
	n := r.uvarint()
	if n > Buckets {
		return nil, fmt.Errorf("%w: %d histogram buckets, at most %d", ErrCorrupt, n, Buckets)
	}
	var sum uint64
	i := uint64(0)
	for k := uint64(0); k < n && r.err == nil; k++ {
		i += r.uvarint()
		c := r.uvarint()
		if i >= Buckets || (k > 0 && i == 0) {
			return nil, fmt.Errorf("%w: histogram bucket %d", ErrCorrupt, i)
		}
		d.hist[i] += c
		sum += c
	}
	copy(d.seen[:], r.bytes(Registers))
	copy(d.refused[:], r.bytes(Registers))
	n = r.uvarint()
	if n > SampleSize {
		return nil, fmt.Errorf("%w: %d sampled actors, at most %d", ErrCorrupt, n, SampleSize)
	}
	for k := uint64(0); k < n && r.err == nil; k++ {
		h := binary.BigEndian.Uint64(r.bytes(8))
		p := r.uvarint()
		f := r.bytes(1)
		if p > math.MaxInt64 || f[0] > 1 || (k > 0 && h <= d.sample[k-1].hash) {
			return nil, fmt.Errorf("%w: sampled actor %d", ErrCorrupt, k)
		}
		d.sample = append(d.sample, entry{hash: h, peak: int64(p), refused: f[0] == 1})
	}
	switch {
	case r.err != nil:
		return nil, r.err
	case len(r.b) != 0:
		return nil, fmt.Errorf("%w: %d bytes after the end", ErrCorrupt, len(r.b))
	case sum != d.Windows || d.Refused > d.Windows:
		return nil, fmt.Errorf("%w: %d windows, %d refused, %d in the histogram", ErrCorrupt, d.Windows, d.Refused, sum)
	}
	return d, nil
}

// reader reads an encoded Day; its first error sticks, and reads after
// it return zeros.
type reader struct {
	b   []byte
	err error
	pad [Registers]byte
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%w: truncated", ErrCorrupt)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if r.err == nil && len(r.b) < n {
		r.err = fmt.Errorf("%w: truncated", ErrCorrupt)
	}
	if r.err != nil {
		return r.pad[:n]
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}
