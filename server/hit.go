package server

import (
	"cmp"
	"errors"
	"strconv"

	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/internal/rules"
)

// Policy rules (divvy's model): POLICY over RESP, ReloadPolicy and INFO's
// policy section; HIT is internal/limitcmd's (RegisterHit). The rule file
// in use, its reloads and the counters behind the divvy_* metrics are a
// rules.File (Server.pol); the line protocol is in divvy.go; every front
// end runs its hits in an engine.Round (Server.eng).

// ReloadPolicy reads the --policy file again, as a reload (reload.go),
// and, if it is valid, puts it in use at once for every new hit; hits
// under way finish with the rules they started with. A bad file keeps the
// rules in use, is logged and counted, and its error is returned. Without
// a policy file it does nothing and returns rules.ErrNoPolicy.
func (s *Server) ReloadPolicy() error { return s.reloading(s.reloadPolicy) }

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

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ReloadRules is POLICY RELOAD: the rules of both front ends, as SIGHUP:
// the --policy file and the --rls-config directory, each kept as it was
// when bad. It returns the error to answer, worded for RESP.
func (h *frontHost) ReloadRules() error {
	s := (*Server)(h)
	err := s.reloading(func() error {
		var perr, rerr error
		if s.pol.Path != "" || s.cfg.RLS.Dir == "" {
			perr = s.reloadPolicy()
			if perr != nil && !errors.Is(perr, rules.ErrNoPolicy) { // a bad file: say which, and that nothing changed
				perr = resp.Error("ERR " + resp.OneLine(perr.Error()) + "; the rules in use are kept")
			}
		}
		if err := s.rls.Reload(); err != nil {
			rerr = resp.Error("ERR --rls-config: " + resp.OneLine(err.Error()) + "; the configuration in use is kept")
		}
		return cmp.Or(perr, rerr)
	})
	if errors.Is(err, ErrReloadTimeout) {
		err = resp.Error("ERR " + resp.OneLine(err.Error()))
	}
	return err
}

// policyInfo is INFO's policy section.
func (s *Server) policyInfo(kv func(k, v string)) {
	ps := &s.pol
	lp := ps.Current()
	kv("policy_file", ps.Path)
	if lp != nil {
		kv("policy_rules", strconv.Itoa(len(lp.Counts)))
		kv("policy_loaded_at", strconv.FormatInt(lp.At.Unix(), 10))
	} else {
		kv("policy_rules", "0")
		kv("policy_loaded_at", "0")
	}
	kv("policy_reloads", strconv.FormatInt(ps.Reloads.Load(), 10))
	kv("policy_reload_failures", strconv.FormatInt(ps.ReloadFailures.Load(), 10))
	kv("policy_last_reload_error", ps.LastError())
	s.polCmds.Info(kv)
	kv("divvy_addr", s.divvyAddr())
	kv("divvy_connections", strconv.FormatInt(s.divvy.srv.Open.Load(), 10))
	// Envoy's rate limit service's configuration, reloaded with the rules.
	ri := s.rls.Info()
	kv("rls_config_dir", s.cfg.RLS.Dir)
	kv("rls_limits", strconv.Itoa(ri.Limits))
	kv("rls_loaded_at", strconv.FormatInt(ri.LoadedAt, 10))
	kv("rls_reloads", strconv.FormatInt(ri.Reloads, 10))
	kv("rls_reload_failures", strconv.FormatInt(ri.ReloadFailures, 10))
}
