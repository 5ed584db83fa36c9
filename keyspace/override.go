package keyspace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Per-actor overrides (POLICY OVERRIDE): one record per rule label and
// actor, the source of truth, and a copy of the actor's limit in the value
// of its rule counter, so that a hit on a live counter reads one record.
//
//	slot(label)  'O'  uvarint len(label), label, actor     override: uvarint limit
//	0x0000       'o'  label                                 overrides of a label: uvarint count
//
// All overrides of a label share the label's slot, so that a label's are
// one key range (POLICY OVERRIDES lists it in order). The counts are in
// slot 0, one range read at start. Neither kind is idle, ever: the sweep
// keeps them, and DEL reaches neither (no client key).
//
// A rule counter's value that carries an override starts with
// OverrideMark, then the limit as a uvarint, then the value of its kind.
// Every kind's value starts with its version byte 1, so a value without
// the mark is read as before.

// The kind bytes of override records.
const (
	KindOverride      byte = 'O'
	KindOverrideCount byte = 'o'
)

// OverrideMark starts a rule counter value that carries an override.
const OverrideMark byte = 0x80

// ErrBadOverride is a stored override, count or override mark that does
// not decode.
var ErrBadOverride = errors.New("keyspace: stored override is corrupt")

// AppendOverrideKey appends the store key of label's override of actor.
func AppendOverrideKey(dst []byte, label string, actor []byte) []byte {
	dst = AppendOverridePrefix(dst, label)
	return append(dst, actor...)
}

// AppendOverridePrefix appends what every override key of label starts
// with: the label's slot, the kind byte and the label.
func AppendOverridePrefix(dst []byte, label string) []byte {
	s := Slot([]byte(label))
	dst = append(dst, byte(s>>8), byte(s), KindOverride)
	dst = binary.AppendUvarint(dst, uint64(len(label)))
	return append(dst, label...)
}

// AppendOverrideCountKey appends the store key of label's count of
// overrides.
func AppendOverrideCountKey(dst []byte, label string) []byte {
	return append(append(dst, 0, 0, KindOverrideCount), label...)
}

// OverrideCountRange returns the bounds [lower, upper) of every count key.
func OverrideCountRange() (lower, upper []byte) {
	return []byte{0, 0, KindOverrideCount}, []byte{0, 0, KindOverrideCount + 1}
}

// OverrideCountLabel returns the label of the count key k.
func OverrideCountLabel(k []byte) string { return string(k[HeaderLen:]) }

// AppendUint appends n, a limit or a count, as an override or count
// record's value.
func AppendUint(dst []byte, n int64) []byte { return binary.AppendUvarint(dst, uint64(n)) }

// DecodeUint decodes a value of AppendUint.
func DecodeUint(v []byte) (int64, error) {
	n, k := binary.Uvarint(v)
	if k <= 0 || k != len(v) || n > math.MaxInt64 {
		return 0, fmt.Errorf("%w: % x", ErrBadOverride, v)
	}
	return int64(n), nil
}

// AppendMarked appends a rule counter value carrying the override limit,
// before the kind's value inner.
func AppendMarked(dst []byte, limit int64, inner []byte) []byte {
	dst = append(dst, OverrideMark)
	dst = binary.AppendUvarint(dst, uint64(limit))
	return append(dst, inner...)
}

// SplitMarked splits a rule counter value into the override it carries
// (ok false for none) and the kind's value, which aliases v.
func SplitMarked(v []byte) (limit int64, ok bool, inner []byte, err error) {
	if len(v) == 0 || v[0] != OverrideMark {
		return 0, false, v, nil
	}
	n, k := binary.Uvarint(v[1:])
	if k <= 0 || n > math.MaxInt64 {
		return 0, false, nil, fmt.Errorf("%w: the override mark of a counter value", ErrBadOverride)
	}
	return int64(n), true, v[1+k:], nil
}

func splitOverride(rest []byte) (int, bool) {
	n, k := binary.Uvarint(rest)
	if k <= 0 || n < 1 || n > uint64(len(rest)-k) {
		return 0, false
	}
	return k + int(n), true
}

func describeOverride(params, val []byte, _ int64) (Description, error) {
	n, err := DecodeUint(val)
	if err != nil {
		return Description{}, err
	}
	_, k := binary.Uvarint(params)
	label := string(params[k:])
	return Description{
		Params: "label=" + label,
		State:  fmt.Sprintf("limit=%d", n),
		Fields: []Field{{"label", label}, {"limit", n}},
	}, nil
}

func describeOverrideCount(_, val []byte, _ int64) (Description, error) {
	n, err := DecodeUint(val)
	if err != nil {
		return Description{}, err
	}
	return Description{State: fmt.Sprintf("overrides=%d", n), Fields: []Field{{"overrides", n}}}, nil
}

func never([]byte, []byte, int64) (bool, error) { return false, nil }

// marked wraps a rule counter kind's idle and describe so that they read
// the kind's value behind an override mark, and describe the override.
func marked(k *Kind) *Kind {
	idle, describe := k.idle, k.describe
	k.idle = func(params, val []byte, now int64) (bool, error) {
		_, _, inner, err := SplitMarked(val)
		if err != nil {
			return false, err
		}
		return idle(params, inner, now)
	}
	k.describe = func(params, val []byte, now int64) (Description, error) {
		limit, ok, inner, err := SplitMarked(val)
		if err != nil {
			return Description{}, err
		}
		d, err := describe(params, inner, now)
		if err == nil && ok {
			d.State += fmt.Sprintf(" override=%d", limit)
			d.Fields = append(d.Fields, Field{"override", limit})
		}
		return d, err
	}
	return k
}
