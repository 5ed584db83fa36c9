package httplimit

import (
	"net/http"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
)

// TestGitHubHeaders: the fields GitHub documents, from a Result with the
// same values. The examples are those of GitHub's REST API documentation
// ("Resources in the REST API", rate limiting: a request with 56 of 60
// left, and a refused one).
func TestGitHubHeaders(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  client.Result
		want http.Header
	}{
		{
			"x-ratelimit-limit: 60, remaining: 56, used: 4, reset: 1372700873",
			client.Result{Allowed: true, Limit: 60, Remaining: 56, Used: 4, RetryAfter: client.NoRetry, ResetAfter: 3000 * time.Second, ResetAt: time.Unix(1372700873, 0)},
			http.Header{
				"X-Ratelimit-Limit":     {"60"},
				"X-Ratelimit-Remaining": {"56"},
				"X-Ratelimit-Used":      {"4"},
				"X-Ratelimit-Reset":     {"1372700873"},
				"X-Ratelimit-Resource":  {"core"},
			},
		},
		{
			"exceeded: remaining 0, used 60, reset 1377013266, and Retry-After",
			client.Result{Allowed: false, Limit: 60, Remaining: 0, Used: 60, RetryAfter: 1800 * time.Second, ResetAfter: 1800 * time.Second, ResetAt: time.Unix(1377013266, 0)},
			http.Header{
				"X-Ratelimit-Limit":     {"60"},
				"X-Ratelimit-Remaining": {"0"},
				"X-Ratelimit-Used":      {"60"},
				"X-Ratelimit-Reset":     {"1377013266"},
				"X-Ratelimit-Resource":  {"core"},
				"Retry-After":           {"1800"},
			},
		},
		{
			"a reset instant between seconds is rounded up, as is Retry-After",
			client.Result{Allowed: false, Limit: 5, Remaining: 0, Used: 5, RetryAfter: 1500 * time.Millisecond, ResetAfter: 1500 * time.Millisecond, ResetAt: time.UnixMilli(1700000000500)},
			http.Header{
				"X-Ratelimit-Limit":     {"5"},
				"X-Ratelimit-Remaining": {"0"},
				"X-Ratelimit-Used":      {"5"},
				"X-Ratelimit-Reset":     {"1700000001"},
				"X-Ratelimit-Resource":  {"core"},
				"Retry-After":           {"2"},
			},
		},
		{
			"refused for good (cost above the limit): no Retry-After",
			client.Result{Allowed: false, Limit: 5, Remaining: 5, Used: 0, RetryAfter: client.NoRetry, ResetAt: time.Unix(1700000000, 0)},
			http.Header{
				"X-Ratelimit-Limit":     {"5"},
				"X-Ratelimit-Remaining": {"5"},
				"X-Ratelimit-Used":      {"0"},
				"X-Ratelimit-Reset":     {"1700000000"},
				"X-Ratelimit-Resource":  {"core"},
			},
		},
	} {
		got, err := Header(GitHubHeaders, "core", 60, time.Hour, tc.res)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %v\nwant %v", tc.name, got, tc.want)
		}
	}
}

// TestIETFHeaders: the examples of draft-ietf-httpapi-ratelimit-headers-10
// (sections 3.2 and 4.2), produced from Results and quotas with their
// values.
func TestIETFHeaders(t *testing.T) {
	for _, tc := range []struct {
		example      string
		name         string
		quota        int64
		window       time.Duration
		res          client.Result
		policy, rate string
	}{
		{
			`RateLimit-Policy: "default";q=100;w=10 / RateLimit: "default";r=50;t=30`,
			"default", 100, 10 * time.Second,
			client.Result{Allowed: true, Limit: 100, Remaining: 50, RetryAfter: client.NoRetry, ResetAfter: 30 * time.Second},
			`"default";q=100;w=10`, `"default";r=50;t=30`,
		},
		{
			`RateLimit-Policy: "permin";q=50;w=60 (its first item)`,
			"permin", 50, time.Minute,
			client.Result{Allowed: true, Limit: 50, Remaining: 1, RetryAfter: client.NoRetry, ResetAfter: 7 * time.Second},
			`"permin";q=50;w=60`, `"permin";r=1;t=7`,
		},
		{
			`RateLimit: "problemPolicy";r=0;t=10 (a refused request: t is its Retry-After)`,
			"problemPolicy", 5, time.Minute,
			client.Result{Allowed: false, Limit: 5, Remaining: 0, RetryAfter: 10 * time.Second, ResetAfter: 50 * time.Second},
			`"problemPolicy";q=5;w=60`, `"problemPolicy";r=0;t=10`,
		},
		{
			"sub-second windows round up to w=1; quotes and backslashes are escaped",
			`a"b\c`, 3, 200 * time.Millisecond,
			client.Result{Allowed: true, Limit: 3, Remaining: 3, RetryAfter: client.NoRetry},
			`"a\"b\\c";q=3;w=1`, `"a\"b\\c";r=3;t=0`,
		},
	} {
		got, err := Header(IETFHeaders, tc.name, tc.quota, tc.window, tc.res)
		if err != nil {
			t.Fatal(err)
		}
		want := http.Header{"Ratelimit-Policy": {tc.policy}, "Ratelimit": {tc.rate}}
		if !tc.res.Allowed {
			want["Retry-After"] = []string{"10"}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %v\nwant %v", tc.example, got, want)
		}
	}
	if _, err := Header(IETFHeaders, "caf\u00e9", 1, time.Second, client.Result{}); err == nil {
		t.Error("a non-ASCII policy name is accepted; a Structured Field String cannot hold it")
	}
	both, err := Header(BothHeaders, "default", 5, 300*time.Second, client.Result{Allowed: true, Limit: 5, Remaining: 4, Used: 1, RetryAfter: client.NoRetry, ResetAfter: 100 * time.Second, ResetAt: time.Unix(1700000100, 0)})
	if err != nil {
		t.Fatal(err)
	}
	want := http.Header{
		"X-Ratelimit-Limit": {"5"}, "X-Ratelimit-Remaining": {"4"}, "X-Ratelimit-Used": {"1"}, "X-Ratelimit-Reset": {"1700000100"}, "X-Ratelimit-Resource": {"default"},
		"Ratelimit-Policy": {`"default";q=5;w=300`}, "Ratelimit": {`"default";r=4;t=100`},
	}
	if !reflect.DeepEqual(both, want) {
		t.Errorf("BothHeaders:\n got %v\nwant %v", both, want)
	}
	none, _ := Header(NoHeaders, "default", 5, time.Minute, client.Result{Allowed: true})
	if len(none) != 0 {
		t.Errorf("NoHeaders: %v", none)
	}
}

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	for _, tc := range []struct {
		name   string
		remote string
		xff    []string
		want   string // "" for the zero Addr
	}{
		{"direct, no header", "203.0.113.7:51234", nil, "203.0.113.7"},
		{"untrusted peer: its X-Forwarded-For is ignored", "203.0.113.7:51234", []string{"198.51.100.1"}, "203.0.113.7"},
		{"through one trusted proxy", "10.0.0.2:443", []string{"198.51.100.1"}, "198.51.100.1"},
		{"two trusted hops", "10.0.0.2:443", []string{"198.51.100.1, 10.1.1.1"}, "198.51.100.1"},
		{"a spoofed leftmost entry is not taken", "10.0.0.2:443", []string{"6.6.6.6, 198.51.100.1"}, "198.51.100.1"},
		{"a spoofed trusted-looking entry behind the client", "10.0.0.2:443", []string{"10.9.9.9, 198.51.100.1, 10.1.1.1"}, "198.51.100.1"},
		{"several field lines are one list, in order", "10.0.0.2:443", []string{"6.6.6.6", "198.51.100.1, 10.1.1.1", "10.2.2.2"}, "198.51.100.1"},
		{"every hop trusted: the leftmost", "10.0.0.2:443", []string{"10.3.3.3, 10.1.1.1"}, "10.3.3.3"},
		{"trusted peer, no header: the peer", "10.0.0.2:443", nil, "10.0.0.2"},
		{"garbage stops the walk at the trusted hop right of it", "10.0.0.2:443", []string{"198.51.100.1, unknown, 10.1.1.1"}, "10.1.1.1"},
		{"empty entries are skipped", "10.0.0.2:443", []string{"198.51.100.1,, "}, "198.51.100.1"},
		{"entries with ports", "10.0.0.2:443", []string{"198.51.100.1:4711"}, "198.51.100.1"},
		{"IPv6 entries, bracketed or not", "[2001:db8:ffff::1]:443", []string{"[2001:db8:1:2::7]:80, 2001:db8:ffff::2"}, "2001:db8:1:2::7"},
		{"IPv6 in brackets without a port", "[2001:db8:ffff::1]:443", []string{"[2001:db8:1:2::7]"}, "2001:db8:1:2::7"},
		{"IPv4-mapped IPv6 peer is IPv4", "[::ffff:10.0.0.2]:443", []string{"198.51.100.1"}, "198.51.100.1"},
		{"zones are dropped", "[fe80::1%eth0]:443", nil, "fe80::1"},
		{"a Unix socket peer", "@", []string{"198.51.100.1"}, ""},
		{"a bad port is not an address", "10.0.0.2:443", []string{"198.51.100.1:http, 10.1.1.1"}, "10.1.1.1"},
		{"an IPv6 address with a port needs brackets", "10.0.0.2:443", []string{"[2001:db8::1]x"}, "10.0.0.2"},
		{"a bracketed IPv4 is not an address", "10.0.0.2:443", []string{"[198.51.100.1]"}, "10.0.0.2"},
	} {
		got := ClientIP(tc.remote, tc.xff, trusted)
		want := netip.Addr{}
		if tc.want != "" {
			want = netip.MustParseAddr(tc.want)
		}
		if got != want {
			t.Errorf("%s: ClientIP(%q, %q) = %v, want %v", tc.name, tc.remote, tc.xff, got, want)
		}
	}
}

func TestAppendIPKey(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		v4, v6 int
		want   string
	}{
		{"203.0.113.7", 32, 64, "203.0.113.7"},
		{"203.0.113.7", 24, 64, "203.0.113.0/24"},
		{"2001:db8:1:2:aaaa:bbbb:cccc:dddd", 32, 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:aaaa:bbbb:cccc:dddd", 32, 56, "2001:db8:1::/56"},
		{"2001:db8:1:2:aaaa:bbbb:cccc:dddd", 32, 128, "2001:db8:1:2:aaaa:bbbb:cccc:dddd"},
		{"", 32, 64, "unknown"},
	} {
		var a netip.Addr
		if tc.addr != "" {
			a = netip.MustParseAddr(tc.addr)
		}
		if got := string(AppendIPKey(nil, a, tc.v4, tc.v6)); got != tc.want {
			t.Errorf("AppendIPKey(%s, %d, %d) = %q, want %q", tc.addr, tc.v4, tc.v6, got, tc.want)
		}
	}
}
