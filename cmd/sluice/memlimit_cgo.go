//go:build cgo

package main

// pebbleOnGoHeap: with cgo, Pebble allocates its block cache and memtables
// with C's malloc (pebble/internal/manual), outside the Go heap and its
// soft limit. (A race-enabled build gives half its processes Go
// allocations instead, so that the race detector sees them; tests only.)
const pebbleOnGoHeap = false
