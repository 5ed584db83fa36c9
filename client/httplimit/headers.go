package httplimit

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/client/ratelimitheader"
)

// HeaderStyle chooses the rate-limit header fields of every response. The
// fields are rendered by package ratelimitheader, which the sluice
// server's forward-auth endpoint uses too.
type HeaderStyle = ratelimitheader.Style

const (
	// GitHubHeaders are the fields GitHub's REST API sends:
	// X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Used,
	// X-RateLimit-Reset (the instant the limit is whole again, in Unix
	// seconds, rounded up) and X-RateLimit-Resource (the policy's name).
	// It is the zero HeaderStyle, the default.
	GitHubHeaders = ratelimitheader.GitHub
	// IETFHeaders are the RateLimit-Policy and RateLimit fields of the
	// IETF draft draft-ietf-httpapi-ratelimit-headers-10 (September 2025):
	// RateLimit-Policy: "name";q=<quota>;w=<window s> and
	// RateLimit: "name";r=<remaining>;t=<s until more quota>.
	IETFHeaders = ratelimitheader.IETF
	// BothHeaders sends the fields of both styles.
	BothHeaders = ratelimitheader.Both
	// NoHeaders sends none; a refused request still gets 429 and
	// Retry-After.
	NoHeaders = ratelimitheader.None
)

func newFields(style HeaderStyle, name string, lim client.Limit) (*ratelimitheader.Fields, error) {
	if style > NoHeaders {
		return nil, errors.New("httplimit: unknown HeaderStyle " + strconv.Itoa(int(style)))
	}
	quota, window := lim.Quota()
	f, err := ratelimitheader.New(style, name, quota, window)
	if err != nil {
		return nil, errors.New("httplimit: PolicyName: " + err.Error())
	}
	return f, nil
}

// PolicyField is the RateLimit-Policy value of a policy named by quoted (a
// Structured Field String, quotes included) allowing quota requests per
// window: "default";q=100;w=10. See ratelimitheader.PolicyField.
func PolicyField(quoted string, quota int64, window time.Duration) string {
	return ratelimitheader.PolicyField(quoted, quota, window)
}

// Header returns the fields a response carries for res: those of style
// for a policy named name allowing quota requests per window, and
// Retry-After when res is a refusal that waiting helps. The middleware
// sets the same fields; Header is for handlers that call the client
// themselves, and for tests.
func Header(style HeaderStyle, name string, quota int64, window time.Duration, res client.Result) (http.Header, error) {
	if style > NoHeaders {
		return nil, errors.New("httplimit: unknown HeaderStyle " + strconv.Itoa(int(style)))
	}
	f, err := ratelimitheader.New(style, name, quota, window)
	if err != nil {
		return nil, errors.New("httplimit: PolicyName: " + err.Error())
	}
	h := http.Header{}
	f.Set(h, ratelimitheader.Result(res))
	return h, nil
}
