//go:build !cgo

package storage

// PebbleOffHeap reports whether Pebble allocates its block cache and
// memtables outside the Go heap: without cgo (the Dockerfile's
// CGO_ENABLED=0) they are ordinary Go allocations, in the Go heap's
// figures.
const PebbleOffHeap = false
