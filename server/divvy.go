package server

import (
	"net"

	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/errs"
)

// The divvy line protocol is served by package internal/divvy; the server
// admits its connections (divvy.Server.Door), renders its errors and counts what
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

// divvyAddr is the line protocol's address, or "" when it is off.
func (s *Server) divvyAddr() string {
	if a := s.adm.Listeners.Addr("divvy"); a != nil {
		return a.String()
	}
	return ""
}
