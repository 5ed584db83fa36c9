package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/storage"
)

// rlsYAML is the configuration of the RLS tests: envoyproxy/ratelimit's
// README examples 2, 5, 6 and 7, and a limit of 3 per minute.
const rlsYAML = `
domain: test
descriptors:
  - key: k
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: hourly
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: ldap
    rate_limit:
      unlimited: true
  - key: blocked
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit:
          requests_per_unit: 2
          unit: second
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
  - key: bucket
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: token_bucket
      burst: 2
  - key: plan
    rate_limit:
      unit: minute
      requests_per_unit: 3
      max_requests_per_unit: 5
  - key: detailed
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
`

// rlsT0 is 10 s into a minute (and 1234 s into an hour): fixed windows
// are aligned to the unit.
var rlsT0 = time.Date(2026, 11, 24, 10, 20, 34, 500e6, time.UTC).UnixMilli()

func rlsConfigDir(t testing.TB, yaml string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startRLS serves srv's RLS on 127.0.0.1:0 until the test ends.
func startRLS(t testing.TB, srv *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeRLS(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; err != nil {
			t.Errorf("ServeRLS: %v", err)
		}
	})
	return ln.Addr().String()
}

func dialRLS(t testing.TB, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

type rlsFixture struct {
	srv    *Server
	clock  *testClock
	client rlspb.RateLimitServiceClient
	addr   string
}

func newRLS(t testing.TB, cfg Config) *rlsFixture {
	t.Helper()
	clock := newTestClock(rlsT0)
	if cfg.RLS.Dir == "" {
		cfg.RLS.Dir = rlsConfigDir(t, rlsYAML)
	}
	cfg.Clock = clock.now
	srv := startServer(t, cfg)
	addr := startRLS(t, srv)
	return &rlsFixture{srv: srv, clock: clock, addr: addr, client: rlspb.NewRateLimitServiceClient(dialRLS(t, addr, nil))}
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (f *rlsFixture) call(t testing.TB, req *rlspb.RateLimitRequest) *rlspb.RateLimitResponse {
	t.Helper()
	if req.Domain == "" {
		req.Domain = "test"
	}
	resp, err := f.client.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func (f *rlsFixture) one(t testing.TB, d *rlcommon.RateLimitDescriptor) *rlspb.RateLimitResponse_DescriptorStatus {
	t.Helper()
	resp := f.call(t, &rlspb.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{d}})
	if resp.Statuses[0].Code != resp.OverallCode {
		t.Fatalf("one descriptor: overall %v, status %v", resp.OverallCode, resp.Statuses[0].Code)
	}
	return resp.Statuses[0]
}

func checkStatus(t testing.TB, what string, st *rlspb.RateLimitResponse_DescriptorStatus, code rlspb.RateLimitResponse_Code, remaining uint32, reset int64) {
	t.Helper()
	if st.Code != code || st.LimitRemaining != remaining || st.DurationUntilReset.GetSeconds() != reset {
		t.Fatalf("%s: code %v remaining %d reset %ds; want %v %d %ds", what, st.Code, st.LimitRemaining, st.DurationUntilReset.GetSeconds(), code, remaining, reset)
	}
}

func TestRLSLimitReachedAtRequestsPerUnit(t *testing.T) {
	f := newRLS(t, Config{})
	// 34.5 s into the minute: the window ends in 25.5 s, 26 rounded up,
	// as envoyproxy/ratelimit's unit - now % unit with now in seconds.
	for i := uint32(1); i <= 3; i++ {
		st := f.one(t, desc("k", "a"))
		checkStatus(t, "hit", st, rlspb.RateLimitResponse_OK, 3-i, 26)
		if l := st.CurrentLimit; l.RequestsPerUnit != 3 || l.Unit != rlspb.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("current_limit %v", l)
		}
	}
	checkStatus(t, "4th", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OVER_LIMIT, 0, 26)
	// Another value of the key has its own counter.
	checkStatus(t, "other value", f.one(t, desc("k", "b")), rlspb.RateLimitResponse_OK, 2, 26)
	// 20 s later: still the same window.
	f.clock.ms.Add(20e3)
	checkStatus(t, "later", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OVER_LIMIT, 0, 6)
	// The next minute starts a new window, whatever the first hit's time.
	f.clock.ms.Add(5500)
	checkStatus(t, "next minute", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 2, 60)
	// An hourly limit's reset is the end of the hour.
	checkStatus(t, "hourly", f.one(t, desc("hourly", "x")), rlspb.RateLimitResponse_OK, 9, 3600-(20*60+60))
}

func TestRLSHitsAddend(t *testing.T) {
	f := newRLS(t, Config{})
	call := func(reqHits uint32, d *rlcommon.RateLimitDescriptor) *rlspb.RateLimitResponse_DescriptorStatus {
		return f.call(t, &rlspb.RateLimitRequest{HitsAddend: reqHits, Descriptors: []*rlcommon.RateLimitDescriptor{d}}).Statuses[0]
	}
	d := desc("hourly", "x")
	checkStatus(t, "request hits_addend 0 means 1", call(0, d), rlspb.RateLimitResponse_OK, 9, 2366)
	checkStatus(t, "request hits_addend 4", call(4, d), rlspb.RateLimitResponse_OK, 5, 2366)
	withHits := func(n uint64) *rlcommon.RateLimitDescriptor {
		d := desc("hourly", "x")
		d.HitsAddend = wrapperspb.UInt64(n)
		return d
	}
	checkStatus(t, "descriptor hits_addend 0 only checks", call(7, withHits(0)), rlspb.RateLimitResponse_OK, 5, 2366)
	checkStatus(t, "descriptor hits_addend wins over the request's", call(1, withHits(5)), rlspb.RateLimitResponse_OK, 0, 2366)
	checkStatus(t, "over", call(0, d), rlspb.RateLimitResponse_OVER_LIMIT, 0, 2366)
}

func TestRLSOverride(t *testing.T) {
	f := newRLS(t, Config{})
	d := desc("anything", "v")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	for i := uint32(1); i <= 2; i++ {
		st := f.one(t, d)
		checkStatus(t, "override", st, rlspb.RateLimitResponse_OK, 2-i, 26)
		if st.CurrentLimit.RequestsPerUnit != 2 || st.CurrentLimit.Unit != rlspb.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("current_limit %v", st.CurrentLimit)
		}
	}
	checkStatus(t, "override reached", f.one(t, d), rlspb.RateLimitResponse_OVER_LIMIT, 0, 26)
	// An override replaces the configured limit of the same descriptor.
	k := desc("k", "a")
	k.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: typev3.RateLimitUnit_HOUR}
	checkStatus(t, "override of a configured limit", f.one(t, k), rlspb.RateLimitResponse_OK, 99, 2366)
	// Unknown domain: no limit, as envoyproxy/ratelimit.
	resp := f.call(t, &rlspb.RateLimitRequest{Domain: "nope", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
	if resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("override in an unknown domain: %v", resp)
	}
}

// TestRLSOverrideCapped: with sluice's max_requests_per_unit, a request's
// override in the limit's unit changes the configured limit (its
// counter, its algorithm), capped; in another unit it is Envoy's.
func TestRLSOverrideCapped(t *testing.T) {
	f := newRLS(t, Config{})
	over := func(value string, rpu uint32, unit typev3.RateLimitUnit) *rlcommon.RateLimitDescriptor {
		d := desc("plan", value)
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
		return d
	}
	for i := uint32(1); i <= 5; i++ {
		st := f.one(t, over("a", 100, typev3.RateLimitUnit_MINUTE))
		checkStatus(t, "capped at 5", st, rlspb.RateLimitResponse_OK, 5-i, 26)
		if st.CurrentLimit.RequestsPerUnit != 5 {
			t.Fatalf("current_limit %v; want the cap, 5", st.CurrentLimit)
		}
	}
	checkStatus(t, "6th", f.one(t, over("a", 100, typev3.RateLimitUnit_MINUTE)), rlspb.RateLimitResponse_OVER_LIMIT, 0, 26)
	// The same counter without the override: its own limit, 3, is used up.
	checkStatus(t, "no override", f.one(t, desc("plan", "a")), rlspb.RateLimitResponse_OVER_LIMIT, 0, 26)
	checkStatus(t, "another value", f.one(t, desc("plan", "b")), rlspb.RateLimitResponse_OK, 2, 26)
	checkStatus(t, "a lower override", f.one(t, over("d", 2, typev3.RateLimitUnit_MINUTE)), rlspb.RateLimitResponse_OK, 1, 26)
	// Another unit: Envoy's override, its own fixed window, uncapped.
	st := f.one(t, over("c", 100, typev3.RateLimitUnit_HOUR))
	checkStatus(t, "other unit", st, rlspb.RateLimitResponse_OK, 99, 2366)
	if m := rlsMetrics(t, f.srv, "test", "plan"); m["total_hits"] != 9 || m["over_limit"] != 2 || m["within_limit"] != 7 {
		t.Fatalf("plan metrics %v; want 9 hits, 2 over, 7 within", m)
	}
	if m := rlsMetrics(t, f.srv, "test", "override"); m["total_hits"] != 1 {
		t.Fatalf("override metrics %v; want 1 hit", m)
	}
}

func TestRLSShadowMode(t *testing.T) {
	f := newRLS(t, Config{})
	d := desc("service", "auth", "user", "user-a")
	for i := 0; i < 5; i++ {
		st := f.one(t, d)
		if st.Code != rlspb.RateLimitResponse_OK || st.CurrentLimit.GetRequestsPerUnit() != 2 {
			t.Fatalf("shadow hit %d: %v", i, st)
		}
	}
	m := rlsMetrics(t, f.srv, "test", "service.user_user-a")
	if m["total_hits"] != 5 || m["within_limit"] != 2 || m["over_limit"] != 3 || m["shadow_mode"] != 3 {
		t.Fatalf("shadow metrics %v; want total 5, within 2, over 3, shadow 3", m)
	}
}

func TestRLSWorstCodeWins(t *testing.T) {
	f := newRLS(t, Config{})
	resp := f.call(t, &rlspb.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{
		desc("k", "a"), desc("blocked", "x"), desc("ldap", "y"), desc("nothing", "z"),
	}})
	if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("overall %v; want OVER_LIMIT", resp.OverallCode)
	}
	checkStatus(t, "k", resp.Statuses[0], rlspb.RateLimitResponse_OK, 2, 26)
	checkStatus(t, "blocked", resp.Statuses[1], rlspb.RateLimitResponse_OVER_LIMIT, 0, 1)
	if st := resp.Statuses[2]; st.Code != rlspb.RateLimitResponse_OK || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
		t.Fatalf("unlimited: %v", st)
	}
	if st := resp.Statuses[3]; st.Code != rlspb.RateLimitResponse_OK || st.CurrentLimit != nil || st.LimitRemaining != 0 {
		t.Fatalf("no limit: %v", st)
	}
	// The OK descriptor was counted all the same, as in envoyproxy.
	checkStatus(t, "k again", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 1, 26)
}

func TestRLSReplaces(t *testing.T) {
	f := newRLS(t, Config{})
	both := &rlspb.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{
		desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps"),
	}}
	resp := f.call(t, both)
	if st := resp.Statuses[0]; st.CurrentLimit != nil {
		t.Fatalf("replaced limit answered %v", st)
	}
	checkStatus(t, "replacing", resp.Statuses[1], rlspb.RateLimitResponse_OK, 9, 1)
	// The replaced limit was not counted: alone it has all its 5.
	st := f.one(t, desc("key_1", "value_1", "user", "bkthomps"))
	checkStatus(t, "specific alone", st, rlspb.RateLimitResponse_OK, 4, 1)
	if st.CurrentLimit.Name != "specific_limit" {
		t.Fatalf("name %q", st.CurrentLimit.Name)
	}
}

func TestRLSOtherAlgorithm(t *testing.T) {
	f := newRLS(t, Config{})
	// token_bucket, 10 per second with a burst of 2.
	checkStatus(t, "1", f.one(t, desc("bucket", "a")), rlspb.RateLimitResponse_OK, 1, 1)
	checkStatus(t, "2", f.one(t, desc("bucket", "a")), rlspb.RateLimitResponse_OK, 0, 1)
	if st := f.one(t, desc("bucket", "a")); st.Code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("3rd at once: %v", st)
	}
	f.clock.ms.Add(100) // one token back
	if st := f.one(t, desc("bucket", "a")); st.Code != rlspb.RateLimitResponse_OK {
		t.Fatalf("after 100 ms: %v", st)
	}
}

func TestRLSResponseHeaders(t *testing.T) {
	f := newRLS(t, Config{})
	if h := f.call(t, &rlspb.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a")}}).ResponseHeadersToAdd; len(h) != 0 {
		t.Fatalf("headers without --rls-response-headers: %v", h)
	}
	f = newRLS(t, Config{RLS: envoy.Config{ResponseHeaders: true}})
	headers := func(r *rlspb.RateLimitResponse) map[string]string {
		m := map[string]string{}
		for _, h := range r.ResponseHeadersToAdd {
			m[h.Key] = h.Value
		}
		return m
	}
	two := &rlspb.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("hourly", "x"), desc("k", "a"), desc("nothing", "y")}}
	got := headers(f.call(t, two))
	want := map[string]string{"RateLimit-Limit": "3", "RateLimit-Remaining": "2", "RateLimit-Reset": "26"}
	for k, v := range want {
		if got[k] != v || len(got) != 3 {
			t.Fatalf("headers %v; want %v (the descriptor closest to its limit)", got, want)
		}
	}
	f.call(t, two)
	f.call(t, two)
	got = headers(f.call(t, two)) // k is over
	if got["RateLimit-Remaining"] != "0" || got["RateLimit-Limit"] != "3" {
		t.Fatalf("headers when over: %v", got)
	}
	if h := f.call(t, &rlspb.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("nothing", "y")}}).ResponseHeadersToAdd; len(h) != 0 {
		t.Fatalf("headers without a limit: %v", h)
	}
}

func TestRLSBadRequests(t *testing.T) {
	f := newRLS(t, Config{})
	for _, req := range []*rlspb.RateLimitRequest{
		{Domain: "", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a")}},
		{Domain: "test"},
	} {
		_, err := f.client.ShouldRateLimit(context.Background(), req)
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%v: err %v; want InvalidArgument", req, err)
		}
	}
}

func TestRLSReload(t *testing.T) {
	dir := rlsConfigDir(t, rlsYAML)
	f := newRLS(t, Config{RLS: envoy.Config{Dir: dir}})
	checkStatus(t, "before", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 2, 26)
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte("domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.srv.ReloadRLS(); err != nil {
		t.Fatal(err)
	}
	checkStatus(t, "after", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 6, 26)
	if err := os.WriteFile(filepath.Join(dir, "bad.yml"), []byte("domain: other\nfoo: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.srv.ReloadRLS(); err == nil {
		t.Fatal("a bad file was loaded")
	}
	checkStatus(t, "kept", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 5, 26)
	if f.srv.rls.Info().Reloads != 1 || f.srv.rls.Info().ReloadFailures != 1 {
		t.Fatalf("reloads %d failures %d", f.srv.rls.Info().Reloads, f.srv.rls.Info().ReloadFailures)
	}
}

func TestRLSMetrics(t *testing.T) {
	f := newRLS(t, Config{})
	for i := 0; i < 5; i++ {
		f.one(t, desc("k", "a"))
	}
	m := rlsMetrics(t, f.srv, "test", "k")
	// 3 within (the 3rd past 80 % of 3, i.e. 2), 2 over.
	if m["total_hits"] != 5 || m["within_limit"] != 3 || m["near_limit"] != 1 || m["over_limit"] != 2 || m["shadow_mode"] != 0 {
		t.Fatalf("metrics %v", m)
	}
	f.one(t, desc("detailed", "v1"))
	f.one(t, desc("detailed", "v2"))
	if m := rlsMetrics(t, f.srv, "test", "detailed_v1"); m["total_hits"] != 1 {
		t.Fatalf("detailed metric: %v", m)
	}
	if m := rlsMetrics(t, f.srv, "test", "detailed"); m["total_hits"] != 0 {
		t.Fatalf("configured key of a detailed metric: %v", m)
	}
}

// rlsMetrics gathers the sluice_rls_* counters of one domain and key.
func rlsMetrics(t testing.TB, srv *Server, domain, key string) map[string]float64 {
	t.Helper()
	mfs, err := srv.http.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		name := mf.GetName()
		if len(name) < 11 || name[:11] != "sluice_rls_" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label(m, "domain") == domain && label(m, "key") == key {
				out[name[11:]] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestRLSHealth(t *testing.T) {
	disk := storage.NewMemDisk()
	store, err := storage.Open("db", storage.Options{Sync: storage.SyncAlways, Disk: disk})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Store: store, RLS: envoy.Config{Dir: rlsConfigDir(t, rlsYAML)}, Clock: newTestClock(rlsT0).now})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, store)
	cc := dialRLS(t, startRLS(t, srv), nil)
	h, cl := healthpb.NewHealthClient(cc), rlspb.NewRateLimitServiceClient(cc)
	expect := func(when string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
			resp, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || resp.Status != want {
				t.Fatalf("health %q %s: %v %v; want %v", svc, when, resp, err, want)
			}
		}
	}
	call := func() error {
		_, err := cl.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a")}})
		return err
	}
	expect("at start", healthpb.HealthCheckResponse_SERVING)
	// The disk fills: the call's write fails, the store takes no more
	// writes, and the service says so until the retried write goes
	// through.
	disk.FailWrites(fmt.Errorf("injected: %w", syscall.ENOSPC))
	if err := call(); status.Code(err) != codes.Unavailable {
		t.Fatalf("a call as the disk fills: %v; want UNAVAILABLE", err)
	}
	expect("with the store unavailable", healthpb.HealthCheckResponse_NOT_SERVING)
	disk.FailWrites(nil)
	for store.Unavailable() != nil { // the store retries the write by itself
		runtime.Gosched()
	}
	expect("after the disk recovered", healthpb.HealthCheckResponse_SERVING)
	if err := call(); err != nil {
		t.Fatalf("a call after the disk recovered: %v", err)
	}
}

func TestRLSTLS(t *testing.T) {
	pki := newTestPKI(t)
	f := newRLS(t, Config{Listen: admit.Config{TLS: &admit.TLSFiles{Cert: pki.cert, Key: pki.key, CA: pki.ca}}})
	ctx := context.Background()
	req := &rlspb.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a")}}
	withCert := credentials.NewTLS(&tls.Config{RootCAs: pki.caPool, Certificates: []tls.Certificate{pki.client}, MinVersion: tls.VersionTLS12})
	if _, err := rlspb.NewRateLimitServiceClient(dialRLS(t, f.addr, withCert)).ShouldRateLimit(ctx, req); err != nil {
		t.Fatalf("with a client certificate: %v", err)
	}
	noCert := credentials.NewTLS(&tls.Config{RootCAs: pki.caPool, MinVersion: tls.VersionTLS12})
	if _, err := rlspb.NewRateLimitServiceClient(dialRLS(t, f.addr, noCert)).ShouldRateLimit(ctx, req); err == nil {
		t.Fatal("served a client without a certificate")
	}
	if _, err := f.client.ShouldRateLimit(ctx, req); err == nil {
		t.Fatal("served a plain-text client")
	}
	// Renewal: new files and ReloadTLS (SIGHUP); new connections get the
	// new certificate, verified against the new CA.
	renewed := newTestPKI(t)
	for src, dst := range map[string]string{renewed.cert: pki.cert, renewed.key: pki.key, renewed.ca: pki.ca} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.srv.ReloadTLS(); err != nil {
		t.Fatal(err)
	}
	newCreds := credentials.NewTLS(&tls.Config{RootCAs: renewed.caPool, Certificates: []tls.Certificate{renewed.client}, MinVersion: tls.VersionTLS12})
	if _, err := rlspb.NewRateLimitServiceClient(dialRLS(t, f.addr, newCreds)).ShouldRateLimit(ctx, req); err != nil {
		t.Fatalf("after the reload, with the new CA and client certificate: %v", err)
	}
	if _, err := rlspb.NewRateLimitServiceClient(dialRLS(t, f.addr, withCert)).ShouldRateLimit(ctx, req); err == nil {
		t.Fatal("after the reload, a client trusting only the old CA was served")
	}
}

// fakeRemoteListener makes every client look remote.
type fakeRemoteListener struct{ net.Listener }

type fakeRemoteConn struct{ net.Conn }

func (l fakeRemoteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return fakeRemoteConn{c}, nil
}

func (fakeRemoteConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 4000}
}

func TestRLSProtectedMode(t *testing.T) {
	for _, tc := range []struct {
		cfg    Config
		served bool
	}{
		{Config{}, false},
		{Config{Listen: admit.Config{Password: "x"}}, false}, // the password protects RESP; RLS has none
		{Config{Listen: admit.Config{AllowRemoteWithoutAuth: true}}, true},
	} {
		tc.cfg.RLS.Dir = rlsConfigDir(t, rlsYAML)
		srv := startServer(t, tc.cfg)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.ServeRLS(fakeRemoteListener{ln}) }()
		t.Cleanup(func() { srv.Close(); <-done })
		c := rlspb.NewRateLimitServiceClient(dialRLS(t, ln.Addr().String(), nil))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a")}})
		cancel()
		if (err == nil) != tc.served {
			t.Fatalf("%+v: err %v; want served %v", tc.cfg, err, tc.served)
		}
		if !tc.served && srv.stats.RejectedDenied.Load() == 0 {
			t.Fatalf("%+v: no protected-mode refusal counted", tc.cfg)
		}
	}
}

func BenchmarkRLSShouldRateLimit(b *testing.B) {
	clock := newTestClock(rlsT0)
	srv := startServer(b, Config{RLS: envoy.Config{Dir: rlsConfigDir(b, rlsYAML)}, Clock: clock.now})
	req := &rlspb.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{desc("detailed", "a")}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := srv.rls.ShouldRateLimit(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

func TestRLSMaxMessage(t *testing.T) {
	f := newRLS(t, Config{RLS: envoy.Config{MaxMessage: 512}})
	big := desc("k", strings.Repeat("x", 600))
	_, err := f.client.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{big}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 600-byte request with --rls-max-message 512: %v; want ResourceExhausted", err)
	}
	checkStatus(t, "a small one", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 2, 26)
}

func TestRLSMaxKeySize(t *testing.T) {
	f := newRLS(t, Config{Engine: engine.Tuning{MaxKeySize: 100}})
	// The first descriptor fits, the second does not: the request is
	// refused as a whole and counts nothing.
	_, err := f.client.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a"), desc("k", strings.Repeat("x", 200))}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptor 1: the key of its entries is 204 bytes, longer than --max-key-size 100") {
		t.Fatalf("a descriptor longer than --max-key-size: %v; want InvalidArgument naming descriptor 1", err)
	}
	checkStatus(t, "nothing counted", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 2, 26)
}

func TestRLSSlidingLogTakesOneHit(t *testing.T) {
	f := newRLS(t, Config{RLS: envoy.Config{Dir: rlsConfigDir(t, "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - key: log\n    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_log}\n")}})
	d := desc("log", "a")
	d.HitsAddend = wrapperspb.UInt64(2)
	_, err := f.client.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a"), d}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptor 1: hits_addend 2; a sliding_log limit counts one request at a time") {
		t.Fatalf("hits_addend 2 on a sliding_log: %v", err)
	}
	checkStatus(t, "nothing counted", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 2, 26)
	for i := uint32(1); i <= 3; i++ {
		checkStatus(t, "log", f.one(t, desc("log", "a")), rlspb.RateLimitResponse_OK, 3-i, 60)
	}
	if st := f.one(t, desc("log", "a")); st.Code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th on the log: %v", st)
	}
}

// TestRLSHealthWatchEndsAtClose: a Watch stream says SERVING, then
// NOT_SERVING when the server closes, and ends, so that it does not hold
// the graceful stop until the shutdown timeout.
func TestRLSHealthWatchEndsAtClose(t *testing.T) {
	f := newRLS(t, Config{Listen: admit.Config{ShutdownTimeout: time.Hour}})
	h := healthpb.NewHealthClient(dialRLS(t, f.addr, nil))
	// The deadline is a guard: a stream that does not end at Close ends
	// with DeadlineExceeded instead of Unavailable.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := h.Watch(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := w.Recv(); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first: %v %v", resp, err)
	}
	unknown, err := h.Watch(ctx, &healthpb.HealthCheckRequest{Service: "no.such.Service"})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := unknown.Recv(); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVICE_UNKNOWN {
		t.Fatalf("unknown service: %v %v", resp, err)
	}
	closed := make(chan struct{})
	go func() {
		f.srv.Close()
		close(closed)
	}()
	if resp, err := w.Recv(); err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("at close: %v %v", resp, err)
	}
	if _, err := w.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("the stream ended with %v; want Unavailable, as the server closed", err)
	}
	<-closed
}

// TestRLSCounterNotReachableFromHIT: a divvy rule with the same operation,
// algorithm, numbers and actor field as an Envoy limit, hit with the
// descriptor's encoding as its actor, does not take from the Envoy
// descriptor's counter: the two identities differ by their source.
func TestRLSCounterNotReachableFromHIT(t *testing.T) {
	ini := policyFile(t, "p.ini", "[domain=d descriptor=*]\nalgorithm = fixedWindow\ncreditLimit = 2\nresetSeconds = 3600\nactorField = descriptor\n\n[default]\ncreditLimit = 100\nresetSeconds = 60\n")
	f := newRLS(t, Config{Policy: policycmd.Config{File: ini}, RLS: envoy.Config{Dir: rlsConfigDir(t, "domain: d\ndescriptors:\n  - key: \"*\"\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")}})
	// rls.AppendDescriptor of the descriptor (*, v): each string with its
	// length in front.
	for i := range 2 {
		if out, pos, err := hitDirect(t, f.srv, "domain=d descriptor=\x01*\x01v", 1); err != nil || !out.Allowed || pos != 1 {
			t.Fatalf("HIT %d on the divvy rule: allowed %v, rule %d, %v", i+1, out.Allowed, pos, err)
		}
	}
	resp := f.call(t, &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{desc("*", "v")}})
	checkStatus(t, "the Envoy descriptor after two HITs on a divvy rule alike", resp.Statuses[0], rlspb.RateLimitResponse_OK, 1, 3600-(rlsT0/1000)%3600)
}

// TestRLSGCRAHitsAddendOverBurstIsOverLimit: a hits_addend larger than a
// gcra limit's burst can never pass: it is OVER_LIMIT, takes nothing and
// reports the counter as it is, whatever its size (before, one past the
// arithmetic's bound failed the whole call with INVALID_ARGUMENT, after
// the descriptors before it were counted). The other descriptors of the
// call are counted, as for any call that is denied.
func TestRLSGCRAHitsAddendOverBurstIsOverLimit(t *testing.T) {
	f := newRLS(t, Config{RLS: envoy.Config{Dir: rlsConfigDir(t, "domain: test\ndescriptors:\n  - key: fw\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: gc\n    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: gcra}\n")}})
	hitsDesc := func(k, v string, n uint64) *rlcommon.RateLimitDescriptor {
		d := desc(k, v)
		d.HitsAddend = wrapperspb.UInt64(n)
		return d
	}
	for _, huge := range []uint64{11, 1 << 40, math.MaxInt64, math.MaxUint64} {
		v := strconv.FormatUint(huge, 10)
		checkStatus(t, "5 hits", f.one(t, hitsDesc("gc", v, 5)), rlspb.RateLimitResponse_OK, 5, 1800)
		// 5 taken at one per 360 s: the allowance is whole in 1800 s.
		checkStatus(t, v+" hits at once", f.one(t, hitsDesc("gc", v, huge)), rlspb.RateLimitResponse_OVER_LIMIT, 0, 1800)
		checkStatus(t, "1 more", f.one(t, desc("gc", v)), rlspb.RateLimitResponse_OK, 4, 2160)
	}
	// With a descriptor before it: the call is answered, and that one
	// counted.
	resp := f.call(t, &rlspb.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("fw", "p"), hitsDesc("gc", "p", 1<<40)}})
	if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 9 {
		t.Fatalf("fw and a gcra over its burst: %v", resp)
	}
}

// TestRLSMetricsSaturate: hits_addend may be up to 2^64-1 (taken as
// 2^63-1); the per-limit counters stop at 2^63-1 instead of wrapping to
// negative values, which Prometheus would read as a counter reset.
func TestRLSMetricsSaturate(t *testing.T) {
	f := newRLS(t, Config{})
	for range 2 {
		d := desc("hourly", "v")
		d.HitsAddend = wrapperspb.UInt64(math.MaxUint64)
		f.one(t, d)
	}
	m := rlsMetrics(t, f.srv, "test", "hourly")
	if m["total_hits"] != math.MaxInt64 || m["over_limit"] != math.MaxInt64 {
		t.Errorf("after two calls of hits_addend 2^64-1: %v; want total_hits and over_limit 2^63-1", m)
	}
}

// TestRLSOverrideUnknownUnitIsRefused: a limit override whose unit is
// UNKNOWN or not in Envoy's enum fails the call with INVALID_ARGUMENT
// (envoyproxy/ratelimit fails it too) and counts nothing; before, the
// descriptor silently had no limit at all, its configured one dropped.
func TestRLSOverrideUnknownUnitIsRefused(t *testing.T) {
	f := newRLS(t, Config{})
	for _, unit := range []typev3.RateLimitUnit{typev3.RateLimitUnit_UNKNOWN, typev3.RateLimitUnit(99)} {
		d := desc("k", "a")
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: unit}
		_, err := f.client.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a"), d}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptor 1: limit override unit") {
			t.Errorf("override with unit %v: %v; want INVALID_ARGUMENT naming descriptor 1 and the unit", unit, err)
		}
	}
	checkStatus(t, "the configured limit after the refused calls", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 2, 60-(rlsT0/1000)%60)
}

// TestPolicyReloadReloadsRLSConfig: POLICY RELOAD reloads --rls-config as
// SIGHUP does, with or without a --policy: a good directory is put in use,
// a bad one is refused naming --rls-config and kept; INFO policy reports
// the configuration and its reloads.
func TestPolicyReloadReloadsRLSConfig(t *testing.T) {
	for _, withPolicy := range []bool{false, true} {
		t.Run(fmt.Sprintf("policy=%v", withPolicy), func(t *testing.T) {
			dir := rlsConfigDir(t, rlsYAML)
			cfg := Config{RLS: envoy.Config{Dir: dir}}
			if withPolicy {
				cfg.Policy.File = policyFile(t, "p.ini", "[default]\ncreditLimit = 5\nresetSeconds = 60\n")
			}
			f := newRLS(t, cfg)
			c := newClient(t, f.srv)
			ctx := context.Background()
			checkStatus(t, "before", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 2, 26)
			if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte("domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := c.Do(ctx, "POLICY", "RELOAD").Err(); err != nil {
				t.Fatalf("POLICY RELOAD: %v", err)
			}
			checkStatus(t, "after POLICY RELOAD", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 6, 26)
			if err := os.WriteFile(filepath.Join(dir, "bad.yml"), []byte("domain: other\nfoo: 1\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := c.Do(ctx, "POLICY", "RELOAD").Err(); err == nil || !strings.Contains(err.Error(), "--rls-config: ") || !strings.Contains(err.Error(), "bad.yml") || !strings.Contains(err.Error(), "configuration in use is kept") {
				t.Fatalf("POLICY RELOAD of a bad --rls-config: %v", err)
			}
			checkStatus(t, "kept", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 5, 26)
			info, err := c.Info(ctx, "policy").Result()
			for _, want := range []string{"rls_config_dir:" + dir + "\r\n", "rls_limits:1\r\n", "rls_reloads:1\r\n", "rls_reload_failures:1\r\n", "rls_loaded_at:"} {
				if err != nil || !strings.Contains(info, want) {
					t.Fatalf("INFO policy: %q, %v; want %q", info, err, want)
				}
			}
		})
	}
}
