package server

import (
	"net"
	"time"

	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/errs"
)

// The divvy line protocol is served by package internal/divvy; the server
// admits its connections (divvyDoor), renders its errors and counts what
// it shares with the other front ends (frontHost).

// Defaults for the line protocol's limits.
const (
	DefaultDivvyMaxLine     = divvy.DefaultMaxLine
	DefaultDivvyMaxPipeline = divvy.DefaultMaxPipeline
)

// divvyState is the line-protocol front end and its listener.
type divvyState struct {
	srv *divvy.Server
	ln  net.Listener // guarded by Server.mu
}

// initDivvy makes the line-protocol front end; New calls it.
func (s *Server) initDivvy() {
	st := &s.stats
	s.divvy.srv = divvy.New(divvy.Config{
		MaxLine:     s.cfg.Divvy.MaxLine,
		MaxPipeline: s.cfg.Divvy.MaxPipeline,
		IdleTimeout: s.cfg.Divvy.IdleTimeout,
		Logger:      s.log,
		After:       func(d time.Duration) <-chan time.Time { return s.after(d) },
	}, s.eng, &s.pol, (*frontHost)(s), divvy.Shared{
		NetIn: &st.netIn, NetOut: &st.netOut, Panics: &st.panics, IdleClosed: &st.idleClosed, ConnsTotal: &st.connsTotal,
	})
}

// frontHost is what the front ends of their own packages ask of the
// server (divvy.Host).
type frontHost Server

// Failure implements divvy.Host: the typed error of err, logged and
// counted once.
func (h *frontHost) Failure(err error) *errs.Error { return (*Server)(h).failure(err) }

// Refuse implements divvy.Host.
func (h *frontHost) Refuse(c net.Conn, reply []byte) { (*Server)(h).refuse(c, reply) }

// ServeDivvy accepts line-protocol connections on ln until Close. It
// returns nil after Close. The line protocol has no authentication: in
// protected mode (the default) it serves loopback clients only.
func (s *Server) ServeDivvy(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		return net.ErrClosed
	}
	if s.divvy.ln != nil {
		s.mu.Unlock()
		return ErrServing
	}
	s.divvy.ln = ln
	s.mu.Unlock()
	s.log.Info("serving the divvy line protocol", "addr", ln.Addr().String(), "policy", s.pol.Path)
	if s.cfg.Password != "" || s.clientCertsRequired() {
		s.log.Warn("the divvy line protocol has no AUTH and no TLS: anyone who can reach its address can use it", "addr", ln.Addr().String())
	}
	err := s.divvy.srv.Serve(s.listen(ln, s.divvyDoor()))
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
func (s *Server) divvyDoor() door {
	return door{
		name:    "divvy",
		take:    s.adm.take,
		guarded: func() bool { return !s.cfg.AllowRemoteWithoutAuth },
		full:    divvy.Refusal("max number of clients reached"),
		denied:  divvy.Refusal("DENIED: sluice is in protected mode and the divvy line protocol has no authentication; it serves clients on loopback only unless started with --protected-mode no"),
		refused: func() { s.divvy.srv.ErrUnknown.Add(1) },
		conn:    func(c *admittedConn) net.Conn { return c },
	}
}

// divvyAddr is the line protocol's address, or "" when it is off.
func (s *Server) divvyAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.divvy.ln == nil {
		return ""
	}
	return s.divvy.ln.Addr().String()
}

// closeDivvy stops accepting, asks every connection to finish its round
// and close, and waits for them until forceAt, then closes the ones left
// and waits for them for rest at most. Close calls it.
func (s *Server) closeDivvy(forceAt time.Time, rest time.Duration) {
	s.mu.Lock()
	ln := s.divvy.ln
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	s.divvy.srv.Close(forceAt, rest)
}
