// Package check serves GET /check, the forward-auth endpoint: a reverse
// proxy (Traefik ForwardAuth, nginx auth_request, Caddy forward_auth,
// Envoy ext_authz over HTTP) asks it before it forwards a request; the
// Handler builds the request's fields from what the proxy sends, runs
// their hit of the rules in an engine.Round as HIT does, and answers 200
// to let the request through or 429 with Retry-After, both with the
// rate-limit header fields, so that refused requests never reach the
// application.
//
// The server that runs it serves the Handler on its HTTP server, behind
// its listener (--maxclients), and renders errors through Host. A Handler
// is safe for concurrent use.
package check

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/client/clientip"
	"github.com/sluicehq/sluice/client/ratelimitheader"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
)

// keepBuf is the largest buffer a pooled checker keeps between requests.
const keepBuf = 8 << 10

// Host is what /check needs of the server that runs it.
type Host interface {
	// Failure returns the typed error of err for an answer, once the
	// server has logged what is not meant for clients and counted the
	// store's errors.
	Failure(err error) *errs.Error
}

// Options are what a Handler runs with besides its Config.
type Options struct {
	Engine *engine.Engine
	Rules  *rules.File // the rules in use; the server serves /check only with some
	Host   Host
	// AllowRemote turns protected mode off: /check answers every peer,
	// not only those on loopback or with a verified client certificate.
	AllowRemote bool
	// RejectedDenied is the server's count of peers protected mode
	// refused, which /check adds to.
	RejectedDenied *atomic.Int64
}

// Config configures the forward-auth endpoint. The zero value trusts no proxy, reads no identity and sends GitHub's header
// fields.
type Config struct {
	// TrustedProxies are the networks of the proxies whose
	// X-Forwarded-For entries are believed: the request's ip is the
	// rightmost address that is not one of them (clientip.Resolve). Nil:
	// the peer address is the ip, whatever X-Forwarded-For says.
	TrustedProxies []netip.Prefix
	// IdentityHeader names the header holding the caller's identity, the
	// request's user field (absent when the header is absent or empty).
	// "": no user field.
	IdentityHeader string
	// FieldHeaders are more request fields, each taken from a header
	// (absent when the header is absent), such as a per-request quota.
	FieldHeaders []FieldHeader
	// HeaderStyle chooses the rate-limit header fields of the answers.
	HeaderStyle ratelimitheader.Style
	// IPv4Bits and IPv6Bits are the prefix lengths that name a client in
	// the ip field (clientip.AppendKey): an IPv6 customer usually holds a
	// whole /64, and would rotate through its addresses. Zero: 32 and 64.
	IPv4Bits, IPv6Bits int
}

// FieldHeader takes the request field Field from the header Header.
type FieldHeader struct {
	Field, Header string
}

// builtinFields are the fields /check always builds: a field header
// may not replace them, or a client could choose its own ip.
var builtinFields = []string{"method", "host", "path", "ip", "user"}

// fieldNames are builtinFields as the keys of request fields.
var fieldNames = [5][]byte{[]byte("method"), []byte("host"), []byte("path"), []byte("ip"), []byte("user")}

// ValidateFieldHeader reports what is wrong with a field header, for
// the flag's error message.
func ValidateFieldHeader(f FieldHeader) error {
	for _, b := range builtinFields {
		if f.Field == b {
			return errors.New("field " + strconv.Quote(f.Field) + " is one /check builds itself (method, host, path, ip, user); choose another name")
		}
	}
	if f.Field == "" || strings.ContainsAny(f.Field, " \t\r\n=\"") {
		return errors.New("field name " + strconv.Quote(f.Field) + ": want a non-empty name without spaces, '=' or '\"'")
	}
	if f.Header == "" || strings.ContainsAny(f.Header, " \t\r\n:") {
		return errors.New("header name " + strconv.Quote(f.Header) + ": want a non-empty HTTP field name")
	}
	return nil
}

// Handler answers /check and every path under /check/.
type Handler struct {
	opt     Options
	style   ratelimitheader.Style
	trusted []netip.Prefix // normalised TrustedProxies
	pool    sync.Pool      // of *checker

	// Seconds times each answer (sluice_check_duration_seconds).
	Seconds prometheus.Histogram
	// Allowed, Denied, Failed and Refused count the requests answered,
	// by result (sluice_check_requests_total).
	Allowed, Denied, Failed, Refused atomic.Int64

	fields atomic.Pointer[ruleFields] // of the policy in use

	extraNames   [][]byte // the fields of FieldHeaders, as keys
	extraHeaders []string // their headers, canonicalised
	identity     string   // IdentityHeader, canonicalised; "" for none
	v4Bits       int      // IPv4Bits, defaulted
	v6Bits       int      // IPv6Bits, defaulted
}

// checker is the state one check request uses, pooled so that a check
// reuses the buffers of earlier ones.
type checker struct {
	r    *engine.Round
	vals []byte // the values of the built fields, one buffer
}

// ruleFields are the header fields of each rule of one loaded policy.
type ruleFields struct {
	lp    *rules.Set
	byPos []*ratelimitheader.Fields
	// runtime are the fields of the rule a runtime limit (POLICY LIMIT)
	// made of each rule, built at its first answer: one per position, so
	// that a change of the limit replaces the one before.
	runtime []atomic.Pointer[runtimeFields]
}

type runtimeFields struct {
	rule *policy.Rule
	f    *ratelimitheader.Fields
}

var descRequests = prometheus.NewDesc("sluice_check_requests_total",
	"Requests to the forward-auth endpoint /check, by result: allowed (200), denied (429), error (503: no decision, see --on-store-error) or refused (403: protected mode, or a request /check cannot read).",
	[]string{"result"}, nil)

// New returns the Handler of cfg; cfg's trusted proxies are valid networks
// (cmd/sluice parses them so).
func New(cfg Config, opt Options) *Handler {
	c := &Handler{opt: opt, style: cfg.HeaderStyle}
	c.trusted, _ = clientip.Trusted(cfg.TrustedProxies)
	c.Seconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_check_duration_seconds",
		Help:    "Time to answer one request to the forward-auth endpoint /check, including the commit of its writes.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 2, 18),
	})
	c.identity = textproto.CanonicalMIMEHeaderKey(cfg.IdentityHeader)
	c.v4Bits, c.v6Bits = cfg.IPv4Bits, cfg.IPv6Bits
	if c.v4Bits == 0 {
		c.v4Bits = 32
	}
	if c.v6Bits == 0 {
		c.v6Bits = 64
	}
	for _, f := range cfg.FieldHeaders {
		c.extraHeaders = append(c.extraHeaders, http.CanonicalHeaderKey(f.Header))
		c.extraNames = append(c.extraNames, []byte(f.Field))
	}
	c.pool.New = func() any { return &checker{r: opt.Engine.NewRound()} }
	return c
}

// Collect adds the endpoint's counters to a scrape.
func (c *Handler) Collect(ch chan<- prometheus.Metric) {
	for _, v := range []struct {
		n     *atomic.Int64
		label string
	}{{&c.Allowed, "allowed"}, {&c.Denied, "denied"}, {&c.Failed, "error"}, {&c.Refused, "refused"}} {
		ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(v.n.Load()), v.label)
	}
}

// admitted reports whether protected mode lets r's peer use /check.
// /check has no password, so, as for the line protocol, a password set for
// RESP does not open it: the peer must be on loopback, or have presented a
// certificate the TLS CA signed, unless protected mode is off.
func (c *Handler) admitted(r *http.Request) bool {
	if c.opt.AllowRemote {
		return true
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return true
	}
	a, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && a.Addr().Unmap().IsLoopback()
}

// WarnIfProtected logs, for /check served on a that other machines can
// reach, that protected mode answers only proxies on loopback (or with a
// client certificate), unless it is off.
func (c *Handler) WarnIfProtected(log *slog.Logger, a net.Addr) {
	if ta, ok := a.(*net.TCPAddr); ok && !ta.IP.IsLoopback() && !c.opt.AllowRemote {
		log.Warn("protected mode: /check answers proxies on loopback only (or, with --tls-ca, proxies that present a client certificate); set --protected-mode no to serve others", "addr", a.String())
	}
}

// ServeHTTP serves /check and every path under /check/, with any method:
// Envoy's ext_authz sends the original request's method, and its path
// after a path prefix. It tests the raw path itself, as http.ServeMux would
// answer a path that is not clean (/check//orders, /check/x/../orders)
// with a redirect, which Envoy hands to the client as a denial;
// fieldsFrom normalises the path instead.
func (c *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, ok := suffix(r); !ok {
		http.NotFound(w, r)
		return
	}
	c.serve(w, r)
}

// suffix returns the raw path of r after /check (without the query),
// and whether r's path is /check or under /check/.
func suffix(r *http.Request) (string, bool) {
	p := r.RequestURI
	if !strings.HasPrefix(p, "/") { // absolute form, or a test's request
		p = r.URL.EscapedPath()
	}
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p = p[:i]
	}
	rest, ok := strings.CutPrefix(p, "/check")
	if !ok || rest != "" && rest[0] != '/' {
		return "", false
	}
	return rest, true
}

const denied = "DENIED sluice is in protected mode and /check has no password: it answers proxies on loopback only, or, with --tls-ca, proxies that present a client certificate; start sluice with --protected-mode no to answer others\n"

func (c *Handler) serve(w http.ResponseWriter, r *http.Request) {
	t0 := time.Now()
	defer func() { c.Seconds.Observe(time.Since(t0).Seconds()) }()
	if !c.admitted(r) {
		c.Refused.Add(1)
		c.opt.RejectedDenied.Add(1)
		text(w, http.StatusForbidden, denied)
		return
	}
	lp := c.opt.Rules.Current()
	if lp == nil { // the server refuses to serve /check without one; a policy is never unloaded
		c.Failed.Add(1)
		text(w, http.StatusServiceUnavailable, resp.ErrorText(rules.ErrNoPolicy)+"\n")
		return
	}
	k := c.pool.Get().(*checker)
	defer c.put(k)
	c.fieldsFrom(k, r)
	if err := c.validate(k.r.Req); err != nil {
		c.Refused.Add(1)
		text(w, http.StatusBadRequest, errs.Of(err).Message()+"\n")
		return
	}
	now := k.r.Now()
	out, err := hit(k.r, lp, now)
	if err != nil {
		c.Failed.Add(1)
		w.Header().Set("Retry-After", "1")
		e := c.opt.Host.Failure(err)
		text(w, HTTPStatus(e.Kind), resp.ErrorText(e)+"\n")
		return
	}
	res := result(out, now)
	h := w.Header()
	c.fieldsOf(lp, out).Set(h, res)
	if q := out.Quota; q == policy.QuotaClamped || q == policy.QuotaMissing || q == policy.QuotaMalformed {
		// The rule has a quotaField and the request's quota did not apply
		// as sent: say so, for the proxy's logs.
		h.Set("X-Sluice-Quota", q.String())
	}
	if out.Shadowed {
		// Shadow mode let through a hit the limit refused: say so, for
		// the proxy's logs; the other fields are the limit's answer.
		h.Set("X-Sluice-Shadow", "over-limit")
	}
	if c.opt.Engine.Degraded() {
		// --on-store-error allow: the answer stands, but is not stored.
		h.Set("X-Sluice-Degraded", "store-unavailable")
	}
	if out.Allowed {
		c.Allowed.Add(1)
		w.WriteHeader(http.StatusOK)
		return
	}
	c.Denied.Add(1)
	text(w, http.StatusTooManyRequests, "Too Many Requests\n")
}

// hit runs the request's hit in round r and commits it. Changes are
// visible once made: even after an error, what the canary rules changed
// before it is committed.
func hit(r *engine.Round, lp *rules.Set, now time.Time) (policy.Outcome, error) {
	r.Begin() // resharding: MIGRATE PAUSE waits until it is committed
	// net/http recovers a panic: the round must not stay counted.
	defer r.End()
	out, err := r.Hit(lp, r.Req, 1, now.UnixNano())
	if ok, cerr := r.Commit(); !ok && err == nil {
		err = cerr
	}
	return out, err
}

// put returns k to the pool, without a buffer a huge request grew.
func (c *Handler) put(k *checker) {
	if cap(k.vals) > keepBuf {
		k.vals = nil
	}
	k.r.Trim(keepBuf)
	c.pool.Put(k)
}

func text(w http.ResponseWriter, code int, body string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(body))
}

// fieldsFrom builds k.r.Req from r: method, host and path from
// X-Forwarded-Method, -Host and -Uri, else from r itself (Envoy sends the
// original method and host, and the original path after /check); ip from
// X-Forwarded-For through the trusted proxies only, else the peer, as the
// network of --check-ipv4-bits or --check-ipv6-bits; user from the
// identity header; and the configured field headers. With trusted proxies
// configured, a peer that is not one of them is taken for the client
// itself: its X-Forwarded-* headers, identity header and field headers are
// ignored, as its X-Forwarded-For is, so that whoever reaches /check
// cannot spend another user's counter. The path is normalised
// (appendCleanPath). The values are copied into one buffer the fields
// point into.
func (c *Handler) fieldsFrom(k *checker, r *http.Request) {
	b := k.vals[:0]
	var ends [5]int
	believed := len(c.trusted) == 0 || c.fromTrustedProxy(r)
	b = append(b, forwarded(r, believed, "X-Forwarded-Method", r.Method)...)
	ends[0] = len(b)
	b = append(b, forwarded(r, believed, "X-Forwarded-Host", r.Host)...)
	ends[1] = len(b)
	uri := ""
	if believed {
		uri = r.Header.Get("X-Forwarded-Uri")
	}
	if uri != "" {
		if i := strings.IndexByte(uri, '?'); i >= 0 {
			uri = uri[:i]
		}
	} else {
		uri, _ = suffix(r)
	}
	b = appendCleanPath(b, uri)
	ends[2] = len(b)
	ip := clientip.Resolve(r.RemoteAddr, r.Header["X-Forwarded-For"], c.trusted)
	if ip.IsValid() {
		b = clientip.AppendKey(b, ip, c.v4Bits, c.v6Bits)
	}
	ends[3] = len(b)
	if believed && c.identity != "" {
		if v := r.Header[c.identity]; len(v) > 0 {
			b = append(b, v[0]...)
		}
	}
	ends[4] = len(b)
	type extra struct{ start, end int }
	var extras [8]extra
	xs := extras[:0]
	for _, hk := range c.extraHeaders {
		v, ok := r.Header[hk]
		if !believed || !ok || len(v) == 0 {
			xs = append(xs, extra{-1, -1})
			continue
		}
		start := len(b)
		b = append(b, v[0]...)
		xs = append(xs, extra{start, len(b)})
	}
	k.vals = b
	req := k.r.Req[:0]
	start := 0
	for i, n := range fieldNames {
		if i == 4 && ends[4] == start { // no identity: no user field
			break
		}
		if i == 3 && ends[3] == start { // no IP peer (a Unix socket): no ip field
			start = ends[i]
			continue
		}
		req = append(req, policy.Field{Key: n, Value: b[start:ends[i]:ends[i]]})
		start = ends[i]
	}
	for i, x := range xs {
		if x.start < 0 {
			continue
		}
		req = append(req, policy.Field{Key: c.extraNames[i], Value: b[x.start:x.end:x.end]})
	}
	k.r.Req = req
}

// forwarded is the header field name of r when its proxy is believed and
// sent one, else own, what r says itself.
func forwarded(r *http.Request, believed bool, name, own string) string {
	if believed {
		if v := r.Header.Get(name); v != "" {
			return v
		}
	}
	return own
}

// fromTrustedProxy reports whether r's peer is one of the trusted proxies.
func (c *Handler) fromTrustedProxy(r *http.Request) bool {
	a, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := a.Addr().Unmap().WithZone("")
	for _, p := range c.trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// appendCleanPath appends the path p (raw, as the client sent it) as the
// application most likely sees it, so that a rule on a path cannot be
// evaded by writing it another way: percent-escapes decoded, except %2F,
// which stays %2F (a slash inside a segment, as Go's URL.Path and RawPath
// tell apart); then empty segments (//) merged and . and .. resolved, as
// RFC 3986's remove_dot_segments (.. above the root stays at the root); a
// trailing slash kept. The result starts with /. It allocates nothing
// when b has room.
func appendCleanPath(b []byte, p string) []byte {
	start := len(b)
	b = append(b, '/')
	// seg is the start of the segment being written, after its slash.
	seg := len(b)
	endSegment := func(last bool) {
		switch string(b[seg:]) {
		case ".":
			b = b[:seg]
		case "..":
			b = b[:seg]
			if seg > start+1 {
				// Drop the previous segment and its slash, keeping the
				// slash before it.
				i := seg - 2
				for i > start && b[i] != '/' {
					i--
				}
				b = b[:i+1]
			}
		case "":
			// An empty segment: // merged, or the trailing slash.
		default:
			if !last {
				b = append(b, '/')
			}
		}
		seg = len(b)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '%' && i+2 < len(p) {
			hi, lo := unhex(p[i+1]), unhex(p[i+2])
			if hi >= 0 && lo >= 0 {
				d := byte(hi<<4 | lo)
				if d == '/' {
					b = append(b, "%2F"...)
				} else {
					b = append(b, d)
				}
				i += 2
				continue
			}
		}
		if c == '/' {
			endSegment(false)
			continue
		}
		b = append(b, c)
	}
	endSegment(true)
	return b
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// validate refuses field values HIT could not carry either.
func (c *Handler) validate(req policy.Request) error {
	for _, f := range req {
		if len(f.Value) > c.opt.Engine.MaxKeySize() {
			return c.opt.Engine.CheckKeySize("the value of field "+string(f.Key), len(f.Value))
		}
	}
	return nil
}

// result turns the deciding rule's outcome into the values of the
// header fields.
func result(out policy.Outcome, now time.Time) ratelimitheader.Result {
	res := ratelimitheader.Result{
		Allowed:    out.Allowed,
		Limit:      max(out.Limit, 0),
		Remaining:  max(out.CreditsLeft, 0),
		RetryAfter: ratelimitheader.NoRetry,
		ResetAt:    now,
	}
	res.Used = max(res.Limit-res.Remaining, 0)
	if out.ResetAfterMs > 0 {
		res.ResetAfter = time.Duration(out.ResetAfterMs) * time.Millisecond
		res.ResetAt = now.Add(res.ResetAfter)
	}
	if !out.Allowed && out.RetryAfterMs >= 0 {
		res.RetryAfter = time.Duration(out.RetryAfterMs) * time.Millisecond
	}
	return res
}

// fieldsOf returns the header fields of the rule that decided out, named
// by its label, else "rule-<position>". RateLimit-Policy states the rate,
// the limit that applied (creditLimit or the request's quota) per
// resetSeconds, never a gcra or tokenBucket rule's burst (which
// X-RateLimit-Limit and the remaining count toward). They are built once
// per loaded policy for each rule's creditLimit, and for a runtime limit
// at its first answer; only a request whose own quota applied builds them
// for the request.
func (c *Handler) fieldsOf(lp *rules.Set, out policy.Outcome) *ratelimitheader.Fields {
	r := out.Rule
	if rate := max(out.Rate, 0); rate != max(r.CreditLimit, 0) {
		return newFields(c.style, r, rate)
	}
	cf := c.fields.Load()
	if cf == nil || cf.lp != lp {
		rs := lp.Policy.Rules()
		cf = &ruleFields{lp: lp, byPos: make([]*ratelimitheader.Fields, len(rs)), runtime: make([]atomic.Pointer[runtimeFields], len(rs))}
		for i, rr := range rs {
			cf.byPos[i] = newFields(c.style, rr, max(rr.CreditLimit, 0))
		}
		c.fields.Store(cf)
	}
	if r.FileRule() == r {
		return cf.byPos[r.Pos-1]
	}
	rt := &cf.runtime[r.Pos-1]
	if f := rt.Load(); f != nil && f.rule == r {
		return f.f
	}
	f := &runtimeFields{rule: r, f: newFields(c.style, r, max(r.CreditLimit, 0))}
	rt.Store(f)
	return f.f
}

func newFields(style ratelimitheader.Style, r *policy.Rule, limit int64) *ratelimitheader.Fields {
	name := r.Label
	if name == "" {
		name = "rule-" + strconv.Itoa(r.Pos)
	}
	f, err := ratelimitheader.New(style, name, limit, time.Duration(r.PeriodMillis())*time.Millisecond)
	if err != nil { // labels are [A-Za-z0-9_-]; the style was validated
		f, _ = ratelimitheader.New(ratelimitheader.None, "", 0, 0)
	}
	return f
}

// HTTPStatus is /check's HTTP status for a hit that failed: 503, with
// Retry-After, whatever the kind. sluice could not decide, and the proxy's
// own failure policy takes over; a request /check can refuse as malformed
// is refused before any hit (400), so an error of the hit itself is the
// rule's or the store's, never the request's.
func HTTPStatus(errs.Kind) int { return http.StatusServiceUnavailable }
