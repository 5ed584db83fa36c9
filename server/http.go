package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/httpport"
	"github.com/sluicehq/sluice/internal/metrics"
)

// httpState is the HTTP side: the listeners' shared http.Server setup
// (package httpport), the HTTP port's listener, its backups, and the
// Prometheus metrics.
type httpState struct {
	port   *httpport.Port
	served httpport.Listener
	backup httpport.Backup
	access httpport.Access // who may take a backup or change the dials
	reg    *prometheus.Registry
}

// initHTTP sets up what every HTTP listener shares; New calls it.
func (s *Server) initHTTP() {
	o := httpport.Options{
		Logger:           s.log,
		Host:             (*frontHost)(s),
		Gate:             &s.adm.Gate,
		Closing:          &s.closing,
		Config:           s.cfg.HTTP,
		MaxMemoryClients: s.cfg.RESP.MaxMemoryClients.N(),
		Evicted:          &s.stats.EvictedClients,
	}
	if s.adm.Guard.TLS != nil {
		o.TLS = s.adm.Guard.TLS.HTTPConfig()
	}
	s.http.port = httpport.New(o)
	s.http.access = httpport.Access{
		Guard:     s.adm.Guard,
		CheckAuth: func(user, pass []byte) bool { return s.resp.CheckAuth(user, pass) }, // made after the HTTP port
		Failures:  &s.stats.AuthFailures,
		Logger:    s.log,
	}
	s.http.backup = httpport.Backup{Store: s.store, Dir: s.cfg.Files.BackupDir, Logger: s.log, Access: &s.http.access, Host: (*frontHost)(s)}
}

// initMetrics makes /metrics' registry (package metrics); New calls it
// once every front end is made.
func (s *Server) initMetrics() {
	src := metrics.Sources{
		Version: s.cfg.Build.Version, Revision: s.cfg.Build.Revision, MaxClients: s.adm.Config.MaxClients,
		RESP: s.resp, Stats: &s.stats, Gate: &s.adm.Gate, Engine: s.eng, Store: s.store,
		Rules: &s.pol, Policy: &s.polCmds, Cluster: s.clus, Divvy: s.divvy.srv, Check: s.check.h,
	}
	if s.cfg.RLS.Dir != "" {
		src.RLS = s.rls
	}
	s.http.reg = metrics.New(src)
}

// closeHTTP stops the HTTP side; Close calls it last, so that /readyz
// answers 503 while connections drain.
func (s *Server) closeHTTP() { s.http.served.Stop() }

// CheckpointFailed implements httpport.BackupHost.
func (h *frontHost) CheckpointFailed(err error) string {
	s := (*Server)(h)
	return s.errorText(s.resp.MaintenanceErr("checkpoint", err))
}

// Checkpointed implements httpport.BackupHost.
func (h *frontHost) Checkpointed() { h.stats.LastSave.Store(time.Now().Unix()) }
