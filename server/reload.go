package server

import (
	"errors"

	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/internal/rules"
)

// Reloads read files an operator names: SIGHUP's (Reload: the TLS files,
// the --policy file, the --rls-config directory) and POLICY RELOAD's, one
// at a time, never waited for past Config.Files.ReloadTimeout or Close (package
// reload: Server.reload).

// Reload reads again what SIGHUP reloads, as one reload: the TLS files,
// the --policy file and the --rls-config directory, each kept as it was
// when bad. Each outcome is logged; the errors are returned joined.
func (s *Server) Reload() error {
	return s.reload.Run(func() error {
		var perr error
		if s.pol.Path != "" {
			perr = s.reloadPolicy()
		}
		return errors.Join(s.reloadTLS(), perr, s.rls.Reload())
	})
}

// ReloadTLS reads the TLS files again, for SIGHUP after a certificate
// renewal, as a reload. Open connections keep their session; on an error
// the old certificates stay in use.
func (s *Server) ReloadTLS() error { return s.reload.Run(s.reloadTLS) }

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

// ReloadPolicy reads the --policy file again, as a reload, and, if it is
// valid, puts it in use at once for every new hit; hits under way finish
// with the rules they started with. A bad file keeps the rules in use, is
// logged and counted, and its error is returned. Without a policy file it
// does nothing and returns rules.ErrNoPolicy.
func (s *Server) ReloadPolicy() error { return s.reload.Run(s.reloadPolicy) }

func (s *Server) reloadPolicy() error {
	if s.pol.Path == "" {
		return rules.ErrNoPolicy
	}
	if err := s.pol.Reload(); err != nil {
		s.log.Error("policy reload failed; keeping the rules in use", "file", s.pol.Path, "err", err)
		return err
	}
	s.log.Info("policy reloaded", "file", s.pol.Path, "rules", len(s.pol.Current().Counts))
	return nil
}

// ReloadRLS reads the --rls-config directory again, as a reload, and, if
// every file is valid, puts the new configuration in use at once; calls
// under way finish with the one they started with. A bad directory keeps
// the configuration in use, is logged and counted, and its error is
// returned. Without RLS it does nothing.
func (s *Server) ReloadRLS() error { return s.reload.Run(s.rls.Reload) }

// ReloadRules is POLICY RELOAD: the rules of both front ends, as SIGHUP:
// the --policy file and the --rls-config directory, each kept as it was
// when bad, which respserver words.
func (h *frontHost) ReloadRules() error {
	s := (*Server)(h)
	return s.reload.Run(func() error {
		var e respserver.ReloadError
		if s.pol.Path != "" || s.cfg.RLS.Dir == "" {
			e.Policy = s.reloadPolicy()
		}
		if e.RLS = s.rls.Reload(); e.Policy == nil && e.RLS == nil {
			return nil
		}
		return &e
	})
}
