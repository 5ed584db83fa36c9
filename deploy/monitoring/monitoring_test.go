// Package monitoring_test checks the monitoring pack in this directory:
// the Prometheus alerting rules with promtool (syntax, and the unit tests
// in sluice.rules.test.yml), and that every query of the rules and of the
// Grafana dashboard names metrics a running sluice exports.
package monitoring_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/storage"
)

const (
	rulesFile     = "sluice.rules.yml"
	rulesTestFile = "sluice.rules.test.yml"
	dashboardFile = "sluice-dashboard.json"
)

// otherExporters are the metrics the rules read from other exporters:
// Prometheus' own up, and the kubelet's and cAdvisor's.
var otherExporters = []string{
	"up",
	"kubelet_volume_stats_available_bytes",
	"kubelet_volume_stats_capacity_bytes",
	"container_memory_working_set_bytes",
	"container_spec_memory_limit_bytes",
}

// promtool finds promtool, which skips the test where it is missing,
// except under CI=true.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("promtool: %v (Debian package prometheus)", err)
		}
		t.Skipf("promtool: %v (Debian package prometheus)", err)
	}
	return p
}

func TestRulesCheck(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// rules is the part of a Prometheus rule file the tests read.
type rules struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert  string            `json:"alert"`
			Expr   string            `json:"expr"`
			Labels map[string]string `json:"labels"`
		} `json:"rules"`
	} `json:"groups"`
}

func loadRules(t *testing.T) rules {
	t.Helper()
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var r rules
	if err := yaml.Unmarshal(raw, &r); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return r
}

// templateVar is a variable of a Grafana dashboard.
type templateVar struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Query any    `json:"query"` // a string, or {"query": ...}
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Templating struct {
		List []templateVar `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// queries is every PromQL query of the rules and the dashboard, by where
// it is.
func queries(t *testing.T) map[string]string {
	t.Helper()
	q := map[string]string{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			q[rulesFile+": "+r.Alert] = r.Expr
		}
	}
	d := loadDashboard(t)
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			q[dashboardFile+": "+p.Title+" "+tg.RefID] = tg.Expr
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var expr string
		switch q := v.Query.(type) {
		case string:
			expr = q
		case map[string]any:
			expr, _ = q["query"].(string)
		}
		// label_values(metric, label) is Grafana's, not PromQL: its
		// first argument is the selector.
		if m := regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`).FindStringSubmatch(expr); m != nil {
			expr = m[1]
		}
		q[dashboardFile+": variable "+v.Name] = expr
	}
	return q
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "atan2", "inf", "nan"}
)

// metricNames returns the metric names a PromQL expression selects: what
// is left of it without strings, label matchers, ranges and grouping
// labels, less function calls, keywords and numbers.
func metricNames(expr string) []string {
	s := promString.ReplaceAllString(expr, `""`)
	s = promMatchers.ReplaceAllString(s, " ")
	s = promRange.ReplaceAllString(s, " ")
	s = promGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, m := range promIdent.FindAllStringIndex(s, -1) {
		name := s[m[0]:m[1]]
		if m[0] > 0 && strings.ContainsRune("0123456789.$", rune(s[m[0]-1])) {
			continue // the exponent of a number (1e9), a Grafana variable
		}
		if strings.HasPrefix(strings.TrimLeft(s[m[1]:], " \t\n"), "(") || slices.Contains(promKeywords, strings.ToLower(name)) {
			continue // a function call, a keyword
		}
		names = append(names, name)
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (instance, le) (rate(a_b_bucket{x="y}", z=~"$instance"}[$__rate_interval])) / c > 1e9 and on (instance) d == bool 0`: {"a_b_bucket", "c", "d"},
		`histogram_quantile(0.99, sum(rate(x[5m]))) > 0.05 unless ignoring(a) y offset 1h`:                                           {"x", "y"},
		`time() - m > 6 * 3600`: {"m"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%s) = %q, want %q", expr, got, want)
		}
	}
}

// scrape starts a sluice, gives every metric family that has labels
// something to count, and returns the metric names /metrics exports (a
// histogram's with its _bucket, _sum and _count series).
func scrape(t *testing.T) map[string]bool {
	t.Helper()
	store, err := storage.Open(filepath.Join(t.TempDir(), "store"), server.StoreOptions(storage.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	policy := filepath.Join(t.TempDir(), "rules.ini")
	if err := os.WriteFile(policy, []byte("[ip=*]\ncreditLimit = 1\nresetSeconds = 60\nactorField = ip\nlabel = per-ip\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Envoy's rate limit service exports its metrics once configured.
	rlsDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(rlsDir, "limits.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A clock the test moves, so that a rule window ends and
	// sluice_policy_peak_used_ratio observes it.
	var now atomic.Int64
	now.Store(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC).UnixNano())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A cluster of this one node, so that the metrics of cluster mode are
	// exported too.
	self := ln.Addr().String()
	srv, err := server.New(server.Config{
		Clock:   func() time.Time { return time.Unix(0, now.Load()) },
		Store:   store,
		Listen:  admit.Config{Password: "pw"},
		RESP:    respserver.Tuning{BackupDir: filepath.Join(t.TempDir(), "backups")},
		Policy:  policycmd.Config{File: policy},
		RLS:     envoy.Config{Dir: rlsDir},
		Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: []string{self}, Self: self}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	go srv.ServeHTTP(hln)

	ctx := context.Background()
	bad := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), Password: "wrong", MaxRetries: -1})
	if err := bad.Ping(ctx).Err(); err == nil {
		t.Fatal("AUTH with a wrong password succeeded")
	}
	bad.Close()
	c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), Password: "pw", MaxRetries: -1})
	defer c.Close()
	for _, cmd := range [][]any{
		{"RL.REDUCE", "k", 1, 60, "AT", 1000},           // allowed
		{"RL.REDUCE", "k", 1, 60, "AT", 1000},           // denied
		{"RL.REDUCE", "k"},                              // error
		{"NO.SUCH.COMMAND"},                             // unknown
		{"HIT", "ip=10.0.0.1"},                          // accepted
		{"HIT", "ip=10.0.0.1"},                          // rejected
		{"POLICY", "RELOAD"},                            // ok
		{"CHECKPOINT"},                                  // a checkpoint
		{"RL.GET", "missing", 1, 60, "AT", 1000},        // a cache miss
		{"RL.GET", "k", 1, 60, "AT", 1000},              // a hit
		{"RL.REDUCE", "k2", 1, 60, "TAKE", 0, "AT", 10}, // more keys written
	} {
		c.Do(ctx, cmd...)
	}
	now.Add(int64(61 * time.Second))
	c.Do(ctx, "HIT", "ip=10.0.0.1") // ends the window of the HITs above
	resp, err := http.Get("http://" + hln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		names[f[2]] = true
		if f[3] == "histogram" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				names[f[2]+suffix] = true
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !names["sluice_commands_total"] {
		t.Fatalf("/metrics has no sluice_commands_total: %d names", len(names))
	}
	return names
}

// TestQueriesNameExportedMetrics: every metric a query of the rules or the
// dashboard selects is one a running sluice exports (or one of the few the
// rules read from other exporters), so that no panel stays empty and no
// alert stays silent because of a misspelt or renamed metric.
func TestQueriesNameExportedMetrics(t *testing.T) {
	exported := scrape(t)
	used := map[string]bool{}
	for where, expr := range queries(t) {
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: %q selects no metric", where, expr)
		}
		for _, n := range names {
			used[n] = true
			if !exported[n] && !slices.Contains(otherExporters, n) {
				t.Errorf("%s: %s is not a metric sluice exports", where, n)
			}
		}
	}
	for _, n := range otherExporters {
		if !used[n] {
			t.Errorf("%s is listed as another exporter's metric, but no query uses it", n)
		}
	}
}

// TestDashboardShape: panels have unique ids and read the dashboard's
// datasource variable, and every query has a refId, so that the JSON
// imports into Grafana as it is.
func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	if !slices.ContainsFunc(d.Templating.List, func(v templateVar) bool { return v.Name == "datasource" && v.Type == "datasource" }) {
		t.Errorf("no datasource variable: the dashboard would be bound to one Prometheus")
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d is used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %v, want the variable ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.RefID == "" || tg.Expr == "" {
				t.Errorf("panel %q: a target without refId or expr", p.Title)
			}
		}
	}
}

// TestDocsListEveryAlert: the table of alerts in docs/ (a row | `Name` |
// severity | ... |) lists every alert of the rules with its severity, and
// no other.
func TestDocsListEveryAlert(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(files) == 0 {
		t.Fatalf("no docs: %v", err)
	}
	row := regexp.MustCompile("(?m)^\\| `(Sluice\\w+)` \\| (\\w+) \\|")
	docs := map[string]string{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range row.FindAllStringSubmatch(string(raw), -1) {
			docs[m[1]] = m[2]
		}
	}
	rules := map[string]string{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = r.Labels["severity"]
			if sev, ok := docs[r.Alert]; !ok {
				t.Errorf("the alert %s is in no table of docs/", r.Alert)
			} else if sev != r.Labels["severity"] {
				t.Errorf("the alert %s: severity %q in docs/, %q in %s", r.Alert, sev, r.Labels["severity"], rulesFile)
			}
		}
	}
	for name := range docs {
		if _, ok := rules[name]; !ok {
			t.Errorf("docs/ lists the alert %s, which %s lacks", name, rulesFile)
		}
	}
}
