//go:build race

package storage

// raceEnabled: the race detector changes what objects cost on the heap.
const raceEnabled = true
