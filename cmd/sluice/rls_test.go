package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestRLSFlags(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	data := t.TempDir()
	err := run(context.Background(), []string{"--rls-addr", "127.0.0.1:0", "--data", data}, none, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--rls-addr needs --rls-config") {
		t.Fatalf("--rls-addr without --rls-config: %v", err)
	}
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "a.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = run(context.Background(), []string{"--rls-addr", "127.0.0.1:0", "--rls-config", bad, "--data", data}, none, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--rls-config: rls: "+filepath.Join(bad, "a.yaml")+":4: invalid rate limit unit 'fortnight'") {
		t.Fatalf("bad --rls-config: %v", err)
	}
}

func rlsClient(t *testing.T, addr string) rlspb.RateLimitServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return rlspb.NewRateLimitServiceClient(cc)
}

func shouldRateLimit(t *testing.T, c rlspb.RateLimitServiceClient, user string) *rlspb.RateLimitResponse_DescriptorStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: user}}},
	}})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp.Statuses[0]
}

// TestRLSLimitSurvivesRestart: a limit reached before SIGTERM is still
// reached after a restart on the same data directory, unlike
// envoyproxy/ratelimit with memcache or a Redis without persistence. The
// unit is a year, so that the test does not straddle a window's end.
func TestRLSLimitSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "rls")
	if err := os.Mkdir(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(rpu string) {
		t.Helper()
		yaml := "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: year\n      requests_per_unit: " + rpu + "\n"
		if err := os.WriteFile(filepath.Join(conf, "api.yaml.new"), []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(conf, "api.yaml.new"), filepath.Join(conf, "api.yaml")); err != nil {
			t.Fatal(err)
		}
	}
	write("3")
	flags := []string{"--rls-addr", "127.0.0.1:0", "--rls-config", conf}
	p := startProc(t, filepath.Join(dir, "data"), flags...)
	c := rlsClient(t, p.rlsAddr)
	for i := 0; i < 3; i++ {
		if st := shouldRateLimit(t, c, "alice"); st.Code != rlspb.RateLimitResponse_OK {
			t.Fatalf("hit %d: %v", i+1, st)
		}
	}
	if st := shouldRateLimit(t, c, "alice"); st.Code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th hit: %v", st)
	}
	if st := shouldRateLimit(t, c, "bob"); st.Code != rlspb.RateLimitResponse_OK || st.LimitRemaining != 2 {
		t.Fatalf("bob: %v", st)
	}
	p.stop(t, syscall.SIGTERM)
	if p.err != nil || !strings.Contains(p.logs.String(), "shutdown complete") {
		t.Fatalf("exit after SIGTERM: %v\n%s", p.err, p.logs)
	}

	p2 := startProc(t, filepath.Join(dir, "data"), flags...)
	c2 := rlsClient(t, p2.rlsAddr)
	if st := shouldRateLimit(t, c2, "alice"); st.Code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("alice after the restart: %v; want OVER_LIMIT", st)
	}
	if st := shouldRateLimit(t, c2, "bob"); st.Code != rlspb.RateLimitResponse_OK || st.LimitRemaining != 1 {
		t.Fatalf("bob after the restart: %v; want OK with 1 left", st)
	}

	// SIGHUP reloads the directory: a bad file is refused and counted,
	// the configuration in use stays.
	if err := os.WriteFile(filepath.Join(conf, "bad.yml"), []byte("domain: other\nunknown: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p2.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, p2, `sluice_rls_config_reloads_total{result="failed"} 1`)
	if st := shouldRateLimit(t, c2, "bob"); st.Code != rlspb.RateLimitResponse_OK || st.LimitRemaining != 0 {
		t.Fatalf("bob after a bad reload: %v", st)
	}
	p2.stop(t, syscall.SIGTERM)
	if !strings.Contains(p2.logs.String(), "rls config reload failed; keeping the configuration in use") {
		t.Fatalf("the failed reload was not logged:\n%s", p2.logs)
	}
}

// waitMetric polls /metrics until it shows line.
func waitMetric(t *testing.T, p *proc, line string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + p.httpAddr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), line+"\n") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics never showed %s", line)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
