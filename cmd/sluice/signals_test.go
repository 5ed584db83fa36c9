package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestSIGHUPDuringStartupIsKept sends SIGHUP while sluice is still
// starting, long before it listens. The signal must not kill the process
// (SIGHUP's default action) and must not be lost: once serving, the server
// reloads. To know for certain that the process is inside startup, past
// main's signal.Notify, when the signal goes, the test holds it there: its
// stderr is a pipe the test does not drain, and its first log line (the
// warning about an unknown SLUICE_ variable, which names the variable) is
// longer than a pipe holds, so the process blocks writing it.
func TestSIGHUPDuringStartupIsKept(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.ini")
	if err := os.WriteFile(rules, []byte("[default]\ncreditLimit = 7\nresetSeconds = 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Longer than a pipe's 64 KiB, shorter than the 128 KiB an
	// environment string may have.
	long := "SLUICE_" + strings.Repeat("X", 100<<10)
	cmd := exec.Command(os.Args[0], "--addr", "127.0.0.1:0", "--http-addr", "", "--data", filepath.Join(dir, "data"), "--log-format", "json", "--policy", rules)
	cmd.Env = append(os.Environ(), execMainEnv+"=1", long+"=1")
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan struct{})
	var exitErr error
	go func() {
		exitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	// The first bytes of the warning: the process is past main's
	// signal.Notify, and blocked until the pipe is drained.
	br := bufio.NewReaderSize(r, 256<<10)
	if first, err := br.Peek(16); err != nil || !bytes.HasPrefix(first, []byte("{")) {
		t.Fatalf("first log bytes: %q, %v", first, err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	var logs bytes.Buffer
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		for {
			line, err := br.ReadBytes('\n')
			if len(line) < 1<<10 {
				logs.Write(line)
			}
			var l struct{ Msg, Addr string }
			if json.Unmarshal(line, &l) == nil && l.Msg == "sluice starting" {
				addrc <- l.Addr
			}
			if err != nil {
				return
			}
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case <-exited:
		<-logged
		t.Fatalf("a SIGHUP during startup stopped sluice: %v\n%s", exitErr, logs.String())
	}
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	waitInfo(t, c, "policy", "policy_reloads:1") // the SIGHUP's reload
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-exited
	if exitErr != nil {
		<-logged
		t.Fatalf("exit after SIGTERM: %v\n%s", exitErr, logs.String())
	}
}

// TestSIGHUPRightAfterStartIsHarmless: SIGHUP's default action ends the
// process, and main can register for it only once every package is
// initialized, tens of milliseconds after exec. The test sends SIGHUP as
// soon as the first package of sluice's own has been initialized (the Go
// runtime says when, with GODEBUG=inittrace=1), twenty times: the process
// must carry on and exit 0.
func TestSIGHUPRightAfterStartIsHarmless(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for i := range 20 {
		cmd := exec.CommandContext(ctx, os.Args[0], "--version")
		cmd.Env = append(os.Environ(), execMainEnv+"=1", "GODEBUG=inittrace=1")
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sent := ""
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if pkg, ok := strings.CutPrefix(sc.Text(), "init github.com/sluicehq/sluice/"); ok && sent == "" {
				sent, _, _ = strings.Cut(pkg, " ")
				if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
					t.Fatal(err)
				}
			}
		}
		err = cmd.Wait()
		if sent == "" {
			t.Fatalf("run %d: the runtime reported no init of a sluice package (GODEBUG=inittrace=1): %v", i, err)
		}
		if err != nil {
			t.Fatalf("run %d: a SIGHUP sent once the package %s was initialized stopped sluice: %v", i, sent, err)
		}
	}
}

// TestJSONLogsStayJSON: with --log-format json every line sluice writes is
// a JSON object, including net/http's own lines (a failed TLS handshake on
// the HTTP port) and the reason a start failed.
func TestJSONLogsStayJSON(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeSelfSigned(t, dir)
	p := startProc(t, filepath.Join(dir, "data"), "--tls-cert", cert, "--tls-key", key, "--log-level", "debug")
	conn, err := net.Dial("tcp", p.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, "hello, not TLS\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// The server logs the failed handshake before it closes the connection.
	_, _ = io.Copy(io.Discard, conn)
	conn.Close()
	p.stop(t, syscall.SIGTERM)
	checkJSONLines(t, p.logs.Bytes(), "TLS handshake error")

	// A start that fails (the port is taken) says why in JSON too.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(os.Args[0], "--addr", ln.Addr().String(), "--http-addr", "", "--data", filepath.Join(dir, "data"), "--log-format", "json")
	cmd.Env = append(os.Environ(), execMainEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("start on a taken port: %v, want exit status 1\n%s", err, stderr.String())
	}
	checkJSONLines(t, stderr.Bytes(), "listen on --addr")
}

// checkJSONLines fails unless every line of logs is a JSON object and one
// of them contains want.
func checkJSONLines(t *testing.T, logs []byte, want string) {
	t.Helper()
	found := false
	sc := bufio.NewScanner(bytes.NewReader(logs))
	for sc.Scan() {
		var obj map[string]any
		if err := json.Unmarshal(sc.Bytes(), &obj); err != nil {
			t.Fatalf("a log line is not JSON: %q\nall logs:\n%s", sc.Text(), logs)
		}
		if strings.Contains(sc.Text(), want) {
			found = true
		}
	}
	if !found {
		t.Fatalf("no log line mentions %q:\n%s", want, logs)
	}
}

// writeSelfSigned writes a certificate for 127.0.0.1 and its key into dir.
func writeSelfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}
