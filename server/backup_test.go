package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/httpport"
	"github.com/sluicehq/sluice/internal/respserver"
)

// TestBackupAuth applies RESP's rules to GET /backup: the password, with
// HTTP basic authentication; without one, loopback clients only, unless
// protected mode is off.
func TestBackupAuth(t *testing.T) {
	get := func(srv *Server, remote, user, pass string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/backup", nil)
		r.RemoteAddr = remote
		if user != "" || pass != "" {
			r.SetBasicAuth(user, pass)
		}
		w := httptest.NewRecorder()
		httpHandler(srv).ServeHTTP(w, r)
		return w
	}
	withPass := startServer(t, Config{Listen: admit.Config{Password: "pw"}, RESP: respserver.Tuning{BackupDir: t.TempDir()}})
	for _, c := range []struct {
		remote, user, pass string
		want               int
	}{
		{"10.1.2.3:5000", "", "", http.StatusUnauthorized},
		{"10.1.2.3:5000", "default", "wrong", http.StatusUnauthorized},
		{"127.0.0.1:5000", "other", "pw", http.StatusUnauthorized},
		{"10.1.2.3:5000", "default", "pw", http.StatusOK},
		{"10.1.2.3:5000", "", "pw", http.StatusOK},
	} {
		w := get(withPass, c.remote, c.user, c.pass)
		if w.Code != c.want {
			t.Errorf("password set, %s user %q pass %q: %d %s, want %d", c.remote, c.user, c.pass, w.Code, w.Body, c.want)
		}
		if w.Code == http.StatusOK && (w.Result().Trailer.Get(httpport.BackupTrailer) == "" || w.Header().Get("Content-Type") != "application/x-tar") {
			t.Errorf("a backup without its trailer or content type: %v", w.Result())
		}
	}
	protected := startServer(t, Config{RESP: respserver.Tuning{BackupDir: t.TempDir()}})
	if w := get(protected, "10.1.2.3:5000", "", ""); w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "protected mode") {
		t.Errorf("protected mode, a remote client: %d %s, want 403", w.Code, w.Body)
	}
	if w := get(protected, "127.0.0.1:5000", "", ""); w.Code != http.StatusOK {
		t.Errorf("protected mode, a loopback client: %d %s, want 200", w.Code, w.Body)
	}
	open := startServer(t, Config{RESP: respserver.Tuning{BackupDir: t.TempDir()}, Listen: admit.Config{AllowRemoteWithoutAuth: true}})
	if w := get(open, "10.1.2.3:5000", "", ""); w.Code != http.StatusOK {
		t.Errorf("protected mode off, a remote client: %d %s, want 200", w.Code, w.Body)
	}
}
