package main

import (
	"bufio"
	"bytes"
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
)

// TestSIGHUPDuringStartupIsKept sends SIGHUP while sluice is still reading
// its rule file, long before it listens. The signal must not kill the
// process (SIGHUP's default action) and must not be lost: once serving,
// the server reloads. The rule file is a named pipe, so the test knows
// for certain that the process is inside startup when the signal goes.
func TestSIGHUPDuringStartupIsKept(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.ini")
	if err := syscall.Mkfifo(rules, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	p := startProcAsync(t, filepath.Join(dir, "data"), nil, "--policy", rules)
	// Opening the pipe for writing returns once sluice has opened it for
	// reading: it is blocked in startup, reading the rules.
	w, err := os.OpenFile(rules, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(w, "[default]\ncreditLimit = 7\nresetSeconds = 0\n"); err != nil {
		t.Fatal(err)
	}
	// Later reads of the path (the server's own load, the reload) find a
	// regular file.
	if err := os.WriteFile(rules+".new", []byte("[default]\ncreditLimit = 9\nresetSeconds = 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(rules+".new", rules); err != nil {
		t.Fatal(err)
	}
	w.Close()
	select {
	case p.addr = <-p.addrc:
	case <-p.exited:
		t.Fatalf("a SIGHUP during startup stopped sluice: %v\n%s", p.err, p.logs)
	}
	c := p.client(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := c.Info(t.Context(), "policy").Result()
		if err == nil && strings.Contains(info, "policy_reloads:1\r\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the SIGHUP received during startup was never acted on: INFO policy:\n%s\nlogs:\n%s", info, p.logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got, err := c.Do(t.Context(), "HIT", "a=b").Slice(); err != nil || len(got) < 2 || got[1] != int64(9) {
		t.Fatalf("HIT after the reload: %v, %v; want the limit of 9", got, err)
	}
	p.stop(t, syscall.SIGTERM)
	if p.err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", p.err, p.logs)
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
