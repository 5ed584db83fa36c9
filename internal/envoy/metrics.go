package envoy

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"sync/atomic"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/rls"
)

// envoyproxy/ratelimit's statistics, per limit, and the service's own
// counters, reported as Prometheus metrics.

type rlsMetricKey struct{ domain, key string }

// rlsCounts are envoyproxy/ratelimit's per-limit statistics.
type rlsCounts struct {
	domain, key                                     string
	totalHits, overLimit, nearLimit, within, shadow atomic.Int64
}

func (s *Server) countsLocked(domain, key string) *rlsCounts {
	k := rlsMetricKey{domain, key}
	c := s.mu.metrics[k]
	if c == nil {
		c = &rlsCounts{domain: domain, key: key}
		s.mu.metrics[k] = c
	}
	return c
}

// detailedCounts returns the counters of a detailed_metric key, creating
// them while there are fewer than rlsMaxDetailedKeys; nil past it.
func (s *Server) detailedCounts(domain string, key []byte) *rlsCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.mu.metrics[rlsMetricKey{domain, string(key)}]; c != nil {
		return c
	}
	if len(s.mu.metrics) >= rlsMaxDetailedKeys {
		return nil
	}
	return s.countsLocked(domain, string(key))
}

// Info is the service's state and counters, as INFO and the metrics
// report them.
type Info struct {
	Limits   int   // limits of the configuration in use
	LoadedAt int64 // unix seconds it was loaded; 0 for none
	// Calls: Requests in all, of which OverLimit and Errors; Refused at
	// --maxmemory-clients, calls and streams, not counted in Requests.
	Requests, OverLimit, Errors, Refused int64
	Reloads, ReloadFailures              int64
}

// Info returns the service's state and counters.
func (s *Server) Info() Info {
	i := Info{
		Requests: s.requests.Load(), OverLimit: s.overLimit.Load(), Errors: s.errors.Load(), Refused: s.refused.Load(),
		Reloads: s.reloads.Load(), ReloadFailures: s.reloadFailures.Load(),
	}
	if ld := s.cur.Load(); ld != nil {
		i.Limits, i.LoadedAt = len(ld.cfg.Limits()), ld.at.Unix()
	}
	return i
}

// PolicyInfo writes the service's lines of INFO's policy section: its
// configuration, reloaded with the rules.
func (s *Server) PolicyInfo(kv func(k, v string)) {
	i := s.Info()
	kv("rls_config_dir", s.cfg.Dir)
	kv("rls_limits", strconv.Itoa(i.Limits))
	kv("rls_loaded_at", strconv.FormatInt(i.LoadedAt, 10))
	kv("rls_reloads", strconv.FormatInt(i.Reloads, 10))
	kv("rls_reload_failures", strconv.FormatInt(i.ReloadFailures, 10))
}

// count adds one descriptor's hits to envoyproxy/ratelimit's
// statistics: total_hits; within_limit and, past 80 % of the limit,
// near_limit for an allowed hit; over_limit (and shadow_mode in shadow
// mode) for a denied one, which sluice does not count toward the limit.
func (s *Server) count(ld *loadedRLS, w *rlsWork, lim *rlsLimit, d *rlcommon.RateLimitDescriptor, out *policy.Outcome, hits int64, shadow bool) {
	var c *rlsCounts
	switch {
	case lim.l == nil: // Envoy's override
		c = ld.override[lim.rule.Operation[0].Value]
	case lim.l.DetailedMetric:
		w.entries = appendEntries(w.entries[:0], d)
		w.metric = rls.MetricKey(w.metric[:0], w.entries)
		c = s.detailedCounts(lim.l.Domain, w.metric)
	}
	if c == nil && lim.l != nil {
		c = ld.counts[lim.l]
	}
	if c == nil {
		return
	}
	addSat(&c.totalHits, hits)
	if !out.Allowed || out.Shadowed { // Shadowed: POLICY ENFORCE shadow
		addSat(&c.overLimit, hits)
		if shadow || out.Shadowed {
			addSat(&c.shadow, hits)
		}
		return
	}
	addSat(&c.within, hits)
	near := int64(math.Floor(float64(float32(lim.rpu) * rlsNearLimitRatio)))
	if used := out.Limit - out.CreditsLeft; out.Limit == int64(lim.rpu) && used > near {
		addSat(&c.nearLimit, min64(hits, used-near))
	}
}

// addSat adds n (>= 0) to a metric counter, stopping at math.MaxInt64: a
// hits_addend may be as large as that, and a counter must never go back.
func addSat(c *atomic.Int64, n int64) {
	for {
		old := c.Load()
		v := old + n
		if v < old {
			v = math.MaxInt64
		}
		if c.CompareAndSwap(old, v) {
			return
		}
	}
}

var (
	descRLSTotal   = prometheus.NewDesc("sluice_rls_total_hits", "Hits on each configured limit of Envoy's rate limit service (envoyproxy/ratelimit's ratelimit.service.rate_limit.DOMAIN.KEY.total_hits), hits_addend counted.", []string{"domain", "key"}, nil)
	descRLSOver    = prometheus.NewDesc("sluice_rls_over_limit", "Hits denied by a limit (envoyproxy/ratelimit's over_limit), shadow mode included.", []string{"domain", "key"}, nil)
	descRLSNear    = prometheus.NewDesc("sluice_rls_near_limit", "Allowed hits past 80% of a limit (envoyproxy/ratelimit's near_limit).", []string{"domain", "key"}, nil)
	descRLSWithin  = prometheus.NewDesc("sluice_rls_within_limit", "Allowed hits (envoyproxy/ratelimit's within_limit).", []string{"domain", "key"}, nil)
	descRLSShadow  = prometheus.NewDesc("sluice_rls_shadow_mode", "Hits over a shadow_mode limit that were allowed (envoyproxy/ratelimit's shadow_mode).", []string{"domain", "key"}, nil)
	descRLSCalls   = prometheus.NewDesc("sluice_rls_requests_total", "ShouldRateLimit calls, by result: ok, over_limit, error, or refused (calls and streams of the listener refused at --maxmemory-clients).", []string{"result"}, nil)
	descRLSReloads = prometheus.NewDesc("sluice_rls_config_reloads_total", "Reloads of --rls-config, by result: ok, or failed (the configuration in use was kept).", []string{"result"}, nil)
	descRLSLimits  = prometheus.NewDesc("sluice_rls_config_limits", "Limits of the --rls-config configuration in use.", nil, nil)
	descRLSLoaded  = prometheus.NewDesc("sluice_rls_config_loaded_timestamp_seconds", "Unix time the --rls-config configuration in use was loaded.", nil, nil)
)

// Describe implements prometheus.Collector: the service's metrics, which
// the server registers when the service is on.
func (s *Server) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(s, ch) }

// Collect implements prometheus.Collector.
func (s *Server) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	s.mu.Lock()
	all := slices.Collect(maps.Values(s.mu.metrics))
	s.mu.Unlock()
	for _, m := range all {
		counter(descRLSTotal, m.totalHits.Load(), m.domain, m.key)
		counter(descRLSOver, m.overLimit.Load(), m.domain, m.key)
		counter(descRLSNear, m.nearLimit.Load(), m.domain, m.key)
		counter(descRLSWithin, m.within.Load(), m.domain, m.key)
		counter(descRLSShadow, m.shadow.Load(), m.domain, m.key)
	}
	i := s.Info()
	counter(descRLSCalls, i.Requests-i.OverLimit-i.Errors, "ok")
	counter(descRLSCalls, i.OverLimit, "over_limit")
	counter(descRLSCalls, i.Errors, "error")
	counter(descRLSCalls, i.Refused, "refused")
	counter(descRLSReloads, i.Reloads, "ok")
	counter(descRLSReloads, i.ReloadFailures, "failed")
	if ld := s.cur.Load(); ld != nil {
		ch <- prometheus.MustNewConstMetric(descRLSLimits, prometheus.GaugeValue, float64(len(ld.cfg.Limits())))
		ch <- prometheus.MustNewConstMetric(descRLSLoaded, prometheus.GaugeValue, float64(ld.at.Unix()))
	}
}
