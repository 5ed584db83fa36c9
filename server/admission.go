package server

import (
	"net"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
)

// Connection admission: one count of open connections for every listener
// (RESP, the divvy line protocol, HTTP, /check, Envoy's rate limit
// service) against MaxClients, so that no listener can take the file
// descriptors the store needs. MaxClients itself is lowered to what the
// open-file limit leaves (see FDBudget). Every front end serves on one
// kind of listener, an admit.Listener: its admit.Door says how it admits
// (--maxclients, protected mode, TLS above admission), how it answers a
// refusal, and how its connections finish when the server closes (its
// admit.Drainer); the listener retries failed Accepts with a backoff, and
// Close drains every listener the same way (admit.Listener.Drain).

// TLSFiles names the PEM files of the server's TLS identity
// (admit.TLSFiles); with CA set, clients must present a certificate
// signed by it.
type TLSFiles = admit.TLSFiles

// FDBudget is how the process's open-file limit is shared
// (admit.FDBudget).
type FDBudget = admit.FDBudget

// BudgetFDs shares an open-file limit (admit.BudgetFDs).
func BudgetFDs(limit int) (FDBudget, error) { return admit.BudgetFDs(limit) }

// ErrFDLimit is returned when the open-file limit is too low to run.
var ErrFDLimit = admit.ErrFDLimit

// HTTPReserve is how many HTTP connections may be open past MaxClients
// (admit.HTTPReserve).
const HTTPReserve = admit.HTTPReserve

// admission counts open connections of every listener (admit.Gate).
type admission struct {
	admit.Gate
	requested int // MaxClients as configured
}

// initAdmission sets the effective MaxClients: the configured one, lowered
// to what Config.Files leaves for connections (FDBudget.MaxClients).
func (s *Server) initAdmission() error {
	s.adm.requested = s.cfg.MaxClients
	n, err := s.cfg.Files.MaxClients(s.cfg.MaxClients, s.log)
	if err != nil {
		return err
	}
	s.cfg.MaxClients = n
	a := &s.adm.Gate
	a.Max = int64(s.cfg.MaxClients)
	a.Closing = &s.closing
	a.RejectedMax, a.RejectedDenied, a.NetOut = &s.stats.RejectedMax, &s.stats.RejectedDenied, &s.stats.NetOut
	a.Log = s.log
	a.After = func(d time.Duration) <-chan time.Time { return s.after(d) }
	return nil
}

// serve makes ln, wrapped in an admit.Listener of door d, the listener
// of a front end whose slot is *ln0, which Close drains; it fails once the
// server is closing (net.ErrClosed) or when the front end has one already
// (ErrServing). *ln0 is guarded by s.mu.
func (s *Server) serve(ln0 *net.Listener, ln net.Listener, d admit.Door) (*admit.Listener, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case *ln0 != nil:
		return nil, ErrServing
	case s.closing.Load():
		return nil, net.ErrClosed
	}
	*ln0 = ln
	l := s.adm.Listen(ln, d)
	s.mu.drain = append(s.mu.drain, l)
	return l, nil
}
