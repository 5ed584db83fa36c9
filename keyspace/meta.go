package keyspace

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
