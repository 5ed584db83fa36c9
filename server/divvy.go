package server

import (
	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/errs"
)

// The divvy line protocol is served by package internal/divvy, which
// admits its connections by the server's gate and guard
// (divvy.Server.Door); the server renders its errors (frontHost) and
// counts what it shares with the other front ends.

// initDivvy makes the line-protocol front end; New calls it.
func (s *Server) initDivvy() {
	st := &s.stats
	c := s.cfg.Divvy
	c.Logger = s.log
	s.divvy = divvy.New(c, s.eng, &s.pol, (*frontHost)(s), divvy.Shared{
		NetIn: &st.NetIn, NetOut: &st.NetOut, Panics: &st.Panics, IdleClosed: &st.IdleClosed, ConnsTotal: &st.ConnsTotal,
		Gate: &s.adm.Gate, Guard: s.adm.Guard,
	})
}

// frontHost is what the front ends of their own packages ask of the
// server (divvy.Host).
type frontHost Server

// Failure implements divvy.Host: the typed error of err, logged and
// counted once.
func (h *frontHost) Failure(err error) *errs.Error { return (*Server)(h).failure(err) }

// divvyAddr is the line protocol's address, or "" when it is off.
func (s *Server) divvyAddr() string {
	if a := s.adm.Listeners.Addr("divvy"); a != nil {
		return a.String()
	}
	return ""
}
