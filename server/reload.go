package server

import (
	"errors"

	"github.com/sluicehq/sluice/internal/respserver"
)

// Reloads read files an operator names: SIGHUP's (Reload: the TLS files,
// the --policy file, the --rls-config directory) and POLICY RELOAD's, one
// at a time, never waited for past Config.Files.Timeout or Close (package
// reload: Server.reload).

// Reload reads again what SIGHUP reloads, as one reload: the TLS files,
// the --policy file and the --rls-config directory, each kept as it was
// when bad. Each outcome is logged; the errors are returned joined.
func (s *Server) Reload() error {
	return s.reload.Run(func() error {
		var perr error
		if s.pol.Path != "" {
			perr = s.polCmds.ReloadFile()
		}
		return errors.Join(s.adm.Guard.TLS.Reload(s.log), perr, s.rls.Reload())
	})
}

// ReloadTLS reads the TLS files again, for SIGHUP after a certificate
// renewal, as a reload. Open connections keep their session; on an error
// the old certificates stay in use.
func (s *Server) ReloadTLS() error {
	return s.reload.Run(func() error { return s.adm.Guard.TLS.Reload(s.log) })
}

// ReloadPolicy reads the --policy file again, as a reload, and, if it is
// valid, puts it in use at once for every new hit; hits under way finish
// with the rules they started with. A bad file keeps the rules in use, is
// logged and counted, and its error is returned. Without a policy file it
// does nothing and returns rules.ErrNoPolicy.
func (s *Server) ReloadPolicy() error { return s.reload.Run(s.polCmds.ReloadFile) }

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
			e.Policy = s.polCmds.ReloadFile()
		}
		if e.RLS = s.rls.Reload(); e.Policy == nil && e.RLS == nil {
			return nil
		}
		return &e
	})
}
