//go:build cgo

package storage

// PebbleOffHeap reports whether Pebble allocates its block cache and
// memtables outside the Go heap: with cgo it uses C's malloc
// (pebble/internal/manual), so the Go runtime's figures leave them out. A
// race-enabled build gives half its processes Go allocations instead, so
// that the race detector sees them; that is for tests only.
const PebbleOffHeap = true
