package storage

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"testing"
)

// A randomized model test of one stripe's table against a map: inserts
// (through makeRoom, as modify does), values that grow, shrink and move,
// removes, evictions (trim, makeRoom), compactions, with clean and dirty
// records. Dirty records must never be evicted nor move position, every
// record in use must read its model value, and the table's invariants hold
// after every step.
// It also checks that the table's charge, what its slices hold, stays
// within limit whenever makeRoom or trim reports room and no record is
// dirty.
func TestTableModel(t *testing.T) {
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			tableModel(t, seed, 3000)
		})
	}
}

func tableModel(t *testing.T, seed uint64, steps int) {
	s := &Store{seed: maphash.MakeSeed()}
	rng := rand.New(rand.NewPCG(seed, 99))
	limit := int64(512 + rng.IntN(8<<10))
	tb := &table{}
	type m struct {
		val   []byte
		dirty bool
		pos   int
	}
	model := map[string]*m{}
	keyOf := func() string {
		n := rng.IntN(300)
		if rng.IntN(50) == 0 {
			return "" // the empty key
		}
		return fmt.Sprintf("k%0*d", rng.IntN(40), n)
	}
	valOf := func() []byte {
		n := rng.IntN(24)
		if rng.IntN(10) == 0 {
			n = rng.IntN(600)
		}
		v := make([]byte, n)
		for i := range v {
			v[i] = byte(rng.Uint32())
		}
		return v
	}
	check := func(step int, what string) {
		t.Helper()
		checkTable(t, s, tb)
		for k, e := range model {
			h := maphash.Bytes(s.seed, []byte(k))
			i := tb.find(h, []byte(k))
			if i < 0 {
				if e.dirty {
					t.Fatalf("step %d (%s): dirty %q lost", step, what, k)
				}
				delete(model, k)
				continue
			}
			if e.dirty && i != e.pos {
				t.Fatalf("step %d (%s): dirty %q moved from record %d to %d", step, what, k, e.pos, i)
			}
			e.pos = i
			if got := tb.val(&tb.recs[i]); !bytes.Equal(got, e.val) {
				t.Fatalf("step %d (%s): %q reads %x, want %x", step, what, k, got, e.val)
			}
			r := &tb.recs[i]
			if (r.flags&fClean == 0) != e.dirty {
				t.Fatalf("step %d (%s): %q flags %b, model dirty %v", step, what, k, r.flags, e.dirty)
			}
		}
		if len(model) != tb.live {
			t.Fatalf("step %d (%s): %d records in use, model has %d", step, what, tb.live, len(model))
		}
	}
	for step := range steps {
		k := keyOf()
		h := maphash.Bytes(s.seed, []byte(k))
		i := tb.find(h, []byte(k))
		var what string
		switch op := rng.IntN(10); {
		case op < 5: // a write (dirty) or a cached read (clean)
			v := valOf()
			dirty := rng.IntN(3) != 0
			if i < 0 {
				what = "insert"
				room := tb.makeRoom(limit, len(k), len(v))
				if !room && !dirty {
					what = "insert refused"
					break
				}
				i = tb.insert(h, []byte(k), len(v))
				model[k] = &m{pos: i}
				if room && tb.bytes() > limit {
					t.Fatalf("step %d: an insert makeRoom made room for holds %d bytes, over %d", step, tb.bytes(), limit)
				}
			} else {
				what = "update"
			}
			// val aliasing the arena, as a mutator may return old.
			if rng.IntN(4) == 0 && tb.recs[i].vlen > 0 {
				old := tb.val(&tb.recs[i])
				v = append([]byte(nil), old[:rng.IntN(len(old)+1)]...)
				tb.setVal(i, old[:len(v)])
			} else {
				tb.setVal(i, v)
			}
			e := model[k]
			e.val = v
			if dirty {
				e.dirty = true
				tb.recs[i].flags &^= fClean
			} else if !e.dirty {
				tb.recs[i].flags |= fClean
			}
		case op < 7: // written: turns clean
			if i < 0 {
				continue
			}
			what = "clean"
			tb.recs[i].flags |= fClean
			model[k].dirty = false
		case op < 8: // removed (a delete written, or a record over its share)
			if i < 0 {
				continue
			}
			what = "remove"
			tb.remove(i)
			delete(model, k)
		case op < 9:
			what = "trim"
			tb.trim(limit)
			dirty := 0
			for _, e := range model {
				if e.dirty {
					dirty++
				}
			}
			if dirty == 0 && tb.bytes() > limit {
				t.Fatalf("step %d: trimmed with no dirty record, the table holds %d bytes, over %d", step, tb.bytes(), limit)
			}
		default:
			what = "compact"
			tb.compact()
		}
		check(step, what)
	}
}
