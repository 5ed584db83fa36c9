package check

import (
	"log/slog"
	"net"
	"testing"

	"github.com/sluicehq/sluice/internal/logrec"
)

// TestWarnIfProtected: /check served where other machines can reach it
// logs that protected mode answers proxies on loopback only, unless it is
// off; on loopback it logs nothing.
func TestWarnIfProtected(t *testing.T) {
	for _, tc := range []struct {
		addr        string
		allowRemote bool
		warn        bool
	}{
		{"192.0.2.1:8081", false, true},
		{"0.0.0.0:8081", false, true},
		{"192.0.2.1:8081", true, false},
		{"127.0.0.1:8081", false, false},
		{"[::1]:8081", false, false},
	} {
		rec := &logrec.Recorder{Level: slog.LevelWarn}
		h := New(Config{}, Options{AllowRemote: tc.allowRemote})
		a, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		h.WarnIfProtected(slog.New(rec), a)
		recs := rec.Records()
		if got := len(recs) == 1; got != tc.warn || len(recs) > 1 {
			t.Errorf("%s, AllowRemote %v: logged %v, want a warning %v", tc.addr, tc.allowRemote, recs, tc.warn)
			continue
		}
		if tc.warn && (recs[0]["msg"] != "protected mode: /check answers proxies on loopback only (or, with --tls-ca, proxies that present a client certificate); set --protected-mode no to serve others" || recs[0]["addr"] != tc.addr) {
			t.Errorf("%s: logged %v", tc.addr, recs[0])
		}
	}
}
