package server

import (
	"net/http"

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
	s.polCmds = policycmd.Commands{Engine: s.eng, Rules: &s.pol, RLS: s.rlsConfig, Log: s.log}
	return s.polCmds.Load(s.cfg.Cluster.Node != nil)
}

// rlsConfig is the configuration of Envoy's rate limit service in use,
// for RLS.OVERRIDE; nil without one.
func (s *Server) rlsConfig() *rls.Config {
	if s.rls == nil {
		return nil
	}
	return s.rls.Config()
}

// policyHTTP is /v1/policy/, which the HTTP port serves behind
// /backup's checks (httpport.Access).
func (s *Server) policyHTTP() http.Handler {
	user := ""
	if s.adm.Config.Password != "" {
		user = "default" // the only user
	}
	return policyhttp.New(&s.polCmds, user)
}
