package server

import (
	"time"

	"github.com/sluicehq/sluice/internal/admit"
)

// Connection admission: one count of open connections for every listener
// (RESP, the divvy line protocol, HTTP, /check, Envoy's rate limit
// service) against MaxClients, so that no listener can take the file
// descriptors the store needs. MaxClients itself is lowered to what the
// open-file limit leaves (see admit.FDBudget). Every front end serves on
// one kind of listener, an admit.Listener: its admit.Door says how it admits
// (--maxclients, protected mode, TLS above admission), how it answers a
// refusal, and how its connections finish when the server closes (its
// admit.Drainer); the listener retries failed Accepts with a backoff, and
// Close drains every listener at once, the same way (admit.Listeners).

// admission counts open connections of every listener (admit.Gate).
type admission struct {
	admit.Gate
	requested int // MaxClients as configured
}

// initAdmission sets the effective MaxClients: the configured one, lowered
// to what Config.Listen.Files leaves for connections
// (admit.FDBudget.MaxClients).
func (s *Server) initAdmission() error {
	s.adm.requested = s.cfg.Listen.MaxClients
	n, err := s.cfg.Listen.Files.MaxClients(s.cfg.Listen.MaxClients, s.log)
	if err != nil {
		return err
	}
	s.cfg.Listen.MaxClients = n
	a := &s.adm.Gate
	a.Max = int64(s.cfg.Listen.MaxClients)
	a.Closing = &s.closing
	a.RejectedMax, a.RejectedDenied, a.NetOut = &s.stats.RejectedMax, &s.stats.RejectedDenied, &s.stats.NetOut
	a.Log = s.log
	a.After = func(d time.Duration) <-chan time.Time { return s.after(d) }
	s.lns.Gate = a
	return nil
}
