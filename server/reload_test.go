package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/conffile"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/reload"
	"github.com/sluicehq/sluice/storage"
)

// TestReloadThatHangsHoldsUpNothing: a reload whose file system does not
// answer (a hung NFS mount; here a reload that blocks until the test lets
// it go) holds up POLICY RELOAD no longer than ReloadTimeout, another
// reload until it ends, and Close not at all. The timeouts are the test's
// to fire.
func TestReloadThatHangsHoldsUpNothing(t *testing.T) {
	store, err := storage.Open(t.TempDir(), StoreOptions(storage.Options{Sync: storage.SyncEverySec}))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Store: store, Policy: policycmd.Config{File: policyFile(t, "rules.ini", "[default]\ncreditLimit = 7\nresetSeconds = 0\n")}})
	if err != nil {
		t.Fatal(err)
	}
	timeouts := make(chan chan time.Time, 8)
	srv.after = func(d time.Duration) <-chan time.Time {
		if d != reload.DefaultTimeout {
			return time.After(d) // Close's
		}
		ch := make(chan time.Time, 1)
		timeouts <- ch
		return ch
	}
	serveOn(t, srv, store)

	// hang starts a reload that blocks until release is closed, and
	// returns its caller's timeout and outcome.
	hang := func(release chan struct{}) (chan time.Time, chan error) {
		hung, outcome := make(chan struct{}), make(chan error, 1)
		go func() { outcome <- srv.reload.Run(func() error { close(hung); <-release; return nil }) }()
		<-hung
		return <-timeouts, outcome
	}
	release := make(chan struct{})
	timeout, outcome := hang(release)

	c := newClient(t, srv)
	reply := make(chan error, 1)
	go func() { reply <- c.Do(t.Context(), "POLICY", "RELOAD").Err() }()
	(<-timeouts) <- time.Time{}
	if err := <-reply; err == nil || !strings.Contains(err.Error(), "another reload has been reading its files for longer than 5s (--reload-timeout)") {
		t.Fatalf("POLICY RELOAD during a hung reload: %v; want the timeout error", err)
	}
	timeout <- time.Time{}
	if err := <-outcome; !errors.Is(err, reload.ErrTimeout) || !strings.Contains(err.Error(), "still reading its files after 5s") {
		t.Fatalf("the hung reload's caller: %v; want %v", err, reload.ErrTimeout)
	}
	// The next reload waits for the hung one, then runs.
	next := make(chan error, 1)
	go func() { next <- srv.ReloadPolicy() }()
	<-timeouts
	close(release)
	if err := <-next; err != nil {
		t.Fatalf("a reload after the hung one ended: %v", err)
	}
	if n := srv.pol.Reloads.Load(); n != 1 {
		t.Fatalf("policy reloads: %d, want 1", n)
	}

	// Close waits for neither a hung reload nor one waiting for it.
	release = make(chan struct{})
	defer close(release)
	_, outcome = hang(release)
	waiting := make(chan error, 1)
	go func() { waiting <- srv.Reload() }()
	<-timeouts
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan error{outcome, waiting} {
		if err := <-ch; !errors.Is(err, storage.ErrClosed) {
			t.Fatalf("a reload's caller at Close: %v; want %v", err, storage.ErrClosed)
		}
	}
}

// TestReloadReadsOnlyRegularFiles: a rule file, a TLS file or a file of
// --rls-config that is not a regular file, or too big, is refused by a
// reload without being opened, and what is in use is kept.
func TestReloadReadsOnlyRegularFiles(t *testing.T) {
	pki := newTestPKI(t)
	cert := pki.cert
	rules := policyFile(t, "rules.ini", "[default]\ncreditLimit = 7\nresetSeconds = 0\n")
	rlsDir := rlsConfigDir(t, rlsYAML)
	srv := startServer(t, Config{Policy: policycmd.Config{File: rules}, RLS: envoy.Config{Dir: rlsDir}, Listen: admit.Config{TLS: &admit.TLSFiles{Cert: pki.cert, Key: pki.key}}, Files: reload.Config{MaxFileBytes: 8 << 10}})
	if err := srv.Reload(); err != nil {
		t.Fatalf("Reload of good files: %v", err)
	}
	for _, tc := range []struct {
		path   string
		reload func() error
	}{
		{rules, srv.ReloadPolicy},
		{cert, srv.ReloadTLS},
		{filepath.Join(rlsDir, "config.yaml"), srv.ReloadRLS},
	} {
		good, err := os.ReadFile(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(tc.path); err != nil {
			t.Fatal(err)
		}
		// A symlink to a directory: --rls-config skips directories.
		if err := os.Symlink(t.TempDir(), tc.path); err != nil {
			t.Fatal(err)
		}
		if err := tc.reload(); !errors.Is(err, conffile.ErrNotRegular) || !strings.Contains(err.Error(), tc.path+", a symlink to ") || !strings.Contains(err.Error(), "is a directory; expected a regular file") {
			t.Errorf("reload with %s a symlink to a directory: %v", tc.path, err)
		}
		if err := os.Remove(tc.path); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(tc.path, append(good, make([]byte, 8<<10)...), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := tc.reload(); !errors.Is(err, conffile.ErrTooBig) || !strings.Contains(err.Error(), "over the limit of 8192 (--max-config-file)") {
			t.Errorf("reload with %s too big: %v", tc.path, err)
		}
		if err := os.WriteFile(tc.path, good, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Reload(); err != nil {
		t.Fatalf("Reload of good files again: %v", err)
	}
	if p, r := srv.pol.ReloadFailures.Load(), srv.rls.Info().ReloadFailures; p != 2 || r != 2 {
		t.Fatalf("reload failures: policy %d, rls %d; want 2 each", p, r)
	}
}
