package admit

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/conffile"
)

// TLSFiles names the PEM files of the server's TLS identity. With CA set,
// clients must present a certificate signed by it.
type TLSFiles struct {
	Cert, Key string
	CA        string // optional
}

// TLS holds the loaded certificates; Load swaps them while connections
// stay open, new handshakes use the new ones. Safe for concurrent use.
type TLS struct {
	files    TLSFiles
	maxBytes int64 // each file's (Config.MaxConfigFile)
	cur      atomic.Pointer[tls.Config]
}

// NewTLS loads the files f names, each read up to maxBytes
// (--max-config-file). Its errors name the server, as they did when the
// server owned them.
func NewTLS(f TLSFiles, maxBytes int64) (*TLS, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("server: TLS needs both a certificate and a key file")
	}
	t := &TLS{files: f, maxBytes: maxBytes}
	if err := t.Load(); err != nil {
		return nil, err
	}
	return t, nil
}

// Load reads the files again; on an error the certificates in use stay.
func (t *TLS) Load() error {
	certPEM, err := conffile.Read(t.files.Cert, t.maxBytes)
	if err != nil {
		return fmt.Errorf("server: read TLS certificate: %w", err)
	}
	keyPEM, err := conffile.Read(t.files.Key, t.maxBytes)
	if err != nil {
		return fmt.Errorf("server: read TLS key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("server: load TLS certificate %s and key %s: %w", t.files.Cert, t.files.Key, err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.files.CA != "" {
		pem, err := conffile.Read(t.files.CA, t.maxBytes)
		if err != nil {
			return fmt.Errorf("server: read TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("server: TLS CA file %s holds no PEM certificate", t.files.CA)
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	t.cur.Store(c)
	return nil
}

// Config is the listener's configuration: every handshake asks for the
// current one.
func (t *TLS) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.cur.Load(), nil
		},
	}
}

// HTTPConfig is the configuration of the HTTP listeners (the probes and
// metrics port, /check): like Config, but a client certificate is checked
// when given rather than required in the handshake, so that probes and
// proxies on loopback need none; each handler decides what a request
// without one may do.
func (t *TLS) HTTPConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := t.cur.Load().Clone()
			if c.ClientAuth == tls.RequireAndVerifyClientCert {
				c.ClientAuth = tls.VerifyClientCertIfGiven
			}
			return c, nil
		},
	}
}

// Replication returns the configurations of the replication transport
// between the nodes of replicated shards: mutual TLS, each node
// presenting the server's certificate and verifying the others' against
// the CA of --tls-ca, both as reloaded (new connections take the new
// certificate). Without a CA the nodes could not tell each other from
// anyone: refused.
func (t *TLS) Replication() (client, server *tls.Config, err error) {
	if t.files.CA == "" {
		return nil, nil, errors.New("server: --cluster-replicas with --tls-cert needs --tls-ca: the nodes authenticate each other's replication connections with certificates that CA signed, each allowing client and server authentication and naming the host of its node's replication address")
	}
	server = &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.cur.Load(), nil
		},
	}
	client = &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The transport keeps this configuration for its life, so the
		// other node's certificate is verified in VerifyConnection,
		// against the CA as last loaded, instead of against RootCAs
		// fixed here: a CA rotated by a reload applies to new
		// connections, as the certificate does.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyNode(t.cur.Load().ClientCAs, cs)
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &t.cur.Load().Certificates[0], nil
		},
	}
	return client, server, nil
}

// verifyNode verifies the certificate another node presented in cs
// against roots, for the host cs.ServerName names, as crypto/tls does
// for RootCAs.
func verifyNode(roots *x509.CertPool, cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: the other node presented no certificate")
	}
	opts := x509.VerifyOptions{Roots: roots, DNSName: cs.ServerName, Intermediates: x509.NewCertPool()}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
	}
	return nil
}

// ErrNodeTLSNeedsCA is the error of NodeClient on a server without a CA
// (--tls-ca): it could not tell another node from anyone.
var ErrNodeTLSNeedsCA = errors.New("over TLS a node reaches another only with --tls-ca, the CA that signed the nodes' certificates (each allowing server and client authentication and naming the host of its node's address)")

// NodeClient returns the configuration of a new connection from this
// node to another node's RESP port (a forwarded counter hit): it
// presents this server's certificate and verifies the other's against
// the CA of --tls-ca, both as last loaded, so a reload (SIGHUP) applies
// to the connections opened afterwards. Each call returns a new
// configuration, for the caller to set ServerName. Without a CA it
// returns ErrNodeTLSNeedsCA.
func (t *TLS) NodeClient() (*tls.Config, error) {
	if t.files.CA == "" {
		return nil, ErrNodeTLSNeedsCA
	}
	cur := t.cur.Load()
	cert := &cur.Certificates[0]
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    cur.ClientCAs,
		// Presented whatever CAs the other node names: one that refuses
		// it says why in its handshake error.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return cert, nil
		},
	}, nil
}

// Current is the configuration in use, as last loaded.
func (t *TLS) Current() *tls.Config { return t.cur.Load() }

// Reload is Load for SIGHUP after a certificate renewal, its outcome
// logged on log; open connections keep their session, and on an error
// the certificates in use stay. Without TLS (a nil t) it does nothing.
func (t *TLS) Reload(log *slog.Logger) error {
	if t == nil {
		return nil
	}
	if err := t.Load(); err != nil {
		log.Error("TLS reload failed; keeping the certificates in use", "err", err)
		return err
	}
	log.Info("TLS certificates reloaded", "cert", t.files.Cert)
	return nil
}

// Files are the files the certificates are read from.
func (t *TLS) Files() TLSFiles { return t.files }
