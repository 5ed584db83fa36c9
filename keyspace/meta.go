package keyspace

import "encoding/binary"

// The names of the values a node keeps among the store's own keys
// (storage.Store.Meta), outside the record key space: neither the sweep,
// DEL, a slot's move nor sluice inspect reaches them, so they stay with
// the node.

// DialsMeta holds the node's policy dials (POLICY LIMIT and POLICY
// ENFORCE): package engine encodes and decodes its value.
const DialsMeta = "policy.dials"

// StatsMeta starts the names of the node's threshold data (POLICY STATS),
// one value per rule label and UTC day: StatsMeta + label + "." +
// "2006-01-02". A label has no dot (policy's ^[a-zA-Z0-9_-]{1,255}$), so
// StatsMeta + label + "." names one label's days, in date order. Package
// engine encodes the values (package peakstats).
const StatsMeta = "policy.stats."

// OverrideMeta starts the names of a cluster node's per-actor overrides
// (POLICY OVERRIDE in cluster mode, where each node keeps its own, as it
// keeps its dials): AppendOverrideMeta's names, valued AppendUint(limit).
// A standalone server keeps them as records instead (override.go).
const OverrideMeta = "policy.override."

// OverrideCountMeta + label names a cluster node's count of label's
// overrides, valued AppendUint(count); none at zero.
const OverrideCountMeta = "policy.overridecount."

// AppendOverrideMeta appends the name of label's override of actor on a
// cluster node: OverrideMeta, the label's length as a uvarint, the label,
// the actor. The prefix up to the actor (AppendOverrideMeta with a nil
// actor) names one label's overrides, in actor order.
func AppendOverrideMeta(dst []byte, label string, actor []byte) []byte {
	dst = append(dst, OverrideMeta...)
	dst = binary.AppendUvarint(dst, uint64(len(label)))
	return append(append(dst, label...), actor...)
}
