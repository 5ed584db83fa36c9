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
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
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
	err := c.Handshake()
	if err == nil {
		// Until the server closes: it checks the client's certificate
		// after the client's handshake is done (TLS 1.3), and on a pipe
		// its session tickets wait for a reader.
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
