package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/httpport"
	"github.com/sluicehq/sluice/internal/metrics"
)

// httpState is the HTTP side: the listeners' shared http.Server setup
// and /backup (package httpport), the HTTP port's listener, and the
// Prometheus metrics.
type httpState struct {
	port   *httpport.Port
	served httpport.Listener
	reg    *prometheus.Registry
}

// initHTTP sets up what every HTTP listener shares; New calls it once
// the RESP front end, its Host, is made.
func (s *Server) initHTTP() {
	s.http.port = httpport.New(httpport.Options{
		Config: s.cfg.HTTP, Logger: s.log, Host: s.resp, Gate: &s.adm.Gate, Guard: s.adm.Guard, Closing: &s.closing,
		MaxMemoryClients: s.cfg.RESP.MaxMemoryClients.N(), Evicted: &s.stats.EvictedClients, AuthFailures: &s.stats.AuthFailures,
		Store: s.store, BackupDir: s.cfg.RESP.BackupDir,
	})
}

// initMetrics makes /metrics' registry (package metrics); New calls it
// once every front end is made.
func (s *Server) initMetrics() {
	src := metrics.Sources{
		Version: s.cfg.Build.Version, Revision: s.cfg.Build.Revision, MaxClients: s.adm.Config.MaxClients,
		RESP: s.resp, Stats: &s.stats, Gate: &s.adm.Gate, Engine: s.eng, Store: s.store,
		Rules: &s.pol, Policy: &s.polCmds, Cluster: s.clus, Divvy: s.divvy, Check: s.check.h,
	}
	if s.cfg.RLS.Dir != "" {
		src.RLS = s.rls
	}
	s.http.reg = metrics.New(src)
}

// closeHTTP stops the HTTP side; Close calls it last, so that /readyz
// answers 503 while connections drain.
func (s *Server) closeHTTP() { s.http.served.Stop() }
