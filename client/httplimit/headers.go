package httplimit

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/client"
)

// HeaderStyle chooses the rate-limit header fields of every response.
type HeaderStyle uint8

const (
	// GitHubHeaders are the fields GitHub's REST API sends (documented in
	// "Rate limits for the REST API", "Checking the status of your rate
	// limit"): X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Used,
	// X-RateLimit-Reset (the instant the limit is whole again, in Unix
	// seconds, rounded up) and X-RateLimit-Resource (the policy's name).
	// It is the zero HeaderStyle, the default.
	GitHubHeaders HeaderStyle = iota
	// IETFHeaders are the RateLimit-Policy and RateLimit fields of the
	// IETF draft draft-ietf-httpapi-ratelimit-headers-10 (September 2025):
	// RateLimit-Policy: "name";q=<quota>;w=<window s> and
	// RateLimit: "name";r=<remaining>;t=<s until more quota>.
	IETFHeaders
	// BothHeaders sends the fields of both styles.
	BothHeaders
	// NoHeaders sends none; a refused request still gets 429 and
	// Retry-After.
	NoHeaders
)

// Canonical header keys, so that the map is written without
// canonicalizing on every request (net/http's canonical form of
// X-RateLimit-Limit is X-Ratelimit-Limit; field names are
// case-insensitive).
const (
	hLimit      = "X-Ratelimit-Limit"
	hRemaining  = "X-Ratelimit-Remaining"
	hUsed       = "X-Ratelimit-Used"
	hReset      = "X-Ratelimit-Reset"
	hResource   = "X-Ratelimit-Resource"
	hPolicy     = "Ratelimit-Policy"
	hRateLimit  = "Ratelimit"
	hRetryAfter = "Retry-After"
)

// fields formats the header values of one response. It is built once per
// middleware (the policy's name, quoted, and the RateLimit-Policy value do
// not change between requests) and used by every request.
type fields struct {
	style  HeaderStyle
	name   string // the policy's name, for X-RateLimit-Resource
	quoted string // the name as a Structured Field String, quotes included
	policy string // the RateLimit-Policy value
}

func newFields(style HeaderStyle, name string, lim client.Limit) (fields, error) {
	if style > NoHeaders {
		return fields{}, errors.New("httplimit: unknown HeaderStyle " + strconv.Itoa(int(style)))
	}
	q, err := quoteString(name)
	if err != nil {
		return fields{}, err
	}
	f := fields{style: style, name: name, quoted: q}
	quota, window := lim.Quota()
	f.policy = PolicyField(q, quota, window)
	return f, nil
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
			return "", errors.New("httplimit: PolicyName " + strconv.Quote(name) + ": want printable ASCII, as a Structured Field String holds")
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
func untilMore(res client.Result) time.Duration {
	if !res.Allowed && res.RetryAfter >= 0 {
		return res.RetryAfter
	}
	return res.ResetAfter
}

// maxValues is the most values a response gets: GitHub's five,
// RateLimit-Policy, RateLimit and Retry-After.
const maxValues = 8

// set writes res's fields into h, and Retry-After for a refused request
// that waiting helps. The numbers share one string and every value one
// []string backing array: two allocations per response, whatever the
// style.
func (f *fields) set(h http.Header, res client.Result) {
	var buf [160]byte
	b := buf[:0]
	var keys [maxValues]string
	var ends [maxValues]int // end of each value in b; -1 for a fixed value
	var fixed [maxValues]string
	n := 0
	github := f.style == GitHubHeaders || f.style == BothHeaders
	ietf := f.style == IETFHeaders || f.style == BothHeaders
	if github {
		b = strconv.AppendInt(b, res.Limit, 10)
		keys[n], ends[n] = hLimit, len(b)
		n++
		b = strconv.AppendInt(b, res.Remaining, 10)
		keys[n], ends[n] = hRemaining, len(b)
		n++
		b = strconv.AppendInt(b, res.Used, 10)
		keys[n], ends[n] = hUsed, len(b)
		n++
		b = strconv.AppendInt(b, resetSeconds(res.ResetAt), 10)
		keys[n], ends[n] = hReset, len(b)
		n++
		keys[n], ends[n], fixed[n] = hResource, -1, f.name
		n++
	}
	if ietf {
		keys[n], ends[n], fixed[n] = hPolicy, -1, f.policy
		n++
		b = append(b, f.quoted...)
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, res.Remaining, 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, ceilSeconds(untilMore(res)), 10)
		keys[n], ends[n] = hRateLimit, len(b)
		n++
	}
	if !res.Allowed && res.RetryAfter >= 0 {
		// Delta seconds (RFC 9110, 10.2.3), rounded up: a refused request
		// has at least 1 ms to wait, so this is at least 1.
		b = strconv.AppendInt(b, ceilSeconds(res.RetryAfter), 10)
		keys[n], ends[n] = hRetryAfter, len(b)
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

// Header returns the fields a response carries for res: those of style
// for a policy named name allowing quota requests per window, and
// Retry-After when res is a refusal that waiting helps. The middleware
// sets the same fields; Header is for handlers that call the client
// themselves, and for tests.
func Header(style HeaderStyle, name string, quota int64, window time.Duration, res client.Result) (http.Header, error) {
	q, err := quoteString(name)
	if err != nil {
		return nil, err
	}
	if style > NoHeaders {
		return nil, errors.New("httplimit: unknown HeaderStyle " + strconv.Itoa(int(style)))
	}
	f := fields{style: style, name: name, quoted: q, policy: PolicyField(q, quota, window)}
	h := http.Header{}
	f.set(h, res)
	return h, nil
}
