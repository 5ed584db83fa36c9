// Package ratelimitheader renders the rate-limit header fields of an HTTP
// response: GitHub's X-RateLimit-* fields, the IETF draft's RateLimit and
// RateLimit-Policy, and Retry-After. It imports only the standard library,
// so that both the Go middleware (client/httplimit) and the sluice server's
// forward-auth endpoint use this one implementation without the server
// linking a Redis client.
package ratelimitheader

import (
	"errors"
	"net/http"
	"strconv"
	"time"
)

// Style chooses the rate-limit header fields of every response.
type Style uint8

const (
	// GitHub are the fields GitHub's REST API sends (documented in "Rate
	// limits for the REST API", "Checking the status of your rate limit"):
	// X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Used,
	// X-RateLimit-Reset (the instant the limit is whole again, in Unix
	// seconds, rounded up) and X-RateLimit-Resource (the policy's name).
	// It is the zero Style, the default.
	GitHub Style = iota
	// IETF are the RateLimit-Policy and RateLimit fields of the IETF
	// draft draft-ietf-httpapi-ratelimit-headers-10 (September 2025):
	// RateLimit-Policy: "name";q=<quota>;w=<window s> and
	// RateLimit: "name";r=<remaining>;t=<s until more quota>.
	IETF
	// Both sends the fields of both styles.
	Both
	// None sends none; a refused request still gets Retry-After.
	None
)

// ParseStyle parses the name of a style as flags and configuration files
// give it: github, ietf, both or none.
func ParseStyle(s string) (Style, error) {
	switch s {
	case "github":
		return GitHub, nil
	case "ietf":
		return IETF, nil
	case "both":
		return Both, nil
	case "none":
		return None, nil
	}
	return 0, errors.New("ratelimitheader: header style " + strconv.Quote(s) + ": want github, ietf, both or none")
}

// String returns the name ParseStyle parses.
func (s Style) String() string {
	switch s {
	case GitHub:
		return "github"
	case IETF:
		return "ietf"
	case Both:
		return "both"
	case None:
		return "none"
	}
	return "Style(" + strconv.Itoa(int(s)) + ")"
}

// Result is one decision, as the fields report it. Its fields are those of
// the Go client's client.Result, in the same order, so that one converts
// to the other.
type Result struct {
	// Allowed reports whether the request is within the limit.
	Allowed bool
	// Limit is the requests the limit allows at once.
	Limit int64
	// Remaining is the requests that would still be allowed now.
	Remaining int64
	// Used is what the limit has counted.
	Used int64
	// RetryAfter is, for a refused request, how long until it would be
	// allowed; negative (NoRetry) when it was allowed or when waiting
	// cannot help. A refusal with a RetryAfter of 0 or more gets a
	// Retry-After field.
	RetryAfter time.Duration
	// ResetAfter is how long until the limit is whole again.
	ResetAfter time.Duration
	// ResetAt is the instant the limit is whole again.
	ResetAt time.Time
}

// NoRetry is Result.RetryAfter when no wait makes the request allowed, or
// when it was allowed.
const NoRetry time.Duration = -1

// Canonical header keys, so that the map is written without
// canonicalizing on every request (net/http's canonical form of
// X-RateLimit-Limit is X-Ratelimit-Limit; field names are
// case-insensitive).
const (
	KeyLimit      = "X-Ratelimit-Limit"
	KeyRemaining  = "X-Ratelimit-Remaining"
	KeyUsed       = "X-Ratelimit-Used"
	KeyReset      = "X-Ratelimit-Reset"
	KeyResource   = "X-Ratelimit-Resource"
	KeyPolicy     = "Ratelimit-Policy"
	KeyRateLimit  = "Ratelimit"
	KeyRetryAfter = "Retry-After"
)

// Fields formats the header values of one policy's responses. It is built
// once per policy (the policy's name, quoted, and the RateLimit-Policy
// value do not change between requests) and used by every request; it is
// safe for concurrent use.
type Fields struct {
	style  Style
	name   string // the policy's name, for X-RateLimit-Resource
	quoted string // the name as a Structured Field String, quotes included
	policy string // the RateLimit-Policy value
}

// New returns the Fields of style for a policy named name allowing quota
// requests per window. name must be printable ASCII, as the draft's
// Structured Field String holds.
func New(style Style, name string, quota int64, window time.Duration) (*Fields, error) {
	if style > None {
		return nil, errors.New("ratelimitheader: unknown Style " + strconv.Itoa(int(style)))
	}
	q, err := quoteString(name)
	if err != nil {
		return nil, err
	}
	return &Fields{style: style, name: name, quoted: q, policy: PolicyField(q, quota, window)}, nil
}

// quoteString writes name as a Structured Field String (RFC 9651, section
// 3.3.3), which the draft requires for the policy's name: printable ASCII,
// with " and \ escaped.
func quoteString(name string) (string, error) {
	b := make([]byte, 0, len(name)+2)
	b = append(b, '"')
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < 0x20 || c > 0x7e {
			return "", errors.New("ratelimitheader: policy name " + strconv.Quote(name) + ": want printable ASCII, as a Structured Field String holds")
		}
		if c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, c)
	}
	return string(append(b, '"')), nil
}

// PolicyField is the RateLimit-Policy value of a policy named by quoted (a
// Structured Field String, quotes included) allowing quota requests per
// window: "default";q=100;w=10. The window is in whole seconds, rounded up
// and at least 1, as the draft's "w" must be.
func PolicyField(quoted string, quota int64, window time.Duration) string {
	b := make([]byte, 0, len(quoted)+48)
	b = append(b, quoted...)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, quota, 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, max(ceilSeconds(window), 1), 10)
	return string(b)
}

// ceilSeconds rounds d up to whole seconds; negative is 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// resetSeconds is the Unix second at which the limit is whole again,
// rounded up, so that a client that sleeps until then does not wake early.
func resetSeconds(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() != 0 {
		s++
	}
	return s
}

// untilMore is the draft's "t": the seconds until more quota is made
// available. For a refused request that is when it would pass (so that
// Retry-After is never earlier than t, as the draft asks); otherwise when
// the limit is whole again, which is when the last of the quota returns.
func untilMore(res Result) time.Duration {
	if !res.Allowed && res.RetryAfter >= 0 {
		return res.RetryAfter
	}
	return res.ResetAfter
}

// maxValues is the most values a response gets: GitHub's five,
// RateLimit-Policy, RateLimit and Retry-After.
const maxValues = 8

// Set writes res's fields into h, and Retry-After for a refused request
// that waiting helps. The numbers share one string and every value one
// []string backing array: two allocations per response, whatever the
// style.
func (f *Fields) Set(h http.Header, res Result) {
	var buf [160]byte
	b := buf[:0]
	var keys [maxValues]string
	var ends [maxValues]int // end of each value in b; -1 for a fixed value
	var fixed [maxValues]string
	n := 0
	github := f.style == GitHub || f.style == Both
	ietf := f.style == IETF || f.style == Both
	if github {
		b = strconv.AppendInt(b, res.Limit, 10)
		keys[n], ends[n] = KeyLimit, len(b)
		n++
		b = strconv.AppendInt(b, res.Remaining, 10)
		keys[n], ends[n] = KeyRemaining, len(b)
		n++
		b = strconv.AppendInt(b, res.Used, 10)
		keys[n], ends[n] = KeyUsed, len(b)
		n++
		b = strconv.AppendInt(b, resetSeconds(res.ResetAt), 10)
		keys[n], ends[n] = KeyReset, len(b)
		n++
		keys[n], ends[n], fixed[n] = KeyResource, -1, f.name
		n++
	}
	if ietf {
		keys[n], ends[n], fixed[n] = KeyPolicy, -1, f.policy
		n++
		b = append(b, f.quoted...)
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, res.Remaining, 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, ceilSeconds(untilMore(res)), 10)
		keys[n], ends[n] = KeyRateLimit, len(b)
		n++
	}
	if !res.Allowed && res.RetryAfter >= 0 {
		// Delta seconds (RFC 9110, 10.2.3), rounded up: a refused request
		// has at least 1 ms to wait, so this is at least 1.
		b = strconv.AppendInt(b, ceilSeconds(res.RetryAfter), 10)
		keys[n], ends[n] = KeyRetryAfter, len(b)
		n++
	}
	if n == 0 {
		return
	}
	s := string(b)
	vals := make([]string, n)
	start := 0
	for i := range n {
		if ends[i] < 0 {
			vals[i] = fixed[i]
		} else {
			vals[i], start = s[start:ends[i]], ends[i]
		}
		h[keys[i]] = vals[i : i+1 : i+1]
	}
}
