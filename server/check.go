package server

import (
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/httpport"
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
		AllowRemote:    s.adm.Config.AllowRemoteWithoutAuth,
		RejectedDenied: &s.stats.RejectedDenied,
	})
}

// closeCheck stops the endpoint; Close calls it once no new request may
// start a hit.
func (s *Server) closeCheck() { s.check.served.Stop() }
