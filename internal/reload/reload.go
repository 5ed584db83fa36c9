// Package reload runs the reloads of the files an operator names
// (SIGHUP's and POLICY RELOAD's) one at a time, and never makes whoever
// asked wait past a timeout or past the server's close. The files that
// block a reader at once, named pipes and devices, are refused before
// they are opened (package conffile); a read can still block for as long
// as its file system does (a hung NFS mount, a FUSE daemon that does not
// answer). So a reload runs in a goroutine of its own, one at a time, and
// whoever asked waits for it at most Options.Timeout, all told, and not
// past Stop: a reload that hangs never holds up a shutdown or a reply.
// One that is given up on goes on, logs its outcome when it ends, and the
// next reload waits for it.
//
// A Runner is safe for concurrent use.
package reload

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// ErrTimeout is a reload that did not finish within Options.Timeout, or
// that waited that long for another one. Its text names the server, as it
// did when the server owned it.
var ErrTimeout = errors.New("server: reload timed out")

// DefaultTimeout is --reload-timeout's default: a reload of local files
// takes milliseconds; seconds mean a file system that does not answer.
const DefaultTimeout = 5 * time.Second

// Config is what an operator sets of the files of the server's
// configuration (the --policy file, the TLS files, the --rls-config
// directory) and their reloads. A zero field means the default given.
type Config struct {
	// MaxFileBytes bounds the bytes read from each file of the
	// configuration (--max-config-file), the files of the --rls-config
	// directory together; default conffile.DefaultLimit, which
	// conffile.Read applies. Only regular files (or symlinks to them) are
	// read: a named pipe or a device is refused without being opened.
	MaxFileBytes int64
	// Timeout is the most a reload is waited for, reading its files or
	// waiting for another one to finish first (--reload-timeout); past
	// it Run returns ErrTimeout, and the reload goes on. Default
	// DefaultTimeout.
	Timeout time.Duration
}

// WithDefaults is c with its zero fields set to their defaults:
// MaxFileBytes stays 0 for conffile.Read's own.
func (c Config) WithDefaults() Config {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	return c
}

// Options configure a Runner.
type Options struct {
	Timeout time.Duration // Config.Timeout
	// After is time.After for the timeout; tests see and drive it.
	After func(time.Duration) <-chan time.Time
	Log   *slog.Logger
	// Closed is what Run returns once Stop has been called.
	Closed error
}

// Runner runs reloads one at a time.
type Runner struct {
	o       Options
	running chan struct{} // holds a token while a reload runs
	stop    chan struct{} // closed by Stop
}

// New returns a Runner of o.
func New(o Options) *Runner {
	return &Runner{o: o, running: make(chan struct{}, 1), stop: make(chan struct{})}
}

// Stop makes every Run under way and to come return Options.Closed at
// once; a reload under way is waited for no longer. Call it once.
func (r *Runner) Stop() { close(r.stop) }

// Run runs fn as a reload and returns its error, or ErrTimeout, or
// Options.Closed once Stop has been called.
func (r *Runner) Run(fn func() error) error {
	// First: below, a free slot and the stop are both ready, and select
	// would pick either.
	select {
	case <-r.stop:
		return r.o.Closed
	default:
	}
	timeout := r.o.After(r.o.Timeout)
	select {
	case r.running <- struct{}{}:
	case <-timeout:
		r.o.Log.Warn("reload not started: another one is still reading its files; the file system may be hung", "reload_timeout", r.o.Timeout)
		return fmt.Errorf("%w: another reload has been reading its files for longer than %v (--reload-timeout), so the file system may be hung; it goes on, the log says when it ends, and then a reload can be asked for again", ErrTimeout, r.o.Timeout)
	case <-r.stop:
		return r.o.Closed
	}
	done := make(chan error, 1)
	go func() {
		defer func() { <-r.running }()
		done <- fn()
	}()
	select {
	case err := <-done:
		return err
	case <-timeout:
		r.o.Log.Warn("reload still reading its files; the file system may be hung. It goes on and logs its outcome when it ends", "reload_timeout", r.o.Timeout)
		return fmt.Errorf("%w: still reading its files after %v (--reload-timeout), so the file system may be hung; it goes on, and the log says how it ends", ErrTimeout, r.o.Timeout)
	case <-r.stop:
		return r.o.Closed
	}
}
