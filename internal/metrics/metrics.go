// Package metrics is /metrics' Prometheus registry: the server's, the
// store's and every front end's counters, turned into metrics at scrape
// time (New). What it collects it is given in Sources; it changes
// nothing. A registry is safe for concurrent use.
package metrics

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// Sources is what the metrics are read from, each at every scrape.
type Sources struct {
	// Version and Revision label sluice_build_info.
	Version, Revision string
	// MaxClients is --maxclients in effect (sluice_maxclients).
	MaxClients int

	RESP   *respserver.Server
	Stats  *respserver.Stats // the counters every front end adds to
	Gate   *admit.Gate       // connections admitted
	Engine *engine.Engine
	Store  *storage.Store
	Rules  *rules.File
	Policy *policycmd.Commands // the dials' changes
	// Cluster is the cluster node, for the metrics of replicated shards
	// and of forwarded hits; nil: standalone.
	Cluster *clusternode.Node
	Divvy   *divvy.Server
	Check   *check.Handler
	// RLS is Envoy's rate limit service, whose sluice_rls_* metrics are
	// registered; nil when it is off.
	RLS *envoy.Server
}

// New returns the registry /metrics serves: the metrics of src, the Go
// runtime's and the process's.
func New(src Sources) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "Always 1; the labels give the version of sluice, the VCS revision it was built from (empty when unknown) and the version of Go.",
	}, []string{"version", "revision", "goversion"})
	build.WithLabelValues(src.Version, src.Revision, runtime.Version()).Set(1)
	c := collector(src)
	reg.MustRegister(
		src.RESP.BatchSeconds,
		src.Divvy.Seconds,
		src.Check.Seconds,
		build,
		&c,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	if src.RLS != nil {
		reg.MustRegister(src.RLS)
	}
	return reg
}

// collector turns the server's and the store's counters into metrics at
// scrape time, so that commands only bump plain counters.
type collector Sources

var (
	descCommands = prometheus.NewDesc("sluice_commands_total",
		"Commands executed, by command and result: allowed or denied for limit commands that take tokens, ok for the others, error for error replies.",
		[]string{"command", "result"}, nil)
	descUnknown     = prometheus.NewDesc("sluice_unknown_commands_total", "Commands not known to sluice.", nil, nil)
	descConns       = prometheus.NewDesc("sluice_connections", "Connections open now.", nil, nil)
	descConnsTotal  = prometheus.NewDesc("sluice_connections_total", "Connections accepted and served.", nil, nil)
	descRejected    = prometheus.NewDesc("sluice_rejected_connections_total", "Connections refused, by reason: maxclients or protected_mode.", []string{"reason"}, nil)
	descIdleClosed  = prometheus.NewDesc("sluice_idle_closed_connections_total", "Connections closed by --timeout.", nil, nil)
	descOverflows   = prometheus.NewDesc("sluice_reply_buffer_overflows_total", "Connections closed because a pipeline's replies exceeded --max-reply-buffer.", nil, nil)
	descEvicted     = prometheus.NewDesc("sluice_evicted_clients_total", "Connections closed because the buffers of all clients exceeded --maxmemory-clients.", nil, nil)
	descClientMem   = prometheus.NewDesc("sluice_client_buffers_bytes", "Bytes of all RESP clients' query and reply buffers, rate limit service calls in flight and HTTP request headers being read, bounded by --maxmemory-clients.", nil, nil)
	descAuthFail    = prometheus.NewDesc("sluice_auth_failures_total", "AUTH and HELLO AUTH attempts, and GET /backup requests, with a wrong user or password or none.", nil, nil)
	descAuthClosed  = prometheus.NewDesc("sluice_auth_closed_connections_total", "Connections closed after --max-auth-failures failed AUTH or HELLO AUTH attempts.", nil, nil)
	descMaxClients  = prometheus.NewDesc("sluice_maxclients", "Most connections served at once, RESP, line protocol and HTTP together: --maxclients, lowered to what the open-file limit allows.", nil, nil)
	descAdmitted    = prometheus.NewDesc("sluice_admitted_connections", "Connections counted against sluice_maxclients now: RESP, line protocol and HTTP.", nil, nil)
	descProtoErrors = prometheus.NewDesc("sluice_protocol_errors_total", "Connections closed for malformed or oversized RESP.", nil, nil)
	descCrossProto  = prometheus.NewDesc("sluice_cross_protocol_closed_total", "Connections closed for sending POST or Host: as a command, as an HTTP request does (cross-protocol scripting).", nil, nil)
	descNetIn       = prometheus.NewDesc("sluice_net_input_bytes_total", "Bytes read from clients.", nil, nil)
	descNetOut      = prometheus.NewDesc("sluice_net_output_bytes_total", "Bytes written to clients.", nil, nil)
	descStoreErrors = prometheus.NewDesc("sluice_store_error_replies_total", "Commands answered with a store error.", nil, nil)
	descStoreAllow  = prometheus.NewDesc("sluice_store_error_allowed_total", "Answers that stood despite a store error (--on-store-error allow), one per operation that wrote.", nil, nil)
	descPanics      = prometheus.NewDesc("sluice_handler_panics_total", "Commands that panicked (each closes its connection).", nil, nil)

	descFsyncs        = prometheus.NewDesc("sluice_fsyncs_total", "fsyncs of the store's log.", nil, nil)
	descFsyncSeconds  = prometheus.NewDesc("sluice_fsync_seconds_total", "Time spent in fsyncs of the store's log.", nil, nil)
	descLastFsync     = prometheus.NewDesc("sluice_last_fsync_timestamp_seconds", "Unix time of the last fsync of the log; everything written before it survives a crash.", nil, nil)
	descCommitRounds  = prometheus.NewDesc("sluice_commit_rounds_total", "Batches the committer wrote to the store.", nil, nil)
	descKeysWritten   = prometheus.NewDesc("sluice_keys_written_total", "Bucket states the committer wrote to the store.", nil, nil)
	descQueued        = prometheus.NewDesc("sluice_commit_queue_keys", "Keys waiting for the committer.", nil, nil)
	descBuckets       = prometheus.NewDesc("sluice_buckets", "Records stored, of every kind, as DBSIZE (counted at start, kept up to date).", nil, nil)
	descRecords       = prometheus.NewDesc("sluice_records", "Records stored, by limiter kind (counted at start, kept up to date).", []string{"kind"}, nil)
	descUnavailable   = prometheus.NewDesc("sluice_store_unavailable", "1 while writes to the data directory fail and changes are refused.", nil, nil)
	descFailed        = prometheus.NewDesc("sluice_store_failed", "1 once a write failed for good; a restart is needed.", nil, nil)
	descWriteRetries  = prometheus.NewDesc("sluice_store_write_retries_total", "Failed writes to the data directory that were retried.", nil, nil)
	descReadErrors    = prometheus.NewDesc("sluice_store_read_errors_total", "Failed reads of the store.", nil, nil)
	descCacheEntries  = prometheus.NewDesc("sluice_bucket_cache_entries", "Bucket states held in memory.", nil, nil)
	descCacheLookups  = prometheus.NewDesc("sluice_bucket_cache_lookups_total", "Bucket lookups, by result: hit (in memory) or miss.", []string{"result"}, nil)
	descFilterSkips   = prometheus.NewDesc("sluice_key_filter_skips_total", "Misses the key filter answered as new buckets without a disk read.", nil, nil)
	descDisk          = prometheus.NewDesc("sluice_store_disk_bytes", "Bytes of every file of the store.", nil, nil)
	descTables        = prometheus.NewDesc("sluice_store_table_bytes", "Bytes of the store's sorted tables.", nil, nil)
	descWAL           = prometheus.NewDesc("sluice_store_wal_bytes", "Bytes of the store's write-ahead log.", nil, nil)
	descMemtable      = prometheus.NewDesc("sluice_store_memtable_bytes", "Bytes of memtables.", nil, nil)
	descBlockCache    = prometheus.NewDesc("sluice_store_block_cache_bytes", "Bytes held by the block cache.", nil, nil)
	descBlockLookups  = prometheus.NewDesc("sluice_store_block_cache_lookups_total", "Block cache lookups, by result: hit or miss.", []string{"result"}, nil)
	descCompactDebt   = prometheus.NewDesc("sluice_store_compaction_debt_bytes", "Estimated bytes compactions still have to rewrite.", nil, nil)
	descCompactions   = prometheus.NewDesc("sluice_store_compactions_total", "Compactions done.", nil, nil)
	descSweepScanned  = prometheus.NewDesc("sluice_sweep_scanned_total", "Buckets the idle sweep examined.", nil, nil)
	descSweepDeleted  = prometheus.NewDesc("sluice_sweep_deleted_total", "Idle buckets the sweep deleted.", nil, nil)
	descSweepRunning  = prometheus.NewDesc("sluice_sweep_running", "1 while a sweep pass runs.", nil, nil)
	descSweepLast     = prometheus.NewDesc("sluice_sweep_last_end_timestamp_seconds", "Unix time the last sweep pass ended; 0 before the first.", nil, nil)
	descSweepDuration = prometheus.NewDesc("sluice_sweep_last_duration_seconds", "Duration of the last sweep pass.", nil, nil)
	descDivvyHits     = prometheus.NewDesc("divvy_hits_total", "Hits by outcome (accepted, rejected, canary-accepted, canary-rejected; shadowed: those of rejected and canary-rejected that shadow mode let through) and the label of the rule that gave it, over RESP, the line protocol and /check.", []string{"status", "rule_label"}, nil)
	descDivvyErrors   = prometheus.NewDesc("divvy_errors_total", "ERR replies of the line protocol, by code; each closes its connection.", []string{"code"}, nil)
	descDivvyConns    = prometheus.NewDesc("divvy_tcp_connections_total", "Line-protocol connections open now (a gauge, named as divvy named it).", nil, nil)
	descDivvyAccepted = prometheus.NewDesc("sluice_divvy_connections_total", "Line-protocol connections accepted.", nil, nil)
	descPolicyRules   = prometheus.NewDesc("sluice_policy_rules", "Rules of the policy in use; 0 without one.", nil, nil)
	descPolicyLoaded  = prometheus.NewDesc("sluice_policy_loaded_timestamp_seconds", "Unix time the policy in use was loaded; 0 without one.", nil, nil)
	descPolicyReloads = prometheus.NewDesc("sluice_policy_reloads_total", "Policy reloads, by result: ok, or failed (the file was bad and the rules in use were kept).", []string{"result"}, nil)
	descCheckpoint    = prometheus.NewDesc("sluice_last_checkpoint_timestamp_seconds", "Unix time of the last CHECKPOINT (the start time before the first).", nil, nil)
)

// Describe implements prometheus.Collector.
func (sc *collector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(sc, ch)
}

// Collect implements prometheus.Collector.
func (sc *collector) Collect(ch chan<- prometheus.Metric) {
	s := (*Sources)(sc)
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	s.RESP.EachCommand(func(name string, calls, errs, allowed, denied int64) {
		if calls == 0 {
			return
		}
		counter(descCommands, calls-errs-allowed-denied, name, "ok")
		counter(descCommands, errs, name, "error")
		if TakesTokens(name) {
			counter(descCommands, allowed, name, "allowed")
			counter(descCommands, denied, name, "denied")
		}
	})
	st := s.Stats
	counter(descUnknown, st.UnknownCommands.Load())
	gauge(descConns, float64(s.RESP.Clients()))
	counter(descConnsTotal, st.ConnsTotal.Load())
	counter(descRejected, st.RejectedMax.Load(), "maxclients")
	counter(descRejected, st.RejectedDenied.Load(), "protected_mode")
	counter(descIdleClosed, st.IdleClosed.Load())
	counter(descOverflows, st.ReplyOverflows.Load())
	counter(descEvicted, st.EvictedClients.Load())
	gauge(descClientMem, float64(st.ClientMem.Load()))
	counter(descAuthFail, st.AuthFailures.Load())
	counter(descAuthClosed, st.AuthClosed.Load())
	gauge(descMaxClients, float64(s.MaxClients))
	gauge(descAdmitted, float64(s.Gate.Open()))
	counter(descProtoErrors, st.ProtocolErrors.Load())
	counter(descCrossProto, st.CrossProtocol.Load())
	counter(descNetIn, st.NetIn.Load())
	counter(descNetOut, st.NetOut.Load())
	counter(descStoreErrors, st.StoreErrors.Load())
	counter(descStoreAllow, s.Engine.StoreAllowed())
	counter(descPanics, st.Panics.Load())

	ss := s.Store.Stats()
	counter(descFsyncs, ss.Fsyncs)
	ch <- prometheus.MustNewConstMetric(descFsyncSeconds, prometheus.CounterValue, ss.FsyncTime.Seconds())
	last := 0.0
	if !ss.LastSync.IsZero() {
		last = float64(ss.LastSync.UnixMilli()) / 1000
	}
	gauge(descLastFsync, last)
	counter(descCommitRounds, ss.Rounds)
	counter(descKeysWritten, ss.KeysWritten)
	gauge(descQueued, float64(ss.Queued))
	gauge(descBuckets, float64(ss.Records))
	for _, k := range keyspace.Kinds() {
		gauge(descRecords, float64(ss.RecordsByClass[k.Class]), k.Name)
	}
	gauge(descUnavailable, b2f(ss.Unavailable != nil))
	gauge(descFailed, b2f(ss.Failed != nil))
	counter(descWriteRetries, ss.WriteRetries)
	counter(descReadErrors, ss.ReadErrors)
	gauge(descCacheEntries, float64(ss.CacheEntries))
	counter(descCacheLookups, ss.CacheHits, "hit")
	counter(descCacheLookups, ss.CacheMisses, "miss")
	counter(descFilterSkips, ss.FilterSkips)
	gauge(descDisk, float64(ss.DiskBytes))
	gauge(descTables, float64(ss.TableBytes))
	gauge(descWAL, float64(ss.WALBytes))
	gauge(descMemtable, float64(ss.MemTableBytes))
	gauge(descBlockCache, float64(ss.BlockCacheBytes))
	counter(descBlockLookups, ss.BlockCacheHits, "hit")
	counter(descBlockLookups, ss.BlockCacheMisses, "miss")
	gauge(descCompactDebt, float64(ss.CompactionDebt))
	counter(descCompactions, ss.Compactions)
	counter(descSweepScanned, ss.SweepScanned)
	counter(descSweepDeleted, ss.SweepDeleted)
	sw := s.RESP.Sweep()
	gauge(descSweepRunning, b2f(sw.Running))
	gauge(descSweepLast, float64(sw.LastAt)/1000)
	gauge(descSweepDuration, sw.LastTook.Seconds())
	gauge(descCheckpoint, float64(st.LastSave.Load()))

	ps := s.Rules
	for _, hc := range ps.LabelCounts() {
		counter(descDivvyHits, hc.Accepted.Load(), "accepted", hc.Label)
		counter(descDivvyHits, hc.Rejected.Load(), "rejected", hc.Label)
		counter(descDivvyHits, hc.CanaryAccepted.Load(), "canary-accepted", hc.Label)
		counter(descDivvyHits, hc.CanaryRejected.Load(), "canary-rejected", hc.Label)
		counter(descDivvyHits, hc.Shadowed.Load(), "shadowed", hc.Label)
	}
	s.collectDials(ch)
	s.collectReplication(ch)
	s.collectForwards(ch)
	counter(descDivvyErrors, s.Divvy.ErrUnknownCommand.Load(), policy.CodeUnknownCommand)
	counter(descDivvyErrors, s.Divvy.ErrUnknown.Load(), policy.CodeUnknown)
	gauge(descDivvyConns, float64(s.Divvy.Open.Load()))
	counter(descDivvyAccepted, s.Divvy.Total.Load())
	rules, loaded := 0.0, 0.0
	if lp := ps.Current(); lp != nil {
		rules, loaded = float64(len(lp.Counts)), float64(lp.At.UnixMilli())/1000
	}
	gauge(descPolicyRules, rules)
	gauge(descPolicyLoaded, loaded)
	s.Check.Collect(ch)
	counter(descPolicyReloads, ps.Reloads.Load(), "ok")
	counter(descPolicyReloads, ps.ReloadFailures.Load(), "failed")
}

// TakesTokens reports whether a command decides allowed or denied: its
// sluice_commands_total has allowed and denied series.
func TakesTokens(name string) bool {
	switch name {
	case "rl.reduce", "rl.preduce", "rl.sessionize", "rl.psessionize", "hit",
		"cl.throttle", "cl.pthrottle", "fw.incr", "fw.pincr", "roll.limit":
		return true
	}
	return false
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
