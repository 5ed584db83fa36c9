package server

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/storage"
)

// Reloads read files an operator names: SIGHUP's (Reload: the TLS files,
// the --policy file, the --rls-config directory) and POLICY RELOAD's. The
// files that block a reader at once, named pipes and devices, are refused
// before they are opened (package conffile); a read can still block for
// as long as its file system does (a hung NFS mount, a FUSE daemon that
// does not answer). So a reload runs in a goroutine of its own, one at a
// time, and whoever asked waits for it at most Config.ReloadTimeout, all
// told, and not past Close: a reload that hangs never holds up a shutdown
// or a reply. One that is given up on goes on, logs its outcome when it
// ends, and the next reload waits for it.
type reloader struct {
	running chan struct{} // holds a token while a reload runs
	stop    chan struct{} // closed by Close
}

// ErrReloadTimeout is a reload that did not finish within
// Config.ReloadTimeout, or that waited that long for another one.
var ErrReloadTimeout = errors.New("server: reload timed out")

func (r *reloader) init() {
	r.running = make(chan struct{}, 1)
	r.stop = make(chan struct{})
}

// reloading runs fn as a reload and returns its error, or
// ErrReloadTimeout, or storage.ErrClosed once Close has begun.
func (s *Server) reloading(fn func() error) error {
	timeout := s.after(s.cfg.ReloadTimeout)
	select {
	case s.reload.running <- struct{}{}:
	case <-timeout:
		s.log.Warn("reload not started: another one is still reading its files; the file system may be hung", "reload_timeout", s.cfg.ReloadTimeout)
		return fmt.Errorf("%w: another reload has been reading its files for longer than %v (--reload-timeout), so the file system may be hung; it goes on, the log says when it ends, and then a reload can be asked for again", ErrReloadTimeout, s.cfg.ReloadTimeout)
	case <-s.reload.stop:
		return storage.ErrClosed
	}
	done := make(chan error, 1)
	go func() {
		defer func() { <-s.reload.running }()
		done <- fn()
	}()
	select {
	case err := <-done:
		return err
	case <-timeout:
		s.log.Warn("reload still reading its files; the file system may be hung. It goes on and logs its outcome when it ends", "reload_timeout", s.cfg.ReloadTimeout)
		return fmt.Errorf("%w: still reading its files after %v (--reload-timeout), so the file system may be hung; it goes on, and the log says how it ends", ErrReloadTimeout, s.cfg.ReloadTimeout)
	case <-s.reload.stop:
		return storage.ErrClosed
	}
}

// Reload reads again what SIGHUP reloads, as one reload: the TLS files,
// the --policy file and the --rls-config directory, each kept as it was
// when bad. Each outcome is logged; the errors are returned joined.
func (s *Server) Reload() error {
	return s.reloading(func() error {
		var perr error
		if s.pol.Path != "" {
			perr = s.reloadPolicy()
		}
		return errors.Join(s.reloadTLS(), perr, s.rls.Reload())
	})
}
