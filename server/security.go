package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/conffile"
)

// TLSFiles names the PEM files of the server's TLS identity. With CA set,
// clients must present a certificate signed by it.
type TLSFiles struct {
	Cert, Key string
	CA        string // optional
}

// tlsState holds the loaded certificates; Reload swaps them while
// connections stay open, new handshakes use the new ones.
type tlsState struct {
	files    TLSFiles
	maxBytes int64 // each file's (Config.MaxConfigFile)
	cur      atomic.Pointer[tls.Config]
}

func newTLSState(f TLSFiles, maxBytes int64) (*tlsState, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("server: TLS needs both a certificate and a key file")
	}
	t := &tlsState{files: f, maxBytes: maxBytes}
	if err := t.load(); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *tlsState) load() error {
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

// config is the listener's configuration: every handshake asks for the
// current one.
func (t *tlsState) config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.cur.Load(), nil
		},
	}
}

// httpConfig is the configuration of the HTTP listeners (the probes and
// metrics port, /check): like config, but a client certificate is checked
// when given rather than required in the handshake, so that probes and
// proxies on loopback need none; each handler decides what a request
// without one may do.
func (t *tlsState) httpConfig() *tls.Config {
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

// replication returns the configurations of the replication transport
// between the nodes of replicated shards: mutual TLS, each node
// presenting the server's certificate and verifying the others' against
// the CA of --tls-ca, both as reloaded (new connections take the new
// certificate). Without a CA the nodes could not tell each other from
// anyone: refused.
func (t *tlsState) replication() (client, server *tls.Config, err error) {
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
		RootCAs:    t.cur.Load().ClientCAs,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &t.cur.Load().Certificates[0], nil
		},
	}
	return client, server, nil
}

// ReloadTLS reads the TLS files again, for SIGHUP after a certificate
// renewal, as a reload (reload.go). Open connections keep their session;
// on an error the old certificates stay in use.
func (s *Server) ReloadTLS() error { return s.reloading(s.reloadTLS) }

func (s *Server) reloadTLS() error {
	if s.tls == nil {
		return nil
	}
	if err := s.tls.load(); err != nil {
		s.log.Error("TLS reload failed; keeping the certificates in use", "err", err)
		return err
	}
	s.log.Info("TLS certificates reloaded", "cert", s.tls.files.Cert)
	return nil
}

// clientCertsRequired reports whether TLS admits only clients with a
// certificate from the configured CA.
func (s *Server) clientCertsRequired() bool {
	return s.tls != nil && s.tls.files.CA != ""
}

// protected reports whether protected mode applies: on, and neither a
// password nor client certificates keep strangers out.
func (s *Server) protected() bool {
	return !s.cfg.AllowRemoteWithoutAuth && s.cfg.Password == "" && !s.clientCertsRequired()
}

const deniedMessage = "DENIED sluice is running in protected mode because protected mode is enabled and no password is set. " +
	"In this mode connections are only accepted from the loopback interface. To accept others, set a password " +
	"(--requirepass or --requirepass-file), require TLS client certificates (--tls-ca), or, if this server is " +
	"only reachable from a network you trust, start it with --protected-mode no."

// warnIfExposed logs loudly when the listener is reachable from other
// machines and nothing but the network keeps strangers out.
func (s *Server) warnIfExposed(a net.Addr) {
	if s.cfg.Password != "" || s.clientCertsRequired() {
		return
	}
	if ta, ok := a.(*net.TCPAddr); ok && ta.IP.IsLoopback() {
		return
	}
	if s.cfg.AllowRemoteWithoutAuth {
		s.log.Warn("WARNING: listening on a non-loopback address with no password and no TLS client certificates, and protected mode is off: anyone who can reach this port can use and exhaust every limit",
			"addr", a.String())
		return
	}
	s.log.Warn("WARNING: listening on a non-loopback address with no password and no TLS client certificates: protected mode refuses every client that is not on loopback (set --requirepass-file, or --tls-ca, or --protected-mode no)",
		"addr", a.String())
}
