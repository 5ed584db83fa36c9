package respserver

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/storage"
)

// INFO memory gives Redis' field names where they mean the same here, so
// that redis_exporter and dashboards built for Redis read them; the Go
// runtime's allocator stands for jemalloc. docs/operations.md lists every
// field with its meaning.

// goMemMetrics are the runtime/metrics INFO memory reads, in this order.
var goMemMetrics = []string{
	"/memory/classes/heap/objects:bytes",  // live objects and dead ones not yet swept
	"/memory/classes/heap/unused:bytes",   // free room in spans holding objects
	"/memory/classes/heap/stacks:bytes",   // goroutine stacks
	"/memory/classes/heap/released:bytes", // heap memory given back to the system
	"/memory/classes/total:bytes",         // everything the Go runtime has mapped
	"/gc/heap/goal:bytes",
}

// memFigures is one sample of the process's memory.
type memFigures struct {
	heapObjects, heapUnused, stacks, released, goTotal, heapGoal int64
	// pebble is the bytes of Pebble's block cache and memtables, and
	// pebbleOff whether they are outside the Go heap (a cgo build).
	blockCache, memtables int64
	pebbleOff             bool
	// used is used_memory: Go heap objects, goroutine stacks, and Pebble's
	// block cache and memtables when they are outside the Go heap.
	used int64
}

// sampleMemory reads the Go runtime's figures (runtime/metrics, which
// does not stop the world as ReadMemStats does) and, from st, Pebble's.
func sampleMemory(st *storage.Stats) memFigures {
	samples := make([]metrics.Sample, len(goMemMetrics))
	for i, n := range goMemMetrics {
		samples[i].Name = n
	}
	metrics.Read(samples)
	v := func(i int) int64 {
		if samples[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return int64(samples[i].Value.Uint64())
	}
	f := memFigures{
		heapObjects: v(0), heapUnused: v(1), stacks: v(2), released: v(3), goTotal: v(4), heapGoal: v(5),
		blockCache: st.BlockCacheBytes, memtables: int64(st.MemTableBytes), pebbleOff: storage.PebbleOffHeap,
	}
	f.used = f.heapObjects + f.stacks
	if f.pebbleOff {
		f.used += f.blockCache + f.memtables
	}
	return f
}

// memState is INFO memory's own state.
type memState struct {
	peak    atomic.Int64 // used_memory_peak
	startup int64        // used_memory when serving began
}

// startMemory samples used_memory_startup, and used_memory_peak every
// second until Close, so that the peak sees what happens between two INFO
// calls (Redis samples it in its 100 ms cron). Serve calls it once.
func (s *Server) startMemory() {
	st := s.store.Stats()
	s.mem.startup = sampleMemory(&st).used
	s.notePeak(s.mem.startup)
	go s.sampleMemoryPeak()
}

// notePeak records used as a candidate for used_memory_peak.
func (s *Server) notePeak(used int64) int64 {
	for {
		p := s.mem.peak.Load()
		if used <= p {
			return p
		}
		if s.mem.peak.CompareAndSwap(p, used) {
			return used
		}
	}
}

func (s *Server) sampleMemoryPeak() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			var st storage.Stats
			if storage.PebbleOffHeap {
				st = s.store.Stats()
			}
			s.notePeak(sampleMemory(&st).used)
		}
	}
}

// writeMemoryInfo writes INFO's # Memory section.
func (s *Server) writeMemoryInfo(kv func(k, v string)) {
	st := s.store.Stats()
	f := sampleMemory(&st)
	peak := s.notePeak(f.used)
	rss := residentBytes()
	if rss <= 0 { // not Linux: what the Go runtime holds, plus Pebble's C memory
		rss = f.goTotal - f.released
		if f.pebbleOff {
			rss += f.blockCache + f.memtables
		}
	}
	i64 := func(n int64) string { return strconv.FormatInt(n, 10) }
	size := func(k string, n int64) {
		kv(k, i64(n))
		kv(k+"_human", HumanBytes(n))
	}
	ratio := func(a, b int64) string {
		if b <= 0 {
			return "0"
		}
		return strconv.FormatFloat(float64(a)/float64(b), 'f', 2, 64)
	}
	size("used_memory", f.used)
	size("used_memory_rss", rss)
	size("used_memory_peak", peak)
	kv("used_memory_peak_perc", ratio(100*f.used, peak)+"%")
	// At most used_memory, which tools subtract it from (Redis'
	// used_memory_dataset is used_memory less it and the overhead): what
	// was live when serving began, opening the store included, can be
	// freed since.
	kv("used_memory_startup", i64(min(s.mem.startup, f.used)))
	active := f.heapObjects + f.heapUnused
	kv("allocator_allocated", i64(f.heapObjects))
	kv("allocator_active", i64(active))
	kv("allocator_resident", i64(f.goTotal-f.released))
	size("total_system_memory", systemMemory())
	// sluice has no maxmemory: it never evicts stored limits nor refuses
	// writes for memory (0 is Redis' "no limit"). The Go runtime's soft
	// limit is memory_limit in # Server.
	size("maxmemory", 0)
	kv("maxmemory_policy", "noeviction")
	kv("allocator_frag_ratio", ratio(active, f.heapObjects))
	kv("allocator_frag_bytes", i64(active-f.heapObjects))
	kv("mem_fragmentation_ratio", ratio(rss, f.used))
	kv("mem_fragmentation_bytes", i64(rss-f.used))
	kv("mem_clients_normal", i64(s.stats.ClientMem.Load()))
	kv("mem_allocator", runtime.Version())
	kv("mem_go_stacks", i64(f.stacks))
	kv("mem_go_total", i64(f.goTotal))
	kv("mem_go_released", i64(f.released))
	kv("mem_go_heap_goal", i64(f.heapGoal))
	kv("mem_bucket_cache", i64(st.CacheBytes))
	kv("mem_bucket_cache_limit", i64(st.CacheMemory))
	kv("mem_bucket_cache_entries", i64(st.CacheEntries))
	kv("mem_pebble_block_cache", i64(f.blockCache))
	kv("mem_pebble_memtables", i64(f.memtables))
	kv("mem_pebble_off_heap", boolInt(f.pebbleOff))
}

// residentBytes is the process's resident set from /proc/self/statm, or
// 0 where there is none.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	fields := bytes.Fields(b)
	if len(fields) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(string(fields[1]), 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

// systemMemory is the machine's memory from /proc/meminfo's MemTotal, as
// Redis' total_system_memory, or 0 where there is none.
func systemMemory() int64 {
	fh, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("MemTotal:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest) // "16318764 kB"
		if len(f) == 0 {
			return 0
		}
		kb, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			return 0
		}
		return kb << 10
	}
	return 0
}

// HumanBytes formats n as Redis' *_human fields: 1023B, 1.50K, 2.00M.
func HumanBytes(n int64) string {
	const units = "KMGTP"
	if n < 1024 {
		return strconv.FormatInt(n, 10) + "B"
	}
	v := float64(n)
	for i := range len(units) {
		v /= 1024
		if v < 1024 || i == len(units)-1 {
			return strconv.FormatFloat(v, 'f', 2, 64) + units[i:i+1]
		}
	}
	return ""
}
