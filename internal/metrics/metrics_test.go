package metrics

import (
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// host is what the front ends ask of a server that is not there.
type host struct{}

func (host) Failure(err error) *errs.Error  { return engine.Typed(err) }
func (host) Release()                       {}
func (host) Admitted() int64                { return 0 }
func (host) Addr() net.Addr                 { return nil }
func (host) Settings() []respserver.Setting { return nil }
func (host) PolicyInfo(func(k, v string))   {}
func (host) ReloadRules() error             { return nil }
func (host) Refuse(c net.Conn, _ []byte)    { c.Close() }

// sources are the front ends over a new store, made as the server makes
// them, and their counters.
func sources(t *testing.T) Sources {
	t.Helper()
	store, err := storage.Open(t.TempDir(), storage.Options{Sync: storage.SyncEverySec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	log := slog.New(slog.DiscardHandler)
	eng := engine.New(engine.Config{Store: store})
	f := &rules.File{}
	pc := &policycmd.Commands{Engine: eng, Rules: f, Log: log}
	st := &respserver.Stats{}
	resp := respserver.New(respserver.Config{}, respserver.Options{
		Store: store, Engine: eng, Rules: f, Policy: pc, Logger: log, Clock: time.Now,
		ClockOffset: new(atomic.Int64), Host: host{}, Stats: st, Closing: new(atomic.Bool), Done: make(chan struct{}),
	})
	dv := divvy.New(divvy.Config{}, eng, f, host{}, divvy.Shared{NetIn: &st.NetIn, NetOut: &st.NetOut, Panics: &st.Panics, IdleClosed: &st.IdleClosed, ConnsTotal: &st.ConnsTotal})
	ck := check.New(check.Config{}, check.Options{Engine: eng, Rules: f, Host: host{}, RejectedDenied: &st.RejectedDenied})
	return Sources{
		Version: "v1.2.3", Revision: "abc-dirty", MaxClients: 77,
		RESP: resp, Stats: st, Gate: &admit.Gate{}, Engine: eng, Store: store, Rules: f, Policy: pc, Divvy: dv, Check: ck,
	}
}

// scrape returns what /metrics would show of src: each series, as
// name{label="value",...} in label order, and its value.
func scrape(t *testing.T, src Sources) map[string]float64 {
	t.Helper()
	mfs, err := New(src).Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			name := mf.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[name] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[name] = m.Gauge.GetValue()
			}
		}
	}
	return out
}

// TestEachCounterItsMetric: every counter the server and the line
// protocol keep is shown under its own metric, each with its own value,
// so that a counter wired to the wrong series shows.
func TestEachCounterItsMetric(t *testing.T) {
	src := sources(t)
	st, dv := src.Stats, src.Divvy
	want := map[string]float64{}
	for i, c := range []struct {
		n      *atomic.Int64
		series string
	}{
		{&st.UnknownCommands, "sluice_unknown_commands_total"},
		{&st.ConnsTotal, "sluice_connections_total"},
		{&st.RejectedMax, `sluice_rejected_connections_total{reason="maxclients"}`},
		{&st.RejectedDenied, `sluice_rejected_connections_total{reason="protected_mode"}`},
		{&st.IdleClosed, "sluice_idle_closed_connections_total"},
		{&st.ReplyOverflows, "sluice_reply_buffer_overflows_total"},
		{&st.EvictedClients, "sluice_evicted_clients_total"},
		{&st.ClientMem, "sluice_client_buffers_bytes"},
		{&st.AuthFailures, "sluice_auth_failures_total"},
		{&st.AuthClosed, "sluice_auth_closed_connections_total"},
		{&st.ProtocolErrors, "sluice_protocol_errors_total"},
		{&st.CrossProtocol, "sluice_cross_protocol_closed_total"},
		{&st.NetIn, "sluice_net_input_bytes_total"},
		{&st.NetOut, "sluice_net_output_bytes_total"},
		{&st.StoreErrors, "sluice_store_error_replies_total"},
		{&st.Panics, "sluice_handler_panics_total"},
		{&st.LastSave, "sluice_last_checkpoint_timestamp_seconds"},
		{&dv.ErrUnknownCommand, `divvy_errors_total{code="` + policy.CodeUnknownCommand + `"}`},
		{&dv.ErrUnknown, `divvy_errors_total{code="` + policy.CodeUnknown + `"}`},
		{&dv.Open, "divvy_tcp_connections_total"},
		{&dv.Total, "sluice_divvy_connections_total"},
	} {
		c.n.Store(int64(i + 1))
		want[c.series] = float64(i + 1)
	}
	want["sluice_maxclients"] = 77
	want[`sluice_build_info{goversion="`+runtime.Version()+`",revision="abc-dirty",version="v1.2.3"}`] = 1
	want["sluice_policy_rules"] = 0 // no policy loaded
	got := scrape(t, src)
	for series, v := range want {
		if g, ok := got[series]; !ok || g != v {
			t.Errorf("%s = %v (shown: %v), want %v", series, g, ok, v)
		}
	}
}

// TestRLSMetricsOnlyWithRLS: Envoy's rate limit service's metrics are
// registered only when it runs.
func TestRLSMetricsOnlyWithRLS(t *testing.T) {
	for series := range scrape(t, sources(t)) {
		if strings.HasPrefix(series, "sluice_rls_") {
			t.Errorf("%s shown without the rate limit service", series)
		}
	}
}

// TestTakesTokens: the commands that decide allowed or denied, and so
// have those series of sluice_commands_total, are the limit commands
// that take tokens; the others, reads and what-ifs included, have not.
func TestTakesTokens(t *testing.T) {
	for _, c := range []string{"rl.reduce", "rl.preduce", "rl.sessionize", "rl.psessionize", "hit", "cl.throttle", "cl.pthrottle", "fw.incr", "fw.pincr", "roll.limit"} {
		if !TakesTokens(c) {
			t.Errorf("TakesTokens(%q) = false", c)
		}
	}
	for _, c := range []string{"rl.get", "rl.pget", "fw.get", "fw.pget", "roll.wouldlimit", "roll.clear", "ping", "policy"} {
		if TakesTokens(c) {
			t.Errorf("TakesTokens(%q) = true", c)
		}
	}
}
