package keyspace

// The names of the values a node keeps among the store's own keys
// (storage.Store.Meta), outside the record key space: neither the sweep,
// DEL, a slot's move nor sluice inspect reaches them, so they stay with
// the node.

// DialsMeta holds the node's policy dials (POLICY LIMIT and POLICY
// ENFORCE): package engine encodes and decodes its value.
const DialsMeta = "policy.dials"
