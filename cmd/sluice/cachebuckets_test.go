package main

import (
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sluicehq/sluice/storage"
)

// TestCacheBucketsDeprecated: --cache-buckets, now deprecated, still reads
// (a manifest that sets it keeps working): without --cache-memory it sets
// the byte budget to its count × the documented charge per bucket, 0 still
// turns the cache off, and --cache-memory wins over it; the environment
// variable does the same.
func TestCacheBucketsDeprecated(t *testing.T) {
	env := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}
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
		{"environment", nil, map[string]string{"SLUICE_CACHE_BUCKETS": "1000"}, 1000 * storage.CacheBucketCharge},
		{"environment, cache-memory wins", nil, map[string]string{"SLUICE_CACHE_BUCKETS": "1000", "SLUICE_CACHE_MEMORY": "2MiB"}, 2 << 20},
	} {
		cfg, err := parseConfig(tc.flags, env(tc.env), nil)
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
	p := startProcEnv(t, t.TempDir(), []string{"SLUICE_CACHE_BUCKETS=1000"})
	c := p.client(t)
	if got := infoString(t, c, "bucket_cache_memory"); got != strconv.Itoa(1000*storage.CacheBucketCharge) {
		t.Errorf("INFO bucket_cache_memory:%s, want %d", got, 1000*storage.CacheBucketCharge)
	}
	c.Close()
	p.stop(t, syscall.SIGTERM)
	logs := p.logs.String()
	if !strings.Contains(logs, "--cache-buckets (SLUICE_CACHE_BUCKETS) is deprecated") || !strings.Contains(logs, "--cache-memory") {
		t.Errorf("no deprecation warning naming --cache-memory:\n%s", logs)
	}
}
