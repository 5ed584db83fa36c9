package server

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/respserver"
)

func TestAuthRequiredLikeRedis(t *testing.T) {
	srv := startServer(t, Config{Listen: admit.Config{Password: "s3cret"}})
	ctx := context.Background()
	c := newClient(t, srv)

	if err := c.Do(ctx, "RL.REDUCE", "k", 10, 60).Err(); err == nil || err.Error() != "NOAUTH Authentication required." {
		t.Fatalf("RL.REDUCE before AUTH: %v, want NOAUTH", err)
	}
	if err := c.Do(ctx, "PING").Err(); err != nil {
		t.Fatalf("PING before AUTH: %v", err)
	}
	if err := c.Do(ctx, "HELLO", 3).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
		t.Fatalf("HELLO 3 before AUTH: %v, want NOAUTH", err)
	}
	for _, args := range [][]any{{"AUTH", "wrong"}, {"AUTH", "default", "wrong"}, {"AUTH", "admin", "s3cret"}, {"HELLO", 3, "AUTH", "default", "nope"}} {
		if err := c.Do(ctx, args...).Err(); err == nil || !strings.HasPrefix(err.Error(), "WRONGPASS") {
			t.Fatalf("%v: %v, want WRONGPASS", args, err)
		}
	}
	if got := srv.stats.AuthFailures.Load(); got != 4 {
		t.Fatalf("auth failures counted: %d, want 4", got)
	}
	if err := c.Do(ctx, "RL.REDUCE", "k", 10, 60).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
		t.Fatalf("RL.REDUCE after failed AUTHs: %v, want NOAUTH", err)
	}
	if err := c.Do(ctx, "AUTH", "s3cret").Err(); err != nil {
		t.Fatalf("AUTH: %v", err)
	}
	if n, err := c.Do(ctx, "RL.REDUCE", "k", 10, 60).Int64(); err != nil || n != 10 {
		t.Fatalf("RL.REDUCE after AUTH: %d, %v", n, err)
	}

	// go-redis with a password authenticates itself (HELLO 3 AUTH ...).
	for _, proto := range []int{2, 3} {
		pc := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), Password: "s3cret", Protocol: proto, MaxRetries: -1})
		if n, err := pc.Do(ctx, "RL.REDUCE", "k", 10, 60).Int64(); err != nil || n != 9-int64(proto-2) {
			t.Fatalf("RESP%d client with a password: %d, %v", proto, n, err)
		}
		pc.Close()
	}
	bad := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), Password: "nope", MaxRetries: -1})
	defer bad.Close()
	if err := bad.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("client with a wrong password: %v, want WRONGPASS", err)
	}
}

func TestAuthWithoutPasswordBehavesLikeRedis(t *testing.T) {
	srv := startServer(t, Config{})
	ctx := context.Background()
	c := newClient(t, srv)
	if err := c.Do(ctx, "AUTH", "x").Err(); err == nil || !strings.Contains(err.Error(), "without any password configured") {
		t.Fatalf("AUTH x without a password configured: %v", err)
	}
	if err := c.Do(ctx, "AUTH", "default", "anything").Err(); err != nil {
		t.Fatalf("AUTH default anything without a password configured: %v", err)
	}
}

// testPKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, as PEM files in a directory.
type testPKI struct {
	dir                         string
	ca, cert, key, cliCert, cli string // file names
	caPool                      *x509.CertPool
	client                      tls.Certificate
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(caCert)
	p.ca = p.write(t, "ca.pem", "CERTIFICATE", caDER)
	p.cert, p.key = p.issue(t, "server", caCert, caKey, x509.ExtKeyUsageServerAuth, 2)
	p.cliCert, p.cli = p.issue(t, "client", caCert, caKey, x509.ExtKeyUsageClientAuth, 3)
	p.client, err = tls.LoadX509KeyPair(p.cliCert, p.cli)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *testPKI) issue(t *testing.T, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage, serial int64) (certFile, keyFile string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+"-key.pem", "EC PRIVATE KEY", kder)
}

func (p *testPKI) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	f := filepath.Join(p.dir, name)
	if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestTLS(t *testing.T) {
	pki := newTestPKI(t)
	ctx := context.Background()
	tlsClient := func(srv *Server, pki *testPKI, cert *tls.Certificate) *redis.Client {
		cfg := &tls.Config{RootCAs: pki.caPool, MinVersion: tls.VersionTLS12}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		c := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), TLSConfig: cfg, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}

	t.Run("server certificate", func(t *testing.T) {
		srv := startServer(t, Config{Listen: admit.Config{TLS: &admit.TLSFiles{Cert: pki.cert, Key: pki.key}}})
		c := tlsClient(srv, pki, nil)
		if n, err := c.Do(ctx, "RL.REDUCE", "k", 5, 60).Int64(); err != nil || n != 5 {
			t.Fatalf("RL.REDUCE over TLS: %d, %v", n, err)
		}
		if err := newClient(t, srv).Ping(ctx).Err(); err == nil {
			t.Fatal("a plain-text client was served by a TLS server")
		}
		redisCLI(t, srv, "--tls", "--cacert", pki.ca)

		// Renewal: new files, ReloadTLS (SIGHUP); the open connection
		// stays, new handshakes get the new certificate.
		peerSerial(t, srv, pki)
		renewed := newTestPKI(t) // another CA: only the new chain verifies
		for src, dst := range map[string]string{renewed.cert: pki.cert, renewed.key: pki.key} {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := srv.ReloadTLS(); err != nil {
			t.Fatal(err)
		}
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("open connection after reload: %v", err)
		}
		peerSerial(t, srv, renewed)
		// A bad file keeps the certificates in use.
		if err := os.WriteFile(pki.cert, []byte("not a certificate"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := srv.ReloadTLS(); err == nil {
			t.Fatal("ReloadTLS accepted a broken certificate file")
		}
		peerSerial(t, srv, renewed)
	})

	t.Run("client certificate required", func(t *testing.T) {
		pki := newTestPKI(t)
		srv := startServer(t, Config{Listen: admit.Config{TLS: &admit.TLSFiles{Cert: pki.cert, Key: pki.key, CA: pki.ca}}})
		if err := tlsClient(srv, pki, nil).Ping(ctx).Err(); err == nil {
			t.Fatal("served a client without a certificate")
		}
		if err := tlsClient(srv, pki, &pki.client).Ping(ctx).Err(); err != nil {
			t.Fatalf("client with a certificate: %v", err)
		}
		redisCLI(t, srv, "--tls", "--cacert", pki.ca, "--cert", pki.cliCert, "--key", pki.cli)
	})
}

// peerSerial makes a new TLS handshake, verifying the server against pki's
// CA, and returns the certificate's serial number.
func peerSerial(t *testing.T, srv *Server, pki *testPKI) string {
	t.Helper()
	conn, err := tls.Dial("tcp", srv.Addr().String(), &tls.Config{RootCAs: pki.caPool, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// redisCLI runs redis-cli with the TLS flags against srv and checks that
// RL.REDUCE works. Missing redis-cli skips, except in CI.
func redisCLI(t *testing.T, srv *Server, flags ...string) {
	t.Helper()
	path, err := exec.LookPath("redis-cli")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-cli is missing; .ci/run installs redis-tools")
		}
		t.Log("redis-cli not installed; skipping its TLS check")
		return
	}
	host, port, _ := net.SplitHostPort(srv.Addr().String())
	args := append([]string{"-h", host, "-p", port}, flags...)
	out, err := exec.Command(path, append(args, "RL.REDUCE", "cli", "3", "60")...).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "3" {
		t.Fatalf("redis-cli %v: %v\n%s", flags, err, out)
	}
}

func TestProtectedMode(t *testing.T) {
	for _, c := range []struct {
		addr net.Addr
		want bool
	}{
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1")}, true},
		{&net.TCPAddr{IP: net.ParseIP("::1")}, true},
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3")}, false},
		{&net.TCPAddr{IP: net.ParseIP("192.168.0.1")}, false},
	} {
		if got := admit.IsLoopback(c.addr); got != c.want {
			t.Errorf("admit.IsLoopback(%v) = %v", c.addr, got)
		}
	}
	pki := newTestPKI(t)
	for _, c := range []struct {
		cfg  Config
		want bool
	}{
		{Config{}, true},
		{Config{Listen: admit.Config{Password: "x"}}, false},
		{Config{Listen: admit.Config{AllowRemoteWithoutAuth: true}}, false},
		{Config{Listen: admit.Config{TLS: &admit.TLSFiles{Cert: pki.cert, Key: pki.key}}}, true},
		{Config{Listen: admit.Config{TLS: &admit.TLSFiles{Cert: pki.cert, Key: pki.key, CA: pki.ca}}}, false},
	} {
		srv := startServer(t, c.cfg)
		if got := srv.adm.Guard.Protected(); got != c.want {
			t.Errorf("protected() with %+v = %v, want %v", c.cfg, got, c.want)
		}
	}
	// A non-loopback client of a protected server gets DENIED and is
	// closed: serve on an address that is not loopback when the machine
	// has one.
	ip := firstNonLoopbackIP()
	if ip == nil {
		t.Log("no non-loopback address on this machine; DENIED reply not exercised")
		return
	}
	srv := startServerOn(t, Config{}, net.JoinHostPort(ip.String(), "0"))
	conn, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 1024)
	n, _ := conn.Read(b)
	if !strings.HasPrefix(string(b[:n]), "-DENIED sluice is running in protected mode") {
		t.Fatalf("non-loopback client of a protected server got %q", b[:n])
	}
	if got := srv.stats.RejectedDenied.Load(); got != 1 {
		t.Fatalf("rejected (protected mode) = %d, want 1", got)
	}
}

func firstNonLoopbackIP() net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return ipn.IP
		}
	}
	return nil
}

// TestAuthFailuresCloseTheConnection: a connection's MaxAuthFailures-th
// failed AUTH or HELLO AUTH is answered WRONGPASS and the connection is
// closed, so one connection cannot guess passwords without end.
func TestAuthFailuresCloseTheConnection(t *testing.T) {
	wrong := "*2\r\n$4\r\nAUTH\r\n$5\r\nwrong\r\n"
	helloWrong := "*5\r\n$5\r\nHELLO\r\n$1\r\n3\r\n$4\r\nAUTH\r\n$7\r\ndefault\r\n$5\r\nwrong\r\n"
	wrongPass := "-WRONGPASS invalid username-password pair or user is disabled.\r\n"

	t.Run("default", func(t *testing.T) {
		srv := startServer(t, Config{Listen: admit.Config{Password: "s3cret"}})
		conn := dial(t, srv)
		// Four AUTHs and a HELLO AUTH, then a PING that must not run.
		if _, err := io.WriteString(conn, strings.Repeat(wrong, 4)+helloWrong+"PING\r\n"); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(conn)
		if err != nil || string(got) != strings.Repeat(wrongPass, 5) {
			t.Fatalf("after %d failed AUTHs read %q, %v; want %d WRONGPASS and the connection closed",
				respserver.DefaultMaxAuthFailures, got, err, respserver.DefaultMaxAuthFailures)
		}
		if f, c := srv.stats.AuthFailures.Load(), srv.stats.AuthClosed.Load(); f != 5 || c != 1 {
			t.Fatalf("failures %d, connections closed %d; want 5 and 1", f, c)
		}
		// Other connections are not affected, and the password still works.
		ok := newClient(t, srv)
		if err := ok.Do(context.Background(), "AUTH", "s3cret").Err(); err != nil {
			t.Fatal(err)
		}
		if got := infoField(t, ok, "stats", "auth_closed_connections"); got != "1" {
			t.Fatalf("INFO auth_closed_connections = %q", got)
		}
		if got := infoField(t, ok, "stats", "acl_access_denied_auth"); got != "5" {
			t.Fatalf("INFO acl_access_denied_auth = %q", got)
		}
	})
	t.Run("a pipeline of guesses stops at the limit", func(t *testing.T) {
		srv := startServer(t, Config{Listen: admit.Config{Password: "s3cret"}, RESP: respserver.Tuning{MaxAuthFailures: respserver.LimitOf(3)}})
		conn := dial(t, srv)
		go io.WriteString(conn, strings.Repeat(wrong, 10000)+"AUTH s3cret\r\n")
		got, _ := io.ReadAll(conn) // a reset is fine: the server did not read everything
		if n := strings.Count(string(got), "WRONGPASS"); n != 3 || strings.Contains(string(got), "+OK") {
			t.Fatalf("read %d WRONGPASS (%q...); want exactly 3 and no OK", n, got[:min(len(got), 200)])
		}
		if f := srv.stats.AuthFailures.Load(); f != 3 {
			t.Fatalf("failures counted %d, want 3: the rest of the pipeline must not run", f)
		}
	})
	t.Run("negative never closes", func(t *testing.T) {
		srv := startServer(t, Config{Listen: admit.Config{Password: "s3cret"}, RESP: respserver.Tuning{MaxAuthFailures: respserver.NoLimit[int]()}})
		conn := dial(t, srv)
		r := bufio.NewReader(conn)
		for range 20 {
			if got := roundTrip(t, conn, r, wrong); got != wrongPass {
				t.Fatalf("AUTH wrong: %q", got)
			}
		}
		if got := roundTrip(t, conn, r, "PING\r\n"); got != "+PONG\r\n" {
			t.Fatalf("PING after 20 failures: %q", got)
		}
	})
}

// TestAuthFailureCloseKeepsTheReplies: the connection closed at the
// MaxAuthFailures-th failure still delivers every WRONGPASS when the
// client pipelined more behind it: a plain close with its commands unread
// makes the kernel reset the connection, which can discard the replies
// before the client reads them.
func TestAuthFailureCloseKeepsTheReplies(t *testing.T) {
	wrong := "*2\r\n$4\r\nAUTH\r\n$5\r\nwrong\r\n"
	wrongPass := "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
	srv := startServer(t, Config{Listen: admit.Config{Password: "s3cret"}})
	conn := dial(t, srv)
	// 100 PINGs of 100 bytes: more than the server's first read, so that
	// some is still unread when it closes.
	pings := strings.Repeat("PING "+strings.Repeat("x", 100)+"\r\n", 100)
	if _, err := io.WriteString(conn, strings.Repeat(wrong, respserver.DefaultMaxAuthFailures)+pings); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	if err != nil || string(got) != strings.Repeat(wrongPass, respserver.DefaultMaxAuthFailures) {
		t.Fatalf("after %d failed AUTHs and 100 PINGs in one write, read %q, %v; want %d WRONGPASS then EOF",
			respserver.DefaultMaxAuthFailures, got, err, respserver.DefaultMaxAuthFailures)
	}
}
