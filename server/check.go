package server

import (
	"net"

	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/httpport"
	"github.com/sluicehq/sluice/internal/rules"
)

// The forward-auth endpoint GET /check is package internal/check's
// Handler; the server serves it on its HTTP server, behind its listener
// (--maxclients), and renders its errors (frontHost).

// checkState is the endpoint's handler and its HTTP server.
type checkState struct {
	h      *check.Handler
	served httpport.Listener
}

// initCheck makes the endpoint's handler; New calls it.
func (s *Server) initCheck() {
	s.check.h = check.New(s.cfg.Check, check.Options{
		Engine:         s.eng,
		Rules:          &s.pol,
		Host:           (*frontHost)(s),
		AllowRemote:    s.cfg.Listen.AllowRemoteWithoutAuth,
		RejectedDenied: &s.stats.RejectedDenied,
	})
}

// ServeCheck serves the forward-auth endpoint /check on ln until Close,
// over TLS when the server has TLS (client certificates are checked when
// given). It answers only with a policy loaded. In protected mode it
// answers only proxies on loopback, or, with TLS client certificates
// configured, proxies that present one: /check has no password.
func (s *Server) ServeCheck(ln net.Listener) error {
	if s.pol.Current() == nil {
		return rules.ErrNoPolicy
	}
	srv := s.http.port.NewServer(s.check.h)
	if !s.http.port.Start(&s.check.served, srv) {
		return net.ErrClosed
	}
	s.log.Info("serving the forward-auth endpoint /check", "addr", ln.Addr().String(), "tls", s.guard.TLS != nil, "policy", s.pol.Path)
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() && !s.cfg.Listen.AllowRemoteWithoutAuth {
		s.log.Warn("protected mode: /check answers proxies on loopback only (or, with --tls-ca, proxies that present a client certificate); set --protected-mode no to serve others", "addr", ln.Addr().String())
	}
	// /check has no probe reserve: it takes its slot as RESP does.
	return s.http.port.Serve(&s.check.served, ln, "check", s.adm.Take)
}

// closeCheck stops the endpoint; Close calls it once no new request may
// start a hit.
func (s *Server) closeCheck() { s.check.served.Stop() }
