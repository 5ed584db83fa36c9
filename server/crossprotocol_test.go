package server

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/logrec"
)

// TestCrossProtocolClosed: a connection that sends POST or Host: as a
// command, as an HTTP request to the RESP port does, is closed at once, as
// Redis closes it: before AUTH, inside MULTI, inline or in RESP, without
// running what follows and without answering them. It is counted, and
// logged at most once a minute; other clients are served on.
func TestCrossProtocolClosed(t *testing.T) {
	logs := &logrec.Recorder{Level: slog.LevelWarn}
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix())
	srv := startServer(t, Config{Listen: admit.Config{Password: "s3cret"}, Logger: slog.New(logs), Clock: func() time.Time { return time.Unix(now.Load(), 0) }})
	ctx := context.Background()
	good := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), Password: "s3cret", MaxRetries: -1})
	defer good.Close()
	if err := good.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	attack := func(name, in string) {
		t.Helper()
		c := rawConn(t, srv)
		if _, err := io.WriteString(c, in); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c) // until the server closes it
		if err != nil {
			t.Fatalf("%s: the connection was not closed: %v (read %q)", name, err, got)
		}
		for _, never := range []string{"'POST'", "'post'", "'Host:'", "'host:'", "'HOST:'", "QUEUED", ":10"} {
			if strings.Contains(string(got), never) {
				t.Errorf("%s: answered %q", name, got)
			}
		}
	}
	attack("POST before AUTH", "POST /x HTTP/1.1\r\nHost: sluice\r\nContent-Length: 20\r\n\r\nRL.REDUCE k1 10 60\r\n")
	attack("GET's Host header", "GET / HTTP/1.1\r\nhost: sluice\r\n\r\nAUTH s3cret\r\nRL.REDUCE k2 10 60\r\n")
	attack("RESP", "AUTH s3cret\r\n*2\r\n$5\r\nHOST:\r\n$1\r\nx\r\n*4\r\n$9\r\nRL.REDUCE\r\n$2\r\nk3\r\n$2\r\n10\r\n$2\r\n60\r\n")
	attack("in MULTI", "AUTH s3cret\r\nMULTI\r\npost\r\nRL.REDUCE k4 10 60\r\nEXEC\r\n")
	if n, err := good.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Errorf("DBSIZE %d, %v: a command sent after POST or Host: ran", n, err)
	}
	stat := func() string {
		info, err := good.Info(ctx, "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		_, v, _ := strings.Cut(info, "cross_protocol_closed:")
		v, _, _ = strings.Cut(v, "\r\n")
		return v
	}
	if got := stat(); got != "4" {
		t.Errorf("INFO stats cross_protocol_closed %q, want 4", got)
	}
	warnings := func() int {
		n := 0
		for _, r := range logs.Records() {
			if strings.Contains(r["msg"], "SECURITY ATTACK") && strings.HasPrefix(r["remote"], "127.0.0.1:") {
				n++
			}
		}
		return n
	}
	if n := warnings(); n != 1 {
		t.Errorf("4 attacks within a minute logged %d warnings, want 1", n)
	}
	now.Add(61)
	attack("a minute later", "POST / HTTP/1.0\r\n\r\n")
	if n := warnings(); n != 2 {
		t.Errorf("an attack over a minute after the last warning: %d warnings, want 2", n)
	}
}
