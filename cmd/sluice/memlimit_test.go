package main

import (
	"bytes"
	"io"
	"log/slog"
	"math"
	"runtime/debug"
	"strings"
	"testing"
)

func noEnvAt(string) (string, bool) { return "", false }

func mustParse(t *testing.T, args ...string) config {
	t.Helper()
	cfg, err := parseConfig(args, noEnvAt, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestAutoMemoryLimit: --memory-limit auto is the sizing rule, term for
// term, with Pebble's memory counted only when it is on the Go heap.
func TestAutoMemoryLimit(t *testing.T) {
	const mib = 1 << 20
	pebble := int64(64*mib + 2*16*mib) // --cache-size, 2 × --memtable-size
	for _, tc := range []struct {
		name  string
		flags []string
		want  int64 // without Pebble's terms
	}{
		{"defaults", nil, 160*mib + 16*mib + 64*mib + 40*mib},
		{"cache-memory binds", []string{"--cache-memory", "10MiB"}, 10*mib + 16*mib + 64*mib + 40*mib},
		{"bucket cache off", []string{"--cache-buckets", "0"}, 16*mib + 64*mib + 40*mib},
		{"cache-memory off", []string{"--cache-memory", "0"}, 16*mib + 64*mib + 40*mib},
		{"no key filter", []string{"--key-filter-size", "0"}, 160*mib + 64*mib + 40*mib},
		{"maxmemory-clients", []string{"--maxmemory-clients", "1GiB"}, 160*mib + 16*mib + 1024*mib + 40*mib},
		{"maxmemory-clients off counts its default", []string{"--maxmemory-clients", "0"}, 160*mib + 16*mib + 64*mib + 40*mib},
		// The runtime term holds the commit queue's default 16 MiB.
		{"commit queue above its default", []string{"--commit-queue-memory", "48MiB"}, 160*mib + 16*mib + 64*mib + 40*mib + 32*mib},
		{"commit queue below its default", []string{"--commit-queue-memory", "1MiB"}, 160*mib + 16*mib + 64*mib + 40*mib},
		// The Raft logs' entries in memory count with replicated shards
		// only; a cluster node's filter of its overrides, 2.5 bytes per
		// --policy-max-overrides, and its cache of them, 1,967,104 bytes,
		// in cluster mode only.
		{"replicated shards", []string{"--cluster-nodes", "a:1,b:1,c:1", "--cluster-replicas", "3"}, 160*mib + 16*mib + 64*mib + 40*mib + 4*mib + 2_500_000 + 1_967_104},
		{"replicated shards, log memory", []string{"--cluster-nodes", "a:1,b:1,c:1", "--cluster-replicas", "3", "--cluster-log-memory", "32MiB"}, 160*mib + 16*mib + 64*mib + 40*mib + 32*mib + 2_500_000 + 1_967_104},
		{"one copy per slot, log memory", []string{"--cluster-nodes", "a:1,b:1,c:1", "--cluster-log-memory", "32MiB"}, 160*mib + 16*mib + 64*mib + 40*mib + 2_500_000 + 1_967_104},
		{"cluster, overrides bound", []string{"--cluster-nodes", "a:1,b:1,c:1", "--policy-max-overrides", "4000000"}, 160*mib + 16*mib + 64*mib + 40*mib + 10_000_000 + 1_967_104},
	} {
		cfg := mustParse(t, tc.flags...)
		if got := autoMemoryLimit(cfg, false); got != tc.want {
			t.Errorf("%s, Pebble off the Go heap (cgo): %d, want %d", tc.name, got, tc.want)
		}
		if got := autoMemoryLimit(cfg, true); got != tc.want+pebble {
			t.Errorf("%s, Pebble on the Go heap: %d, want %d", tc.name, got, tc.want+pebble)
		}
	}
	cfg := mustParse(t, "--cache-size", "1GiB", "--memtable-size", "100MiB")
	if got, want := autoMemoryLimit(cfg, true)-autoMemoryLimit(cfg, false), int64(1024*mib+200*mib); got != want {
		t.Errorf("Pebble's terms with --cache-size 1GiB --memtable-size 100MiB: %d, want %d", got, want)
	}
	// The figure of docs/operations.md ("Sizing"): about 310 MiB plus --maxmemory-clients.
	if got := autoMemoryLimit(mustParse(t), true); got>>20 != 376 {
		t.Errorf("default limit without cgo: %d MiB, want 376 (docs/operations.md, Sizing)", got>>20)
	}
}

func TestMemoryLimitFlag(t *testing.T) {
	if cfg := mustParse(t); !cfg.memoryLimit.auto {
		t.Errorf("default %+v, want auto", cfg.memoryLimit)
	}
	for arg, want := range map[string]memoryLimit{
		"auto":   {auto: true},
		"0":      {},
		"512MiB": {bytes: 512 << 20},
		"1GB":    {bytes: 1 << 30}, // as in redis.conf: GB is 1024³, G 1000³
		"1g":     {bytes: 1e9},
		"123":    {bytes: 123},
	} {
		if cfg := mustParse(t, "--memory-limit", arg); cfg.memoryLimit != want {
			t.Errorf("--memory-limit %s: %+v, want %+v", arg, cfg.memoryLimit, want)
		}
	}
	env := func(k string) (string, bool) { return "256MiB", k == "SLUICE_MEMORY_LIMIT" }
	if cfg, err := parseConfig(nil, env, io.Discard); err != nil || cfg.memoryLimit != (memoryLimit{bytes: 256 << 20}) {
		t.Errorf("SLUICE_MEMORY_LIMIT=256MiB: %+v, %v", cfg.memoryLimit, err)
	}
	for _, bad := range []string{"lots", "-1", "auto2", "1TB"} {
		_, err := parseConfig([]string{"--memory-limit", bad}, noEnvAt, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "memory-limit") || !strings.Contains(err.Error(), "want auto, 0 (no limit) or a size") {
			t.Errorf("--memory-limit %s: %v, want an error naming the flag and what it takes", bad, err)
		}
	}
}

// TestChooseMemoryLimit: where the limit comes from. GOMEMLIMIT, which the
// runtime applied before main, wins over the flag.
func TestChooseMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		flags      []string
		gomemlimit string // "-" for unset
		limit      int64
		source     string
		set        bool
	}{
		{nil, "-", autoMemoryLimit(mustParse(t), pebbleOnGoHeap), "auto", true},
		{nil, "", autoMemoryLimit(mustParse(t), pebbleOnGoHeap), "auto", true}, // empty is unset, as for the runtime
		{[]string{"--memory-limit", "0"}, "-", math.MaxInt64, "off", true},
		{[]string{"--memory-limit", "1GiB"}, "-", 1 << 30, "--memory-limit", true},
		{nil, "300MiB", 0, "GOMEMLIMIT", false},
		{[]string{"--memory-limit", "1GiB"}, "300MiB", 0, "GOMEMLIMIT", false},
		{[]string{"--memory-limit", "0"}, "off", 0, "GOMEMLIMIT", false},
	} {
		env := func(k string) (string, bool) {
			if k == "GOMEMLIMIT" && tc.gomemlimit != "-" {
				return tc.gomemlimit, true
			}
			return "", false
		}
		limit, source, set := chooseMemoryLimit(mustParse(t, tc.flags...), env)
		if limit != tc.limit || source != tc.source || set != tc.set {
			t.Errorf("%v with GOMEMLIMIT %q: %d, %q, %v; want %d, %q, %v", tc.flags, tc.gomemlimit, limit, source, set, tc.limit, tc.source, tc.set)
		}
	}
}

// TestApplyMemoryLimit sets the process's limit and puts it back; with
// GOMEMLIMIT set it only reads it.
func TestApplyMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })

	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	limit, source, restore := applyMemoryLimit(mustParse(t, "--memory-limit", "3GiB"), noEnvAt, log)
	if now := debug.SetMemoryLimit(-1); limit != 3<<30 || source != "--memory-limit" || now != 3<<30 {
		t.Errorf("--memory-limit 3GiB: returned %d from %q, runtime limit %d", limit, source, now)
	}
	restore()
	if now := debug.SetMemoryLimit(-1); now != before {
		t.Errorf("after restore: %d, want %d", now, before)
	}
	if !strings.Contains(logs.String(), `msg="memory limit" bytes=3221225472 source=--memory-limit`) {
		t.Errorf("log lacks the limit:\n%s", logs.String())
	}

	logs.Reset()
	env := func(k string) (string, bool) { return "300MiB", k == "GOMEMLIMIT" }
	limit, source, restore = applyMemoryLimit(mustParse(t, "--memory-limit", "3GiB"), env, log)
	restore()
	if now := debug.SetMemoryLimit(-1); now != before {
		t.Errorf("GOMEMLIMIT set: the runtime limit changed from %d to %d", before, now)
	}
	want := before
	if want == math.MaxInt64 {
		want = 0
	}
	if limit != want || source != "GOMEMLIMIT" {
		t.Errorf("GOMEMLIMIT set: returned %d from %q, want %d from GOMEMLIMIT", limit, source, want)
	}
	if !strings.Contains(logs.String(), "--memory-limit is ignored") || !strings.Contains(logs.String(), "source=GOMEMLIMIT") {
		t.Errorf("log does not say GOMEMLIMIT won:\n%s", logs.String())
	}
}
