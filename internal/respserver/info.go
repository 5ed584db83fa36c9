package respserver

import (
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
)

// RedisCompatVersion is the Redis version whose protocol and commands sluice
// answers like. Client libraries read redis_version to pick features.
const RedisCompatVersion = "7.2.0"

var infoSections = []string{"server", "clients", "memory", "stats", "persistence", "storage", "policy", "replication", "cluster", "keyspace"}

// cmdInfo implements INFO [section ...] in Redis' "# Section" and
// "key:value" format. Unknown sections are left out, as in Redis.
func cmdInfo(s *Server, c *client, args [][]byte) {
	want := map[string]bool{}
	for _, a := range args[1:] {
		sec := strings.ToLower(string(a))
		switch sec {
		case "all", "everything", "default":
			for _, n := range infoSections {
				want[n] = true
			}
		default:
			want[sec] = true
		}
	}
	if len(args) == 1 {
		for _, n := range infoSections {
			want[n] = true
		}
	}
	var b strings.Builder
	for _, sec := range infoSections {
		if !want[sec] {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("\r\n")
		}
		s.writeInfo(&b, sec)
	}
	c.Out = resp.AppendBulkString(c.Out, b.String())
}

func (s *Server) writeInfo(b *strings.Builder, section string) {
	kv := func(k string, v string) {
		b.WriteString(k)
		b.WriteByte(':')
		b.WriteString(v)
		b.WriteString("\r\n")
	}
	i64 := func(n int64) string { return strconv.FormatInt(n, 10) }
	switch section {
	case "server":
		b.WriteString("# Server\r\n")
		up := time.Since(s.start)
		port := ""
		if a := s.host.Addr(); a != nil {
			_, port, _ = splitHostPort(a.String())
		}
		exe, _ := os.Executable()
		kv("redis_version", RedisCompatVersion)
		// Redis gives its own commit here; sluice's is the one that
		// identifies the build.
		sha1, dirty := gitSHA1(s.cfg.Revision)
		kv("redis_git_sha1", sha1)
		kv("redis_git_dirty", dirty)
		kv("sluice_version", s.cfg.Version)
		kv("sluice_revision", s.cfg.Revision)
		kv("redis_mode", s.helloMode())
		kv("os", runtime.GOOS+" "+runtime.GOARCH)
		kv("arch_bits", strconv.Itoa(strconv.IntSize))
		kv("go_version", runtime.Version())
		kv("process_id", strconv.Itoa(os.Getpid()))
		kv("run_id", s.runID)
		kv("tcp_port", port)
		kv("server_time_usec", i64(s.clock().UnixMicro()))
		kv("uptime_in_seconds", i64(int64(up/time.Second)))
		kv("uptime_in_days", i64(int64(up/(24*time.Hour))))
		kv("executable", exe)
		// 0 when the server was not given the open-file limit.
		kv("fd_limit", strconv.Itoa(s.cfg.FDLimit))
		kv("fd_reserved", strconv.Itoa(s.cfg.FDReserved))
		kv("store_max_open_files", strconv.Itoa(s.cfg.StoreMaxOpenFiles))
		kv("memory_limit", i64(s.cfg.MemoryLimit))
		kv("memory_limit_source", s.cfg.MemoryLimitSource)
	case "clients":
		b.WriteString("# Clients\r\n")
		s.mu.Lock()
		n := len(s.mu.clients)
		s.mu.Unlock()
		kv("connected_clients", strconv.Itoa(n))
		kv("blocked_clients", "0")
		kv("maxclients", strconv.Itoa(s.cfg.MaxClients))
		kv("maxclients_requested", strconv.Itoa(s.cfg.MaxClientsRequested))
		kv("admitted_connections", i64(s.gate.Open()))
		kv("max_auth_failures", strconv.Itoa(s.cfg.MaxAuthFailures.N()))
		kv("max_args", strconv.Itoa(s.cfg.MaxArgs))
		kv("max_bulk", i64(s.cfg.MaxBulk))
		kv("max_key_size", strconv.Itoa(s.cfg.MaxKeySize))
		kv("max_inline", strconv.Itoa(s.cfg.MaxInline))
		kv("max_query_buffer", strconv.Itoa(s.cfg.MaxQueryBuffer))
		kv("max_reply_buffer", strconv.Itoa(s.cfg.MaxReplyBuffer))
		kv("mem_clients_normal", i64(s.stats.ClientMem.Load()))
		kv("mem_clients_peak", i64(s.stats.ClientMemPeak.Load()))
		kv("maxmemory_clients", i64(s.cfg.MaxMemoryClients.N()))
	case "memory":
		b.WriteString("# Memory\r\n")
		s.writeMemoryInfo(kv)
	case "stats":
		b.WriteString("# Stats\r\n")
		kv("total_connections_received", i64(s.stats.ConnsTotal.Load()))
		kv("total_commands_processed", i64(s.stats.Commands.Load()))
		kv("rejected_connections", i64(s.stats.RejectedMax.Load()))
		kv("rejected_connections_protected_mode", i64(s.stats.RejectedDenied.Load()))
		kv("acl_access_denied_auth", i64(s.stats.AuthFailures.Load()))
		kv("auth_closed_connections", i64(s.stats.AuthClosed.Load()))
		kv("total_net_input_bytes", i64(s.stats.NetIn.Load()))
		kv("total_net_output_bytes", i64(s.stats.NetOut.Load()))
		kv("total_error_replies", i64(s.stats.ErrorReplies.Load()))
		kv("protocol_errors", i64(s.stats.ProtocolErrors.Load()))
		kv("cross_protocol_closed", i64(s.stats.CrossProtocol.Load()))
		kv("evicted_clients", i64(s.stats.EvictedClients.Load()))
		kv("client_reply_overflows", i64(s.stats.ReplyOverflows.Load()))
		kv("rl_allowed", i64(s.stats.RlAllowed.Load()))
		kv("rl_denied", i64(s.stats.RlDenied.Load()))
		kv("store_errors", i64(s.stats.StoreErrors.Load()))
		kv("handler_panics", i64(s.stats.Panics.Load()))
	case "persistence":
		st := s.store.Stats()
		b.WriteString("# Persistence\r\n")
		kv("loading", "0")
		kv("fsync_policy", st.Mode.String())
		kv("data_dir", s.store.Dir())
		kv("disk_usage_bytes", strconv.FormatUint(st.DiskBytes, 10))
		kv("commit_rounds", i64(st.Rounds))
		kv("keys_written", i64(st.KeysWritten))
		kv("commit_queue_keys", strconv.Itoa(st.Queued))
		kv("unwritten_keys", i64(st.Dirty))
		kv("cache_entries", i64(st.CacheEntries))
		kv("cache_hits", i64(st.CacheHits))
		kv("cache_misses", i64(st.CacheMisses))
		kv("key_filter_skips", i64(st.FilterSkips))
		kv("applied_round", strconv.FormatUint(st.AppliedRound, 10))
		kv("synced_round", strconv.FormatUint(st.SyncedRound, 10))
		kv("fsyncs", i64(st.Fsyncs))
		avg := int64(0)
		if st.Fsyncs > 0 {
			avg = int64(st.FsyncTime/time.Microsecond) / st.Fsyncs
		}
		kv("fsync_avg_usec", i64(avg))
		last := int64(-1)
		if !st.LastSync.IsZero() {
			last = st.LastSync.Unix()
		}
		kv("last_fsync_time", i64(last))
		kv("store_read_errors", i64(st.ReadErrors))
		kv("store_write_errors", i64(st.WriteErrors))
		status, since := "ok", int64(-1)
		switch {
		case st.Failed != nil:
			status = "failed"
		case st.Unavailable != nil:
			status, since = "unavailable", st.UnavailableSince.Unix()
		}
		kv("store_status", status)
		kv("store_unavailable_since", i64(since))
		kv("store_unavailable_times", i64(st.UnavailableTimes))
		kv("store_write_retries", i64(st.WriteRetries))
		policy := "deny"
		if s.cfg.AllowOnStoreError {
			policy = "allow"
		}
		kv("on_store_error", policy)
		kv("store_error_allowed", i64(s.eng.StoreAllowed()))
		kv("last_checkpoint_time", i64(s.stats.LastSave.Load()))
	case "storage":
		st := s.store.Stats()
		sw := &s.sweep
		b.WriteString("# Storage\r\n")
		kv("records", i64(st.Records))
		for _, k := range keyspace.Kinds() {
			kv("records_"+k.Name, i64(st.RecordsByClass[k.Class]))
		}
		kv("buckets", i64(st.Records)) // its name predates the other kinds
		kv("table_bytes", strconv.FormatUint(st.TableBytes, 10))
		kv("wal_bytes", strconv.FormatUint(st.WALBytes, 10))
		kv("memtable_bytes", strconv.FormatUint(st.MemTableBytes, 10))
		kv("block_cache_bytes", i64(st.BlockCacheBytes))
		kv("block_cache_hits", i64(st.BlockCacheHits))
		kv("block_cache_misses", i64(st.BlockCacheMisses))
		kv("block_cache_hit_rate", ratio(st.BlockCacheHits, st.BlockCacheMisses))
		kv("bucket_cache_hit_rate", ratio(st.CacheHits, st.CacheMisses))
		kv("bucket_cache_bytes", i64(st.CacheBytes))
		kv("bucket_cache_memory", i64(st.CacheMemory))
		kv("compaction_debt_bytes", strconv.FormatUint(st.CompactionDebt, 10))
		kv("compactions", i64(st.Compactions))
		interval, rate := int64(-1), -1 // -1: off
		if !s.cfg.SweepInterval.Off() {
			interval = int64(s.cfg.SweepInterval.N() / time.Second)
		}
		if !s.cfg.SweepRate.Off() {
			rate = s.cfg.SweepRate.N()
		}
		kv("sweep_interval_sec", i64(interval))
		kv("sweep_rate", strconv.Itoa(rate))
		kv("sweep_in_progress", boolInt(sw.running.Load()))
		last := int64(-1)
		if ms := sw.lastAt.Load(); ms != 0 {
			last = ms / 1000
		}
		kv("last_sweep_time", i64(last))
		kv("last_sweep_scanned", i64(sw.lastScanned.Load()))
		kv("last_sweep_deleted", i64(sw.lastDeleted.Load()))
		kv("last_sweep_duration_ms", i64(sw.lastTook.Load()/int64(time.Millisecond)))
		kv("sweep_scanned_total", i64(st.SweepScanned))
		kv("sweep_deleted_total", i64(st.SweepDeleted))
	case "policy":
		b.WriteString("# Policy\r\n")
		s.policyInfo(kv)
		s.host.PolicyInfo(kv)
	case "replication":
		// Redis's role line, which tools read; a node of a cluster with
		// replicated shards adds its replicas, one line per shard.
		b.WriteString("# Replication\r\n")
		kv("role", "master")
		kv("connected_slaves", "0")
		s.clus.ReplicationInfo(kv)
	case "cluster":
		s.writeClusterInfo(b)
	case "keyspace":
		b.WriteString("# Keyspace\r\n")
		// As in Redis, an empty database is not listed.
		if n := s.store.Records(); n > 0 {
			kv("db0", "keys="+i64(n)+",expires=0,avg_ttl=0")
			byClass := s.store.RecordsByClass()
			for _, k := range keyspace.Kinds() {
				kv("keys_"+k.Name, i64(byClass[k.Class]))
			}
		}
	}
}

// ratio formats hits/(hits+misses) with four decimals; 0 when both are 0.
func ratio(hits, misses int64) string {
	if hits+misses == 0 {
		return "0"
	}
	return strconv.FormatFloat(float64(hits)/float64(hits+misses), 'f', 4, 64)
}

func boolInt(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func splitHostPort(addr string) (string, string, error) { return net.SplitHostPort(addr) }

// gitSHA1 gives a revision as Redis gives its commit in redis_git_sha1 and
// redis_git_dirty: the first 8 hex digits, "00000000" when unknown, and
// "1" for a build with uncommitted changes.
func gitSHA1(revision string) (sha1, dirty string) {
	rev, modified := strings.CutSuffix(revision, "-dirty")
	sha1 = "00000000"
	if len(rev) >= 8 && strings.Trim(rev[:8], "0123456789abcdef") == "" {
		sha1 = rev[:8]
	}
	return sha1, boolInt(modified)
}
