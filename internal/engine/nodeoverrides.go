package engine

import (
	"maps"

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
// hit, the owner) reads the actor's override on every hit of a label that
// has overrides on the node, not only when it creates the counter: a
// counter moved in from another node, or replicated from a leader that
// took a change a moment before this node did, carries no copy this node
// could trust. The counter still carries the limit its last hit used, for
// the sweep's threshold data (Swept). A label without overrides costs
// nothing; the read is one point read of the node's own store, no round
// trip and no allocation.

// nodeLookup reads the override of rule's label for actor, among the
// node's own values, into r.m: the hit is then applied under it.
func (r *Round) nodeLookup(rule *policy.Rule, actor []byte) error {
	m := &r.m
	r.okey = keyspace.AppendOverrideMeta(storage.AppendMetaKey(r.okey[:0]), rule.OverridesLabel(), actor)
	limit, found, val, err := r.e.nodeOverrideAt(r.okey, r.oval)
	r.oval = val
	if err != nil {
		return err
	}
	m.lookup, m.has, m.limit = lookupLocal, found, limit
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
	name := string(keyspace.AppendOverrideMeta(nil, label, actor))
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
	if err := e.store.UpdateMeta(put, del); err != nil {
		return false, Typed(err)
	}
	o.add(label, delta)
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
