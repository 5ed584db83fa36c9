// Package keyspace lays out sluice's records in the store and holds the
// registry of limiter kinds.
//
// Every record key starts with the Redis Cluster hash slot of the client's
// key (2 bytes, big-endian), then one byte naming the record's kind, then
// the kind's own layout:
//
//	slot  'b'  uvarint max, uvarint refill, uvarint refill_ms, key   token bucket (RL.*)
//	slot  'd'  rule identity (8 bytes), actor                        divvy counter (HIT)
//	slot  'g'  key                                                   GCRA (CL.THROTTLE)
//	slot  'r'  key                                                   sliding log (ROLL.*)
//	slot  'w'  uvarint window_ms, stagger (0 or 1), key              fixed window (FW.*)
//	slot  'B'  uvarint max, uvarint refill, uvarint refill_ms, id    tokenBucket rule counter
//	slot  'G'  id                                                    gcra rule counter
//	slot  'R'  id                                                    slidingLog rule counter
//	slot  'W'  uvarint window_ms, stagger (0 or 1), id               fixedWindow rule counter
//	slot  'O'  uvarint len(label), label, actor                      per-actor override (override.go)
//	0     'o'  label                                                 count of a label's overrides
//
// where id is a rule counter's identity: the rule identity (8 bytes) and the
// actor (policy.Rule.AppendCounterID).
//
// The records of one slot are one contiguous key range, so DEL reads one
// slot and, later, a slot moves between cluster nodes as a range. Inside a
// slot, the keys of one parameter set still share a prefix. A rule counter
// has no client key: its slot is that of its identity. The counters of rules
// with another algorithm than divvy (fixedWindow, tokenBucket, gcra,
// slidingLog) have the layout and the value of that algorithm's command
// kind, but kind bytes of their own, so that no RESP command reaches them:
// a client that names the bytes of a rule identity and actor as a key of
// DEL, RL.*, CL.*, FW.* or ROLL.* gets a record of the command's kind, never
// the rule's counter (AppendRuleKey).
//
// Each kind in the registry knows how to split its keys, whether a record
// is idle (the sweep may delete it), and how to describe a record for
// sluice inspect, so that the sweep, inspect, DEL, INFO and metrics need not
// know the kinds. It is the only package that builds or parses a record
// key: the others ask it for a key's slot (RecordSlot), kind (KindOf) or
// parts (Parse). Like bucket and policy, the package is pure: time is an
// argument, in unix nanoseconds.
package keyspace

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/policy"
)

// The kind bytes. Bucket and divvy keys keep the first byte they had before
// slots were added, so that upgrading an old store only prepends the slot.
const (
	KindBucket  byte = 'b'
	KindCounter byte = 'd'
	KindGCRA    byte = 'g'
	KindWindow  byte = 'w'
	KindLog     byte = 'r'

	// The kinds of rule counters (AppendRuleKey): each has the layout of
	// the command kind of its letter, in upper case.
	KindRuleBucket byte = 'B'
	KindRuleGCRA   byte = 'G'
	KindRuleWindow byte = 'W'
	KindRuleLog    byte = 'R'
)

// HeaderLen is the length of the slot and kind bytes.
const HeaderLen = 3

// PutSlot writes slot into the first two bytes of k.
func PutSlot(k []byte, slot uint16) { binary.BigEndian.PutUint16(k, slot) }

// RecordSlot returns the slot of the record key k, its first two bytes,
// without looking at the rest (Parse does); ok is false when k is shorter
// or they are no slot, as for the store's own keys (from 0xff on).
func RecordSlot(k []byte) (slot uint16, ok bool) {
	if len(k) < 2 {
		return 0, false
	}
	slot = binary.BigEndian.Uint16(k)
	if slot >= Slots {
		return 0, false
	}
	return slot, true
}

// appendHeader appends the slot of key and the kind byte.
func appendHeader(dst []byte, key []byte, kind byte) []byte {
	s := Slot(key)
	return append(dst, byte(s>>8), byte(s), kind)
}

// AppendBucketKey appends the store key of the RL.* bucket key under p.
func AppendBucketKey(dst []byte, p bucket.Params, key []byte) []byte {
	return appendBucketKey(dst, KindBucket, p, key)
}

// appendBucketKey appends the header, then the three parameters as
// unsigned varints, then key. Varints form a prefix-free code, so all
// buckets of one parameter set in a slot share one header (a few bytes for
// typical limits) that no other set's keys start with; short headers keep
// memtable comparisons and files small.
func appendBucketKey(dst []byte, kind byte, p bucket.Params, key []byte) []byte {
	dst = appendHeader(dst, key, kind)
	dst = binary.AppendUvarint(dst, uint64(p.Max))
	dst = binary.AppendUvarint(dst, uint64(p.RefillAmount))
	dst = binary.AppendUvarint(dst, uint64(p.RefillMs))
	return append(dst, key...)
}

// AppendCounterKey appends the store key of r's divvy counter for req: the
// header, then the counter's identity (r.AppendCounterID: rule identity
// and actor), whose slot it is.
func AppendCounterKey(dst []byte, r *policy.Rule, req policy.Request) []byte {
	start := len(dst)
	dst = r.AppendCounterID(append(dst, 0, 0, KindCounter), req)
	PutSlot(dst[start:], Slot(dst[start+HeaderLen:]))
	return dst
}

// AppendRuleKey appends the store key of the counter of a hit on rule r
// under limit (r.Limit's), whose identity id is r.AppendCounterID's. A
// divvy rule's counter is a divvy record, as AppendCounterKey makes; the
// other algorithms store theirs with the layout and value of their command
// kind, under a kind byte of their own that no command reaches: a
// fixedWindow rule as a window of its period and stagger, a tokenBucket
// rule as a bucket of r.BucketParams(limit), a gcra rule as a GCRA key, a
// slidingLog rule as a log. The sweep, sluice inspect and INFO's per-kind
// counts treat them as the records of those kinds. The slot is id's, as for
// divvy counters.
func AppendRuleKey(dst []byte, r *policy.Rule, limit int64, id []byte) []byte {
	switch r.Algorithm {
	case policy.FixedWindow:
		return appendWindowKey(dst, KindRuleWindow, r.PeriodMillis(), r.Stagger, id)
	case policy.TokenBucket:
		return appendBucketKey(dst, KindRuleBucket, r.BucketParams(limit), id)
	case policy.GCRA:
		return append(appendHeader(dst, id, KindRuleGCRA), id...)
	case policy.SlidingLog:
		return append(appendHeader(dst, id, KindRuleLog), id...)
	}
	return append(appendHeader(dst, id, KindCounter), id...)
}

// AppendGCRAKey appends the store key of the CL.THROTTLE key key. Its
// parameters are not part of it: like redis-cell, a call with other
// parameters reinterprets the stored state.
func AppendGCRAKey(dst []byte, key []byte) []byte {
	return append(appendHeader(dst, key, KindGCRA), key...)
}

// AppendWindowKey appends the store key of the FW.* counter of key with
// windows of ms milliseconds, staggered or not: the counter's identity. The
// limit is not part of it, so it can change and keep the count.
func AppendWindowKey(dst []byte, ms int64, stagger bool, key []byte) []byte {
	return appendWindowKey(dst, KindWindow, ms, stagger, key)
}

func appendWindowKey(dst []byte, kind byte, ms int64, stagger bool, key []byte) []byte {
	dst = appendHeader(dst, key, kind)
	dst = binary.AppendUvarint(dst, uint64(ms))
	var st byte
	if stagger {
		st = 1
	}
	dst = append(dst, st)
	return append(dst, key...)
}

// AppendLogKey appends the store key of the ROLL.* log of key. As the npm
// rolling-rate-limiter keeps one sorted set per id, the parameters are not
// part of it: they are per call, and the stored value carries the interval
// of the last call that wrote it, for the sweep.
func AppendLogKey(dst []byte, key []byte) []byte {
	return append(appendHeader(dst, key, KindLog), key...)
}

// SlotRange returns the bounds [lower, upper) of every record key of slot.
func SlotRange(slot uint16) (lower, upper [2]byte) {
	binary.BigEndian.PutUint16(lower[:], slot)
	binary.BigEndian.PutUint16(upper[:], slot+1) // slot < Slots: no wrap
	return lower, upper
}

// Record is a record key split into its parts.
type Record struct {
	Slot uint16
	Kind *Kind
	// Params is the kind's bytes between the kind byte and the client key
	// (empty for GCRA and logs); Key the client key, or for a divvy counter its
	// actor. Both alias the record key.
	Params, Key []byte
	rest        []byte // Params and Key together
}

// ID returns what the record is kept for: its client key, or for a rule
// counter the identity it was made of (AppendRuleKey's id), which for a
// divvy counter is Params and Key together. It aliases the record key.
func (r Record) ID() []byte {
	if r.Kind.ID == KindCounter {
		return r.rest
	}
	return r.Key
}

// ErrBadKey is returned for a store key that no kind laid out.
var ErrBadKey = errors.New("keyspace: not a record key")

// Parse splits a record key. Keys of unknown kinds or malformed layouts
// are ErrBadKey.
func Parse(k []byte) (Record, error) {
	if len(k) < HeaderLen {
		return Record{}, fmt.Errorf("%w: %d bytes", ErrBadKey, len(k))
	}
	slot, ok := RecordSlot(k)
	if !ok {
		return Record{}, fmt.Errorf("%w: slot %d", ErrBadKey, binary.BigEndian.Uint16(k))
	}
	kind := Lookup(k[2])
	if kind == nil {
		return Record{}, fmt.Errorf("%w: unknown kind %q", ErrBadKey, k[2])
	}
	n, ok := kind.split(k[HeaderLen:])
	if !ok {
		return Record{}, fmt.Errorf("%w: malformed %s key", ErrBadKey, kind.Name)
	}
	rest := k[HeaderLen:]
	return Record{Slot: slot, Kind: kind, Params: rest[:n], Key: rest[n:], rest: rest}, nil
}

// ClientKey reports whether the record key k belongs to the client key key:
// what DEL removes. Rule counters belong to no client key.
func ClientKey(k, key []byte) bool {
	r, err := Parse(k)
	return err == nil && r.Kind.HasClientKey && string(r.Key) == string(key)
}

// Idle reports whether the record (k, v) is idle at now (unix ns on the
// server clock), so that the sweep may delete it. A record of an unknown
// kind, or one that does not decode, is kept.
func Idle(k, v []byte, now int64) bool {
	r, err := Parse(k)
	if err != nil {
		return false
	}
	idle, err := r.Kind.idle(r.Params, v, now)
	return err == nil && idle
}

// Class is the storage class of a record key, for per-kind record counts:
// the kind's Class, or 0 for a key of no known kind.
func Class(k []byte) int {
	if kind := KindOf(k); kind != nil {
		return kind.Class
	}
	return 0
}

// KindOf returns the kind named by the kind byte of the record key k, nil
// if none, without looking at the rest (Parse does).
func KindOf(k []byte) *Kind {
	if len(k) < HeaderLen {
		return nil
	}
	return Lookup(k[2])
}

// UpgradeKey maps a record key of the previous layout (format 1: a bucket
// or divvy key without the slot) to the current one, by prepending the
// slot. A key already in the current layout, left by an interrupted
// upgrade, is reported with moved false and a nil key. Any other key is an
// error: it is never guessed at.
func UpgradeKey(dst, k []byte) (newKey []byte, moved bool, err error) {
	if len(k) > 0 && k[0] < Slots>>8 {
		// Current keys start with the slot's high byte, below 0x40; keys of
		// the previous layout with their kind byte, 'b' or 'd'.
		if _, err := Parse(k); err != nil {
			return nil, false, fmt.Errorf("keyspace: upgrade: %q is in neither layout: %w", k, err)
		}
		return nil, false, nil
	}
	if len(k) < 1 {
		return nil, false, fmt.Errorf("keyspace: upgrade: empty key")
	}
	var slot uint16
	switch k[0] {
	case KindBucket:
		n, ok := splitBucket(k[1:])
		if !ok {
			return nil, false, fmt.Errorf("keyspace: upgrade: %q: %w: malformed bucket key", k, ErrBadKey)
		}
		slot = Slot(k[1+n:])
	case KindCounter:
		if len(k) < 1+policy.CounterIDLen {
			return nil, false, fmt.Errorf("keyspace: upgrade: %q: divvy counter key shorter than its rule identity", k)
		}
		slot = Slot(k[1:])
	default:
		return nil, false, fmt.Errorf("keyspace: upgrade: %q: unknown kind %q in the previous layout", k, k[0])
	}
	dst = append(dst, byte(slot>>8), byte(slot))
	return append(dst, k...), true, nil
}

// Kind is one limiter kind in the registry.
type Kind struct {
	ID   byte   // the kind byte of its keys
	Name string // in INFO keyspace, metrics and sluice inspect
	// Class is the kind's storage class, 1 or more: see Class.
	Class int
	// HasClientKey is false for kinds whose records belong to no client
	// key (rule counters): DEL leaves them alone.
	HasClientKey bool

	// split returns the length of the parameter bytes at the start of rest,
	// the part of a key after the kind byte; ok false if rest is malformed.
	split func(rest []byte) (n int, ok bool)
	// idle reports whether a record with these parameter bytes and value
	// is idle at now (unix ns).
	idle func(params, val []byte, now int64) (bool, error)
	// describe summarises a record for sluice inspect.
	describe func(params, val []byte, now int64) (Description, error)
}

// Description is a record as sluice inspect shows it.
type Description struct {
	Params string // the kind's parameters, "max=10 refill=10 refill_ms=60000"
	State  string // its state at the time asked, "tokens=3 anchor=..."
	Idle   bool   // the sweep would delete it
	// Fields are the parameters and the state as named values, for JSON.
	Fields []Field
}

// Field is one named value of a Description.
type Field struct {
	Name  string
	Value any
}

// Describe summarises a record at now (unix ns) for sluice inspect.
func (r Record) Describe(v []byte, now int64) (Description, error) {
	return r.Kind.describe(r.Params, v, now)
}

var kinds = []*Kind{
	{ID: KindBucket, Name: "bucket", Class: 1, HasClientKey: true,
		split: splitBucket, idle: idleBucket, describe: describeBucket},
	marked(&Kind{ID: KindCounter, Name: "divvy", Class: 2,
		split: splitCounter, idle: idleCounter, describe: describeCounter}),
	{ID: KindGCRA, Name: "gcra", Class: 3, HasClientKey: true,
		split: func([]byte) (int, bool) { return 0, true }, idle: idleGCRA, describe: describeGCRA},
	{ID: KindWindow, Name: "window", Class: 4, HasClientKey: true,
		split: splitWindow, idle: idleWindow, describe: describeWindow},
	{ID: KindLog, Name: "log", Class: 5, HasClientKey: true,
		split: func([]byte) (int, bool) { return 0, true }, idle: idleLog, describe: describeLog},
	// Rule counters: the codecs of their command kinds, no client key,
	// and a value that may carry an override (override.go).
	marked(&Kind{ID: KindRuleBucket, Name: "rule_bucket", Class: 6,
		split: splitBucket, idle: idleBucket, describe: describeBucket}),
	marked(&Kind{ID: KindRuleGCRA, Name: "rule_gcra", Class: 7,
		split: func([]byte) (int, bool) { return 0, true }, idle: idleGCRA, describe: describeGCRA}),
	marked(&Kind{ID: KindRuleWindow, Name: "rule_window", Class: 8,
		split: splitWindow, idle: idleWindow, describe: describeWindow}),
	marked(&Kind{ID: KindRuleLog, Name: "rule_log", Class: 9,
		split: func([]byte) (int, bool) { return 0, true }, idle: idleLog, describe: describeLog}),
	// Per-actor overrides and their counts (override.go): never idle.
	{ID: KindOverride, Name: "override", Class: 10,
		split: splitOverride, idle: never, describe: describeOverride},
	{ID: KindOverrideCount, Name: "override_count", Class: 11,
		split: func([]byte) (int, bool) { return 0, true }, idle: never, describe: describeOverrideCount},
}

var byID = func() (t [256]*Kind) {
	for _, k := range kinds {
		t[k.ID] = k
	}
	return t
}()

// Kinds returns the registry, in class order. The slice must not be changed.
func Kinds() []*Kind { return kinds }

// Lookup returns the kind of kind byte id, or nil.
func Lookup(id byte) *Kind { return byID[id] }

// MaxClass is the largest Class of a kind.
const MaxClass = 11
