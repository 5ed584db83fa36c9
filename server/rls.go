package server

import (
	"crypto/tls"

	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/respserver"
)

// Envoy's rate limit service is served by package internal/envoy; the
// server admits its connections (envoy.Server.Door), renders its errors, lends it
// the client memory budget and the store's health (frontHost), and runs
// its reloads with the others.

// initRLS makes the rate limit service and loads its configuration; New
// calls it.
func (s *Server) initRLS() error {
	opt := envoy.Options{
		Engine:           s.eng,
		Host:             (*frontHost)(s),
		Logger:           s.log,
		Clock:            s.clock,
		MaxConfigFile:    s.cfg.Files.MaxFileBytes,
		MaxMemoryClients: s.cfg.RESP.MaxMemoryClients.N(),
		KeepBuf:          respserver.KeepBuf,
	}
	if s.adm.Guard.TLS != nil {
		opt.TLS = func() *tls.Config { return s.adm.Guard.TLS.Current() }
	}
	r, err := envoy.New(s.cfg.RLS, opt)
	if err != nil {
		return err
	}
	s.rls = r
	return nil
}

// ReserveClients implements envoy.Host: --maxmemory-clients.
func (h *frontHost) ReserveClients(n int64) bool { return h.resp.ReserveClients(n) }

// ReleaseClients implements envoy.Host.
func (h *frontHost) ReleaseClients(n int64) { h.resp.ReleaseClients(n) }

// ClientMemory implements envoy.Host.
func (h *frontHost) ClientMemory() int64 { return h.stats.ClientMem.Load() }

// NotReady implements envoy.Host: the readiness of /readyz.
func (h *frontHost) NotReady() string { return h.resp.NotReady() }
