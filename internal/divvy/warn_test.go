package divvy

import (
	"log/slog"
	"net"
	"testing"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/logrec"
)

// TestWarnUnauthenticated: the line protocol logs that it has neither
// AUTH nor TLS when the server's other front ends require either, and
// nothing when they do not.
func TestWarnUnauthenticated(t *testing.T) {
	a := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 7070}
	for _, authRequired := range []bool{true, false} {
		rec := &logrec.Recorder{Level: slog.LevelWarn}
		s := New(Config{Logger: slog.New(rec)}, nil, nil, host{}, Shared{Guard: admit.Guard{Password: authRequired}})
		s.WarnUnauthenticated(a)
		recs := rec.Records()
		switch {
		case !authRequired && len(recs) != 0:
			t.Errorf("no AUTH required: logged %v", recs)
		case authRequired && (len(recs) != 1 || recs[0]["msg"] != "the divvy line protocol has no AUTH and no TLS: anyone who can reach its address can use it" || recs[0]["addr"] != a.String()):
			t.Errorf("AUTH required: logged %v, want one warning naming %s", recs, a)
		}
	}
}
