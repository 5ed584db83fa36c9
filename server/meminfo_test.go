package server

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/respserver"
)

// memoryFields are the fields of INFO memory (docs/operations.md lists
// them with their meaning).
var memoryFields = []string{"used_memory", "used_memory_human", "used_memory_rss", "used_memory_rss_human",
	"used_memory_peak", "used_memory_peak_human", "used_memory_peak_perc", "used_memory_startup",
	"allocator_allocated", "allocator_active", "allocator_resident", "total_system_memory", "total_system_memory_human",
	"maxmemory", "maxmemory_human", "maxmemory_policy", "allocator_frag_ratio", "allocator_frag_bytes",
	"mem_fragmentation_ratio", "mem_fragmentation_bytes", "mem_clients_normal", "mem_allocator",
	"mem_go_stacks", "mem_go_total", "mem_go_released", "mem_go_heap_goal",
	"mem_bucket_cache", "mem_bucket_cache_limit", "mem_bucket_cache_entries",
	"mem_pebble_block_cache", "mem_pebble_memtables", "mem_pebble_off_heap"}

// TestInfoMemory: INFO memory has a # Memory section with Redis' field
// names (it used to be empty), in INFO, INFO all, INFO everything and
// INFO default too, and not in another section's INFO.
func TestInfoMemory(t *testing.T) {
	srv := startServer(t, Config{})
	rdb := newClient(t, srv)
	ctx := context.Background()
	sec, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sec, "# Memory\r\n") || strings.Contains(sec, "# Server") {
		t.Fatalf("INFO memory:\n%s", sec)
	}
	var keys []string
	vals := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(sec), "\r\n")[1:] {
		k, v, _ := strings.Cut(l, ":")
		keys = append(keys, k)
		vals[k] = v
	}
	if strings.Join(keys, " ") != strings.Join(memoryFields, " ") {
		t.Errorf("INFO memory fields\n%v\nwant\n%v", keys, memoryFields)
	}
	num := func(k string) int64 {
		t.Helper()
		n, err := strconv.ParseInt(vals[k], 10, 64)
		if err != nil {
			t.Fatalf("%s:%q is not an integer", k, vals[k])
		}
		return n
	}
	used, peak, rss := num("used_memory"), num("used_memory_peak"), num("used_memory_rss")
	if used <= 0 || peak < used || rss <= 0 || num("used_memory_startup") <= 0 {
		t.Errorf("used_memory %d, used_memory_peak %d, used_memory_rss %d: want positive and peak >= used", used, peak, rss)
	}
	if num("allocator_active") < num("allocator_allocated") || num("mem_bucket_cache_limit") != 160<<20 || num("maxmemory") != 0 {
		t.Errorf("INFO memory:\n%s", sec)
	}
	if vals["used_memory_human"] != respserver.HumanBytes(used) || vals["maxmemory_policy"] != "noeviction" {
		t.Errorf("INFO memory:\n%s", sec)
	}
	// mem_clients_normal is the buffers --maxmemory-clients counts, as in
	// # Clients: the same figure, read in the same command.
	both, _ := rdb.Info(ctx, "clients", "memory").Result()
	var fromClients, fromMemory string
	for _, l := range strings.Split(both, "\r\n") {
		if v, ok := strings.CutPrefix(l, "mem_clients_normal:"); ok {
			if fromClients == "" {
				fromClients = v
			} else {
				fromMemory = v
			}
		}
	}
	if fromClients == "" || fromClients != fromMemory {
		t.Errorf("mem_clients_normal: # Clients %q, # Memory %q", fromClients, fromMemory)
	}
	for _, args := range [][]any{{"INFO"}, {"INFO", "all"}, {"INFO", "everything"}, {"INFO", "default"}, {"INFO", "server", "memory"}} {
		info, err := rdb.Do(ctx, args...).Text()
		if err != nil || !strings.Contains(info, "\r\n# Memory\r\nused_memory:") {
			t.Errorf("%v lacks # Memory: %v", args, err)
		}
	}
	if info, _ := rdb.Info(ctx, "stats").Result(); strings.Contains(info, "# Memory") {
		t.Errorf("INFO stats has # Memory")
	}
}

// TestUsedMemoryStartupNotAboveUsed: used_memory_startup, sampled when
// serving began, is never above used_memory, which tools subtract it from
// (Redis' used_memory_dataset): memory that was live at startup and is
// freed later, such as what opening the store held, must not make it so.
func TestUsedMemoryStartupNotAboveUsed(t *testing.T) {
	held := make([]byte, 64<<20) // live while serving begins
	for i := range held {
		held[i] = 1
	}
	srv := startServer(t, Config{})
	rdb := newClient(t, srv)
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil { // served: startMemory has run
		t.Fatal(err)
	}
	runtime.KeepAlive(held)
	held = nil
	runtime.GC()
	sec, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]int64{}
	for _, l := range strings.Split(sec, "\r\n") {
		k, v, _ := strings.Cut(l, ":")
		vals[k], _ = strconv.ParseInt(v, 10, 64)
	}
	if startup, used := vals["used_memory_startup"], vals["used_memory"]; startup <= 0 || startup > used {
		t.Errorf("used_memory_startup %d, used_memory %d: want 0 < startup <= used", startup, used)
	}
}
