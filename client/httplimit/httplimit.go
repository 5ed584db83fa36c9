// Package httplimit is net/http middleware that rate-limits requests
// through sluice: one call per request, the rate-limit header fields on
// every response, and 429 Too Many Requests with Retry-After when a caller
// is over its limit.
//
//	limit, err := httplimit.New(httplimit.Config{
//		Client:   client.New(rdb, client.Config{}),
//		Requests: 100, Per: time.Minute, // a fixed window per caller
//		Identity: func(r *http.Request) string { return userID(r) },
//	})
//	...
//	http.ListenAndServe(":8080", limit(mux))
//
// Each request is keyed by its caller: the authenticated identity that
// Config.Identity returns, else the client's IP address, taken from
// X-Forwarded-For only through Config.TrustedProxies (see ClientIP), with
// IPv6 addresses keyed by their /64. The limit may be of any kind sluice
// has (Config.Limit); the default is a fixed window of Config.Requests per
// Config.Per. When sluice cannot answer, requests are let through (the
// default) or refused with 503 (Config.FailClosed), and the failure is
// logged through slog.
//
// The middleware is safe for concurrent use. Apart from the sluice call
// (go-redis' allocations), it allocates the key and the header values of
// each response: see the package's benchmarks.
package httplimit

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/client/clientip"
	"github.com/sluicehq/sluice/client/ratelimitheader"
)

// Config holds the middleware's settings. Client and a limit (Requests and
// Per, or Limit) are required; every other zero field means the default
// its comment gives.
type Config struct {
	// Client sends the calls to sluice. Required.
	Client *client.Client

	// Requests and Per are the default limit: a fixed window of Requests
	// requests per Per for each caller, windows aligned to the clock, as the
	// INCR + EXPIRE middlewares count (client.FixedWindow). Per must be a
	// whole number of milliseconds.
	Requests int64
	Per      time.Duration
	// Limit, instead of Requests and Per, is a limit of any kind:
	// client.FixedWindow (with Stagger or NoCountBlocked),
	// client.GCRA, client.TokenBucket or client.SlidingLog (which counts
	// one action per request: Cost 0 or 1). The response headers follow
	// its decisions.
	Limit client.Limit

	// Identity returns the authenticated identity of the request's caller
	// (a user or API-key id), or "" for an anonymous request. Identified
	// requests are keyed "user:<identity>", anonymous ones by the client's
	// IP address, "ip:<address or network>". Nil: every request is keyed by
	// IP.
	Identity func(*http.Request) string
	// Key, when set, replaces the whole caller key (Identity and IP);
	// returning "" falls back to the IP key.
	Key func(*http.Request) string
	// KeyPrefix starts every sluice key, so that several limits, or
	// several services on one sluice, do not share counters. Default
	// "httplimit:".
	KeyPrefix string

	// TrustedProxies are the networks of the reverse proxies and load
	// balancers in front of the server whose X-Forwarded-For entries are
	// believed (see ClientIP). Nil: none, and the TCP peer is the client,
	// which is right for a server reached directly and wrong behind a
	// proxy (every request would share the proxy's key).
	TrustedProxies []netip.Prefix
	// IPv4Bits and IPv6Bits are the network sizes anonymous callers are
	// keyed by: a whole address (32) for IPv4 by default, and a /64 for
	// IPv6, the size one subscriber usually gets.
	IPv4Bits, IPv6Bits int

	// Headers chooses the rate-limit fields: GitHubHeaders (the default),
	// IETFHeaders, BothHeaders or NoHeaders.
	Headers HeaderStyle
	// PolicyName names the limit in X-RateLimit-Resource and in the IETF
	// fields. Default "default".
	PolicyName string
	// ProblemJSON makes the body of a 429 (and of a fail-closed 503) an
	// RFC 9457 application/problem+json document (for 429, the draft's
	// "quota-exceeded" problem type naming the policy) instead of a line
	// of text.
	ProblemJSON bool

	// Cost returns what a request counts for (a bulk request may count for
	// several). Nil: 1. A cost of 0 checks the limit without counting; a
	// negative cost (or, with a client.SlidingLog, one above 1) is a bug,
	// handled as a sluice error with FailClosed's choice.
	Cost func(*http.Request) int64
	// Skip returns true for requests that are not limited (health checks,
	// static assets): they get no call to sluice and no headers.
	Skip func(*http.Request) bool

	// FailClosed refuses requests with 503 Service Unavailable when sluice
	// cannot decide (it is down or unreachable, its store is unavailable,
	// the call times out, or any other error). By default (false) such
	// requests are let through without rate-limit headers: an outage of
	// the limiter does not become an outage of the service.
	FailClosed bool
	// Logger records each failed call (at most one line per second, with
	// the number of failures since the last line): Warn when sluice is
	// unavailable, Error for the errors that mean a misconfiguration (auth,
	// arguments, an unsupported server). Nil: slog.Default().
	Logger *slog.Logger
}

// The problem documents. quota-exceeded is the draft's problem type
// (draft-ietf-httpapi-ratelimit-headers-10, section 5.1).
const (
	problemQuotaType  = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	problemQuotaTitle = "Request cannot be satisfied as assigned quota has been exceeded"
	problemJSON       = "application/problem+json"
	textPlain         = "text/plain; charset=utf-8"
)

type middleware struct {
	c          *client.Client
	limit      client.Limit
	identity   func(*http.Request) string
	key        func(*http.Request) string
	prefix     string
	trusted    []netip.Prefix
	v4, v6     int
	fields     *ratelimitheader.Fields
	cost       func(*http.Request) int64
	skip       func(*http.Request) bool
	failClosed bool
	log        *slog.Logger

	tooMany, unavailable []byte // bodies
	tooManyType          string

	lastLog atomic.Int64 // unix ns of the last failure logged
	quiet   atomic.Int64 // failures not logged since
}

// New returns the middleware cfg describes, or an error naming the
// setting that is wrong.
func New(cfg Config) (func(http.Handler) http.Handler, error) {
	m, err := newMiddleware(cfg)
	if err != nil {
		return nil, err
	}
	return m.wrap, nil
}

func newMiddleware(cfg Config) (*middleware, error) {
	if cfg.Client == nil {
		return nil, errors.New("httplimit: Config.Client is required")
	}
	lim := cfg.Limit
	switch {
	case lim != nil && (cfg.Requests != 0 || cfg.Per != 0):
		return nil, errors.New("httplimit: set either Config.Limit or Config.Requests and Config.Per, not both")
	case lim == nil && cfg.Per == 0:
		return nil, errors.New("httplimit: no limit: set Config.Requests and Config.Per (a fixed window), or Config.Limit")
	case lim == nil:
		lim = client.FixedWindow{Limit: cfg.Requests, Window: cfg.Per}
	}
	if err := lim.Validate(); err != nil {
		return nil, errors.New("httplimit: the limit: " + err.Error())
	}
	m := &middleware{
		c:          cfg.Client,
		limit:      lim,
		identity:   cfg.Identity,
		key:        cfg.Key,
		prefix:     cfg.KeyPrefix,
		v4:         cfg.IPv4Bits,
		v6:         cfg.IPv6Bits,
		cost:       cfg.Cost,
		skip:       cfg.Skip,
		failClosed: cfg.FailClosed,
		log:        cfg.Logger,
	}
	if m.prefix == "" {
		m.prefix = "httplimit:"
	}
	if m.v4 == 0 {
		m.v4 = 32
	}
	if m.v6 == 0 {
		m.v6 = 64
	}
	if m.v4 < 1 || m.v4 > 32 {
		return nil, errors.New("httplimit: IPv4Bits " + strconv.Itoa(m.v4) + ": want 1 to 32")
	}
	if m.v6 < 1 || m.v6 > 128 {
		return nil, errors.New("httplimit: IPv6Bits " + strconv.Itoa(m.v6) + ": want 1 to 128")
	}
	trusted, err := clientip.Trusted(cfg.TrustedProxies)
	if err != nil {
		return nil, errors.New("httplimit: TrustedProxies holds an invalid prefix")
	}
	m.trusted = trusted
	if m.log == nil {
		m.log = slog.Default()
	}
	name := cfg.PolicyName
	if name == "" {
		name = "default"
	}
	if m.fields, err = newFields(cfg.Headers, name, lim); err != nil {
		return nil, err
	}
	if cfg.ProblemJSON {
		m.tooManyType = problemJSON
		m.tooMany = []byte(`{"type":"` + problemQuotaType + `","title":"` + problemQuotaTitle + `","status":429,"violated-policies":[` + strconv.Quote(name) + `]}`)
		m.unavailable = []byte(`{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"the rate limiter cannot answer"}`)
	} else {
		m.tooManyType = textPlain
		m.tooMany = []byte("Too Many Requests\n")
		m.unavailable = []byte("Service Unavailable: the rate limiter cannot answer\n")
	}
	return m, nil
}

func (m *middleware) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.skip != nil && m.skip(r) {
			next.ServeHTTP(w, r)
			return
		}
		var cost int64 = 1
		if m.cost != nil {
			cost = m.cost(r)
		}
		res, err := m.c.Take(r.Context(), m.keyOf(r), m.limit, cost)
		if err != nil {
			if errors.Is(r.Context().Err(), context.Canceled) {
				// The request itself was cancelled (its client went
				// away): nobody is waiting for a response, and sluice is
				// not to blame. A deadline is another matter: a client
				// may still wait behind it, and returning here would
				// answer it an empty 200, so the fail mode decides.
				return
			}
			m.failed(r.Context(), err)
			if m.failClosed {
				m.write(w, http.StatusServiceUnavailable, m.contentType(), m.unavailable)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		m.fields.Set(w.Header(), ratelimitheader.Result(res))
		if !res.Allowed {
			m.write(w, http.StatusTooManyRequests, m.tooManyType, m.tooMany)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (m *middleware) contentType() string { return m.tooManyType }

func (m *middleware) write(w http.ResponseWriter, code int, contentType string, body []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	w.Write(body)
}

// keyOf is the request's sluice key: the prefix, then "user:" and the
// identity, or "ip:" and the client's address or network.
func (m *middleware) keyOf(r *http.Request) string {
	var id string
	if m.key != nil {
		if k := m.key(r); k != "" {
			return m.prefix + k
		}
	} else if m.identity != nil {
		id = m.identity(r)
	}
	if id != "" {
		return m.prefix + "user:" + id
	}
	a := clientip.Resolve(r.RemoteAddr, r.Header["X-Forwarded-For"], m.trusted)
	var buf [96]byte
	b := append(buf[:0], m.prefix...)
	b = append(b, "ip:"...)
	b = clientip.AppendKey(b, a, m.v4, m.v6)
	return string(b)
}

// failed logs a failed call, at most once a second, counting the
// failures in between.
func (m *middleware) failed(ctx context.Context, err error) {
	now := time.Now().UnixNano()
	last := m.lastLog.Load()
	if now-last < int64(time.Second) || !m.lastLog.CompareAndSwap(last, now) {
		m.quiet.Add(1)
		return
	}
	level, kind := slog.LevelError, "misconfigured"
	if errors.Is(err, client.ErrUnavailable) {
		level, kind = slog.LevelWarn, "unavailable"
	}
	action := "request let through (fail open)"
	if m.failClosed {
		action = "request refused with 503 (fail closed)"
	}
	m.log.LogAttrs(ctx, level, "httplimit: sluice could not decide; "+action,
		slog.String("kind", kind), slog.Any("err", err), slog.Int64("failures_not_logged", m.quiet.Swap(0)))
}
