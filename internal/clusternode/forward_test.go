package clusternode

import (
	"crypto/tls"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
)

// TestForwardErrorKeepsItsReplyText: a forwarding failure is of kind
// errs.Forward and still tells RESP clients its reply text unchanged; an
// owner's reply that the request's hit caused stays a plain reply error,
// any other owner reply is a forwarding failure.
func TestForwardErrorKeepsItsReplyText(t *testing.T) {
	rendered := func(err error) string { return resp.ErrorText(engine.Typed(err)) }
	const text = "ERR cluster: forwarding a counter of slot 7 to its owner 10.0.0.1:9049 failed: i/o timeout"
	err := forwardErr("", strings.TrimPrefix(text, "ERR "))
	if errs.KindOf(err) != errs.Forward || rendered(err) != text {
		t.Errorf("forwardErr: Forward %v, text %q; want true, %q", errs.KindOf(err) == errs.Forward, rendered(err), text)
	}
	if code := status.Code(envoy.StatusErr(engine.Typed(err), 0)); code != codes.Unavailable {
		t.Errorf("forwardErr as a gRPC status: %v; want Unavailable", code)
	}
	for _, tc := range []struct {
		reply   string
		forward bool
	}{
		{"ERR hits: 2; a slidingLog rule records one hit at a time (hits 0 or 1)", false},
		{"ERR rule arithmetic out of range: quantity: 9: too large", false},
		{"CLUSTERDOWN Hash slot not served", true},
		{"ERR store unavailable: writes to the data directory are failing", true},
		{"ERR server is shutting down", true},
		{"ERR cluster: this node has no rule with the counter identity of the sender's rule 3", true},
	} {
		err := ownerErr(tc.reply)
		if (errs.KindOf(err) == errs.Forward) != tc.forward || rendered(err) != tc.reply {
			t.Errorf("owner reply %q: forwarding failure %v, text %q; want %v and the reply", tc.reply, errs.KindOf(err) == errs.Forward, rendered(err), tc.forward)
		}
	}
}

// TestForwardNamesARefusedCertificate: an owner that refuses the
// forwarding node's certificate (signed by a CA it does not trust) says
// so only at the first read over TLS 1.3; the error then says what the
// certificates need, as a certificate the forwarder cannot verify does.
func TestForwardNamesARefusedCertificate(t *testing.T) {
	td := filepath.Join("..", "admit", "testdata")
	a, aKey := filepath.Join(td, "node-a.pem"), filepath.Join(td, "node-a-key.pem")
	owner, err := admit.NewTLS(admit.TLSFiles{Cert: a, Key: aKey, CA: a}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	// The forwarder trusts the owner's CA, but presents node b's
	// certificate, of a CA the owner does not trust.
	self, err := admit.NewTLS(admit.TLSFiles{Cert: filepath.Join(td, "node-b.pem"), Key: filepath.Join(td, "node-b-key.pem"), CA: a}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", owner.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.(*tls.Conn).Handshake() // refuses the certificate
	}()
	f := &forwarder{tls: self.NodeClient}
	_, err = f.call(&Node{}, l.Addr().String(), time.Now().Add(time.Minute), [][]byte{[]byte("PING")})
	if err == nil || !strings.Contains(err.Error(), "the owner refused this node's certificate") || !strings.Contains(err.Error(), "--tls-ca") {
		t.Fatalf("a call the owner refused the certificate of: %v; want the refusal, naming --tls-ca", err)
	}
}
