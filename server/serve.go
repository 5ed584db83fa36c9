package server

import (
	"errors"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/httpport"
	"github.com/sluicehq/sluice/internal/rules"
)

// Each front end is served on its listener the same way: through its
// door (admit.Listeners, or an HTTP server behind one), once a line
// names it and its address, with a warning when what keeps strangers out
// does not reach it.

// Serve accepts connections on ln until Close. It returns nil after Close.
func (s *Server) Serve(ln net.Listener) error {
	return s.serve(ln, s.resp.Door(s.adm.Guard), s.resp.Serve, s.warnIfExposed,
		"serving RESP", "fsync", s.store.Mode().String(), "data", s.store.Dir())
}

// ServeDivvy accepts line-protocol connections on ln until Close. It
// returns nil after Close. The line protocol has no authentication: in
// protected mode (the default) it serves loopback clients only.
func (s *Server) ServeDivvy(ln net.Listener) error {
	return s.serve(ln, s.divvy.Door(), s.divvy.Serve, s.divvy.WarnUnauthenticated,
		"serving the divvy line protocol", "policy", s.pol.Path)
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
	return s.serve(ln, s.rls.Door(), s.rls.Serve, s.warnIfExposed,
		"serving Envoy's rate limit service (gRPC)", "config", s.cfg.RLS.Dir, "tls", s.adm.Guard.TLS != nil)
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
	warn := func(a net.Addr) { s.check.h.WarnIfProtected(s.log, a) }
	// /check has no probe reserve: it takes its slot as RESP does.
	return s.serveHTTP(ln, &s.check.served, s.check.h, "check", s.adm.Take, warn,
		"serving the forward-auth endpoint /check", "tls", s.adm.Guard.TLS != nil, "policy", s.pol.Path)
}

// ServeHTTP serves /metrics, /healthz, /readyz and /backup on ln until
// Close, over TLS when the server has TLS. Client certificates are checked
// when given but not required, so that probes and scrapers without one
// still work; /backup requires one when RESP does.
func (s *Server) ServeHTTP(ln net.Listener) error {
	h := &s.http
	routes := h.port.Handler(httpport.Routes{
		Metrics: promhttp.HandlerFor(h.reg, promhttp.HandlerOpts{ErrorLog: nil}),
		Policy:  s.policyHTTP(),
	})
	return s.serveHTTP(ln, &h.served, routes, "http", s.adm.TakeHTTP, func(net.Addr) {},
		"serving HTTP", "tls", s.adm.Guard.TLS != nil)
}

// serve serves ln, through door d, with serve until Close, once it has
// logged msg with ln's address and attrs and warned (warn) of what may
// reach it; it returns nil after Close.
func (s *Server) serve(ln net.Listener, d admit.Door, serve func(net.Listener) error, warn func(net.Addr), msg string, attrs ...any) error {
	l, err := s.adm.Listeners.Listen(ln, d)
	if err != nil {
		return err
	}
	s.logServing(ln, warn, msg, attrs)
	if err := serve(l); err != nil && !s.closing.Load() {
		return err
	}
	return nil
}

// serveHTTP serves h on ln, in an HTTP server v holds, until Close, each
// connection admitted by take, once it has logged msg with ln's address
// and attrs and warned (warn) of what may reach it.
func (s *Server) serveHTTP(ln net.Listener, v *httpport.Listener, h http.Handler, name string, take func() bool, warn func(net.Addr), msg string, attrs ...any) error {
	if !s.http.port.Start(v, s.http.port.NewServer(h)) {
		return net.ErrClosed
	}
	s.logServing(ln, warn, msg, attrs)
	return s.http.port.Serve(v, ln, name, take)
}

// logServing logs msg with ln's address and attrs, then warns (warn).
func (s *Server) logServing(ln net.Listener, warn func(net.Addr), msg string, attrs []any) {
	s.log.Info(msg, append([]any{"addr", ln.Addr().String()}, attrs...)...)
	warn(ln.Addr())
}

// warnIfExposed warns when a listens where nothing but the network keeps
// strangers out (admit.Guard.WarnIfExposed).
func (s *Server) warnIfExposed(a net.Addr) { s.adm.Guard.WarnIfExposed(s.log, a) }

// Addr returns the listening address, or nil before Serve.
func (s *Server) Addr() net.Addr { return s.adm.Listeners.Addr("resp") }

// RLSAddr returns the gRPC listener's address, or nil when it is off.
func (s *Server) RLSAddr() net.Addr { return s.adm.Listeners.Addr("rls") }
