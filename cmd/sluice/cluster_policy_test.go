package main

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestClusterSendAndCheckPolicy (issue 30, dials in cluster mode): sluice
// cluster send gives a change to every node and exits non-zero naming
// a node that is down, or nodes that answer an error; sluice cluster
// check-policy finds the changes a node missed while it was down (the
// enforcement mode, a runtime limit, overrides of a rule and of an Envoy
// domain, compared page by page), and agrees once they are sent again.
func TestClusterSendAndCheckPolicy(t *testing.T) {
	rules, _ := overrideCluster(t)
	conf := overrideRLSConfig(t, rules)
	// An Envoy domain may hold "=" and ",", which INFO's one-line list of
	// labels cannot tell from two labels.
	replaceFile(t, filepath.Join(conf, "odd.yaml"), "domain: x=1,y\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 3\n")
	addrs := freePorts(t, 2)
	dirs := []string{t.TempDir(), t.TempDir()}
	start := func(i int) *proc {
		p := startProc(t, dirs[i], "--addr", addrs[i], "--cluster-nodes", strings.Join(addrs, ","), "--cluster-ordinal", strconv.Itoa(i),
			"--policy", rules, "--rls-addr", "127.0.0.1:0", "--rls-config", conf)
		if p.addr != addrs[i] {
			t.Fatalf("node %d serves on %s, want %s", i, p.addr, addrs[i])
		}
		return p
	}
	procs := []*proc{start(0), start(1)}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // bounds a hang
	defer cancel()
	nodes := strings.Join(addrs, ",")
	// tool runs sluice cluster with args, its page 2 overrides so that
	// the listings take several pages, and returns its output and error.
	tool := func(args ...string) (string, error) {
		var out bytes.Buffer
		args = append([]string{"cluster", args[0], "--nodes", nodes, "--cluster-page", "2", "--cluster-command-timeout", "20s"}, args[1:]...)
		err := runReloading(ctx, nil, args, noEnvLookup, nil, &out, &out)
		return out.String(), err
	}
	send := func(args ...string) {
		t.Helper()
		if out, err := tool(append([]string{"send"}, args...)...); err != nil {
			t.Fatalf("sluice cluster send %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	changes := [][]string{
		{"POLICY", "OVERRIDE", "api", "10.0.0.1", "4"},
		{"POLICY", "OVERRIDE", "api", "10.0.0.3", "5"},
		{"POLICY", "OVERRIDE", "api", "10.0.0.5", "6"},
		{"RLS.OVERRIDE", "api", "user=u", "5"},
	}
	for _, c := range changes {
		send(c...)
	}
	if out, err := tool("check-policy"); err != nil || !strings.Contains(out, "2 nodes agree: enforce on") || !strings.Contains(out, "4 overrides in 2 labels") {
		t.Fatalf("check-policy of nodes that took every change: %v\n%s", err, out)
	}
	if out, err := tool("send"); err == nil || !strings.Contains(err.Error(), "want a change of the dials") {
		t.Fatalf("send without a command: %v; want an error naming what it wants\n%s", err, out)
	}
	out, err := tool("send", "POLICY", "OVERRIDE", "nosuchlabel", "10.0.0.1", "4")
	if err == nil || !strings.Contains(err.Error(), "2 of 2 nodes did not take") || strings.Count(out, ": error: ERR") != 2 {
		t.Fatalf("send refused by every node: %v; want both named\n%s", err, out)
	}

	// Node 1 misses changes while it is down: send names it, and the
	// process exits 1.
	procs[1].stop(t, syscall.SIGTERM)
	if code, out := runToExit(t, "cluster", "send", "--nodes", nodes, "POLICY", "ENFORCE", "shadow"); code != 1 || !strings.Contains(out, "node "+addrs[1]+": not reached") {
		t.Fatalf("sluice cluster send with node 1 down: exit status %d; want 1, naming it\n%s", code, out)
	}
	missed := [][]string{
		{"POLICY", "ENFORCE", "shadow"},
		{"POLICY", "LIMIT", "api", "3"},
		{"POLICY", "OVERRIDE", "api", "10.0.0.2", "7"},
		{"POLICY", "OVERRIDE", "api", "10.0.0.3", "8"},
		{"POLICY", "OVERRIDE", "api", "10.0.0.5", "RESET"},
		{"RLS.OVERRIDE", "api", "user=v", "9"},
		{"RLS.OVERRIDE", "x=1,y", "user=w", "2"},
	}
	for _, c := range missed {
		out, err := tool(append([]string{"send"}, c...)...)
		if err == nil || !strings.Contains(err.Error(), "1 of 2 nodes did not take") || !strings.Contains(err.Error(), addrs[1]+" (not reached") ||
			!strings.Contains(out, "node "+addrs[0]+": ") || !strings.Contains(out, "node "+addrs[1]+": not reached") {
			t.Fatalf("send %s with node 1 down: %v; want it named\n%s", strings.Join(c, " "), err, out)
		}
	}
	out, err = tool("check-policy")
	if err == nil || !strings.Contains(out, "node "+addrs[1]+": not reached") || !strings.Contains(err.Error(), "not reached: "+addrs[1]) {
		t.Fatalf("check-policy with node 1 down: %v; want it named\n%s", err, out)
	}
	procs[1] = start(1)
	out, err = tool("check-policy")
	a, b := addrs[0], addrs[1]
	for _, want := range []string{
		"enforce: " + a + " shadow, " + b + " on\n",
		"rule api effectiveCreditLimit: " + a + " 3, " + b + " 2\n",
		"rule api limitSource: " + a + " runtime, " + b + " file\n",
		`override api "10.0.0.2": ` + a + " 7, " + b + " none\n",
		`override api "10.0.0.3": ` + a + " 8, " + b + " 5\n",
		`override api "10.0.0.5": ` + a + " none, " + b + " 6\n",
		`override rls:api "user=v": ` + a + " 9, " + b + " none\n",
		`override rls:x=1,y "user=w": ` + a + " 2, " + b + " none\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check-policy after node 1 missed changes: no line %q", want)
		}
	}
	if err == nil || !strings.Contains(err.Error(), "8 differences") || strings.Contains(out, `"10.0.0.1"`) || strings.Contains(out, `"user=u"`) {
		t.Fatalf("check-policy after node 1 missed changes: %v; want 8 differences, none of the overrides both have\n%s", err, out)
	}

	for _, c := range missed {
		send(c...)
	}
	if code, out := runToExit(t, "cluster", "check-policy", "--nodes", nodes, "--cluster-page", "2"); code != 0 || !strings.Contains(out, "2 nodes agree: enforce shadow") || !strings.Contains(out, "6 overrides in 3 labels") {
		t.Fatalf("sluice cluster check-policy after the changes were sent again: exit status %d; want 0\n%s", code, out)
	}
}

// TestOverrideLabels: check-policy reads INFO's policy_override_labels
// whole, an Envoy domain with commas (or a '=') in it included, which a
// split at each comma read as other labels.
func TestOverrideLabels(t *testing.T) {
	for _, tc := range []struct {
		list string
		want []string
	}{
		{"", nil},
		{"api=3", []string{"api"}},
		{"api=3,rls:messaging=1", []string{"api", "rls:messaging"}},
		{"rls:a,b=2,web=10", []string{"rls:a,b", "web"}},
		{"rls:x=y,z=4", []string{"rls:x=y,z"}},
	} {
		if got := overrideLabels(tc.list); !slices.Equal(got, tc.want) {
			t.Errorf("overrideLabels(%q) = %q; want %q", tc.list, got, tc.want)
		}
	}
}
