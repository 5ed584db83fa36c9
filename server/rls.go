package server

import (
	"crypto/tls"
	"errors"
	"net"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/respserver"
)

// Envoy's rate limit service is served by package internal/envoy; the
// server admits its connections (rlsDoor), renders its errors, lends it
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
		MaxConfigFile:    s.cfg.Files.MaxConfigFile,
		MaxMemoryClients: s.cfg.RESP.MaxMemoryClients.N(),
		KeepBuf:          respserver.KeepBuf,
	}
	if s.guard.TLS != nil {
		opt.TLS = func() *tls.Config { return s.guard.TLS.Current() }
	}
	r, err := envoy.New(s.cfg.RLS, opt)
	if err != nil {
		return err
	}
	s.rls = r
	return nil
}

// ServeRLS serves Envoy's rate limit service and the gRPC health service
// on ln until Close, over TLS when the server has TLS (client
// certificates required when --tls-ca is given, as for RESP). The service
// has no password: in protected mode it serves loopback clients only,
// unless TLS client certificates are required.
func (s *Server) ServeRLS(ln net.Listener) error {
	if s.cfg.RLS.Dir == "" {
		return errors.New("server: RLS needs Config.RLS.Dir")
	}
	l, err := s.lns.Listen(ln, s.rlsDoor())
	if err != nil {
		return err
	}
	s.log.Info("serving Envoy's rate limit service (gRPC)", "addr", ln.Addr().String(), "config", s.cfg.RLS.Dir, "tls", s.guard.TLS != nil)
	s.guard.WarnIfExposed(s.log, ln.Addr())
	err = s.rls.Serve(l)
	if s.closing.Load() {
		return nil
	}
	return err
}

// RLSAddr returns the gRPC listener's address, or nil when it is off.
func (s *Server) RLSAddr() net.Addr { return s.lns.Addr("rls") }

// rlsDoor is how the gRPC listener admits: a slot of --maxclients, given
// back when the connection closes, and protected mode (the service has no
// password) unless TLS client certificates are required or protected mode
// is off. A refused connection is closed: a gRPC client reads no text.
func (s *Server) rlsDoor() admit.Door {
	return admit.Door{
		Name:    "rls",
		Take:    s.adm.Take,
		Guarded: func() bool { return !s.cfg.Listen.AllowRemoteWithoutAuth && !s.guard.CertsRequired() },
		Conn: func(c *admit.Conn) net.Conn {
			s.stats.ConnsTotal.Add(1)
			return c
		},
		Drain: s.rls, // a graceful stop of its gRPC server, then a hard one
	}
}

// ReserveClients implements envoy.Host: --maxmemory-clients.
func (h *frontHost) ReserveClients(n int64) bool { return h.resp.ReserveClients(n) }

// ReleaseClients implements envoy.Host.
func (h *frontHost) ReleaseClients(n int64) { h.resp.ReleaseClients(n) }

// ClientMemory implements envoy.Host.
func (h *frontHost) ClientMemory() int64 { return h.stats.ClientMem.Load() }

// NotReady implements envoy.Host: the readiness of /readyz.
func (h *frontHost) NotReady() string { return (*Server)(h).notReady() }
