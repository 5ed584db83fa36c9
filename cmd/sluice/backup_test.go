package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// backup runs sluice backup with only the given arguments.
func backup(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := backupCommand{}.run(invocation{ctx: context.Background(), lookupEnv: func(string) (string, bool) { return "", false }, stdout: &out, stderr: io.Discard}, args)
	return out.String(), err
}

// TestBackupOverHTTP takes a backup over the network while clients keep
// writing, restores it into a second server, and compares every bucket:
// those written before the backup are equal, and each one written during
// it holds every change acknowledged before the backup began and none made
// after it ended.
func TestBackupOverHTTP(t *testing.T) {
	backupDir := t.TempDir()
	p := startProc(t, t.TempDir(), "--requirepass", "pw", "--backup-dir", backupDir)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: p.addr, Password: "pw", MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	const at, limit, settled, writers = 1_700_000_000, 1_000_000, 500, 8

	pipe := c.Pipeline()
	for i := range settled {
		pipe.Do(ctx, "RL.REDUCE", fmt.Sprintf("a:%d", i), limit, 3600, "TAKE", i+1, "AT", at)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	var acked [writers]atomic.Int64
	stop := make(chan struct{})
	errs := make(chan error, writers)
	var started, running sync.WaitGroup
	for w := range writers {
		started.Add(1)
		running.Add(1)
		go func() {
			defer running.Done()
			once := sync.OnceFunc(started.Done)
			defer once()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := c.Do(ctx, "RL.REDUCE", fmt.Sprintf("b:%d", w), limit, 3600, "TAKE", 1, "AT", at).Err(); err != nil {
					errs <- err
					return
				}
				if acked[w].Add(1) == 10 {
					once()
				}
			}
		}()
	}
	started.Wait() // every writer is under way
	var before, after [writers]int64
	for w := range writers {
		before[w] = acked[w].Load()
	}
	restored := filepath.Join(t.TempDir(), "restored")
	out, err := backup(t, "--from", p.httpAddr, "--requirepass", "pw", "--dir", restored)
	for w := range writers {
		after[w] = acked[w].Load()
	}
	close(stop)
	running.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}
	if err != nil {
		t.Fatalf("backup: %v", err)
	}
	if !strings.Contains(out, "in "+restored) {
		t.Errorf("backup output %q does not name %s", out, restored)
	}
	for w := range writers {
		if after[w] <= before[w] {
			t.Logf("writer %d acknowledged nothing during the backup (%d)", w, before[w])
		}
	}

	// Refused without the password, and with a wrong one.
	for _, pw := range []string{"", "wrong"} {
		args := []string{"--from", p.httpAddr, "--dir", filepath.Join(t.TempDir(), "x")}
		if pw != "" {
			args = append(args, "--requirepass", pw)
		}
		if _, err := backup(t, args...); err == nil || !strings.Contains(err.Error(), "401") {
			t.Errorf("backup with password %q: %v, want 401", pw, err)
		}
	}

	// The same backup as a file: a tar archive of one directory, the files
	// the directory got.
	outDir := t.TempDir()
	if _, err := backup(t, "--from", "http://"+p.httpAddr, "--requirepass", "pw", "--out", outDir+"/"); err != nil {
		t.Fatalf("backup --out: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(outDir, "*"))
	if len(files) != 1 || !strings.HasPrefix(filepath.Base(files[0]), "sluice-") || !strings.HasSuffix(files[0], ".tar") {
		t.Fatalf("--out %s/ made %v, want one sluice-<time>.tar", outDir, files)
	}
	// It is another checkpoint than the one in --dir, taken later, so its
	// log files may differ (Pebble may have rotated its log meanwhile): it
	// must hold a store's files in one directory, whatever their number.
	names := tarNames(t, files[0])
	dir := strings.TrimSuffix(filepath.Base(files[0]), ".tar")
	for _, want := range []string{"MANIFEST-", "OPTIONS-", "marker.manifest."} {
		found := false
		for _, n := range names {
			if strings.HasPrefix(n, dir+"/") && strings.HasPrefix(strings.TrimPrefix(n, dir+"/"), want) {
				found = true
			}
		}
		if !found {
			t.Errorf("--out holds %v: no %s* file in %s/", names, want, dir)
		}
	}

	// Restore into a second server.
	q := startProc(t, restored, "--requirepass", "pw", "--backup-dir", t.TempDir())
	qc := redis.NewClient(&redis.Options{Addr: q.addr, Password: "pw", MaxRetries: -1})
	t.Cleanup(func() { qc.Close() })
	for i := range settled {
		key := fmt.Sprintf("a:%d", i)
		got, err := qc.Do(ctx, "RL.GET", key, limit, 3600, "AT", at).Int64()
		want, werr := c.Do(ctx, "RL.GET", key, limit, 3600, "AT", at).Int64()
		if err != nil || werr != nil || got != want || got != limit-int64(i+1) {
			t.Fatalf("%s: restored %d (%v), original %d (%v), want %d", key, got, err, want, werr, limit-int64(i+1))
		}
	}
	for w := range writers {
		key := fmt.Sprintf("b:%d", w)
		tokens, err := qc.Do(ctx, "RL.GET", key, limit, 3600, "AT", at).Int64()
		if err != nil {
			t.Fatal(err)
		}
		// One reply per writer may still have been on its way when the
		// backup returned.
		if n := limit - tokens; n < before[w] || n > after[w]+1 {
			t.Errorf("%s: the backup holds %d changes; %d were acknowledged before it began, %d when it ended", key, n, before[w], after[w])
		}
	}
	if n, err := qc.DBSize(ctx).Result(); err != nil || n != settled+writers {
		t.Errorf("restored DBSIZE %d, %v; want %d", n, err, settled+writers)
	}
	// The streamed copies are gone from the server's --backup-dir.
	if left, err := os.ReadDir(backupDir); err != nil || len(left) != 0 {
		t.Errorf("--backup-dir holds %v (%v) after the backups; want nothing", left, err)
	}
}

// TestBackupRefusesTruncated: an archive that ends without the server's
// trailer (a connection cut at a file boundary looks like a short, valid
// tar) fails the backup and leaves nothing at --out or --dir.
func TestBackupRefusesTruncated(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := tar.NewWriter(w)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "sluice-x/MANIFEST-000001", Size: 2, Mode: 0o600})
		tw.Write([]byte("ab"))
		tw.Close()
	}))
	defer srv.Close()
	dir := t.TempDir()
	for _, args := range [][]string{{"--out", filepath.Join(dir, "b.tar")}, {"--dir", filepath.Join(dir, "b")}} {
		if _, err := backup(t, append([]string{"--from", srv.URL}, args...)...); err == nil || !strings.Contains(err.Error(), "incomplete") {
			t.Errorf("%v: %v, want an incomplete archive", args, err)
		}
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("a failed backup left %v", left)
	}
}

// TestBackupProtectedMode: without a password, protected mode lets only
// loopback clients take a backup, as it does for RESP.
func TestBackupProtectedMode(t *testing.T) {
	p := startProc(t, t.TempDir(), "--backup-dir", t.TempDir())
	if _, err := backup(t, "--from", p.httpAddr, "--dir", filepath.Join(t.TempDir(), "r")); err != nil {
		t.Errorf("backup from loopback without a password: %v", err)
	}
	if _, err := backup(t, "--from", p.httpAddr); err == nil || !strings.Contains(err.Error(), "--out and --dir") {
		t.Errorf("backup without --out or --dir: %v", err)
	}
	dir := t.TempDir()
	if _, err := backup(t, "--from", p.httpAddr, "--dir", dir); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("backup into an existing directory: %v", err)
	}
	out, err := backup(t, "--from", p.httpAddr, "--dir", dir+"/")
	made, _ := filepath.Glob(filepath.Join(dir, "sluice-*", "MANIFEST-*"))
	if err != nil || len(made) != 1 || !strings.Contains(out, filepath.Dir(made[0])) {
		t.Errorf("backup --dir %s/: %q, %v; made %v, want one sluice-<time> directory", dir, out, err, made)
	}
}

func tarNames(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		names = append(names, h.Name)
	}
}

// TestBackupOverTLS: against a server with --tls-cert and --tls-ca, the
// backup verifies the server with --cacert and needs a client certificate
// as well as the password.
func TestBackupOverTLS(t *testing.T) {
	cert, key := writeCA(t, t.TempDir())
	p := startProc(t, t.TempDir(), "--tls-cert", cert, "--tls-key", key, "--tls-ca", cert, "--requirepass", "pw", "--backup-dir", t.TempDir())
	base := []string{"--from", p.httpAddr, "--requirepass", "pw", "--cacert", cert}
	if _, err := backup(t, append(base, "--tls-cert", cert, "--tls-key", key, "--dir", filepath.Join(t.TempDir(), "r"))...); err != nil {
		t.Errorf("backup over TLS with a client certificate: %v", err)
	}
	if _, err := backup(t, append(base, "--dir", filepath.Join(t.TempDir(), "r"))...); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("backup over TLS without a client certificate: %v, want 403", err)
	}
	other, _ := writeCA(t, t.TempDir())
	if _, err := backup(t, "--from", p.httpAddr, "--cacert", other, "--tls-cert", cert, "--tls-key", key, "--requirepass", "pw", "--dir", filepath.Join(t.TempDir(), "r")); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("backup verifying the server against another CA: %v, want a certificate error", err)
	}
}
