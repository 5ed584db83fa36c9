package kubernetes_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// monitoringOverlay is the kustomize overlay that adds a ServiceMonitor.
const monitoringOverlay = "../kubernetes-monitoring"

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1) that the overlay uses; decoding it strictly
// rejects any other field, so a field added there must be added here too.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// TestMonitoringOverlay checks the ServiceMonitor against the base: it
// selects the headless Service, scrapes its http port on /metrics, and
// its job (the Service's name) is the one the alerting rules expect.
func TestMonitoringOverlay(t *testing.T) {
	k := loadOverlay(t, monitoringOverlay)
	if len(k.Resources) != 2 || k.Resources[1] != "servicemonitor.yaml" {
		t.Fatalf("resources %v: want the base, ../kubernetes, and servicemonitor.yaml", k.Resources)
	}
	doc, err := os.ReadFile(filepath.Join(monitoringOverlay, "servicemonitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sms, err := appendStrict([]*serviceMonitor(nil), doc)
	if err != nil {
		t.Fatalf("servicemonitor.yaml: %v", err)
	}
	sm := sms[0]
	if sm.APIVersion != "monitoring.coreos.com/v1" || sm.Kind != "ServiceMonitor" {
		t.Errorf("servicemonitor.yaml is %s %s, want monitoring.coreos.com/v1 ServiceMonitor", sm.APIVersion, sm.Kind)
	}

	svc := load(t).services[0]
	if len(sm.Spec.Selector.MatchExpressions) != 0 || !selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
		t.Errorf("selector %v does not select the Service's labels %v", sm.Spec.Selector.MatchLabels, svc.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("want one endpoint, have %d", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port && p.Name == "http" }) {
		t.Errorf("endpoint port %q: want the Service's port http, where /metrics is served", ep.Port)
	}
	if ep.Path != "/metrics" {
		t.Errorf("endpoint path %q, want /metrics", ep.Path)
	}

	rules, err := os.ReadFile("../monitoring/sluice.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`up\{job="([^"]*)"\}`).FindSubmatch(rules)
	if m == nil {
		t.Fatal(`sluice.rules.yml has no up{job="..."}`)
	}
	if string(m[1]) != svc.Name {
		t.Errorf(`the rules read up{job=%q}; the ServiceMonitor's job is the Service's name, %q`, m[1], svc.Name)
	}
}
