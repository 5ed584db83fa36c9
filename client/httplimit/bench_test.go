package httplimit_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/client/httplimit"
	"github.com/sluicehq/sluice/client/internal/sluicetest"
)

// fwReply is an FW.PINCR reply: allowed, 5, 4 left, no retry, 100 s to
// the window's end, 1 used, ending at 1700000100000 ms.
const fwReply = "*7\r\n:0\r\n:5\r\n:4\r\n:-1\r\n:100000\r\n:1\r\n:1700000100000\r\n"

// fakeClient is a client whose go-redis connections answer every command
// with fwReply in memory: no network, no sluice.
func fakeClient(b *testing.B) *client.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr: "fake", Protocol: 2, DisableIdentity: true, PoolSize: 1,
		Dialer: func(context.Context, string, string) (net.Conn, error) { return sluicetest.NewConn(fwReply), nil },
	})
	b.Cleanup(func() { rdb.Close() })
	return client.New(rdb, client.Config{})
}

// discard is a ResponseWriter that keeps nothing but its header map,
// emptied for every request as net/http gives each response a new one.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkMiddleware is one request through the middleware in front of
// a handler that does nothing, with sluice replaced by an in-memory
// connection. Subtract BenchmarkTakeOnly (the same call to sluice through
// the client and go-redis) to get the middleware's own cost: the key, the
// client IP, the header values.
func BenchmarkMiddleware(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  httplimit.Config
		xff  string
	}{
		{"ip/github", httplimit.Config{}, ""},
		{"ip/both", httplimit.Config{Headers: httplimit.BothHeaders}, ""},
		{"ip-behind-proxy/github", httplimit.Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, "203.0.113.7, 10.1.1.1"},
		{"ipv6/github", httplimit.Config{}, ""},
		{"user/github", httplimit.Config{Identity: func(r *http.Request) string { return r.Header.Get("X-User") }}, ""},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := bc.cfg
			cfg.Client = fakeClient(b)
			cfg.Requests, cfg.Per = 5, 300*time.Second
			mw, err := httplimit.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			req := httptest.NewRequest("GET", "/api", nil)
			req.RemoteAddr = "203.0.113.7:51234"
			switch {
			case bc.xff != "":
				req.RemoteAddr = "10.0.0.2:443"
				req.Header.Set("X-Forwarded-For", bc.xff)
			case bc.name == "ipv6/github":
				req.RemoteAddr = "[2001:db8:1:2::7]:51234"
			}
			req.Header.Set("X-User", "alice")
			w := &discard{h: make(http.Header)}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, req)
				if w.h["X-Ratelimit-Remaining"][0] != "4" {
					b.Fatal(w.h)
				}
			}
		})
	}
}

// BenchmarkTakeOnly is the sluice call of BenchmarkMiddleware alone.
func BenchmarkTakeOnly(b *testing.B) {
	c := fakeClient(b)
	ctx := context.Background()
	lim := client.FixedWindow{Limit: 5, Window: 300 * time.Second}
	key := string([]byte("httplimit:ip:203.0.113.7")) // not a constant, as the middleware's
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Take(ctx, key, lim, 1); err != nil {
			b.Fatal(err)
		}
	}
}
