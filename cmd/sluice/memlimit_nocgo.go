//go:build !cgo

package main

// pebbleOnGoHeap: without cgo (the Dockerfile's CGO_ENABLED=0), Pebble's
// block cache and memtables are ordinary Go allocations, counted by the
// soft limit.
const pebbleOnGoHeap = true
