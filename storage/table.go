package storage

import (
	"cmp"
	"slices"
	"unsafe"
)

// The hot-state table of one stripe holds no Go pointer per record, so the
// garbage collector never scans it however many buckets it holds, and a new
// record costs no allocation once its slices have grown:
//
//   - index is an open-addressing hash table (linear probing, deletion by
//     backward shift) of record numbers plus one (the low 24 bits; 0 is an
//     empty slot) and the top 8 bits of the record's hash (the high byte),
//     so that a lookup passes the other records of its probe run without
//     reading them: a lookup of a new key, the common case when buckets are
//     created, probes several slots at the index's load, and each record
//     read is a cache miss. It doubles when three quarters full.
//   - recs is the records, at stable positions: a removed record goes on a
//     free list threaded through its hash field, and is reused by the next
//     insert, so the committer can name a record by stripe and position
//     (plus gen) instead of by pointer.
//   - arena holds each record's key, then room bytes for its value. A value
//     that fits its room is updated in place; a bigger one moves to the end
//     of the arena, leaving its old bytes as garbage, which compact reclaims.
//     A free record keeps its region, so that the next record, typically of
//     the same size (a bucket of the same kind), reuses it in place.
//
// What the table is charged (bytes) is the memory its slices hold: their
// capacity, free records, garbage and unused tails included, so that the
// byte bound holds for real memory. The slices grow only explicitly (by a
// quarter, or double while small), and an insert is charged the growth it
// causes (needs), so that makeRoom evicts clean records, whose free
// records and regions the next inserts reuse, rather than grow a table at
// its share. Dirty records may take a table over its share (they cannot
// be evicted); trim brings it back once they are written, and shrink
// gives back the capacity over the share.
type table struct {
	index   []uint32
	recs    []record
	arena   []byte
	free    uint32 // first free record, plus one; 0: none
	nfree   int
	live    int   // records in use
	garbage int64 // arena bytes no record in use holds
	hand    int   // the CLOCK hand, a position in recs
}

// record is one key's newest state: dirty until Pebble has it, then clean,
// a cached copy of what Pebble holds.
type record struct {
	// hash is the high half of the key's hash: its home in index, and a
	// tag that spares most key comparisons. A free record's is the next
	// free record, plus one.
	hash uint32
	off  uint32 // the key's offset in arena; the value follows it
	klen uint32
	vlen uint32
	room uint32 // bytes reserved for the value, vlen or more
	// gen changes each time the record is reused, so that the committer,
	// which names records by position, can tell a reused one (it never
	// finds one: a record it wrote stays dirty, so in use, until it has
	// looked at it again).
	gen   uint16
	flags uint8
}

// Record flags.
const (
	fLive  = 1 << iota // in use (else on the free list)
	fDel               // the record does not exist
	fClean             // Pebble holds this state; the record may be evicted
	fRef               // used since the CLOCK hand last passed
	// fMod says the record changed since the committer last read it; the
	// committer marks a record clean after its round only if it did not.
	fMod
	// fRound says the committer's current round has written the record,
	// so that a round writes each key once however often it was queued.
	fRound
	// fStored says the key exists in the state last handed on: what
	// Pebble held when the record was read, or what the committer's last
	// round that took the record wrote. A replicated round tells each
	// change's Prior from it, so that followers keep their record counts
	// without reading the record first.
	fStored
)

// recordSize is the bytes of one record; each record in use also holds
// about two index slots (indexSlot bytes each) at the index's load.
const (
	recordSize = int64(unsafe.Sizeof(record{}))
	indexSlot  = 4
)

// recordOverhead is what a record is charged besides its key and value
// room where one figure is needed (the commit queue's bytes): its record
// and two index slots.
const recordOverhead = recordSize + 2*indexSlot

// The first sizes of a stripe's index, records and arena: a few growth
// steps fewer for a table that fills, little for one that does not.
const (
	minIndex = 16
	minRecs  = 16
	minArena = 512
)

// compactMin is the least garbage worth a compaction outside makeRoom.
const compactMin = 4 << 10

// roomFor is the value room given to a new region for a value of n bytes:
// rounded up to 4, so that a value that grows by a byte or two (a varint
// crossing a boundary) mostly stays in place.
func roomFor(n int) uint32 { return uint32((n + 3) &^ 3) }

// bytes is what the table is charged: the capacity of its records, index
// and arena.
func (t *table) bytes() int64 {
	return int64(cap(t.recs))*recordSize + int64(cap(t.index))*indexSlot + int64(cap(t.arena))
}

// grownCap is the capacity a slice of capacity c grows to so as to hold n:
// double while below small, then by a quarter (few copies, little unused
// tail), and at least least.
func grownCap(c, n, least, small int) int {
	g := c + c/4
	if c < small {
		g = 2 * c
	}
	return max(g, n, least)
}

// reserveArena makes room for n more bytes at the end of the arena.
func (t *table) reserveArena(n int) {
	if len(t.arena)+n <= cap(t.arena) {
		return
	}
	a := make([]byte, len(t.arena), grownCap(cap(t.arena), len(t.arena)+n, minArena, 4<<10))
	copy(a, t.arena)
	t.arena = a
}

// reserveRecs makes room for one more record.
func (t *table) reserveRecs() {
	if len(t.recs) < cap(t.recs) {
		return
	}
	r := make([]record, len(t.recs), grownCap(cap(t.recs), len(t.recs)+1, minRecs, 256))
	copy(r, t.recs)
	t.recs = r
}

func (t *table) key(r *record) []byte {
	return t.arena[r.off : r.off+r.klen : r.off+r.klen]
}

func (t *table) val(r *record) []byte {
	s := r.off + r.klen
	return t.arena[s : s+r.vlen : s+r.vlen]
}

// size is what the commit queue is charged for r.
func (t *table) size(r *record) int64 { return recordOverhead + int64(r.klen) + int64(r.room) }

// find returns the position of key's record, or -1.
func (t *table) find(h uint64, key []byte) int {
	if len(t.index) == 0 {
		return -1
	}
	tag := uint32(h >> 32)
	mask := uint32(len(t.index) - 1)
	for i := tag & mask; ; i = (i + 1) & mask {
		v := t.index[i]
		if v == 0 {
			return -1
		}
		if v&^idxPos != tag&^idxPos {
			continue
		}
		r := &t.recs[v&idxPos-1]
		if r.hash == tag && r.klen == uint32(len(key)) && string(t.arena[r.off:r.off+r.klen]) == string(key) {
			return int(v&idxPos - 1)
		}
	}
}

// needs returns what inserting a record of klen key bytes and vlen value
// bytes adds to bytes: the growth of the records unless one is free, of
// the arena unless the first free record's region or the arena's unused
// tail takes the new region, and of the index.
func (t *table) needs(klen, vlen int) int64 {
	n := int64(0)
	region := klen + int(roomFor(vlen))
	if t.free != 0 {
		if r := &t.recs[t.free-1]; int(r.klen+r.room) >= region {
			region = 0
		}
	} else if len(t.recs) == cap(t.recs) {
		n += int64(grownCap(cap(t.recs), len(t.recs)+1, minRecs, 256)-cap(t.recs)) * recordSize
	}
	if region > 0 && len(t.arena)+region > cap(t.arena) {
		n += int64(grownCap(cap(t.arena), len(t.arena)+region, minArena, 4<<10) - cap(t.arena))
	}
	if (t.live+1)*4 > len(t.index)*3 {
		n += int64(max(len(t.index), minIndex)) * indexSlot
	}
	return n
}

// insert adds a record for key, which must not be in the table, with room
// for a value of vlen bytes (set by setVal), and returns its position.
func (t *table) insert(h uint64, key []byte, vlen int) int {
	if (t.live+1)*4 > len(t.index)*3 {
		t.grow()
	}
	region := uint32(len(key)) + roomFor(vlen)
	var i int
	var gen uint16
	reused := false
	if t.free != 0 {
		i = int(t.free - 1)
		r := &t.recs[i]
		t.free = r.hash
		t.nfree--
		gen = r.gen + 1
		if have := r.klen + r.room; have >= region {
			// The free record's region takes the new one in place.
			t.garbage -= int64(have)
			region, reused = have, true
		}
	} else {
		i = len(t.recs)
		if i >= maxRecs {
			panic("storage: a stripe's table would pass 16M records; lower --cache-memory")
		}
		t.reserveRecs()
		t.recs = t.recs[:i+1]
		t.recs[i] = record{}
	}
	r := &t.recs[i]
	off := r.off
	if !reused {
		t.check(region)
		t.reserveArena(int(region))
		off = uint32(len(t.arena))
		t.arena = append(t.arena, key...)
		t.arena = append(t.arena, make([]byte, region-uint32(len(key)))...)
	} else {
		copy(t.arena[off:], key)
	}
	*r = record{hash: uint32(h >> 32), off: off, klen: uint32(len(key)), room: region - uint32(len(key)), gen: gen, flags: fLive}
	t.place(i)
	t.live++
	return i
}

// idxPos masks the record number (plus one) in an index slot; the bits
// above it are the record's hash's high byte. A stripe holds fewer records
// than it leaves room for: see maxRecs.
const idxPos = 1<<24 - 1

// maxRecs is the most records a stripe's table may hold. The cache refuses
// a clean record past it (makeRoom), which only a --cache-memory of about
// a terabyte could reach; dirty records are bounded by the commit queue's
// key count (Options.MaxQueued), far below it.
const maxRecs = idxPos - 1

// check panics before the arena would pass the 4 GiB its 32-bit offsets
// reach: a stripe's table holds its share of the cache and the dirty
// records of the commit queue, far less, unless --commit-queue-memory is
// set to many gigabytes.
func (t *table) check(n uint32) {
	if uint64(len(t.arena))+uint64(n) > 1<<32-1 {
		panic("storage: a stripe's table would pass 4 GiB; lower --commit-queue-memory")
	}
}

// place puts record i into the index.
func (t *table) place(i int) {
	mask := uint32(len(t.index) - 1)
	j := t.recs[i].hash & mask
	for t.index[j] != 0 {
		j = (j + 1) & mask
	}
	t.index[j] = uint32(i+1) | t.recs[i].hash&^idxPos
}

// grow doubles the index and places every record in use again.
func (t *table) grow() {
	t.index = make([]uint32, max(2*len(t.index), minIndex))
	for i := range t.recs {
		if t.recs[i].flags&fLive != 0 {
			t.place(i)
		}
	}
}

// setVal sets record i's value to val (which may alias the arena): in
// place if it fits the record's room, otherwise in a new region at the end
// of the arena.
func (t *table) setVal(i int, val []byte) {
	r := &t.recs[i]
	if uint32(len(val)) <= r.room {
		r.vlen = uint32(copy(t.arena[r.off+r.klen:r.off+r.klen+r.room], val))
		return
	}
	// Room for growth: a value that grew once (a log) is likely to again.
	room := roomFor(len(val) + len(val)/4)
	old := r.off
	t.garbage += int64(r.klen + r.room)
	t.check(r.klen + room)
	// val may alias the arena: a new one has copied the old, which stays
	// valid while val refers to it.
	t.reserveArena(int(r.klen + room))
	off := uint32(len(t.arena))
	t.arena = append(t.arena, t.arena[old:old+r.klen]...)
	t.arena = append(t.arena, val...)
	t.arena = append(t.arena, make([]byte, room-uint32(len(val)))...)
	r = &t.recs[i]
	r.off, r.vlen, r.room = off, uint32(len(val)), room
	t.maybeCompact()
}

// remove frees record i: out of the index, onto the free list, its region
// kept for the next record (and counted as garbage meanwhile).
func (t *table) remove(i int) {
	r := &t.recs[i]
	mask := uint32(len(t.index) - 1)
	j := r.hash & mask
	for t.index[j]&idxPos != uint32(i+1) {
		j = (j + 1) & mask
	}
	// Backward shift: move each following record of the probe run that
	// may live at j or before into the hole, so lookups need no
	// tombstones.
	for k := (j + 1) & mask; t.index[k] != 0; k = (k + 1) & mask {
		home := t.recs[t.index[k]&idxPos-1].hash & mask
		// Does home lie cyclically in (j, k]? Then it stays.
		if (j < k && j < home && home <= k) || (j > k && (home > j || home <= k)) {
			continue
		}
		t.index[j] = t.index[k]
		j = k
	}
	t.index[j] = 0
	t.garbage += int64(r.klen + r.room)
	r.hash, r.flags, r.vlen = t.free, 0, 0
	r.room += r.klen // the region, kept whole for reuse
	r.klen = 0
	t.free = uint32(i + 1)
	t.nfree++
	t.live--
	if t.live == 0 {
		t.empty()
		return
	}
	t.maybeCompact()
}

// empty drops every free record and the garbage once no record is in use
// (no committer names one then), and gives back slices bigger than a new
// table's first ones (960 bytes in all, within MinCacheMemory's share).
func (t *table) empty() {
	t.recs, t.arena = t.recs[:0], t.arena[:0]
	t.free, t.nfree, t.garbage, t.hand = 0, 0, 0, 0
	if cap(t.arena) > minArena {
		t.arena = nil
	}
	if cap(t.recs) > minRecs {
		t.recs = nil
	}
	if len(t.index) > minIndex {
		t.index = nil
	}
}

// maybeCompact compacts the arena when garbage is most of it.
func (t *table) maybeCompact() {
	if t.garbage >= compactMin && 2*t.garbage > int64(len(t.arena)) {
		t.compact()
	}
}

// shrink gives back the unused capacity of the arena, then of the
// records, that takes the table over limit: a table that dirty records
// took over its share returns to it once they are written and evicted.
// The free records between records in use stay (records in use never
// move), for the next inserts.
func (t *table) shrink(limit int64) {
	if over := t.bytes() - limit; over > 0 && cap(t.arena) > len(t.arena) {
		c := len(t.arena) + int(max(int64(cap(t.arena)-len(t.arena))-over, 0))
		a := make([]byte, len(t.arena), c)
		copy(a, t.arena)
		t.arena = a
	}
	if over := t.bytes() - limit; over > 0 && cap(t.recs) > len(t.recs) {
		c := len(t.recs) + int(max(int64(cap(t.recs)-len(t.recs))-(over+recordSize-1)/recordSize, 0))
		r := make([]record, len(t.recs), c)
		copy(r, t.recs)
		t.recs = r
	}
}

// compact moves every record's region to the start of the arena, in
// order, dropping the garbage and the free records' regions, and gives
// back an arena much bigger than what it holds. It allocates the list of
// positions it sorts (rare: once per several kilobytes of garbage).
func (t *table) compact() {
	order := make([]uint32, 0, t.live)
	for i := range t.recs {
		r := &t.recs[i]
		if r.flags&fLive != 0 {
			order = append(order, uint32(i))
		} else {
			r.off, r.room = 0, 0
		}
	}
	slices.SortFunc(order, func(a, b uint32) int { return cmp.Compare(t.recs[a].off, t.recs[b].off) })
	w := uint32(0)
	for _, i := range order {
		r := &t.recs[i]
		n := r.klen + r.room
		copy(t.arena[w:w+n], t.arena[r.off:r.off+n])
		r.off = w
		w += n
	}
	t.arena = t.arena[:w]
	t.garbage = 0
	if cap(t.arena) > 2*int(w)+compactMin {
		t.arena = append(make([]byte, 0, int(w)+int(w)/4), t.arena...)
	}
	// Free records at the end go (records in use never move: the
	// committer names them by position), and the free list is made again
	// from those left.
	n := len(t.recs)
	for n > 0 && t.recs[n-1].flags&fLive == 0 {
		n--
	}
	t.recs = t.recs[:n]
	t.free, t.nfree = 0, 0
	for i := n - 1; i >= 0; i-- {
		if t.recs[i].flags&fLive == 0 {
			t.recs[i].hash = t.free
			t.free = uint32(i + 1)
			t.nfree++
		}
	}
	if cap(t.recs) > n+n/4+minRecs {
		t.recs = append(make([]record, 0, n+n/8), t.recs...)
	}
	if t.hand > n {
		t.hand = 0
	}
	// An index eight times too big shrinks to twice what it holds.
	if len(t.index) > minIndex && t.live*8 < len(t.index) {
		size := minIndex
		for (t.live+1)*4 > size*3 || size < 2*t.live {
			size *= 2
		}
		t.index = make([]uint32, size)
		for i := range t.recs {
			if t.recs[i].flags&fLive != 0 {
				t.place(i)
			}
		}
	}
}

// makeRoom evicts clean records until one more record, of klen key bytes
// and vlen value bytes, fits in limit bytes with the rest. The CLOCK hand
// passes over dirty records, clears the reference bit of clean ones used
// since its last pass, and evicts clean ones not used since, whose free
// record and region the insert reuses; when garbage reaches a sixteenth of
// limit, compaction reclaims it instead, and shrink gives back capacity
// over limit. It reports whether there is room; a record that needs more
// than limit never fits, and evicts nothing.
func (t *table) makeRoom(limit int64, klen, vlen int) bool {
	if recordSize+2*indexSlot+int64(klen)+int64(roomFor(vlen)) > limit || t.live >= maxRecs-1 {
		return false
	}
	return t.evict(limit, klen, vlen, true)
}

// trim evicts clean records until the table is within limit, as it must
// be once the dirty records that took it over have been written. While
// some are still to be written it evicts only until the clean records'
// own bytes fit limit: evicting more would make room for records that
// give back their bytes once written (the sweep's deletes, queued for the
// next round), and evicted the clean records in use, all the hand found
// when the others were dirty.
func (t *table) trim(limit int64) { t.evict(limit, 0, 0, false) }

// settle shrinks the table to limit in trim, which the committer calls on
// a table over its share: an insert would grow it again at once (one
// that does not fit is dirty, taking the table over its share until it is
// written), and copying the arena back and forth for each would cost more
// than the memory it gives back for that while.
func (t *table) settle(limit int64, insert bool) {
	if !insert {
		t.shrink(limit)
	}
}

// evict is makeRoom, and with insert false trim.
func (t *table) evict(limit int64, klen, vlen int, insert bool) bool {
	need := func() int64 {
		if !insert {
			return 0
		}
		return t.needs(klen, vlen)
	}
	if !insert && t.bytes() > limit {
		// A table over its share mostly holds the unused tail of an arena
		// that grew for a value that moved: give that back before
		// evicting anything.
		if t.garbage > 0 {
			t.compact()
		}
		t.shrink(limit)
	}
	// clean is the clean records' bytes, and dirty whether there are
	// others, for trim.
	clean, dirty := int64(0), false
	if !insert {
		for i := range t.recs {
			if r := &t.recs[i]; r.flags&(fLive|fClean) == fLive|fClean {
				clean += t.size(r)
			} else if r.flags&fLive != 0 {
				dirty = true
			}
		}
	}
	// Two passes see every clean record: the first may only clear its bit.
	steps := 2 * len(t.recs)
	for t.bytes()+need() > limit && (insert || !dirty || clean > limit) {
		if t.garbage > 0 && t.garbage >= limit/16 {
			t.compact()
			t.settle(limit, insert)
			continue
		}
		if steps <= 0 || t.live == 0 {
			// The last resort before giving up.
			if t.garbage > 0 {
				t.compact()
			}
			t.settle(limit, insert)
			return t.bytes()+need() <= limit
		}
		steps--
		if t.hand >= len(t.recs) {
			t.hand = 0
		}
		i := t.hand
		t.hand++
		r := &t.recs[i]
		if r.flags&(fLive|fClean) != fLive|fClean {
			continue
		}
		if r.flags&fRef != 0 {
			r.flags &^= fRef
			continue
		}
		clean -= t.size(r)
		t.remove(i)
	}
	return true
}
