package server

import (
	"net"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/errs"
)

// The divvy line protocol is served by package internal/divvy; the server
// admits its connections (divvyDoor), renders its errors and counts what
// it shares with the other front ends (frontHost).

// divvyState is the line-protocol front end.
type divvyState struct {
	srv *divvy.Server
}

// initDivvy makes the line-protocol front end; New calls it.
func (s *Server) initDivvy() {
	st := &s.stats
	c := s.cfg.Divvy
	c.Logger = s.log
	s.divvy.srv = divvy.New(c, s.eng, &s.pol, (*frontHost)(s), divvy.Shared{
		NetIn: &st.NetIn, NetOut: &st.NetOut, Panics: &st.Panics, IdleClosed: &st.IdleClosed, ConnsTotal: &st.ConnsTotal,
	})
}

// frontHost is what the front ends of their own packages ask of the
// server (divvy.Host).
type frontHost Server

// Failure implements divvy.Host: the typed error of err, logged and
// counted once.
func (h *frontHost) Failure(err error) *errs.Error { return (*Server)(h).failure(err) }

// Refuse implements divvy.Host.
func (h *frontHost) Refuse(c net.Conn, reply []byte) { h.adm.Refuse(c, reply) }

// ServeDivvy accepts line-protocol connections on ln until Close. It
// returns nil after Close. The line protocol has no authentication: in
// protected mode (the default) it serves loopback clients only.
func (s *Server) ServeDivvy(ln net.Listener) error {
	l, err := s.lns.Listen(ln, s.divvyDoor())
	if err != nil {
		return err
	}
	s.log.Info("serving the divvy line protocol", "addr", ln.Addr().String(), "policy", s.pol.Path)
	if s.cfg.Listen.Password != "" || s.guard.CertsRequired() {
		s.log.Warn("the divvy line protocol has no AUTH and no TLS: anyone who can reach its address can use it", "addr", ln.Addr().String())
	}
	err = s.divvy.srv.Serve(l)
	if s.closing.Load() {
		return nil
	}
	return err
}

// divvyDoor is how the line protocol's listener admits: a slot of
// --maxclients, shared with RESP and HTTP, given back when the connection
// closes, and protected mode unless it is off: the line protocol has no
// authentication. It refuses with an ERR line, counted in
// divvy_errors_total.
func (s *Server) divvyDoor() admit.Door {
	return admit.Door{
		Name:    "divvy",
		Take:    s.adm.Take,
		Guarded: func() bool { return !s.cfg.Listen.AllowRemoteWithoutAuth },
		Full:    divvy.Refusal("max number of clients reached"),
		Denied:  divvy.Refusal("DENIED: sluice is in protected mode and the divvy line protocol has no authentication; it serves clients on loopback only unless started with --protected-mode no"),
		Refused: func() { s.divvy.srv.ErrUnknown.Add(1) },
		Conn:    func(c *admit.Conn) net.Conn { return c },
		Drain:   s.divvy.srv, // every connection finishes its round and closes
	}
}

// divvyAddr is the line protocol's address, or "" when it is off.
func (s *Server) divvyAddr() string {
	if a := s.lns.Addr("divvy"); a != nil {
		return a.String()
	}
	return ""
}
