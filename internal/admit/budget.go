package admit

import (
	"errors"
	"fmt"
	"log/slog"
)

// The connections of every listener count against one MaxClients (Gate),
// so that no front end can take the file descriptors the store needs;
// MaxClients itself is lowered to what the open-file limit leaves
// (FDBudget).

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

// ErrFDLimit is returned when the open-file limit is too low to run. Its
// text names the server, as it did when the server owned it.
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

// MaxClients is the most connections to serve at once: requested,
// lowered to what the budget leaves for connections, with a warning that
// names both numbers, as Redis logs when it lowers maxclients. A zero
// budget (no Limit) leaves requested as it is; one leaving fewer than
// MinClients is an error (ErrFDLimit).
func (b FDBudget) MaxClients(requested int, log *slog.Logger) (int, error) {
	if b.Limit <= 0 {
		return requested, nil
	}
	if b.Clients() < MinClients {
		_, err := BudgetFDs(b.Limit)
		if err == nil {
			err = fmt.Errorf("%w: %d files reserved of %d", ErrFDLimit, b.Reserved, b.Limit)
		}
		return 0, err
	}
	if b.Clients() < requested {
		log.Warn("maxclients lowered to what the open-file limit allows; raise the limit (ulimit -n, LimitNOFILE=) to serve more clients",
			"maxclients", b.Clients(), "requested", requested, "fd_limit", b.Limit, "fd_reserved", b.Reserved, "store_max_open_files", b.StoreFiles)
		return b.Clients(), nil
	}
	return requested, nil
}

// TakeHTTP admits an HTTP connection, which may also use HTTPReserve
// slots past Max.
func (g *Gate) TakeHTTP() bool { return g.TakeUpTo(g.Max + HTTPReserve) }
