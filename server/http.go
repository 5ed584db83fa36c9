package server

import (
	"net"
	"net/http"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/httpport"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
)

// httpState is the HTTP side: the listeners' shared http.Server setup
// (package httpport), the HTTP port's listener, its backups, and the
// Prometheus metrics.
type httpState struct {
	port   *httpport.Port
	served httpport.Listener
	backup httpport.Backup
	reg    *prometheus.Registry
}

// BackupTrailer is the HTTP trailer GET /backup sets once the archive is
// complete, to the number of files in it: a client that reads the body to
// its end without it has a truncated archive.
const BackupTrailer = httpport.BackupTrailer

// initHTTP sets up what every HTTP listener shares; New calls it.
func (s *Server) initHTTP() {
	o := httpport.Options{
		Logger:           s.log,
		Host:             (*frontHost)(s),
		Gate:             &s.adm.Gate,
		Closing:          &s.closing,
		MaxHeaderBytes:   s.cfg.HTTPMaxHeaderBytes,
		MaxMemoryClients: s.cfg.MaxMemoryClients.N(),
		Evicted:          &s.stats.EvictedClients,
	}
	if s.tls != nil {
		o.TLS = s.tls.httpConfig()
	}
	s.http.port = httpport.New(o)
	s.http.backup = httpport.Backup{Store: s.store, Dir: s.cfg.BackupDir, Logger: s.log, Host: (*frontHost)(s)}
}

func (s *Server) initMetrics() {
	h := &s.http
	h.reg = prometheus.NewRegistry()
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "Always 1; the labels give the version of sluice, the VCS revision it was built from (empty when unknown) and the version of Go.",
	}, []string{"version", "revision", "goversion"})
	build.WithLabelValues(s.cfg.Version, s.cfg.Revision, runtime.Version()).Set(1)
	h.reg.MustRegister(
		s.resp.BatchSeconds,
		s.divvy.srv.Seconds,
		s.check.h.Seconds,
		build,
		(*serverCollector)(s),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	if s.cfg.RLS.Dir != "" {
		h.reg.MustRegister(s.rls)
	}
}

// ServeHTTP serves /metrics, /healthz, /readyz and /backup on ln until
// Close, over TLS when the server has TLS. Client certificates are checked
// when given but not required, so that probes and scrapers without one
// still work; /backup requires one when RESP does.
func (s *Server) ServeHTTP(ln net.Listener) error {
	h := &s.http
	srv := h.port.NewServer(h.port.Handler(httpport.Routes{
		Metrics: promhttp.HandlerFor(h.reg, promhttp.HandlerOpts{ErrorLog: nil}),
		Backup:  &h.backup,
		Policy:  s.policyHTTP(),
	}))
	if !h.port.Start(&h.served, srv) {
		return net.ErrClosed
	}
	s.log.Info("serving HTTP", "addr", ln.Addr().String(), "tls", s.tls != nil)
	return h.port.Serve(&h.served, ln, "http", s.adm.takeHTTP)
}

// closeHTTP stops the HTTP side; Close calls it last, so that /readyz
// answers 503 while connections drain.
func (s *Server) closeHTTP() { s.http.served.Stop() }

// notReady says why the server should get no traffic, or "" when it should.
func (s *Server) notReady() string {
	switch {
	case s.closing.Load():
		return "shutting down"
	case s.store.Failed() != nil:
		return "store failed: " + s.store.Failed().Error()
	case s.store.Unavailable() != nil:
		return "store unavailable: " + s.store.Unavailable().Error()
	}
	return ""
}

// serverCollector turns the server's and the store's counters into
// metrics at scrape time, so that commands only bump plain counters.
type serverCollector Server

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
func (sc *serverCollector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(sc, ch)
}

// Collect implements prometheus.Collector.
func (sc *serverCollector) Collect(ch chan<- prometheus.Metric) {
	s := (*Server)(sc)
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	s.resp.EachCommand(func(name string, calls, errs, allowed, denied int64) {
		if calls == 0 {
			return
		}
		counter(descCommands, calls-errs-allowed-denied, name, "ok")
		counter(descCommands, errs, name, "error")
		if takesTokens(name) {
			counter(descCommands, allowed, name, "allowed")
			counter(descCommands, denied, name, "denied")
		}
	})
	st := &s.stats
	counter(descUnknown, st.UnknownCommands.Load())
	gauge(descConns, float64(s.resp.Clients()))
	counter(descConnsTotal, st.ConnsTotal.Load())
	counter(descRejected, st.RejectedMax.Load(), "maxclients")
	counter(descRejected, st.RejectedDenied.Load(), "protected_mode")
	counter(descIdleClosed, st.IdleClosed.Load())
	counter(descOverflows, st.ReplyOverflows.Load())
	counter(descEvicted, st.EvictedClients.Load())
	gauge(descClientMem, float64(s.stats.ClientMem.Load()))
	counter(descAuthFail, st.AuthFailures.Load())
	counter(descAuthClosed, st.AuthClosed.Load())
	gauge(descMaxClients, float64(s.cfg.MaxClients))
	gauge(descAdmitted, float64(s.adm.Open()))
	counter(descProtoErrors, st.ProtocolErrors.Load())
	counter(descCrossProto, st.CrossProtocol.Load())
	counter(descNetIn, st.NetIn.Load())
	counter(descNetOut, st.NetOut.Load())
	counter(descStoreErrors, st.StoreErrors.Load())
	counter(descStoreAllow, s.eng.StoreAllowed())
	counter(descPanics, st.Panics.Load())

	ss := s.store.Stats()
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
	sw := s.resp.Sweep()
	gauge(descSweepRunning, b2f(sw.Running))
	gauge(descSweepLast, float64(sw.LastAt)/1000)
	gauge(descSweepDuration, sw.LastTook.Seconds())
	gauge(descCheckpoint, float64(s.stats.LastSave.Load()))

	ps := &s.pol
	for _, hc := range ps.LabelCounts() {
		counter(descDivvyHits, hc.Accepted.Load(), "accepted", hc.Label)
		counter(descDivvyHits, hc.Rejected.Load(), "rejected", hc.Label)
		counter(descDivvyHits, hc.CanaryAccepted.Load(), "canary-accepted", hc.Label)
		counter(descDivvyHits, hc.CanaryRejected.Load(), "canary-rejected", hc.Label)
		counter(descDivvyHits, hc.Shadowed.Load(), "shadowed", hc.Label)
	}
	s.collectDials(ch)
	s.collectReplication(ch)
	counter(descDivvyErrors, s.divvy.srv.ErrUnknownCommand.Load(), policy.CodeUnknownCommand)
	counter(descDivvyErrors, s.divvy.srv.ErrUnknown.Load(), policy.CodeUnknown)
	gauge(descDivvyConns, float64(s.divvy.srv.Open.Load()))
	counter(descDivvyAccepted, s.divvy.srv.Total.Load())
	rules, loaded := 0.0, 0.0
	if lp := ps.Current(); lp != nil {
		rules, loaded = float64(len(lp.Counts)), float64(lp.At.UnixMilli())/1000
	}
	gauge(descPolicyRules, rules)
	gauge(descPolicyLoaded, loaded)
	s.check.h.Collect(ch)
	counter(descPolicyReloads, ps.Reloads.Load(), "ok")
	counter(descPolicyReloads, ps.ReloadFailures.Load(), "failed")
}

// takesTokens reports whether a command decides allowed or denied.
func takesTokens(name string) bool {
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

// BackupAllowed implements httpport.BackupHost: it applies the RESP rules to GET /backup, which hands out
// every limit's state: with a password, HTTP basic authentication as user
// default (or no user name) with it; with --tls-ca, a client certificate
// from that CA (which the HTTP port otherwise does not require); with
// neither, protected mode admits loopback clients only. It returns 0 when
// the request may proceed.
func (h *frontHost) BackupAllowed(r *http.Request) (int, string) {
	s := (*Server)(h)
	if s.clientCertsRequired() && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
		return http.StatusForbidden, "a client certificate signed by --tls-ca is required"
	}
	if s.cfg.Password != "" {
		user, pass, ok := r.BasicAuth()
		if user == "" {
			user = "default"
		}
		if !ok || !s.resp.CheckAuth([]byte(user), []byte(pass)) {
			s.stats.AuthFailures.Add(1)
			// Debug, not warn: every request is a new attempt, and a guesser
			// must not fill the log; sluice_auth_failures_total counts them.
			s.log.Debug("backup over HTTP: authentication failed", "remote", r.RemoteAddr, "gave_credentials", ok)
			return http.StatusUnauthorized, "WRONGPASS invalid username-password pair or user is disabled (use HTTP basic authentication with the password)"
		}
		return 0, ""
	}
	if s.protected() {
		if addr, err := net.ResolveTCPAddr("tcp", r.RemoteAddr); err != nil || !admit.IsLoopback(addr) {
			return http.StatusForbidden, deniedMessage
		}
	}
	return 0, ""
}

// CheckpointFailed implements httpport.BackupHost.
func (h *frontHost) CheckpointFailed(err error) string {
	s := (*Server)(h)
	return s.errorText(s.resp.MaintenanceErr("checkpoint", err))
}

// Checkpointed implements httpport.BackupHost.
func (h *frontHost) Checkpointed() { h.stats.LastSave.Store(time.Now().Unix()) }
