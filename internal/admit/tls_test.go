package admit

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestNodeClient: a node's connection to another presents its
// certificate and verifies the other's against --tls-ca, both as last
// loaded: after a reload to another CA's certificate, a new connection
// is accepted and one configured before the reload is not. Without a CA
// NodeClient refuses, naming the flag.
func TestNodeClient(t *testing.T) {
	dir := t.TempDir()
	f := TLSFiles{Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
	installNodeCert(t, f, "a")
	noCA, err := NewTLS(f, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noCA.NodeClient(); !errors.Is(err, ErrNodeTLSNeedsCA) {
		t.Fatalf("NodeClient without a CA: %v; want ErrNodeTLSNeedsCA", err)
	}

	f.CA = f.Cert // self-signed: its own CA, as every node's
	tt, err := NewTLS(f, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	before, err := tt.NodeClient()
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(tt, before); err != nil {
		t.Fatalf("handshake with the certificates loaded: %v", err)
	}
	installNodeCert(t, f, "b") // another key and CA
	if err := tt.Load(); err != nil {
		t.Fatal(err)
	}
	after, err := tt.NodeClient()
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(tt, after); err != nil {
		t.Fatalf("handshake after a reload: %v", err)
	}
	if err := handshake(tt, before); err == nil {
		t.Fatal("a configuration from before the reload verified the new certificate")
	}
}

// handshake runs a TLS handshake between a node serving with srv and
// another connecting to it with client, and returns the client's error
// or, when it has none, the server's (its check of the client's
// certificate).
func handshake(srv *TLS, client *tls.Config) error {
	// Over loopback TCP, not net.Pipe: a side that fails the handshake
	// writes its alert while the other may still be writing its flight,
	// which a pipe's unbuffered writes turn into a wait for the deadline.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer l.Close()
	b, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return err
	}
	defer b.Close()
	a, err := l.Accept()
	if err != nil {
		return err
	}
	defer a.Close()
	deadline := time.Now().Add(time.Minute) // bounds a hang only
	a.SetDeadline(deadline)
	b.SetDeadline(deadline)
	client.ServerName = "127.0.0.1"
	done := make(chan error, 1)
	go func() {
		s := tls.Server(a, srv.Config())
		err := s.Handshake()
		s.Close()
		done <- err
	}()
	c := tls.Client(b, client)
	err = c.Handshake()
	if err == nil {
		// Until the server closes: it checks the client's certificate
		// after the client's handshake is done (TLS 1.3).
		c.Read(make([]byte, 1))
		err = <-done
	}
	c.Close()
	return err
}

// installNodeCert copies testdata's self-signed certificate of node
// name (for 127.0.0.1, allowing server and client authentication, its
// own CA, valid until 2126) and its key to f's files.
func installNodeCert(t *testing.T, f TLSFiles, name string) {
	t.Helper()
	for dst, src := range map[string]string{f.Cert: "node-" + name + ".pem", f.Key: "node-" + name + "-key.pem"} {
		b, err := os.ReadFile(filepath.Join("testdata", src))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReplicationClientFollowsReload: the replication transport's client
// configuration, made once when the node starts, verifies a node's
// certificate against --tls-ca as last loaded: after a reload to another
// CA's certificate, as every node does on SIGHUP during a CA rotation,
// the handshake with the new certificate succeeds; with the CA of the
// start it failed. A certificate from an unknown CA is still refused.
func TestReplicationClientFollowsReload(t *testing.T) {
	dir := t.TempDir()
	f := TLSFiles{Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
	f.CA = f.Cert // self-signed: its own CA, as every node's
	installNodeCert(t, f, "a")
	tt, err := NewTLS(f, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	client, _, err := tt.Replication()
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(tt, client.Clone()); err != nil {
		t.Fatalf("handshake with the certificates loaded: %v", err)
	}
	installNodeCert(t, f, "b") // another key and CA
	if err := tt.Load(); err != nil {
		t.Fatal(err)
	}
	if err := handshake(tt, client.Clone()); err != nil {
		t.Fatalf("handshake after a reload, with the configuration of the start: %v", err)
	}
	other := TLSFiles{Cert: filepath.Join(dir, "other.pem"), Key: filepath.Join(dir, "other-key.pem")}
	installNodeCert(t, other, "a")
	stranger, err := NewTLS(other, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(stranger, client.Clone()); err == nil {
		t.Fatal("a node serving a certificate of a CA no longer loaded was accepted")
	}
}
