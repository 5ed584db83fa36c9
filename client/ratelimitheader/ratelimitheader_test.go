package ratelimitheader

import (
	"net/http"
	"reflect"
	"testing"
	"time"
)

func TestParseStyle(t *testing.T) {
	for _, s := range []Style{GitHub, IETF, Both, None} {
		got, err := ParseStyle(s.String())
		if err != nil || got != s {
			t.Errorf("ParseStyle(%q) = %v, %v", s.String(), got, err)
		}
	}
	if _, err := ParseStyle("GitHub"); err == nil {
		t.Error("ParseStyle(GitHub): no error")
	}
}

// TestSetBoth: a refusal in both styles, as the server's /check renders it
// for a divvy window of 5 per 300 s with 200 s left.
func TestSetBoth(t *testing.T) {
	f, err := New(Both, "per-user", 5, 300*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	f.Set(h, Result{Allowed: false, Limit: 5, Remaining: 0, Used: 5, RetryAfter: 200 * time.Second, ResetAfter: 200 * time.Second, ResetAt: time.Unix(1700000200, 0)})
	want := http.Header{
		"X-Ratelimit-Limit":     {"5"},
		"X-Ratelimit-Remaining": {"0"},
		"X-Ratelimit-Used":      {"5"},
		"X-Ratelimit-Reset":     {"1700000200"},
		"X-Ratelimit-Resource":  {"per-user"},
		"Ratelimit-Policy":      {`"per-user";q=5;w=300`},
		"Ratelimit":             {`"per-user";r=0;t=200`},
		"Retry-After":           {"200"},
	}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("got %v\nwant %v", h, want)
	}
	if _, err := New(GitHub, "caf\u00e9", 1, time.Second); err == nil {
		t.Error("a non-ASCII name: no error")
	}
}
