package server

import (
	"errors"
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
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
)

// The forward-auth endpoint: a reverse proxy (Traefik ForwardAuth, nginx
// auth_request, Caddy forward_auth, Envoy ext_authz over HTTP) asks
// GET /check before it forwards a request; sluice builds the request's
// fields from what the proxy sends, evaluates the policy's rules as HIT
// does, and answers 200 to let the request through or 429 with
// Retry-After, both with the rate-limit header fields, so that refused
// requests never reach the application.

// CheckConfig configures the forward-auth endpoint (ServeCheck). The zero
// value trusts no proxy, reads no identity and sends GitHub's header
// fields.
type CheckConfig struct {
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
	FieldHeaders []CheckFieldHeader
	// HeaderStyle chooses the rate-limit header fields of the answers.
	HeaderStyle ratelimitheader.Style
	// IPv4Bits and IPv6Bits are the prefix lengths that name a client in
	// the ip field (clientip.AppendKey): an IPv6 customer usually holds a
	// whole /64, and would rotate through its addresses. Zero: 32 and 64.
	IPv4Bits, IPv6Bits int
}

// CheckFieldHeader takes the request field Field from the header Header.
type CheckFieldHeader struct {
	Field, Header string
}

// checkBuiltinFields are the fields /check always builds: a field header
// may not replace them, or a client could choose its own ip.
var checkBuiltinFields = []string{"method", "host", "path", "ip", "user"}

// checkFieldNames are checkBuiltinFields as the keys of request fields.
var checkFieldNames = [5][]byte{[]byte("method"), []byte("host"), []byte("path"), []byte("ip"), []byte("user")}

// ValidateCheckFieldHeader reports what is wrong with a field header, for
// the flag's error message.
func ValidateCheckFieldHeader(f CheckFieldHeader) error {
	for _, b := range checkBuiltinFields {
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

// checkState is the endpoint's listener, metrics and reusable state.
type checkState struct {
	trusted []netip.Prefix // normalised TrustedProxies
	pool    sync.Pool      // of *checker

	seconds prometheus.Histogram
	// Requests answered, by result.
	allowed, denied, failed, refused atomic.Int64

	fields atomic.Pointer[checkFields] // of the policy in use

	extraNames   [][]byte // the fields of FieldHeaders, as keys
	extraHeaders []string // their headers, canonicalised
	identity     string   // IdentityHeader, canonicalised; "" for none
	v4Bits       int      // IPv4Bits, defaulted
	v6Bits       int      // IPv6Bits, defaulted

	served served
}

// checker is the state one check request uses, pooled so that a check
// reuses the buffers of earlier ones.
type checker struct {
	r    *engine.Round
	vals []byte // the values of the built fields, one buffer
}

// checkFields are the header fields of each rule of one loaded policy.
type checkFields struct {
	lp    *rules.Set
	byPos []*ratelimitheader.Fields
}

var (
	descCheckRequests = prometheus.NewDesc("sluice_check_requests_total",
		"Requests to the forward-auth endpoint /check, by result: allowed (200), denied (429), error (503: no decision, see --on-store-error) or refused (403: protected mode, or a request /check cannot read).",
		[]string{"result"}, nil)
)

func (s *Server) initCheck() {
	c := &s.check
	c.trusted, _ = clientip.Trusted(s.cfg.Check.TrustedProxies) // cmd/sluice parses them valid
	c.seconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_check_duration_seconds",
		Help:    "Time to answer one request to the forward-auth endpoint /check, including the commit of its writes.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 2, 18),
	})
	c.identity = textproto.CanonicalMIMEHeaderKey(s.cfg.Check.IdentityHeader)
	c.v4Bits, c.v6Bits = s.cfg.Check.IPv4Bits, s.cfg.Check.IPv6Bits
	if c.v4Bits == 0 {
		c.v4Bits = 32
	}
	if c.v6Bits == 0 {
		c.v6Bits = 64
	}
	for _, f := range s.cfg.Check.FieldHeaders {
		c.extraHeaders = append(c.extraHeaders, http.CanonicalHeaderKey(f.Header))
		c.extraNames = append(c.extraNames, []byte(f.Field))
	}
	c.pool.New = func() any { return &checker{r: s.eng.NewRound()} }
}

// collectCheck adds the endpoint's counters to a scrape.
func (s *Server) collectCheck(ch chan<- prometheus.Metric) {
	c := &s.check
	for _, v := range []struct {
		n     *atomic.Int64
		label string
	}{{&c.allowed, "allowed"}, {&c.denied, "denied"}, {&c.failed, "error"}, {&c.refused, "refused"}} {
		ch <- prometheus.MustNewConstMetric(descCheckRequests, prometheus.CounterValue, float64(v.n.Load()), v.label)
	}
}

// ServeCheck serves the forward-auth endpoint /check on ln until Close,
// over TLS when the server has TLS (client certificates are checked when
// given). It answers only with a policy loaded. In protected mode it
// answers only proxies on loopback, or, with TLS client certificates
// configured, proxies that present one: /check has no password.
func (s *Server) ServeCheck(ln net.Listener) error {
	if s.pol.Current() == nil {
		return rules.ErrNoPolicy
	}
	srv := s.newHTTPServer(http.HandlerFunc(s.routeCheck))
	if !s.check.served.start(srv, &s.closing) {
		return net.ErrClosed
	}
	s.log.Info("serving the forward-auth endpoint /check", "addr", ln.Addr().String(), "tls", s.tls != nil, "policy", s.pol.Path)
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() && !s.cfg.AllowRemoteWithoutAuth {
		s.log.Warn("protected mode: /check answers proxies on loopback only (or, with --tls-ca, proxies that present a client certificate); set --protected-mode no to serve others", "addr", ln.Addr().String())
	}
	// /check has no probe reserve: it takes its slot as RESP does.
	return s.serveHTTPOn(srv, ln, "check", s.adm.take)
}

// closeCheck stops the endpoint; Close calls it once no new request may
// start a hit.
func (s *Server) closeCheck() { s.check.served.stop() }

// checkAdmitted reports whether protected mode lets r's peer use /check.
// /check has no password, so, as for the line protocol, a password set for
// RESP does not open it: the peer must be on loopback, or have presented a
// certificate the TLS CA signed, unless protected mode is off.
func (s *Server) checkAdmitted(r *http.Request) bool {
	if s.cfg.AllowRemoteWithoutAuth {
		return true
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return true
	}
	a, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && a.Addr().Unmap().IsLoopback()
}

// routeCheck serves /check and every path under /check/, with any method:
// Envoy's ext_authz sends the original request's method, and its path
// after a path prefix. It tests the raw path itself, as http.ServeMux would
// answer a path that is not clean (/check//orders, /check/x/../orders)
// with a redirect, which Envoy hands to the client as a denial;
// checkFields normalises the path instead.
func (s *Server) routeCheck(w http.ResponseWriter, r *http.Request) {
	if _, ok := checkSuffix(r); !ok {
		http.NotFound(w, r)
		return
	}
	s.serveCheck(w, r)
}

// checkSuffix returns the raw path of r after /check (without the query),
// and whether r's path is /check or under /check/.
func checkSuffix(r *http.Request) (string, bool) {
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

const checkDenied = "DENIED sluice is in protected mode and /check has no password: it answers proxies on loopback only, or, with --tls-ca, proxies that present a client certificate; start sluice with --protected-mode no to answer others\n"

func (s *Server) serveCheck(w http.ResponseWriter, r *http.Request) {
	t0 := time.Now()
	defer func() { s.check.seconds.Observe(time.Since(t0).Seconds()) }()
	if !s.checkAdmitted(r) {
		s.check.refused.Add(1)
		s.stats.rejectedDenied.Add(1)
		checkText(w, http.StatusForbidden, checkDenied)
		return
	}
	lp := s.pol.Current()
	if lp == nil { // ServeCheck refuses to start without one; a policy is never unloaded
		s.check.failed.Add(1)
		checkText(w, http.StatusServiceUnavailable, resp.ErrorText(rules.ErrNoPolicy)+"\n")
		return
	}
	c := s.check.pool.Get().(*checker)
	defer s.putChecker(c)
	s.checkFields(c, r)
	if err := s.validateCheckRequest(c.r.Req); err != nil {
		s.check.refused.Add(1)
		checkText(w, http.StatusBadRequest, typed(err).Message()+"\n")
		return
	}
	now := c.r.Now()
	c.r.Begin() // resharding: MIGRATE PAUSE waits until it is committed (migrate.go)
	out, err := c.r.Hit(lp, c.r.Req, 1, now.UnixNano())
	// Changes are visible once made: even after an error, what the canary
	// rules changed before it is committed.
	if ok, cerr := c.r.Commit(); !ok && err == nil {
		err = cerr
	}
	if err != nil {
		s.check.failed.Add(1)
		w.Header().Set("Retry-After", "1")
		e := s.failure(err)
		checkText(w, checkHTTPStatus(e.Kind), resp.ErrorText(e)+"\n")
		return
	}
	res := checkResult(out, now)
	h := w.Header()
	s.fieldsOf(lp, out).Set(h, res)
	if q := out.Quota; q == policy.QuotaClamped || q == policy.QuotaMissing || q == policy.QuotaMalformed {
		// The rule has a quotaField and the request's quota did not apply
		// as sent: say so, for the proxy's logs.
		h.Set("X-Sluice-Quota", q.String())
	}
	if s.cfg.AllowOnStoreError && (s.store.Unavailable() != nil || s.store.Failed() != nil) {
		// --on-store-error allow: the answer stands, but is not stored.
		h.Set("X-Sluice-Degraded", "store-unavailable")
	}
	if out.Allowed {
		s.check.allowed.Add(1)
		w.WriteHeader(http.StatusOK)
		return
	}
	s.check.denied.Add(1)
	checkText(w, http.StatusTooManyRequests, "Too Many Requests\n")
}

// putChecker returns c to the pool, without a buffer a huge request grew.
func (s *Server) putChecker(c *checker) {
	if cap(c.vals) > connKeepBuf {
		c.vals = nil
	}
	c.r.Trim(connKeepBuf)
	s.check.pool.Put(c)
}

func checkText(w http.ResponseWriter, code int, body string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(body))
}

// checkFields builds c.r.Req from r: method, host and path from
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
func (s *Server) checkFields(c *checker, r *http.Request) {
	b := c.vals[:0]
	var ends [5]int
	believed := len(s.check.trusted) == 0 || s.fromTrustedProxy(r)
	method := ""
	if believed {
		method = r.Header.Get("X-Forwarded-Method")
	}
	if method == "" {
		method = r.Method
	}
	b = append(b, method...)
	ends[0] = len(b)
	host := ""
	if believed {
		host = r.Header.Get("X-Forwarded-Host")
	}
	if host == "" {
		host = r.Host
	}
	b = append(b, host...)
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
		uri, _ = checkSuffix(r)
	}
	b = appendCleanPath(b, uri)
	ends[2] = len(b)
	ip := clientip.Resolve(r.RemoteAddr, r.Header["X-Forwarded-For"], s.check.trusted)
	if ip.IsValid() {
		b = clientip.AppendKey(b, ip, s.check.v4Bits, s.check.v6Bits)
	}
	ends[3] = len(b)
	if believed && s.check.identity != "" {
		if v := r.Header[s.check.identity]; len(v) > 0 {
			b = append(b, v[0]...)
		}
	}
	ends[4] = len(b)
	type extra struct{ start, end int }
	var extras [8]extra
	xs := extras[:0]
	for _, hk := range s.check.extraHeaders {
		v, ok := r.Header[hk]
		if !believed || !ok || len(v) == 0 {
			xs = append(xs, extra{-1, -1})
			continue
		}
		start := len(b)
		b = append(b, v[0]...)
		xs = append(xs, extra{start, len(b)})
	}
	c.vals = b
	req := c.r.Req[:0]
	start := 0
	for i, n := range checkFieldNames {
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
		req = append(req, policy.Field{Key: s.check.extraNames[i], Value: b[x.start:x.end:x.end]})
	}
	c.r.Req = req
}

// fromTrustedProxy reports whether r's peer is one of the trusted proxies.
func (s *Server) fromTrustedProxy(r *http.Request) bool {
	a, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := a.Addr().Unmap().WithZone("")
	for _, p := range s.check.trusted {
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

// validateCheckRequest refuses field values HIT could not carry either.
func (s *Server) validateCheckRequest(req policy.Request) error {
	for _, f := range req {
		if len(f.Value) > s.cfg.MaxKeySize {
			return s.eng.CheckKeySize("the value of field "+string(f.Key), len(f.Value))
		}
	}
	return nil
}

// checkResult turns the deciding rule's outcome into the values of the
// header fields.
func checkResult(out policy.Outcome, now time.Time) ratelimitheader.Result {
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
// per loaded policy for each rule's creditLimit; only a request whose own
// quota applied builds them for the request.
func (s *Server) fieldsOf(lp *rules.Set, out policy.Outcome) *ratelimitheader.Fields {
	r := out.Rule
	if rate := max(out.Rate, 0); rate != max(r.CreditLimit, 0) {
		return newCheckFields(s.cfg.Check.HeaderStyle, r, rate)
	}
	cf := s.check.fields.Load()
	if cf == nil || cf.lp != lp {
		rs := lp.Policy.Rules()
		cf = &checkFields{lp: lp, byPos: make([]*ratelimitheader.Fields, len(rs))}
		for i, rr := range rs {
			cf.byPos[i] = newCheckFields(s.cfg.Check.HeaderStyle, rr, max(rr.CreditLimit, 0))
		}
		s.check.fields.Store(cf)
	}
	return cf.byPos[r.Pos-1]
}

func newCheckFields(style ratelimitheader.Style, r *policy.Rule, limit int64) *ratelimitheader.Fields {
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
