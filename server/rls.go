package server

import (
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/respserver"
)

// Envoy's rate limit service is served by package internal/envoy, which
// admits its connections by the server's gate and guard
// (envoy.Server.Door); the server renders its errors, lends it the client
// memory budget and the store's health (frontHost), and runs its reloads
// with the others.

// initRLS makes the rate limit service and loads its configuration; New
// calls it.
func (s *Server) initRLS() error {
	var err error
	s.rls, err = envoy.New(s.cfg.RLS, envoy.Options{
		Engine: s.eng, Host: (*frontHost)(s), Logger: s.log, Clock: s.clock,
		MaxConfigFile: s.cfg.Files.MaxFileBytes, MaxMemoryClients: s.cfg.RESP.MaxMemoryClients.N(),
		Guard: s.adm.Guard, Gate: &s.adm.Gate, ConnsTotal: &s.stats.ConnsTotal, KeepBuf: respserver.KeepBuf,
	})
	return err
}

// ReserveClients implements envoy.Host: --maxmemory-clients.
func (h *frontHost) ReserveClients(n int64) bool { return h.resp.ReserveClients(n) }

// ReleaseClients implements envoy.Host.
func (h *frontHost) ReleaseClients(n int64) { h.resp.ReleaseClients(n) }

// ClientMemory implements envoy.Host.
func (h *frontHost) ClientMemory() int64 { return h.stats.ClientMem.Load() }

// NotReady implements envoy.Host: the readiness of /readyz.
func (h *frontHost) NotReady() string { return h.resp.NotReady() }
