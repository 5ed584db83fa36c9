package respserver

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/logrec"
)

// TestAuthFailuresLoggedAtWarn: the first failure is logged at warn at
// once; later ones are summed up in one line per window, with how many
// failures from how many addresses.
func TestAuthFailuresLoggedAtWarn(t *testing.T) {
	logs := &logrec.Recorder{Level: slog.LevelWarn}
	srv := newTestServer(t, testOptions{Password: "s3cret", Logger: slog.New(logs)})
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: serveTest(t, srv), MaxRetries: -1})
	defer c.Close()
	authWarnings := func() []map[string]string {
		var out []map[string]string
		for _, r := range logs.Records() {
			if strings.HasPrefix(r["msg"], "authentication fail") {
				out = append(out, r)
			}
		}
		return out
	}
	if err := c.Do(ctx, "AUTH", "guess1").Err(); err == nil {
		t.Fatal("a wrong password was accepted")
	}
	recs := authWarnings()
	if len(recs) != 1 || recs[0]["level"] != "WARN" || !strings.HasPrefix(recs[0]["remote"], "127.0.0.1:") {
		t.Fatalf("after one failure, logged %v; want one warning naming the client's address", recs)
	}
	for i := range 3 {
		if err := c.Do(ctx, "AUTH", "guess"+strconv.Itoa(i+2)).Err(); err == nil {
			t.Fatal("a wrong password was accepted")
		}
	}
	if recs := authWarnings(); len(recs) != 1 {
		t.Fatalf("failures within the window logged one by one: %v", recs)
	}
	srv.authLog.flush(srv) // the window's end
	recs = authWarnings()
	if len(recs) != 2 || recs[1]["failures"] != "3" || recs[1]["addresses"] != "1" || recs[1]["failures_total"] != "4" {
		t.Fatalf("at the window's end logged %v; want a summary of 3 failures from 1 address", recs)
	}
	srv.authLog.flush(srv) // a quiet window: nothing to say
	if recs := authWarnings(); len(recs) != 2 {
		t.Fatalf("a quiet window logged %v", recs[2:])
	}
}
