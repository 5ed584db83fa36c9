package server

import (
	"net"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/internal/settings"
)

// RESP is served by package internal/respserver; the server admits its
// connections (respserver.Server.Door), and answers what it asks of the server
// (frontHost): the other front ends' facts for INFO, CONFIG GET's
// settings, POLICY RELOAD.

// initRESP makes the RESP front end; New calls it once the other front
// ends are made.
func (s *Server) initRESP() {
	cfg := &s.cfg
	s.resp = respserver.New(respserver.Config{
		Tuning: cfg.RESP, Password: s.adm.Config.Password,
		Version: cfg.Build.Version, Revision: cfg.Build.Revision,
		AllowOnStoreError: cfg.Engine.OnStoreError == engine.Allow, MaxKeySize: s.eng.MaxKeySize(),
		MaxClients: s.adm.Config.MaxClients, MaxClientsRequested: s.adm.Requested,
		FDLimit: s.adm.Config.Files.Limit, FDReserved: s.adm.Config.Files.Reserved, StoreMaxOpenFiles: s.adm.Config.Files.StoreFiles,
	}, respserver.Options{
		Store: s.store, Engine: s.eng, Rules: &s.pol, Policy: &s.polCmds, Cluster: s.clus, RLS: s.rls,
		Logger: s.log, Clock: s.clock, ClockOffset: &s.clockOffset,
		Host: (*frontHost)(s), Stats: &s.stats, Gate: &s.adm.Gate, Closing: &s.closing, Done: s.done,
	})
}

// Addr implements respserver.Host.
func (h *frontHost) Addr() net.Addr { return (*Server)(h).Addr() }

// Settings implements respserver.Host: CONFIG GET's table (package
// settings) of the configuration in use.
func (h *frontHost) Settings() []respserver.Setting {
	s := (*Server)(h)
	cfg := &s.cfg
	pol := cfg.Policy // the engine applies its defaults
	pol.MaxOverrides, pol.StatsDays = int(s.eng.MaxOverrides()), s.eng.StatsDays()
	o := settings.Of{
		Addr: s.Addr(), Store: s.store, Cluster: s.clus != nil,
		RESP: s.resp.Config(), Check: cfg.Check, Divvy: s.divvy.Config(), RLS: s.rls.Settings(), HTTP: s.http.port.Config(),
		Listen: s.adm.Config, Policy: pol, AcceptRepairedClusterState: cfg.Cluster.AcceptRepairedState,
		MaxConfigFile: cfg.Files.MaxFileBytes, ReloadTimeout: cfg.Files.Timeout,
	}
	return o.List()
}

// Ready reports whether the server can serve changes now: not shutting
// down, and the store neither failed nor refusing changes because writes to
// its disk fail.
func (s *Server) Ready() bool { return s.resp.Ready() }

// PolicyInfo implements respserver.Host: the line protocol's and Envoy's
// lines of INFO's policy section.
func (h *frontHost) PolicyInfo(kv func(k, v string)) {
	s := (*Server)(h)
	s.divvy.PolicyInfo(kv, s.divvyAddr())
	s.rls.PolicyInfo(kv)
}
