package engine

import (
	"hash/maphash"
	"maps"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/sluicehq/sluice/internal/bloom"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// Per-actor overrides in cluster mode. Each node keeps its own, among the
// store's own values (keyspace.OverrideMeta), outside the slot-owned
// records, as it keeps its dials: a slot's move, a shard's replication
// and a change of its leader never touch them, and the command is sent
// to every node (as POLICY RELOAD). The node that applies a hit to a
// counter (the owner of its slot, or its shard's leader; for a forwarded
// hit, the owner) looks the actor's override up at every hit of a label
// that has overrides on the node, not only when it creates the counter:
// a counter moved in from another node, or replicated from a leader that
// took a change a moment before this node did, carries no copy this node
// could trust. The counter still carries the limit its last hit used, for
// the sweep's threshold data (Swept). A label without overrides costs
// nothing.
//
// The lookup asks the node's filter of its override keys first (a Bloom
// filter, nodeFilter): an actor it does not hold has no override, and
// its hit costs no store read and no allocation. An actor it may hold
// (one with an override, or about 1% of the others) is looked up in the
// node's cache of the overrides its hits read (nodeCache), then, when
// the cache does not have it, read with one point read of the node's own
// store. The filter holds every stored key at every moment: a change adds
// its key before the store write, a removal leaves its key, and a new
// filter, built from the store under o.mu, replaces the old one whole.

// Sizing of a node's filter: 10 bits per key it is sized for (about 1%
// false positives, package bloom), for twice the overrides there are when
// it is built, and at least minFilterKeys.
const (
	filterBitsPerKey = 10
	minFilterKeys    = 4096
)

// NodeFilterBytes is the most memory a cluster node's filter of its
// overrides takes with maxOverrides (--policy-max-overrides): 2.5 bytes
// per override, for the --memory-limit auto budget.
func NodeFilterBytes(maxOverrides int64) int64 {
	return filterSize(2 * maxOverrides)
}

// Sizing of a node's cache: nodeCacheShards shards of nodeCacheSets sets
// of nodeCacheWays entries, each with room for an override name of
// nodeCacheMaxName bytes (a longer one is read from the store at every
// hit): 16384 entries in NodeCacheBytes, made at the first lookup. A
// name may be in any entry of its set: with one entry per hash, 10,000
// actors hit at random found theirs three times in four.
const (
	nodeCacheShards  = 64
	nodeCacheSets    = 64
	nodeCacheWays    = 4
	nodeCacheMaxName = 96
)

// NodeCacheBytes is the memory of a cluster node's cache of the
// overrides its hits read, for the --memory-limit auto budget.
const NodeCacheBytes = nodeCacheShards * int64(unsafe.Sizeof(cacheShard{}))

// nodeCache holds the lookups of a cluster node's hits, found or not,
// by the name of the override (as nodeFilter's): a set of entries per
// hash, in shards under their own mutex, the entries made once, so that
// a miss allocates nothing and the hits of many cores rarely meet. An entry serves while gen is the one
// read before the store read that made it; each change of an override
// adds one to gen after its store write, so that no entry read before
// the change serves after it returns.
type nodeCache struct {
	seed   maphash.Seed
	gen    atomic.Uint64
	once   sync.Once
	shards []cacheShard
}

type cacheShard struct {
	mu   sync.Mutex
	next uint32 // which entry of a full set the next put replaces
	sets [nodeCacheSets][nodeCacheWays]cachedOverride
}

type cachedOverride struct {
	valid uint64 // gen + 1 when made; 0: empty
	limit int64
	found bool
	n     uint8
	name  [nodeCacheMaxName]byte
}

// set returns the shard and set of name, making the shards at the first
// call.
func (c *nodeCache) set(name []byte) (*cacheShard, *[nodeCacheWays]cachedOverride) {
	c.once.Do(func() { c.shards = make([]cacheShard, nodeCacheShards) })
	h := maphash.Bytes(c.seed, name)
	sh := &c.shards[h%nodeCacheShards]
	return sh, &sh.sets[(h/nodeCacheShards)%nodeCacheSets]
}

// holds reports whether e is name's lookup at gen.
func (e *cachedOverride) holds(name []byte, gen uint64) bool {
	return e.valid == gen+1 && int(e.n) == len(name) && string(e.name[:e.n]) == string(name)
}

// get returns name's lookup if the cache has it at gen.
func (c *nodeCache) get(name []byte, gen uint64) (limit int64, found, ok bool) {
	sh, set := c.set(name)
	sh.mu.Lock()
	for i := range set {
		if e := &set[i]; e.holds(name, gen) {
			limit, found, ok = e.limit, e.found, true
			break
		}
	}
	sh.mu.Unlock()
	return limit, found, ok
}

// put keeps name's lookup, read from the store after gen was, in its
// entry, else an entry of its set that serves no longer, else the next
// in turn.
func (c *nodeCache) put(name []byte, gen uint64, limit int64, found bool) {
	if len(name) > nodeCacheMaxName {
		return
	}
	sh, set := c.set(name)
	sh.mu.Lock()
	e := (*cachedOverride)(nil)
	for i := range set {
		if set[i].holds(name, gen) {
			e = &set[i]
			break
		}
		if e == nil && set[i].valid != gen+1 {
			e = &set[i]
		}
	}
	if e == nil {
		e = &set[sh.next%nodeCacheWays]
		sh.next++
	}
	e.valid, e.limit, e.found, e.n = gen+1, limit, found, uint8(len(name))
	copy(e.name[:], name)
	sh.mu.Unlock()
}

// filterSize is the bytes of a filter sized for keys keys.
func filterSize(keys int64) int64 {
	return max(keys, minFilterKeys) * filterBitsPerKey / 8
}

// nodeFilter is a cluster node's filter of its override keys (their
// names after keyspace.OverrideMeta: the label, then the actor). The
// counts are o.mu's.
type nodeFilter struct {
	bits *bloom.Filter
	seed maphash.Seed
	// capacity is the keys it is sized for; added the keys added since
	// it was built, those it was built with included; removed the
	// overrides removed since.
	capacity, added, removed int64
}

func (f *nodeFilter) add(name []byte) { f.bits.Add(maphash.Bytes(f.seed, name)) }

func (f *nodeFilter) mayHold(name []byte) bool {
	return f.bits.MayContain(maphash.Bytes(f.seed, name))
}

// buildFilterLocked builds the node's filter from the overrides the store
// holds, sized for n of them, and puts it in use; the caller holds o.mu,
// so that no change is made meanwhile. On an error the filter in use
// stays, which holds every stored key still.
func (e *Engine) buildFilterLocked(n int64) (*nodeFilter, error) {
	capacity := max(2*n, minFilterKeys)
	f := &nodeFilter{bits: bloom.New(filterSize(capacity)), seed: maphash.MakeSeed(), capacity: capacity}
	err := e.store.ScanMetaBytes(keyspace.OverrideMeta, func(name, _ []byte) bool {
		f.bits.Add(maphash.Bytes(f.seed, name))
		f.added++
		return true
	})
	if err != nil {
		return nil, Typed(StoreErr(err))
	}
	e.ov.filter.Store(f)
	return f, nil
}

// filterLocked returns the node's filter, built now if LoadOverrides has
// not built it; the caller holds o.mu.
func (e *Engine) filterLocked() (*nodeFilter, error) {
	if f := e.ov.filter.Load(); f != nil {
		return f, nil
	}
	return e.buildFilterLocked(e.ov.total.Load())
}

// nodeLookup looks the override of rule's label for actor up among the
// node's own values, into r.m: the hit is then applied under it.
func (r *Round) nodeLookup(rule *policy.Rule, actor []byte) error {
	m := &r.m
	r.okey = storage.AppendMetaKey(r.okey[:0])
	name := len(r.okey) + len(keyspace.OverrideMeta)
	r.okey = keyspace.AppendOverrideMeta(r.okey, rule.OverridesLabel(), actor)
	m.lookup = lookupLocal
	if f := r.e.ov.filter.Load(); f != nil && !f.mayHold(r.okey[name:]) {
		m.has = false
		return nil
	}
	c := r.e.ov.cache
	gen := c.gen.Load()
	if limit, found, ok := c.get(r.okey[name:], gen); ok {
		m.has, m.limit = found, limit
		if found {
			m.base = limit
		}
		return nil
	}
	if h := r.e.onNodeRead; h != nil {
		h()
	}
	limit, found, val, err := r.e.nodeOverrideAt(r.okey, r.oval)
	r.oval = val
	if err != nil {
		return err
	}
	c.put(r.okey[name:], gen, limit, found)
	m.has, m.limit = found, limit
	if found {
		m.base = limit
	}
	return nil
}

// nodeOverrideAt reads the override stored under key (storage.AppendMetaKey,
// then keyspace.AppendOverrideMeta), with val as room for its value:
// its limit and whether there is one.
func (e *Engine) nodeOverrideAt(key, val []byte) (limit int64, found bool, room []byte, err error) {
	v, found, err := e.store.MetaAt(val[:0], key)
	if err != nil {
		return 0, false, v, Typed(StoreErr(err))
	}
	if !found {
		return 0, false, v, nil
	}
	if limit, err = keyspace.DecodeUint(v); err != nil {
		return 0, false, v, &errs.Error{Kind: errs.Corrupt, Err: err}
	}
	return limit, true, v, nil
}

// nodeOverride returns actor's override in label on this node, or -1 for
// none.
func (e *Engine) nodeOverride(label string, actor []byte) (int64, error) {
	key := keyspace.AppendOverrideMeta(storage.AppendMetaKey(nil), label, actor)
	limit, found, _, err := e.nodeOverrideAt(key, nil)
	if err != nil || !found {
		return -1, err
	}
	return limit, nil
}

// scanNodeCounts calls fn with each count of overrides of this cluster
// node.
func (e *Engine) scanNodeCounts(fn func(label string, v []byte) bool) error {
	return e.store.ScanMeta(keyspace.OverrideCountMeta, fn)
}

// changeNodeOverride sets (set) or removes actor's override of label on
// this node, with its label's count, in one synced write, and reports
// whether actor had an override. Changes are one at a time (o.mu), so the
// count in memory is the stored one.
func (e *Engine) changeNodeOverride(label string, actor []byte, limit int64, set bool) (existed bool, err error) {
	o := &e.ov
	o.mu.Lock()
	defer o.mu.Unlock()
	had, err := e.nodeOverride(label, actor)
	if err != nil {
		return false, err
	}
	existed = had >= 0
	if set && !existed && o.total.Load() >= o.max {
		return false, errBound(o.max)
	}
	if !set && !existed {
		return false, nil
	}
	f, err := e.filterLocked()
	if err != nil {
		return false, err
	}
	key := keyspace.AppendOverrideMeta(nil, label, actor)
	if set && !existed {
		if f.added >= f.capacity {
			// Grown, or filled with removed keys: a new one, sized for
			// twice the overrides there are. Should the store not give
			// them, the full one still holds every key, at a higher false
			// positive rate.
			if nf, err := e.buildFilterLocked(o.total.Load()); err == nil {
				f = nf
			}
		}
		// Before the write: a hit that can read the override finds its
		// key in the filter.
		f.add(key[len(keyspace.OverrideMeta):])
		f.added++
	}
	name := string(key)
	put, del := map[string][]byte{}, []string(nil)
	if set {
		put[name] = keyspace.AppendUint(nil, limit)
	} else {
		del = append(del, name)
	}
	delta := int64(0)
	switch {
	case set && !existed:
		delta = 1
	case !set:
		delta = -1
	}
	if delta != 0 {
		countName := keyspace.OverrideCountMeta + label
		if n := o.count(label) + delta; n > 0 {
			put[countName] = keyspace.AppendUint(nil, n)
		} else {
			del = append(del, countName)
		}
	}
	if h := e.beforeNodeWrite; h != nil {
		h()
	}
	err = e.store.UpdateMeta(put, del)
	// After the write, stored or not: a lookup that read the store
	// before it caches nothing that serves after this returns.
	o.cache.gen.Add(1)
	if err != nil {
		return false, Typed(err)
	}
	o.add(label, delta)
	if !set {
		// The removed key stays in the filter, where it costs its actor's
		// hits a read; once the removed outnumber the overrides left, a
		// new filter forgets them, in time linear in the removals. Should
		// the store not give the overrides, the filter in use stays: it
		// holds every stored key.
		if f.removed++; f.removed > o.total.Load() {
			_, _ = e.buildFilterLocked(o.total.Load())
		}
	}
	return existed, nil
}

// listNodeOverrides is ListOverrides of this node's own overrides.
func (e *Engine) listNodeOverrides(label string, after []byte, count int) (list []Override, next []byte, err error) {
	prefix := string(keyspace.AppendOverrideMeta(nil, label, nil))
	from := prefix
	if after != nil {
		from = prefix + string(after) + "\x00"
	}
	var derr error
	err = e.store.ScanMetaFrom(prefix, from, func(actor string, v []byte) bool {
		if len(list) == count {
			next = []byte(list[len(list)-1].Actor)
			return false
		}
		n, err := keyspace.DecodeUint(v)
		if err != nil {
			derr = &errs.Error{Kind: errs.Corrupt, Err: err}
			return false
		}
		list = append(list, Override{Actor: []byte(actor), Limit: n})
		return true
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return nil, nil, Typed(err)
	}
	return list, next, nil
}

// count returns label's count of overrides in memory.
func (o *overrides) count(label string) int64 {
	if m := o.counts.Load(); m != nil {
		return (*m)[label]
	}
	return 0
}

// add adds delta to label's count of overrides in memory, and to the
// total; the caller holds o.mu.
func (o *overrides) add(label string, delta int64) {
	if delta == 0 {
		return
	}
	next := make(map[string]int64)
	if m := o.counts.Load(); m != nil {
		next = maps.Clone(*m)
	}
	if next[label] += delta; next[label] <= 0 {
		delete(next, label)
	}
	o.counts.Store(&next)
	o.total.Add(delta)
}
