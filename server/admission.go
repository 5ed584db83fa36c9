package server

import (
	"errors"
	"fmt"
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

// FDBudget is how the process's open-file limit (the soft RLIMIT_NOFILE) is
// shared: StoreFiles for the store's tables, ProcessFiles for everything
// else the process opens, and the rest for client connections, as Redis
// lowers maxclients to its limit minus a reserve.
type FDBudget struct {
	Limit      int // the open-file limit the process runs with
	StoreFiles int // Pebble's MaxOpenFiles: tables kept open, its logs and lock
	Reserved   int // StoreFiles + ProcessFiles: never given to connections
}

// File-descriptor reserve.
const (
	// ProcessFiles are the descriptors kept for everything but the store's
	// table cache and the connections: stdin, stdout and stderr, the
	// network poller, three listeners, the store's directory handles,
	// compaction outputs and the WAL being rotated (which Pebble does not
	// count in MaxOpenFiles), tables iterators keep open past the cache's
	// soft limit, CHECKPOINT copies, TLS and policy reloads, /proc reads
	// of the metrics collector, HTTPReserve probes, and RefusalSlots
	// connections being refused.
	ProcessFiles = 64
	// HTTPReserve is how many HTTP connections may be open past MaxClients,
	// so that liveness and readiness probes and metric scrapes are still
	// answered while RESP or line-protocol clients hold every slot (a probe
	// refused then would have the orchestrator restart a healthy server).
	// They are part of ProcessFiles.
	HTTPReserve = 8
	// RefusalSlots is how many refused connections may be answered at once:
	// admit.RefusalSlots.
	RefusalSlots = admit.RefusalSlots
	// MinStoreFiles is the least MaxOpenFiles sluice gives Pebble: its
	// table cache never goes below 64 tables plus 10 other files.
	MinStoreFiles = 100
	// MaxStoreFiles is Pebble's own default MaxOpenFiles, the most sluice
	// gives it: a store of a few GiB has far fewer tables.
	MaxStoreFiles = 1000
	// MinClients is the fewest connections worth starting for: a limit
	// leaving fewer is an error.
	MinClients = 16
)

// ErrFDLimit is returned when the open-file limit is too low to run.
var ErrFDLimit = errors.New("server: open-file limit too low")

// BudgetFDs shares an open-file limit: a quarter of it, between
// MinStoreFiles and MaxStoreFiles, for the store, ProcessFiles for the
// process, the rest for connections. It fails with ErrFDLimit when fewer
// than MinClients connections would be left.
func BudgetFDs(limit int) (FDBudget, error) {
	b := FDBudget{Limit: limit, StoreFiles: min(max(limit/4, MinStoreFiles), MaxStoreFiles)}
	b.Reserved = b.StoreFiles + ProcessFiles
	if need := b.Reserved + MinClients; limit < need {
		return b, fmt.Errorf("%w: the open-file limit (RLIMIT_NOFILE) is %d; sluice needs at least %d: %d for the store, %d for itself and %d for clients; raise it (ulimit -n, or LimitNOFILE= in a systemd unit, or --ulimit nofile= for docker)",
			ErrFDLimit, limit, need, b.StoreFiles, ProcessFiles, MinClients)
	}
	return b, nil
}

// Clients is the most connections the budget leaves.
func (b FDBudget) Clients() int { return b.Limit - b.Reserved }

// admission counts open connections of every listener (admit.Gate).
type admission struct {
	admit.Gate
	requested int // MaxClients as configured
}

// takeHTTP admits an HTTP connection, which may also use HTTPReserve
// slots past MaxClients.
func (a *admission) takeHTTP() bool { return a.TakeUpTo(a.Max + HTTPReserve) }

// initAdmission sets the effective MaxClients: the configured one, lowered
// to what Config.Files leaves for connections, with a warning that names
// both numbers, as Redis logs when it lowers maxclients.
func (s *Server) initAdmission() error {
	s.adm.requested = s.cfg.MaxClients
	if b := s.cfg.Files; b.Limit > 0 {
		if b.Clients() < MinClients {
			_, err := BudgetFDs(b.Limit)
			if err == nil {
				err = fmt.Errorf("%w: %d files reserved of %d", ErrFDLimit, b.Reserved, b.Limit)
			}
			return err
		}
		if b.Clients() < s.cfg.MaxClients {
			s.cfg.MaxClients = b.Clients()
			s.log.Warn("maxclients lowered to what the open-file limit allows; raise the limit (ulimit -n, LimitNOFILE=) to serve more clients",
				"maxclients", s.cfg.MaxClients, "requested", s.adm.requested, "fd_limit", b.Limit, "fd_reserved", b.Reserved, "store_max_open_files", b.StoreFiles)
		}
	}
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
