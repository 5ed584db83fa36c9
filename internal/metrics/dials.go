package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policycmd"
)

// The rules' dials (POLICY LIMIT, POLICY ENFORCE: internal/policycmd over
// the engine's).
var (
	descPolicyEnforce   = prometheus.NewDesc("sluice_policy_enforce", "1 for the enforcement mode in use (POLICY ENFORCE: on, shadow or off), 0 for the others.", []string{"mode"}, nil)
	descPolicyChanges   = prometheus.NewDesc("sluice_policy_changes_total", "Changes of the dials (POLICY LIMIT, its RESET, POLICY ENFORCE, POLICY OVERRIDE, its RESET, and the same under /v1/policy/), by change (limit, reset, enforce, override, override_reset) and front end (resp, http).", []string{"change", "via"}, nil)
	descPolicyOverrides = prometheus.NewDesc("sluice_policy_overrides", "Per-actor overrides (POLICY OVERRIDE) kept, by rule label.", []string{"label"}, nil)
	descPolicyPeak      = prometheus.NewDesc("sluice_policy_peak_used_ratio", "Peak used of each actor-window at its end, divided by its limit, by rule label (POLICY STATS).", []string{"label"}, nil)
	descPolicyLimits    = prometheus.NewDesc("sluice_policy_runtime_limits", "Runtime limits (POLICY LIMIT) by state: applied; orphaned, their label no longer in the rules; refused, not fitting the rule the label names now.", []string{"state"}, nil)
)

// collectDials sends the dials' metrics.
func (s *Sources) collectDials(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	m := s.Engine.Enforcement()
	for _, mode := range []engine.Mode{engine.Enforce, engine.Shadow, engine.Off} {
		gauge(descPolicyEnforce, b2f(m == mode), mode.String())
	}
	for v, via := range policycmd.ViaNames {
		for c, change := range policycmd.ChangeNames {
			ch <- prometheus.MustNewConstMetric(descPolicyChanges, prometheus.CounterValue, float64(s.Policy.Changes.N[v][c].Load()), change, via)
		}
	}
	n := policycmd.CountLimits(s.Engine.Limits(s.Rules.Current()))
	gauge(descPolicyLimits, float64(n.Applied), "applied")
	gauge(descPolicyLimits, float64(n.Orphaned), "orphaned")
	gauge(descPolicyLimits, float64(n.Refused), "refused")
	ovs, _ := s.Engine.OverrideCounts()
	for label, n := range ovs {
		gauge(descPolicyOverrides, float64(n), label)
	}
	s.Engine.PeakRatios(func(label string, r engine.Ratios) {
		buckets := make(map[float64]uint64, len(r.Buckets))
		var cum uint64
		for i, b := range engine.RatioBounds {
			cum += r.Buckets[i]
			buckets[b] = cum
		}
		ch <- prometheus.MustNewConstHistogram(descPolicyPeak, r.Count, r.Sum, buckets, label)
	})
}
