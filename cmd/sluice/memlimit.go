package main

import (
	"log/slog"
	"math"
	"runtime/debug"
	"strings"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/storage"
)

// runtimeMemory is the sizing rule's term for what the flags do not bound:
// the Go runtime, goroutine stacks, Pebble's indexes and table metadata,
// and the commit queue at its default bound (docs/operations.md,
// "Sizing"); --commit-queue-memory above that default adds to it.
const runtimeMemory = 40 << 20

// autoMemoryLimit is the soft memory limit of --memory-limit auto: the
// sizing rule of docs/operations.md ("Sizing"), term for term,
// plus --maxmemory-clients (and --cluster-log-memory with replicated
// shards, and a cluster node's filter of its overrides at
// --policy-max-overrides), so that a burst of big commands is collected
// before it doubles the heap. Without it the collector lets the heap run to
// about twice its live size between collections (GOGC=100), and the peak
// RSS to well over the rule with long keys.
//
// pebbleOnGoHeap says whether Pebble's block cache and memtables are Go
// memory: with cgo they are allocated with C's malloc, which the Go limit
// does not see, so counting them would let the Go heap grow by as much.
// --maxmemory-clients 0 (no bound) counts its default: a rule needs some
// figure, and the limit is soft.
func autoMemoryLimit(cfg config, pebbleOnGoHeap bool) int64 {
	clients := int64(cfg.maxMemClients)
	if clients == 0 {
		clients = respserver.DefaultMaxMemoryClients
	}
	// parseConfig has converted a deprecated --cache-buckets.
	n := int64(cfg.cacheMemory) + int64(cfg.keyFilterSize) + clients + runtimeMemory
	n += max(int64(cfg.commitQueueMem)-storage.DefaultMaxQueuedBytes, 0)
	if cfg.clusterReplicas > 1 {
		n += int64(cfg.clusterLogMemory)
	}
	if cfg.clusterNodes != "" {
		n += engine.NodeFilterBytes(int64(cfg.policyMaxOverrides)) + engine.NodeCacheBytes
	}
	if pebbleOnGoHeap {
		n += int64(cfg.cacheSize) + 2*int64(cfg.memtableSize)
	}
	return n
}

// Where the memory limit came from, as logged and shown by INFO.
const (
	limitFromAuto = "auto"
	limitFromFlag = "--memory-limit"
	limitFromEnv  = "GOMEMLIMIT"
	limitOff      = "off"
)

// chooseMemoryLimit returns the soft memory limit to set and where it comes
// from. GOMEMLIMIT, which the Go runtime applied before main, wins over
// --memory-limit: ok is false then, and nothing is to be set.
func chooseMemoryLimit(cfg config, lookupEnv func(string) (string, bool)) (limit int64, source string, ok bool) {
	// The runtime reads an empty GOMEMLIMIT as unset, and so does this.
	if v, set := lookupEnv("GOMEMLIMIT"); set && v != "" {
		return 0, limitFromEnv, false
	}
	switch {
	case cfg.memoryLimit.auto:
		return autoMemoryLimit(cfg, pebbleOnGoHeap), limitFromAuto, true
	case cfg.memoryLimit.bytes == 0:
		return math.MaxInt64, limitOff, true
	}
	return int64(cfg.memoryLimit.bytes), limitFromFlag, true
}

// applyMemoryLimit sets the Go runtime's soft memory limit from cfg and
// lookupEnv, logs it, and returns it (0 for none) with its source, and a
// function that puts back the limit in force before.
func applyMemoryLimit(cfg config, lookupEnv func(string) (string, bool), log *slog.Logger) (limit int64, source string, restore func()) {
	limit, source, ok := chooseMemoryLimit(cfg, lookupEnv)
	restore = func() {}
	if ok {
		prev := debug.SetMemoryLimit(limit)
		restore = func() { debug.SetMemoryLimit(prev) }
	} else {
		limit = debug.SetMemoryLimit(-1) // reads the limit GOMEMLIMIT set
		if !cfg.memoryLimit.auto {
			log.Warn("GOMEMLIMIT is set: --memory-limit is ignored", "memory_limit_flag", cfg.memoryLimit.String())
		}
	}
	if limit == math.MaxInt64 {
		limit = 0
	}
	log.Info("memory limit", "bytes", limit, "source", source, "pebble_on_go_heap", pebbleOnGoHeap)
	if source == limitFromFlag {
		if rule := autoMemoryLimit(cfg, pebbleOnGoHeap); limit < rule {
			log.Warn("--memory-limit is below the sizing rule: the garbage collector may run constantly and take up to half the CPU", "bytes", limit, "rule", rule)
		}
	}
	return limit, source, restore
}

// memoryLimit is the value of --memory-limit: auto, 0 (no limit) or a size.
type memoryLimit struct {
	auto  bool
	bytes byteSize
}

func (m *memoryLimit) String() string {
	if m.auto {
		return "auto"
	}
	return m.bytes.String()
}

func (m *memoryLimit) Set(s string) error {
	if strings.TrimSpace(s) == "auto" {
		*m = memoryLimit{auto: true}
		return nil
	}
	var b byteSize
	if err := b.Set(s); err != nil {
		return &badValue{problem: "not a memory limit: want auto, 0 (no limit) or a size, written as for the other size flags (512mb, 1GiB)"}
	}
	*m = memoryLimit{bytes: b}
	return nil
}
