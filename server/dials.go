package server

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/policyhttp"
	"github.com/sluicehq/sluice/rls"
)

// The rules' dials (POLICY LIMIT, POLICY ENFORCE: internal/policycmd over
// the engine's): loaded from the store at start, shown in INFO and the
// metrics. Each node keeps its own.

// initDials puts the dials the store holds in use and logs the
// enforcement mode when it is not on.
func (s *Server) initDials() error {
	if err := s.eng.LoadDials(); err != nil {
		return err
	}
	if err := s.eng.LoadOverrides(); err != nil {
		return err
	}
	s.polCmds = policycmd.Commands{Engine: s.eng, Rules: &s.pol, RLS: s.rlsConfig, Log: s.log}
	if m := s.eng.Enforcement(); m != engine.Enforce {
		policycmd.LogMode(s.log, m)
	}
	return nil
}

// rlsConfig is the configuration of Envoy's rate limit service in use,
// for RLS.OVERRIDE; nil without one.
func (s *Server) rlsConfig() *rls.Config {
	if s.rls == nil {
		return nil
	}
	return s.rls.Config()
}

var (
	descPolicyEnforce   = prometheus.NewDesc("sluice_policy_enforce", "1 for the enforcement mode in use (POLICY ENFORCE: on, shadow or off), 0 for the others.", []string{"mode"}, nil)
	descPolicyChanges   = prometheus.NewDesc("sluice_policy_changes_total", "Changes of the dials (POLICY LIMIT, its RESET, POLICY ENFORCE, POLICY OVERRIDE, its RESET, and the same under /v1/policy/), by change (limit, reset, enforce, override, override_reset) and front end (resp, http).", []string{"change", "via"}, nil)
	descPolicyOverrides = prometheus.NewDesc("sluice_policy_overrides", "Per-actor overrides (POLICY OVERRIDE) kept, by rule label.", []string{"label"}, nil)
	descPolicyPeak      = prometheus.NewDesc("sluice_policy_peak_used_ratio", "Peak used of each actor-window at its end, divided by its limit, by rule label (POLICY STATS).", []string{"label"}, nil)
	descPolicyLimits    = prometheus.NewDesc("sluice_policy_runtime_limits", "Runtime limits (POLICY LIMIT) by state: applied; orphaned, their label no longer in the rules; refused, not fitting the rule the label names now.", []string{"state"}, nil)
)

// collectDials sends the dials' metrics.
func (s *Server) collectDials(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	m := s.eng.Enforcement()
	for _, mode := range []engine.Mode{engine.Enforce, engine.Shadow, engine.Off} {
		gauge(descPolicyEnforce, b2f(m == mode), mode.String())
	}
	for v, via := range policycmd.ViaNames {
		for c, change := range policycmd.ChangeNames {
			ch <- prometheus.MustNewConstMetric(descPolicyChanges, prometheus.CounterValue, float64(s.polCmds.Changes.N[v][c].Load()), change, via)
		}
	}
	n := policycmd.CountLimits(s.eng.Limits(s.pol.Current()))
	gauge(descPolicyLimits, float64(n.Applied), "applied")
	gauge(descPolicyLimits, float64(n.Orphaned), "orphaned")
	gauge(descPolicyLimits, float64(n.Refused), "refused")
	ovs, _ := s.eng.OverrideCounts()
	for label, n := range ovs {
		gauge(descPolicyOverrides, float64(n), label)
	}
	s.eng.PeakRatios(func(label string, r engine.Ratios) {
		buckets := make(map[float64]uint64, len(r.Buckets))
		var cum uint64
		for i, b := range engine.RatioBounds {
			cum += r.Buckets[i]
			buckets[b] = cum
		}
		ch <- prometheus.MustNewConstHistogram(descPolicyPeak, r.Count, r.Sum, buckets, label)
	})
}

// policyHTTP is /v1/policy/, behind /backup's checks: the password (HTTP
// basic authentication), a client certificate when --tls-ca requires
// one, and protected mode's loopback-only without either.
func (s *Server) policyHTTP() http.Handler {
	user := ""
	if s.cfg.Password != "" {
		user = "default" // the only user
	}
	h := policyhttp.New(&s.polCmds, user)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if code, msg := (*frontHost)(s).BackupAllowed(r); code != 0 {
			if code == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Basic realm="sluice", charset="UTF-8"`)
			}
			http.Error(w, msg, code)
			return
		}
		h.ServeHTTP(w, r)
	})
}
