package server

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/logrec"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/storage"
)

func TestMaxClientsLoweredToFDLimit(t *testing.T) {
	store, err := storage.Open(t.TempDir(), storage.Options{Sync: storage.SyncEverySec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	b, err := admit.BudgetFDs(256)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logrec.Recorder{Level: slog.LevelWarn}
	srv, err := New(Config{Store: store, Logger: slog.New(logs), Listen: admit.Config{Files: b}})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, store)
	c := newClient(t, srv)
	for field, want := range map[string]string{
		"clients/maxclients":           "92",
		"clients/maxclients_requested": "10000",
		"server/fd_limit":              "256",
		"server/fd_reserved":           "164",
		"server/store_max_open_files":  "100",
	} {
		sec, name, _ := strings.Cut(field, "/")
		if got := infoField(t, c, sec, name); got != want {
			t.Errorf("INFO %s = %q, want %q", field, got, want)
		}
	}
	recs := logs.Records()
	if len(recs) != 1 || !strings.Contains(recs[0]["msg"], "maxclients lowered") || recs[0]["maxclients"] != "92" ||
		recs[0]["requested"] != "10000" || recs[0]["fd_limit"] != "256" {
		t.Fatalf("warnings logged: %v; want one that names maxclients 92, the 10000 requested and the limit 256", recs)
	}

	// A --maxclients below what the limit allows stays; a limit that
	// leaves too few clients is an error.
	srv2, err := New(Config{Store: store, Listen: admit.Config{Files: b, MaxClients: 50}})
	if err != nil || srv2.adm.Config.MaxClients != 50 {
		t.Fatalf("MaxClients 50 under a limit allowing 92: %v, %v", srv2.adm.Config.MaxClients, err)
	}
	if _, err := New(Config{Store: store, Listen: admit.Config{Files: admit.FDBudget{Limit: 170, StoreFiles: 100, Reserved: 164}}}); !errors.Is(err, admit.ErrFDLimit) {
		t.Fatalf("New with 6 descriptors left for clients: %v, want ErrFDLimit", err)
	}
}

// httpGet sends one keep-alive request on conn and returns the status.
func httpGet(t *testing.T, conn net.Conn, r *bufio.Reader, path string) int {
	t.Helper()
	if _, err := io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: sluice\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestAdmissionSharedByEveryListener: RESP, line-protocol and HTTP
// connections take slots of one MaxClients; a refused one is answered in
// its protocol and counted, and a freed slot serves any listener again.
func TestAdmissionSharedByEveryListener(t *testing.T) {
	path := policyFile(t, "p.ini", "[default]\ncreditLimit = 100\nresetSeconds = 60\n")
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Listen: admit.Config{MaxClients: 3}})
	divvyAddr := startDivvy(t, srv)
	httpAddr := strings.TrimPrefix(serveHTTPOn(t, srv), "http://")

	resp := dial(t, srv)
	if got := roundTrip(t, resp, bufio.NewReader(resp), "PING\r\n"); got != "+PONG\r\n" {
		t.Fatalf("PING = %q", got)
	}
	line := dialLine(t, divvyAddr)
	line.send("HIT\n")
	if got := line.line(); !strings.HasPrefix(got, "OK true") {
		t.Fatalf("HIT = %q", got)
	}
	hc, err := net.Dial("tcp", httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	_ = hc.SetDeadline(time.Now().Add(20 * time.Second))
	hr := bufio.NewReader(hc)
	if code := httpGet(t, hc, hr, "/metrics"); code != 200 {
		t.Fatalf("GET /metrics under the limit: %d", code)
	}
	if n := srv.adm.Open(); n != 3 {
		t.Fatalf("admitted connections = %d, want 3", n)
	}

	// Full: each listener refuses in its own protocol.
	extra := dial(t, srv)
	if got, err := io.ReadAll(extra); err != nil || string(got) != "-ERR max number of clients reached\r\n" {
		t.Fatalf("RESP client past the limit got %q, %v; want the max clients error and EOF", got, err)
	}
	extraLine := dialLine(t, divvyAddr)
	if got, err := io.ReadAll(extraLine.r); err != nil || string(got) != `ERR unknown "max number of clients reached"`+"\n" {
		t.Fatalf("line client past the limit got %q, %v", got, err)
	}
	// HTTP keeps HTTPReserve connections past the limit for probes and
	// scrapes; past those it refuses too.
	var probes []net.Conn
	for i := range admit.HTTPReserve + 1 {
		xh, err := net.Dial("tcp", httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer xh.Close()
		_ = xh.SetDeadline(time.Now().Add(20 * time.Second))
		code := httpGet(t, xh, bufio.NewReader(xh), "/healthz")
		switch {
		case i < admit.HTTPReserve && code != http.StatusOK:
			t.Fatalf("probe %d while the clients hold every slot: %d, want 200 from the HTTP reserve", i, code)
		case i == admit.HTTPReserve && code != http.StatusServiceUnavailable:
			t.Fatalf("HTTP client past the limit and the reserve: %d, want 503", code)
		}
		probes = append(probes, xh)
	}
	if n := srv.stats.RejectedMax.Load(); n != 3 {
		t.Fatalf("rejected (maxclients) = %d, want 3", n)
	}
	for _, c := range probes {
		c.Close()
	}

	// Closing the HTTP connection frees a slot for RESP.
	hc.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c := dial(t, srv)
		if roundTrip(t, c, bufio.NewReader(c), "PING\r\n") == "+PONG\r\n" {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("no RESP client admitted after the HTTP connection closed")
		}
		time.Sleep(time.Millisecond)
	}
}

// fakeListener returns errs from Accept, one per call, then net.ErrClosed.
type fakeListener struct {
	mu    sync.Mutex
	errs  []error
	calls int
}

func (l *fakeListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if len(l.errs) == 0 {
		return nil, net.ErrClosed
	}
	err := l.errs[0]
	l.errs = l.errs[1:]
	return nil, err
}
func (l *fakeListener) Close() error   { return nil }
func (l *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

func acceptErrs() []error {
	return []error{
		&net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE},
		&net.OpError{Op: "accept", Net: "tcp", Err: syscall.ENOBUFS},
		&net.OpError{Op: "accept", Net: "tcp", Err: syscall.ENFILE},
	}
}

// TestAcceptErrorsDoNotStopListeners: a failed Accept (out of descriptors
// or buffers) is retried after a pause on the line-protocol and HTTP
// listeners; it neither stops the listener nor spins.
func TestAcceptErrorsDoNotStopListeners(t *testing.T) {
	path := policyFile(t, "p.ini", "[default]\ncreditLimit = 1\nresetSeconds = 0\n")
	srv := startServer(t, Config{Policy: policycmd.Config{File: path}})
	for name, serve := range map[string]func(net.Listener) error{"divvy": srv.ServeDivvy, "http": srv.ServeHTTP} {
		ln := &fakeListener{errs: acceptErrs()}
		err := serve(ln)
		if !errors.Is(err, net.ErrClosed) || ln.calls != 4 {
			t.Errorf("%s: Serve returned %v after %d Accepts; want every error retried (4 Accepts) and the close", name, err, ln.calls)
		}
	}

	// RESP's accept loop pauses the same way, and returns the listener's
	// close.
	store, err := storage.Open(t.TempDir(), storage.Options{Sync: storage.SyncEverySec})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	resp, err := New(Config{Store: store, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Close()
	ln := &fakeListener{errs: acceptErrs()}
	if err := resp.Serve(ln); !errors.Is(err, net.ErrClosed) || ln.calls != 4 {
		t.Errorf("resp: Serve returned %v after %d Accepts; want every error retried (4 Accepts)", err, ln.calls)
	}

	// The pause doubles from 5ms up to 1s: internal/admit's
	// TestBackoffDoubles.
}
