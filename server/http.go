package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/keyspace"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/policy"
)

// httpState is the HTTP side: Prometheus metrics and health endpoints.
type httpState struct {
	reg          *prometheus.Registry
	batchSeconds prometheus.Histogram

	served served
}

// served is the http.Server of one HTTP listener (probes and metrics, or
// /check): set once by its Serve method, and drained by Close as every
// front end's listener is (admit.Listener.Drain), within httpGrace:
// net/http's graceful shutdown, then a close of the connections left.
type served struct {
	mu      sync.Mutex
	srv     *http.Server
	ln      *admit.Listener // once srv serves on it
	stopped bool
	done    chan struct{} // closed once srv is shut down or closed
	end     sync.Once
}

// httpGrace is how long an HTTP listener's requests may take to finish
// once Close stops it.
const httpGrace = time.Second

// start records srv as the one served. It reports false, and srv must not
// be served, when the server is closing or one was started already.
func (v *served) start(srv *http.Server, closing *atomic.Bool) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if closing.Load() || v.stopped || v.srv != nil {
		return false
	}
	v.srv, v.done = srv, make(chan struct{})
	return true
}

// listen records l as the listener srv serves on.
func (v *served) listen(l *admit.Listener) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.ln = l
}

// stop drains the served server and makes a later start refuse.
func (v *served) stop() {
	v.mu.Lock()
	srv, ln, already := v.srv, v.ln, v.stopped
	v.stopped = true
	v.mu.Unlock()
	switch {
	case srv == nil || already:
	case ln == nil:
		_ = srv.Close() // not serving yet: Serve returns at once
	default:
		ln.Drain(time.Now().Add(httpGrace), httpGrace/10, httpGrace)
	}
}

// Finish implements admit.Drainer: net/http's graceful shutdown, which
// closes the idle connections and lets the requests under way finish.
func (v *served) Finish() {
	go func() {
		_ = v.srv.Shutdown(context.Background())
		v.end.Do(func() { close(v.done) })
	}()
}

// Force implements admit.Drainer.
func (v *served) Force() {
	_ = v.srv.Close()
	v.end.Do(func() { close(v.done) })
}

// Wait implements admit.Drainer.
func (v *served) Wait() { <-v.done }

func (s *Server) initMetrics() {
	h := &s.http
	h.reg = prometheus.NewRegistry()
	h.batchSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sluice_pipeline_duration_seconds",
		Help: "Time to execute one pipeline of commands read together and commit its writes (observed once per pipeline, not per command).",
		// 10µs to ~1.3s: a cached reduce takes microseconds, an fsync
		// in --fsync always a millisecond or more.
		Buckets: prometheus.ExponentialBuckets(10e-6, 2, 18),
	})
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "Always 1; the labels give the version of sluice, the VCS revision it was built from (empty when unknown) and the version of Go.",
	}, []string{"version", "revision", "goversion"})
	build.WithLabelValues(s.cfg.Version, s.cfg.Revision, runtime.Version()).Set(1)
	h.reg.MustRegister(
		h.batchSeconds,
		s.divvy.srv.Seconds,
		s.check.h.Seconds,
		build,
		(*serverCollector)(s),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
}

// ServeHTTP serves /metrics, /healthz, /readyz and /backup on ln until
// Close, over TLS when the server has TLS. Client certificates are checked
// when given but not required, so that probes and scrapers without one
// still work; /backup requires one when RESP does.
func (s *Server) ServeHTTP(ln net.Listener) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.http.reg, promhttp.HandlerOpts{ErrorLog: nil}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /backup", s.serveBackup)
	mux.Handle("/v1/policy/", s.policyHTTP())
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if reason := s.notReady(); reason != "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(reason + "\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	srv := s.newHTTPServer(mux)
	if !s.http.served.start(srv, &s.closing) {
		return net.ErrClosed
	}
	s.log.Info("serving HTTP", "addr", ln.Addr().String(), "tls", s.tls != nil)
	return s.serveHTTPOn(&s.http.served, ln, "http", s.adm.takeHTTP)
}

// serveHTTPOn serves v's server on ln until Close, counting its connections
// against MaxClients with take, below TLS, so that a refusal costs no
// handshake. name names the listener in the log.
func (s *Server) serveHTTPOn(v *served, ln net.Listener, name string, take func() bool) error {
	srv := v.srv
	d := admit.Door{Name: name, Take: take, Conn: func(c *admit.Conn) net.Conn { return &httpConn{Conn: c, srv: s} }, Drain: v}
	if s.tls == nil {
		d.Full = http503 // with TLS, which runs above, a refusal is closed
	}
	l := s.adm.Listen(ln, d)
	v.listen(l)
	ln = l
	var err error
	if s.tls != nil {
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	if errors.Is(err, http.ErrServerClosed) || s.closing.Load() {
		return nil
	}
	return err
}

// httpLogWriter takes net/http's own log lines (failed TLS handshakes,
// accept errors, recovered handler panics) into the server's logger, so
// that --log-format json stays one JSON object per line. Failed handshakes
// are routine (port scanners, TCP probes on a TLS port) and go to debug,
// as protocol errors on RESP do; the rest are warnings.
type httpLogWriter struct{ log *slog.Logger }

func (w httpLogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimRight(string(p), "\n")
	level := slog.LevelWarn
	if strings.HasPrefix(msg, "http: TLS handshake error") {
		level = slog.LevelDebug
	}
	w.log.Log(context.Background(), level, msg, "component", "http")
	return len(p), nil
}

// closeHTTP stops the HTTP side; Close calls it last, so that /readyz
// answers 503 while connections drain.
func (s *Server) closeHTTP() { s.http.served.stop() }

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
	for _, cmd := range s.cmds {
		calls, errs := cmd.stat.calls.Load(), cmd.stat.errors.Load()
		allowed, denied := cmd.stat.allowed.Load(), cmd.stat.denied.Load()
		if calls == 0 {
			continue
		}
		counter(descCommands, calls-errs-allowed-denied, cmd.Name, "ok")
		counter(descCommands, errs, cmd.Name, "error")
		if takesTokens(cmd.Name) {
			counter(descCommands, allowed, cmd.Name, "allowed")
			counter(descCommands, denied, cmd.Name, "denied")
		}
	}
	st := &s.stats
	counter(descUnknown, st.unknownCommands.Load())
	s.mu.Lock()
	open := len(s.mu.clients)
	s.mu.Unlock()
	gauge(descConns, float64(open))
	counter(descConnsTotal, st.connsTotal.Load())
	counter(descRejected, st.rejectedMax.Load(), "maxclients")
	counter(descRejected, st.rejectedDenied.Load(), "protected_mode")
	counter(descIdleClosed, st.idleClosed.Load())
	counter(descOverflows, st.replyOverflows.Load())
	counter(descEvicted, st.evictedClients.Load())
	gauge(descClientMem, float64(s.clientMem.Load()))
	counter(descAuthFail, st.authFailures.Load())
	counter(descAuthClosed, st.authClosed.Load())
	gauge(descMaxClients, float64(s.cfg.MaxClients))
	gauge(descAdmitted, float64(s.adm.Open()))
	counter(descProtoErrors, st.protocolErrors.Load())
	counter(descCrossProto, st.crossProtocol.Load())
	counter(descNetIn, st.netIn.Load())
	counter(descNetOut, st.netOut.Load())
	counter(descStoreErrors, st.storeErrors.Load())
	counter(descStoreAllow, s.eng.StoreAllowed())
	counter(descPanics, st.panics.Load())

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
	sw := &s.sweep
	gauge(descSweepRunning, b2f(sw.running.Load()))
	gauge(descSweepLast, float64(sw.lastAt.Load())/1000)
	gauge(descSweepDuration, time.Duration(sw.lastTook.Load()).Seconds())
	gauge(descCheckpoint, float64(s.lastSave.Load()))

	ps := &s.pol
	for _, hc := range ps.LabelCounts() {
		counter(descDivvyHits, hc.Accepted.Load(), "accepted", hc.Label)
		counter(descDivvyHits, hc.Rejected.Load(), "rejected", hc.Label)
		counter(descDivvyHits, hc.CanaryAccepted.Load(), "canary-accepted", hc.Label)
		counter(descDivvyHits, hc.CanaryRejected.Load(), "canary-rejected", hc.Label)
		counter(descDivvyHits, hc.Shadowed.Load(), "shadowed", hc.Label)
	}
	s.collectDials(ch)
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

// newHTTPServer is an HTTP server for one of sluice's HTTP listeners, with
// their shared timeouts, logging and TLS (tlsState.httpConfig).
func (s *Server) newHTTPServer(h http.Handler) *http.Server {
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c, ok := r.Context().Value(httpConnKey{}).(*httpConn); ok {
				c.handling(true)
				defer c.handling(false)
			}
			h.ServeHTTP(w, r)
		}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tls.Conn); ok {
				c = tc.NetConn()
			}
			return context.WithValue(ctx, httpConnKey{}, c)
		},
		MaxHeaderBytes:    s.cfg.HTTPMaxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          log.New(httpLogWriter{s.log}, "", 0),
	}
	if s.tls != nil {
		srv.TLSConfig = s.tls.httpConfig()
	}
	return srv
}

// httpConnKey is the context key of a request's *httpConn.
type httpConnKey struct{}

// httpConn takes what an HTTP connection reads while a request's header is
// read from --maxmemory-clients: net/http holds a header until it is
// whole, so connections that send long headers and never end them would
// otherwise hold up to --http-max-header-bytes each until the header
// timeout. The charge is given back when the request's handler starts
// (newHTTPServer), when the next request's begins, and at close. A read
// that would pass the bound ends the connection, answered 503 when no TLS
// runs above.
type httpConn struct {
	*admit.Conn
	srv *Server
	mu  struct {
		sync.Mutex
		held    int64 // taken from clientMem
		handled bool  // a handler runs: reads are its body's
		closed  bool
		over    bool // a read passed --maxmemory-clients: the connection ends
	}
}

var http503Memory = func() []byte {
	const msg = "client memory limit reached: the clients' buffers exceed --maxmemory-clients\n"
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(msg), msg)
}()

// errClientMemory ends an HTTP connection at --maxmemory-clients.
var errClientMemory = errors.New("server: client memory limit reached")

func (c *httpConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n == 0 {
		return n, err
	}
	switch c.take(int64(n)) {
	case httpTaken:
		return n, err
	case httpOverNow:
		s := c.srv
		s.stats.evictedClients.Add(1)
		s.log.Warn("closing an HTTP connection: its request header and the buffers of all clients exceed --maxmemory-clients", "remote", c.RemoteAddr().String(), "limit", s.cfg.MaxMemoryClients.N())
		if s.tls == nil {
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write(http503Memory)
		}
	}
	// A read error net/http ends the connection on without answering (it
	// may read once more first).
	return 0, &net.OpError{Op: "read", Net: "tcp", Addr: c.RemoteAddr(), Err: errClientMemory}
}

// What take did with the bytes read.
const (
	httpTaken   = iota
	httpOverNow // they pass the bound: the connection is to be closed
	httpOver    // it passed before
)

// take counts n bytes read against --maxmemory-clients.
func (c *httpConn) take(n int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.mu.over:
		return httpOver
	case c.mu.handled || c.mu.closed:
		return httpTaken
	case !c.srv.reserveClients(n):
		c.mu.over = true
		return httpOverNow
	}
	c.mu.held += n
	return httpTaken
}

// handling marks the start (true) and end of a request's handler.
func (c *httpConn) handling(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.handled = on
	c.srv.releaseClients(c.mu.held)
	c.mu.held = 0
}

// Close implements net.Conn.
func (c *httpConn) Close() error {
	c.mu.Lock()
	c.mu.closed = true
	c.srv.releaseClients(c.mu.held)
	c.mu.held = 0
	c.mu.Unlock()
	return c.Conn.Close()
}
