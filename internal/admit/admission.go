package admit

import "time"

// Admission is a server's admission of every front end's connections:
// one count of open connections for every listener (RESP, the divvy line
// protocol, HTTP, /check, Envoy's rate limit service) against MaxClients
// (the embedded Gate), protected mode and TLS (Guard), and the listeners,
// one for each front end, which Drain drains all at once. Every front end
// serves on one kind of listener, a Listener: its Door says how it admits
// (MaxClients, protected mode, TLS above admission), how it answers a
// refusal, and how its connections finish when the server closes (its
// Drainer).
type Admission struct {
	// Config is the configuration in use: its defaults applied, and
	// MaxClients lowered to what Files leaves (FDBudget.MaxClients).
	Config Config
	// Requested is MaxClients as configured, before Files lowered it.
	Requested int
	Gate
	Guard     Guard
	Listeners Listeners
}

// New returns the admission of c, its gate sharing sh with the server:
// its TLS files read (at most maxConfigFile bytes each, as every
// configuration file), then MaxClients lowered to what c.Files leaves,
// which fails with ErrFDLimit when that is too few.
func New(c Config, maxConfigFile int64, sh Shared) (*Admission, error) {
	c = c.WithDefaults()
	a := &Admission{Config: c, Requested: c.MaxClients}
	var err error
	if a.Guard, err = c.Guard(maxConfigFile); err != nil {
		return nil, err
	}
	if a.Config.MaxClients, err = c.Files.MaxClients(c.MaxClients, sh.Log); err != nil {
		return nil, err
	}
	a.Gate.Max, a.Gate.Shared = int64(a.Config.MaxClients), sh
	a.Listeners.Gate = &a.Gate
	return a, nil
}

// Drain drains every listener at once (Listeners.Drain) on a shutdown
// that started at start: connections get nine tenths of ShutdownTimeout
// from then to finish, are then closed, and are waited for at most the
// last tenth.
func (a *Admission) Drain(start time.Time) {
	timeout := a.Config.ShutdownTimeout
	rest := timeout / 10
	a.Listeners.Drain(start.Add(timeout-rest), rest, timeout)
}
