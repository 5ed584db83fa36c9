package httpport

import (
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/admit"
)

// Access is who may take a backup (/backup) or change the rules' dials
// (/v1/policy/) over HTTP: RESP's rules, applied to a request, which hands
// out every limit's state. With a password, HTTP basic authentication as
// user default (or no user name) with it; with --tls-ca, a client
// certificate from that CA (which the HTTP port otherwise does not
// require); with neither, protected mode admits loopback clients only.
type Access struct {
	Guard admit.Guard // Guard.Password: a password is required
	// CheckAuth reports whether user and pass are a user and its password,
	// as AUTH checks them.
	CheckAuth func(user, pass []byte) bool
	Failures  *atomic.Int64 // failed authentications (sluice_auth_failures_total)
	Logger    *slog.Logger
}

// Allowed returns 0 when r may proceed, else the status and the message
// to answer.
func (a *Access) Allowed(r *http.Request) (int, string) {
	if a.Guard.CertsRequired() && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
		return http.StatusForbidden, "a client certificate signed by --tls-ca is required"
	}
	if a.Guard.Password {
		user, pass, ok := r.BasicAuth()
		if user == "" {
			user = "default"
		}
		if !ok || !a.CheckAuth([]byte(user), []byte(pass)) {
			a.Failures.Add(1)
			// Debug, not warn: every request is a new attempt, and a guesser
			// must not fill the log; sluice_auth_failures_total counts them.
			a.Logger.Debug("backup over HTTP: authentication failed", "remote", r.RemoteAddr, "gave_credentials", ok)
			return http.StatusUnauthorized, "WRONGPASS invalid username-password pair or user is disabled (use HTTP basic authentication with the password)"
		}
		return 0, ""
	}
	if a.Guard.Protected() {
		if addr, err := net.ResolveTCPAddr("tcp", r.RemoteAddr); err != nil || !admit.IsLoopback(addr) {
			return http.StatusForbidden, admit.DeniedMessage
		}
	}
	return 0, ""
}

// Protect serves h to the requests Allowed lets through.
func (a *Access) Protect(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.refused(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	})
}

// refused answers r and reports true when Allowed refuses it; a request
// without the password is asked for one (WWW-Authenticate).
func (a *Access) refused(w http.ResponseWriter, r *http.Request) bool {
	code, msg := a.Allowed(r)
	if code == 0 {
		return false
	}
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Basic realm="sluice", charset="UTF-8"`)
	}
	http.Error(w, msg, code)
	return true
}
