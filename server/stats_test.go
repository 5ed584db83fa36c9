package server

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
)

// TestStatsTranscript replays resp/stats.txt on a server of its own with
// the rules of stats.ini, whose clock the transcript moves with DEBUG
// CLOCK-OFFSET.
func TestStatsTranscript(t *testing.T) {
	srv := startServer(t, Config{
		Clock:  newTestClock(transcriptTime).now,
		Policy: policycmd.Config{File: filepath.Join(transcriptDir, "stats.ini")},
		RESP:   respserver.Tuning{Debug: respserver.DebugLocal},
	})
	runRESPTranscript(t, srv, filepath.Join(transcriptDir, "resp", "stats.txt"))
}

// TestStatsOverHTTP: GET /v1/policy/stats/{label} answers POLICY STATS as
// JSON, with ?whatif=, behind /backup's password; bad input gets a 400
// naming it; /metrics has the histogram of peak used ÷ limit.
func TestStatsOverHTTP(t *testing.T) {
	var logs bytes.Buffer
	srv, c := policyServer(t, Config{RESP: respserver.Tuning{Debug: respserver.DebugLocal}}, "stats.ini", &logs)
	ctx := context.Background()
	for _, ip := range []string{"10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2"} {
		if err := c.Do(ctx, "HIT", "path=/api", "ip="+ip).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Do(ctx, "DEBUG", "CLOCK-OFFSET", "60000").Err(); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{"10.0.0.1", "10.0.0.2"} {
		if err := c.Do(ctx, "HIT", "path=/api", "ip="+ip).Err(); err != nil {
			t.Fatal(err)
		}
	}
	remote := "10.1.2.3:5000"
	checkPolicyRequests(t, srv, remote, []policyCase{
		{"GET", "/v1/policy/stats/api", "", "", 401, "WRONGPASS"},
		{"GET", "/v1/policy/stats/api", "pw", "", 200, `{"label":"api","from":"2023-10-16","to":"2023-11-14","windows":2,"windowsRefused":1,"actors":2,"actorsRefused":1,"actorsExact":true,"actorsStdErr":0,"peakMax":3,"peaks":[{"quantile":"p50","peak":1},{"quantile":"p90","peak":3},{"quantile":"p99","peak":3},{"quantile":"p99.9","peak":3}],"peakRelErr":0}`},
		{"GET", "/v1/policy/stats/api?whatif=2", "pw", "", 200, `"whatif":{"limit":2,"windows":0.5,"windowsErr":0,"actors":0.5,"actorsStdErr":0}}`},
		{"GET", "/v1/policy/stats/api?whatif=-1", "pw", "", 400, `limit is -1; expected a non-negative integer`},
		{"GET", "/v1/policy/stats/api?whatif=1.5", "pw", "", 400, `limit \"1.5\" is not an integer`},
		{"GET", "/v1/policy/stats/api?whatif=", "pw", "", 400, `limit \"\" is not an integer`},
		{"GET", "/v1/policy/stats/nope", "pw", "", 400, `label \"nope\" is not a label of the rules in use`},
		{"GET", "/v1/policy/stats/tb", "pw", "", 400, `the rule's threshold data are not kept: its algorithm, tokenBucket, has no windows`},
	})

	_, b := get(t, serveHTTPOn(t, srv)+"/metrics")
	for _, want := range []string{
		`sluice_policy_peak_used_ratio_bucket{label="api",le="0.25"} 0`,
		`sluice_policy_peak_used_ratio_bucket{label="api",le="0.5"} 1`,
		`sluice_policy_peak_used_ratio_bucket{label="api",le="1"} 2`,
		`sluice_policy_peak_used_ratio_count{label="api"} 2`,
	} {
		if !strings.Contains(b, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
