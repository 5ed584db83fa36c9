package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// health runs sluice health with only the given environment.
func health(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := healthCommand{}.run(invocation{lookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }, stdout: &out, stderr: &errOut}, args)
	return out.String(), err
}

// TestHealth checks a real server through /readyz and through READY over
// RESP with its password, from flags and from the server's variables, and
// fails once the server is gone.
func TestHealth(t *testing.T) {
	p := startProc(t, t.TempDir(), "--requirepass", "s3cret")
	_, port, _ := net.SplitHostPort(p.addr)
	_, httpPort, _ := net.SplitHostPort(p.httpAddr)

	if out, err := health(t, nil, "--http-addr", p.httpAddr); err != nil || !strings.Contains(out, "/readyz ready") {
		t.Errorf("HTTP check: %q, %v", out, err)
	}
	// A listen address without a host, as in the image, is checked on
	// loopback.
	if out, err := health(t, map[string]string{"SLUICE_HTTP_ADDR": ":" + httpPort}); err != nil {
		t.Errorf("HTTP check of :%s from SLUICE_HTTP_ADDR: %q, %v", httpPort, out, err)
	}
	env := map[string]string{"SLUICE_HTTP_ADDR": "", "SLUICE_ADDR": ":" + port, "SLUICE_REQUIREPASS": "s3cret"}
	if out, err := health(t, env); err != nil || !strings.Contains(out, "READY on 127.0.0.1:"+port) {
		t.Errorf("RESP check from the environment: %q, %v", out, err)
	}
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := health(t, nil, "--http-addr", "", "--addr", p.addr, "--requirepass-file", pwFile); err != nil {
		t.Errorf("RESP check with --requirepass-file: %v", err)
	}
	if _, err := health(t, nil, "--http-addr", "", "--addr", p.addr, "--requirepass", "wrong"); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("RESP check with a wrong password: %v, want WRONGPASS", err)
	}
	if _, err := health(t, nil, "--http-addr", "", "--addr", p.addr); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("RESP check without the password: %v, want NOAUTH", err)
	}
	if _, err := health(t, nil, "--health-timeout", "0"); err == nil || !strings.Contains(err.Error(), "--health-timeout") {
		t.Errorf("--health-timeout 0: %v", err)
	}

	p.stop(t, syscall.SIGTERM)
	if _, err := health(t, nil, "--http-addr", p.httpAddr); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("HTTP check of a stopped server: %v", err)
	}
	if _, err := health(t, env); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("RESP check of a stopped server: %v", err)
	}
}

// TestHealthOverTLS: with --tls-cert the check speaks TLS and accepts the
// server's certificate only; with --tls-ca it presents the pair on RESP.
func TestHealthOverTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeCA(t, filepath.Join(dir, "a"))
	p := startProc(t, t.TempDir(), "--tls-cert", cert, "--tls-key", key, "--tls-ca", cert)
	if _, err := health(t, nil, "--http-addr", p.httpAddr, "--tls-cert", cert, "--tls-key", key); err != nil {
		t.Errorf("HTTPS check: %v", err)
	}
	if _, err := health(t, nil, "--http-addr", "", "--addr", p.addr, "--tls-cert", cert, "--tls-key", key, "--tls-ca", cert); err != nil {
		t.Errorf("RESP check over TLS with a client certificate: %v", err)
	}
	if _, err := health(t, nil, "--http-addr", p.httpAddr); err == nil {
		t.Errorf("plain HTTP check of an HTTPS server passed")
	}
	other, otherKey := writeCA(t, filepath.Join(dir, "b"))
	if _, err := health(t, nil, "--http-addr", p.httpAddr, "--tls-cert", other, "--tls-key", otherKey); err == nil || !strings.Contains(err.Error(), "not the one in --tls-cert") {
		t.Errorf("HTTPS check with another certificate: %v, want a refusal", err)
	}
}

func TestLoopback(t *testing.T) {
	for in, want := range map[string]string{
		":9049":          "127.0.0.1:9049",
		"0.0.0.0:9049":   "127.0.0.1:9049",
		"[::]:9049":      "[::1]:9049",
		"10.1.2.3:9049":  "10.1.2.3:9049",
		"sluice-0:9049":  "sluice-0:9049",
		"127.0.0.1:9050": "127.0.0.1:9050",
	} {
		if got, err := loopback(in); err != nil || got != want {
			t.Errorf("loopback(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := loopback("9049"); err == nil {
		t.Errorf("loopback(9049) accepted an address without a port separator")
	}
}

// writeCA writes a self-signed certificate for 127.0.0.1 that may serve,
// authenticate a client and sign itself (so it can be its own --tls-ca),
// and its key, into dir.
func writeCA(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice health test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true, IsCA: true,
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
