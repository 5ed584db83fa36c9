package admit

import "time"

// DefaultShutdownTimeout is Config.ShutdownTimeout's default.
const DefaultShutdownTimeout = 10 * time.Second

// Config configures what the listeners of every front end share. A zero
// field means the default given.
type Config struct {
	// MaxClients is the most connections served at once, RESP, line
	// protocol and HTTP together; more are answered "ERR max number of
	// clients reached" (HTTP: 503) and closed. Default DefaultMaxClients,
	// as in Redis; lowered to what Files leaves.
	MaxClients int
	// Files is how the process's open-file limit is shared (see
	// BudgetFDs); with its Limit set, MaxClients is lowered to
	// Files.Clients() and the server fails to start when that is below
	// MinClients. Zero: MaxClients as given.
	Files FDBudget
	// TLS, when set, serves RESP (and HTTP) over TLS only.
	TLS *TLSFiles
	// AllowRemoteWithoutAuth turns protected mode off. In protected mode
	// (the default) a server with neither a Password nor TLS client
	// certificates answers clients from addresses other than loopback
	// with a DENIED error and closes them, as Redis does.
	AllowRemoteWithoutAuth bool
	// Password, when set, must be given with AUTH or HELLO ... AUTH before
	// any command other than AUTH, HELLO, PING and QUIT, as with Redis'
	// requirepass (user "default").
	Password string
	// ShutdownTimeout bounds the server's Close: connections get nine
	// tenths of it to finish their last pipeline, are then closed, and
	// Close waits for them at most the last tenth; default
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
}

// WithDefaults is c with its zero fields set to their defaults.
// MaxClients is still as requested: New lowers it to what Files leaves
// (FDBudget.MaxClients), and its Admission keeps both.
func (c Config) WithDefaults() Config {
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.MaxClients <= 0 {
		c.MaxClients = DefaultMaxClients
	}
	return c
}

// Guard is the protected mode of c, its TLS certificates read as every
// configuration file is (at most maxConfigFile bytes each).
func (c Config) Guard(maxConfigFile int64) (Guard, error) {
	g := Guard{Off: c.AllowRemoteWithoutAuth, Password: c.Password != ""}
	if c.TLS != nil {
		t, err := NewTLS(*c.TLS, maxConfigFile)
		if err != nil {
			return g, err
		}
		g.TLS = t
	}
	return g, nil
}
