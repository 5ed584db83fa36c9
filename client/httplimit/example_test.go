package httplimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/netip"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/client/httplimit"
)

// 100 requests per minute per user, or per client IP for anonymous
// requests, behind a load balancer in 10.0.0.0/8.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:9049"})
	limit, err := httplimit.New(httplimit.Config{
		Client:         client.New(rdb, client.Config{}),
		Requests:       100,
		Per:            time.Minute,
		Identity:       func(r *http.Request) string { return r.Header.Get("X-Authenticated-User") },
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	log.Fatal(http.ListenAndServe(":8080", limit(mux)))
}

// Any kind of limit: GCRA, 10 per second in bursts of 20, with the IETF
// draft's fields and problem+json refusals; health checks are not
// limited.
func ExampleConfig_gcra() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:9049"})
	limit, err := httplimit.New(httplimit.Config{
		Client:      client.New(rdb, client.Config{}),
		Limit:       client.GCRA{Count: 10, Period: time.Second, Burst: 20},
		Headers:     httplimit.IETFHeaders,
		PolicyName:  "api",
		ProblemJSON: true,
		Skip:        func(r *http.Request) bool { return r.URL.Path == "/healthz" },
		FailClosed:  true,
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = limit
}

// The fields of a refused request in both styles.
func ExampleHeader() {
	res := client.Result{Allowed: false, Limit: 5, Remaining: 0, Used: 6, RetryAfter: 95 * time.Second, ResetAfter: 95 * time.Second, ResetAt: time.Unix(1700000100, 0)}
	h, err := httplimit.Header(httplimit.BothHeaders, "default", 5, 300*time.Second, res)
	if err != nil {
		log.Fatal(err)
	}
	for _, k := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Used", "X-RateLimit-Reset", "X-RateLimit-Resource", "RateLimit-Policy", "RateLimit", "Retry-After"} {
		fmt.Printf("%s: %s\n", k, h.Get(k))
	}
	// Output:
	// X-RateLimit-Limit: 5
	// X-RateLimit-Remaining: 0
	// X-RateLimit-Used: 6
	// X-RateLimit-Reset: 1700000100
	// X-RateLimit-Resource: default
	// RateLimit-Policy: "default";q=5;w=300
	// RateLimit: "default";r=0;t=95
	// Retry-After: 95
}

// The client behind a trusted proxy is the rightmost address that is not
// a trusted proxy; the leftmost entry is whatever the client claimed.
func ExampleClientIP() {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	fmt.Println(httplimit.ClientIP("10.0.0.2:443", []string{"6.6.6.6, 203.0.113.9, 10.1.1.1"}, trusted))
	fmt.Println(httplimit.ClientIP("198.51.100.7:5000", []string{"6.6.6.6"}, trusted))
	// Output:
	// 203.0.113.9
	// 198.51.100.7
}
