package server

import "github.com/sluicehq/sluice/internal/admit"

// TLS and protected mode are package admit's (admit.TLS, admit.Guard):
// every front end's listener applies them; the server holds them
// (Server.guard) and reloads the certificates.

// TLSFiles names the PEM files of the server's TLS identity
// (admit.TLSFiles).
type TLSFiles = admit.TLSFiles

// ReloadTLS reads the TLS files again, for SIGHUP after a certificate
// renewal, as a reload (reload.go). Open connections keep their session;
// on an error the old certificates stay in use.
func (s *Server) ReloadTLS() error { return s.reloading(s.reloadTLS) }

func (s *Server) reloadTLS() error {
	if s.guard.TLS == nil {
		return nil
	}
	if err := s.guard.TLS.Load(); err != nil {
		s.log.Error("TLS reload failed; keeping the certificates in use", "err", err)
		return err
	}
	s.log.Info("TLS certificates reloaded", "cert", s.guard.TLS.Files().Cert)
	return nil
}
