package main

import (
	"log/slog"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/storage"
)

// TestCacheBucketsDeprecated: --cache-buckets, now deprecated, still reads
// (a manifest that sets it keeps working): without --cache-memory it sets
// the byte budget to its count × the documented charge per bucket, 0 still
// turns the cache off, and --cache-memory wins over it; the environment
// variable does the same.
func TestCacheBucketsDeprecated(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		env   map[string]string
		want  int64
	}{
		{"default", nil, nil, storage.DefaultCacheMemory},
		{"cache-buckets alone", []string{"--cache-buckets", "262144"}, nil, 262144 * storage.CacheBucketCharge},
		{"cache-buckets 0 turns it off", []string{"--cache-buckets", "0"}, nil, 0},
		{"cache-memory wins", []string{"--cache-buckets", "1000", "--cache-memory", "1MiB"}, nil, 1 << 20},
		{"environment", nil, map[string]string{"SLUICE_CACHE_BUCKETS": "20000"}, 20000 * storage.CacheBucketCharge},
		{"a few buckets give the least cache", []string{"--cache-buckets", "1000"}, nil, storage.MinCacheMemory},
		{"environment, cache-memory wins", nil, map[string]string{"SLUICE_CACHE_BUCKETS": "1000", "SLUICE_CACHE_MEMORY": "2MiB"}, 2 << 20},
	} {
		cfg, err := parseConfig(tc.flags, envOf(tc.env), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if int64(cfg.cacheMemory) != tc.want {
			t.Errorf("%s: cache memory %d, want %d", tc.name, cfg.cacheMemory, tc.want)
		}
	}
}

// A server started with SLUICE_CACHE_BUCKETS uses the converted budget and
// warns at startup, naming --cache-memory.
func TestCacheBucketsDeprecatedWarns(t *testing.T) {
	p := startProcEnv(t, t.TempDir(), []string{"SLUICE_CACHE_BUCKETS=20000"})
	c := p.client(t)
	if got := infoString(t, c, "bucket_cache_memory"); got != strconv.Itoa(20000*storage.CacheBucketCharge) {
		t.Errorf("INFO bucket_cache_memory:%s, want %d", got, 20000*storage.CacheBucketCharge)
	}
	c.Close()
	p.stop(t, syscall.SIGTERM)
	logs := p.logs.String()
	if !strings.Contains(logs, "--cache-buckets (SLUICE_CACHE_BUCKETS) is deprecated") || !strings.Contains(logs, "--cache-memory") {
		t.Errorf("no deprecation warning naming --cache-memory:\n%s", logs)
	}
}

// TestCacheBucketsOverflow: a --cache-buckets count whose bytes pass int64
// is refused, naming the flag and the most it takes, instead of wrapping
// to a negative budget (which storage read as "off" and --memory-limit
// auto as a huge negative term).
func TestCacheBucketsOverflow(t *testing.T) {
	for _, n := range []string{"9223372036854775807", strconv.FormatInt(storage.MaxCacheEntries+1, 10)} {
		cfg, err := parseConfig([]string{"--cache-buckets", n}, func(string) (string, bool) { return "", false }, nil)
		if err == nil {
			t.Fatalf("--cache-buckets %s accepted as cache memory %d, memory limit auto %d", n, int64(cfg.cacheMemory), autoMemoryLimit(cfg, false))
		}
		if !strings.Contains(err.Error(), "--cache-buckets "+n) || !strings.Contains(err.Error(), strconv.FormatInt(storage.MaxCacheEntries, 10)) {
			t.Errorf("--cache-buckets %s: error %q names neither the flag and value nor the most", n, err)
		}
	}
	cfg, err := parseConfig([]string{"--cache-buckets", strconv.FormatInt(storage.MaxCacheEntries, 10)}, func(string) (string, bool) { return "", false }, nil)
	if err != nil || cfg.cacheMemory <= 0 {
		t.Errorf("--cache-buckets %d: cache memory %d, error %v", storage.MaxCacheEntries, int64(cfg.cacheMemory), err)
	}
}

// TestCacheMemoryTooSmall: a --cache-memory between 0 (off) and
// storage.MinCacheMemory, under which no stripe holds a record, is refused
// with an error naming the flag, the value and the minimum; the minimum
// itself and 0 are taken.
func TestCacheMemoryTooSmall(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	for _, v := range []string{"1", "1000", "64KiB", strconv.Itoa(storage.MinCacheMemory - 1)} {
		cfg, err := parseConfig([]string{"--cache-memory", v}, none, nil)
		if err == nil {
			t.Errorf("--cache-memory %s accepted as %d: it caches nothing", v, int64(cfg.cacheMemory))
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "--cache-memory") || !strings.Contains(msg, humanSize(storage.MinCacheMemory)) {
			t.Errorf("--cache-memory %s: error %q names neither the flag nor the minimum %d", v, msg, storage.MinCacheMemory)
		}
	}
	for _, v := range []string{"0", "1MiB"} {
		if _, err := parseConfig([]string{"--cache-memory", v}, none, nil); err != nil {
			t.Errorf("--cache-memory %s: %v", v, err)
		}
	}
}

// envOf looks variables up in vars, as os.LookupEnv does in the
// environment.
func envOf(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

// TestStoreOptionsOff: --cache-memory 0 and --key-filter-size 0 (or their
// environment variables) turn the bucket cache and the key filter off, as
// docs/operations.md says: from the flags to storage.Options.NoCache and
// NoKeyFilter, whose zero sizes would otherwise mean the store's defaults,
// and to a store that caches nothing. Any other size keeps them on.
func TestStoreOptionsOff(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		flags                 []string
		env                   map[string]string
		noCache, noKeyFilter  bool
		cacheMemory, filterSz int64
	}{
		{"defaults", nil, nil, false, false, storage.DefaultCacheMemory, storage.DefaultKeyFilter},
		{"flags 0", []string{"--cache-memory", "0", "--key-filter-size", "0"}, nil, true, true, 0, 0},
		{"environment 0", nil, map[string]string{"SLUICE_CACHE_MEMORY": "0", "SLUICE_KEY_FILTER_SIZE": "0"}, true, true, 0, 0},
		{"cache off alone", []string{"--cache-memory", "0"}, nil, true, false, 0, storage.DefaultKeyFilter},
		{"filter off alone", []string{"--key-filter-size", "0"}, nil, false, true, storage.DefaultCacheMemory, 0},
		{"sizes", []string{"--cache-memory", "2MiB", "--key-filter-size", "1MiB"}, nil, false, false, 2 << 20, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseConfig(tc.flags, envOf(tc.env), nil)
			if err != nil {
				t.Fatal(err)
			}
			o := storeOptions(cfg, storage.SyncEverySec, admit.FDBudget{}, slog.New(slog.DiscardHandler))
			if o.NoCache != tc.noCache || o.NoKeyFilter != tc.noKeyFilter {
				t.Errorf("NoCache %v, NoKeyFilter %v; want %v, %v", o.NoCache, o.NoKeyFilter, tc.noCache, tc.noKeyFilter)
			}
			if o.CacheMemory != tc.cacheMemory || o.KeyFilterSize != tc.filterSz {
				t.Errorf("CacheMemory %d, KeyFilterSize %d; want %d, %d", o.CacheMemory, o.KeyFilterSize, tc.cacheMemory, tc.filterSz)
			}
			s, err := storage.Open(t.TempDir(), o)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.Stats().CacheMemory; got != tc.cacheMemory {
				t.Errorf("the store's cache holds %d bytes, want %d", got, tc.cacheMemory)
			}
		})
	}
}
