package server

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/policycmd"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rlsClusterYAML has a limit of 2 per hour of each algorithm that takes
// hits_addend, and a configured limit a request may override.
const rlsClusterYAML = `
domain: test
descriptors:
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tb
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: token_bucket}
  - key: gcra
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: gcra}
  - key: plan
    rate_limit: {unit: hour, requests_per_unit: 5, max_requests_per_unit: 5}
`

// TestRLSClusterCountsEveryCounter: two cluster nodes load the same
// --rls-config, with or without a --policy next to it. Through either
// node, every descriptor value, whichever node owns its counter's slot,
// answers as a standalone server: OK, OK, OVER_LIMIT for a limit of 2
// (and for a request's override of 2 on a limit that allows overrides,
// and for Envoy's own override). Before, the owner looked the forwarded
// rule up by position in the divvy rules: "no policy loaded" without
// --policy, another rule with one.
func TestRLSClusterCountsEveryCounter(t *testing.T) {
	for _, withPolicy := range []bool{false, true} {
		t.Run(fmt.Sprintf("policy=%v", withPolicy), func(t *testing.T) {
			cfg := Config{RLS: envoy.Config{Dir: rlsConfigDir(t, rlsClusterYAML)}, Clock: newTestClock(rlsT0).now}
			if withPolicy {
				cfg.Policy.File = filepath.Join("..", "policy", "testdata", "algorithms.ini")
			}
			nodes := startClusterServers(t, 2, cfg)
			clients := []rlspb.RateLimitServiceClient{
				rlspb.NewRateLimitServiceClient(dialRLS(t, startRLS(t, nodes[0]), nil)),
				rlspb.NewRateLimitServiceClient(dialRLS(t, startRLS(t, nodes[1]), nil)),
			}
			bad := 0
			for _, key := range []string{"fw", "tb", "gcra", "plan", "envoy-override"} {
				for i := range 20 {
					d := desc(key, fmt.Sprintf("user%d", i))
					switch key {
					case "plan":
						d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
					case "envoy-override": // no configured limit: Envoy's override rule
						d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
					}
					var got []string
					for j := range 3 {
						resp, err := clients[(i+j)%2].ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
						if err != nil {
							got = append(got, "error: "+err.Error())
							continue
						}
						got = append(got, fmt.Sprintf("%v %d", resp.OverallCode, resp.Statuses[0].LimitRemaining))
					}
					if want := "[OK 1 OK 0 OVER_LIMIT 0]"; fmt.Sprint(got) != want {
						if bad++; bad <= 3 {
							t.Errorf("%s=user%d, three calls alternating between the nodes: %v; want %s", key, i, got, want)
						}
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of 100 descriptor values answered wrongly", bad)
			}
		})
	}
}

// TestRLSClusterOwnerDownIsUnavailable: when the node owning a
// descriptor's counter is down, the call fails with UNAVAILABLE, as a
// store that takes no writes (Envoy's failure_mode_deny decides), not
// INVALID_ARGUMENT, which would blame the request; the message still names
// the slot and the owner. Counters owned here still answer. GET /check
// answers 503 for the same failure.
func TestRLSClusterOwnerDownIsUnavailable(t *testing.T) {
	cfg := Config{RLS: envoy.Config{Dir: rlsConfigDir(t, rlsClusterYAML)}, Clock: newTestClock(rlsT0).now,
		Policy: policycmd.Config{File: policyFile(t, "check.ini", checkPolicy)}, Check: check.Config{IdentityHeader: "X-User"}}
	nodes := startClusterServers(t, 2, cfg)
	cl := rlspb.NewRateLimitServiceClient(dialRLS(t, startRLS(t, nodes[0]), nil))
	check := startCheck(t, nodes[0])
	nodes[1].Close()
	seen := map[codes.Code]int{}
	for i := range 20 {
		_, err := cl.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{desc("fw", fmt.Sprintf("user%d", i))}})
		code := status.Code(err)
		seen[code]++
		if code == codes.Unavailable && !strings.Contains(status.Convert(err).Message(), "to its owner "+nodes[1].cfg.Cluster.Node.Self+" failed") {
			t.Errorf("owner down: %v; want the message to name the owner", err)
		}
	}
	if seen[codes.OK] == 0 || seen[codes.Unavailable] == 0 || len(seen) != 2 {
		t.Errorf("20 descriptors, half owned by the node that is down: codes %v; want OK and Unavailable only", seen)
	}
	down := 0
	for i := range 20 {
		resp := checkGet(t, "GET", check+"/check", fmt.Sprintf("X-User: user%d", i))
		switch resp.StatusCode {
		case http.StatusServiceUnavailable:
			down++
		case http.StatusOK:
		default:
			t.Errorf("GET /check with the owner down: %d; want 200 or 503", resp.StatusCode)
		}
	}
	if down == 0 {
		t.Errorf("GET /check: no 503 for 20 clients, half owned by the node that is down")
	}
}
