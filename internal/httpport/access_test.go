package httpport

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/internal/admit"
)

// access returns an Access of g whose password is "pw", and the users
// CheckAuth was asked about.
func access(g admit.Guard) (*Access, *[]string) {
	var users []string
	return &Access{
		Guard: g,
		CheckAuth: func(user, pass []byte) bool {
			users = append(users, string(user))
			return string(user) == "default" && string(pass) == "pw"
		},
		Failures: new(atomic.Int64),
		Logger:   slog.New(slog.DiscardHandler),
	}, &users
}

// request is a GET from remote, with basic authentication when user or
// pass is set, and a verified client certificate when cert.
func request(remote, user, pass string, cert bool) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/backup", nil)
	r.RemoteAddr = remote
	if user != "" || pass != "" {
		r.SetBasicAuth(user, pass)
	}
	if cert {
		r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{}}}}
	}
	return r
}

// TestAccessPassword: with a password, every client must give it, from
// anywhere; no user name is user default; each failed attempt is counted
// once, and a success not at all.
func TestAccessPassword(t *testing.T) {
	a, users := access(admit.Guard{Password: true})
	for _, tc := range []struct {
		remote, user, pass string
		want               int
	}{
		{"127.0.0.1:1", "", "", http.StatusUnauthorized},
		{"10.0.0.1:1", "default", "wrong", http.StatusUnauthorized},
		{"10.0.0.1:1", "", "pw", 0},
		{"10.0.0.1:1", "default", "pw", 0},
	} {
		code, msg := a.Allowed(request(tc.remote, tc.user, tc.pass, false))
		if code != tc.want || (code != 0) != strings.HasPrefix(msg, "WRONGPASS") {
			t.Errorf("%s user %q pass %q: %d %q, want %d", tc.remote, tc.user, tc.pass, code, msg, tc.want)
		}
	}
	if got := strings.Join(*users, ","); got != "default,default,default" {
		t.Errorf("CheckAuth asked about %q; want default for each request with credentials", got)
	}
	if n := a.Failures.Load(); n != 2 {
		t.Errorf("%d failures counted, want 2", n)
	}
}

// TestAccessProtected: without a password or client certificates,
// protected mode admits loopback clients only, IPv4 or IPv6, and refuses
// an address it cannot read; protected mode off admits everyone. None of
// it is an authentication failure.
func TestAccessProtected(t *testing.T) {
	a, _ := access(admit.Guard{})
	a.CheckAuth = nil // never asked
	for remote, want := range map[string]int{
		"127.0.0.1:1": 0, "[::1]:1": 0,
		"10.0.0.1:1": http.StatusForbidden, "[2001:db8::1]:1": http.StatusForbidden, "@": http.StatusForbidden,
	} {
		if code, msg := a.Allowed(request(remote, "", "", false)); code != want || (code != 0 && msg != admit.DeniedMessage) {
			t.Errorf("protected mode, %s: %d %q, want %d", remote, code, msg, want)
		}
	}
	off, _ := access(admit.Guard{Off: true})
	if code, msg := off.Allowed(request("10.0.0.1:1", "", "", false)); code != 0 {
		t.Errorf("protected mode off, a remote client: %d %q, want 0", code, msg)
	}
	if n := a.Failures.Load() + off.Failures.Load(); n != 0 {
		t.Errorf("%d authentication failures counted, want 0", n)
	}
}

// TestAccessCertificates: with --tls-ca, a client certificate is asked
// for first, before the password, and its absence is no authentication
// failure; with one, the password still applies when set, and protected
// mode no longer does.
func TestAccessCertificates(t *testing.T) {
	tl := newTLS(t)
	a, _ := access(admit.Guard{Password: true, TLS: tl})
	for _, tc := range []struct {
		cert       bool
		pass       string
		want       int
		wantPrefix string
	}{
		{false, "pw", http.StatusForbidden, "a client certificate signed by --tls-ca is required"},
		{true, "wrong", http.StatusUnauthorized, "WRONGPASS"},
		{true, "pw", 0, ""},
	} {
		code, msg := a.Allowed(request("10.0.0.1:1", "default", tc.pass, tc.cert))
		if code != tc.want || !strings.HasPrefix(msg, tc.wantPrefix) {
			t.Errorf("certificate %v, password %q: %d %q, want %d %q", tc.cert, tc.pass, code, msg, tc.want, tc.wantPrefix)
		}
	}
	if n := a.Failures.Load(); n != 1 {
		t.Errorf("%d failures counted, want 1 (the wrong password)", n)
	}
	noPass, _ := access(admit.Guard{TLS: tl})
	if code, msg := noPass.Allowed(request("10.0.0.1:1", "", "", true)); code != 0 {
		t.Errorf("no password, a remote client with a certificate: %d %q, want 0", code, msg)
	}
}

// TestProtect: the handler serves only what Allowed lets through; a
// refusal is answered with its status and message, and only a missing
// password asks for one (WWW-Authenticate).
func TestProtect(t *testing.T) {
	a, _ := access(admit.Guard{Password: true})
	served := 0
	h := a.Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ }))
	for _, tc := range []struct {
		r         *http.Request
		code      int
		challenge bool
	}{
		{request("127.0.0.1:1", "default", "wrong", false), http.StatusUnauthorized, true},
		{request("127.0.0.1:1", "default", "pw", false), http.StatusOK, false},
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, tc.r)
		if w.Code != tc.code || (w.Header().Get("WWW-Authenticate") != "") != tc.challenge {
			t.Errorf("%d (WWW-Authenticate %q), want %d, challenge %v", w.Code, w.Header().Get("WWW-Authenticate"), tc.code, tc.challenge)
		}
		if tc.code != http.StatusOK && !strings.Contains(w.Body.String(), "WRONGPASS") {
			t.Errorf("a refusal without its message: %q", w.Body)
		}
	}
	protected, _ := access(admit.Guard{})
	w := httptest.NewRecorder()
	protected.Protect(http.NotFoundHandler()).ServeHTTP(w, request("10.0.0.1:1", "", "", false))
	if w.Code != http.StatusForbidden || w.Header().Get("WWW-Authenticate") != "" || !strings.Contains(w.Body.String(), "protected mode") {
		t.Errorf("protected mode, a remote client: %d (WWW-Authenticate %q) %q; want 403 without a challenge", w.Code, w.Header().Get("WWW-Authenticate"), w.Body)
	}
	if served != 1 {
		t.Errorf("the handler served %d requests, want 1", served)
	}
}

// newTLS returns a TLS identity that requires client certificates:
// testdata's self-signed certificate (a throwaway key, made with openssl
// req -x509 -newkey ec), its own CA.
func newTLS(t *testing.T) *admit.TLS {
	t.Helper()
	cert := filepath.Join("testdata", "cert.pem")
	tl, err := admit.NewTLS(admit.TLSFiles{Cert: cert, Key: filepath.Join("testdata", "key.pem"), CA: cert}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return tl
}
