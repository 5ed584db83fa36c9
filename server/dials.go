package server

import (
	"net/http"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/policyhttp"
	"github.com/sluicehq/sluice/rls"
)

// The rules' dials (POLICY LIMIT, POLICY ENFORCE: internal/policycmd over
// the engine's): loaded from the store at start, shown in INFO and the
// metrics. Each node keeps its own.

// initDials puts the dials the store holds in use and logs the
// enforcement mode when it is not on.
func (s *Server) initDials() error {
	if err := s.eng.LoadDials(); err != nil {
		return err
	}
	if err := s.eng.LoadOverrides(); err != nil {
		return err
	}
	if s.cfg.Cluster.Node != nil {
		// A standalone store started as a cluster node: its overrides are
		// records, which a node does not use (it keeps its own values).
		if n, err := s.eng.RecordOverrides(); err != nil {
			return err
		} else if n > 0 {
			s.log.Warn("cluster: this store holds per-actor overrides a standalone server kept; a cluster node does not use them: list them (POLICY OVERRIDES) standalone, or read them with sluice inspect --kind override, and set them on every node", "overrides", n)
		}
	}
	s.polCmds = policycmd.Commands{Engine: s.eng, Rules: &s.pol, RLS: s.rlsConfig, Log: s.log}
	if m := s.eng.Enforcement(); m != engine.Enforce {
		policycmd.LogMode(s.log, m)
	}
	return nil
}

// rlsConfig is the configuration of Envoy's rate limit service in use,
// for RLS.OVERRIDE; nil without one.
func (s *Server) rlsConfig() *rls.Config {
	if s.rls == nil {
		return nil
	}
	return s.rls.Config()
}

// policyHTTP is /v1/policy/, behind /backup's checks (httpport.Access):
// the password (HTTP basic authentication), a client certificate when
// --tls-ca requires one, and protected mode's loopback-only without
// either.
func (s *Server) policyHTTP() http.Handler {
	user := ""
	if s.cfg.Listen.Password != "" {
		user = "default" // the only user
	}
	return s.http.access.Protect(policyhttp.New(&s.polCmds, user))
}
