package storage

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Pebble cannot survive a failed write to its log: the commit pipeline stops
// (it panics with a mutex held, or calls Fatalf) and the DB can be neither
// used nor closed. So Pebble must never see a write fail for a reason that
// goes away by itself (a full disk, a quota, a transient I/O error). The
// guard sits between Pebble and the filesystem: a write that fails that way
// is retried until it succeeds, so Pebble only ever waits. While any write
// is being retried the store refuses changes with ErrUnavailable, so no
// client waits on the stuck writer, and when the write finally goes through
// the store takes changes again by itself, with nothing lost.
//
// Errors that retrying cannot fix reach Pebble as before: a failed fsync
// other than for space (after which the kernel may have dropped the data,
// so retrying could report a lost write as durable) stops the process, and a
// restart recovers from the log.

// ErrUnavailable means the store refuses changes for now because writes to
// its directory fail; they resume by themselves once a write succeeds.
var ErrUnavailable = errors.New("storage: writes to the data directory are failing (disk full or I/O error); changes are refused until a write succeeds")

// Retry pacing for failing writes, and how often a still-failing disk is
// logged again.
const (
	guardFirstRetry = time.Millisecond
	guardMaxRetry   = 250 * time.Millisecond
	guardLogEvery   = 10 * time.Second
)

// guard counts and paces the writes being retried. The zero value passes
// every error through; arm turns retrying on once the store is open, so
// that a failure while opening is reported, not waited out.
type guard struct {
	armed   atomic.Bool
	failing atomic.Int64 // writes being retried now
	retries atomic.Int64 // failed attempts since Open
	spells  atomic.Int64 // times the store became unavailable
	log     *slog.Logger
	dir     string

	mu struct {
		sync.Mutex
		since   time.Time // when the current spell began; zero when healthy
		lastLog time.Time
		lastErr error
	}
	// sleep is time.Sleep; tests make retries instant.
	sleep func(time.Duration)
	// wake, if set, runs when writes start failing, without g.mu held.
	wake func()
}

func newGuard(dir string, log *slog.Logger) *guard {
	return &guard{log: log, dir: dir, sleep: time.Sleep}
}

// unavailable returns ErrUnavailable, with the failing write's error, while
// a write is being retried.
func (g *guard) unavailable() error {
	if g.failing.Load() == 0 {
		return nil
	}
	g.mu.Lock()
	last := g.mu.lastErr
	g.mu.Unlock()
	if last == nil {
		return ErrUnavailable
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, last)
}

// since returns when the current spell of failing writes began, or the zero
// time when writes succeed.
func (g *guard) since() time.Time {
	if g.failing.Load() == 0 {
		return time.Time{}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.since
}

// retryable reports whether err may go away by itself. fsync errors other
// than for space are not: see the comment at the top of the file.
func retryable(err error, sync bool) bool {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return true
	}
	return !sync && errors.Is(err, syscall.EIO)
}

// do runs op until it succeeds or fails for a reason retrying cannot fix.
func (g *guard) do(what, name string, sync bool, op func() error) error {
	err := op()
	if err == nil || !g.armed.Load() || !retryable(err, sync) {
		return err
	}
	g.begin(what, name, err)
	defer g.end()
	wait := guardFirstRetry
	for {
		g.sleep(wait)
		wait = min(2*wait, guardMaxRetry)
		if err = op(); err == nil || !retryable(err, sync) {
			return err
		}
		g.note(what, name, err)
	}
}

func (g *guard) begin(what, name string, err error) {
	g.retries.Add(1)
	g.mu.Lock()
	g.mu.lastErr = err
	first := g.failing.Add(1) == 1 && g.mu.since.IsZero()
	if first {
		g.mu.since = time.Now()
		g.mu.lastLog = g.mu.since
		g.spells.Add(1)
		g.log.Error("writes to the data directory fail; refusing changes and retrying until a write succeeds",
			"dir", g.dir, "op", what, "file", name, "err", err)
	}
	g.mu.Unlock()
	if first && g.wake != nil {
		g.wake() // callers waiting for a sync must hear of it now
	}
}

// note logs a write that is still failing, once per guardLogEvery.
func (g *guard) note(what, name string, err error) {
	g.retries.Add(1)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.mu.lastErr = err
	if time.Since(g.mu.lastLog) >= guardLogEvery {
		g.mu.lastLog = time.Now()
		g.log.Error("writes to the data directory still fail; changes still refused",
			"dir", g.dir, "op", what, "file", name, "err", err, "for", time.Since(g.mu.since).Round(time.Millisecond))
	}
}

func (g *guard) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failing.Add(-1) == 0 && !g.mu.since.IsZero() {
		g.log.Warn("writes to the data directory succeed again; taking changes",
			"dir", g.dir, "after", time.Since(g.mu.since).Round(time.Millisecond))
		g.mu.since = time.Time{}
		g.mu.lastErr = nil
	}
}

// guardFS is the filesystem Pebble sees: fs with its writes guarded.
type guardFS struct {
	vfs.FS
	g *guard
}

func (f guardFS) Unwrap() vfs.FS { return f.FS }

func (f guardFS) Create(name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	var file vfs.File
	err := f.g.do("create", name, false, func() (err error) {
		file, err = f.FS.Create(name, cat)
		return err
	})
	if err != nil {
		return nil, err
	}
	return guardFile{file, f.g, name}, nil
}

func (f guardFS) OpenReadWrite(name string, cat vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	file, err := f.FS.OpenReadWrite(name, cat, opts...)
	if err != nil {
		return nil, err
	}
	return guardFile{file, f.g, name}, nil
}

func (f guardFS) ReuseForWrite(oldname, newname string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	var file vfs.File
	err := f.g.do("reuse", newname, false, func() (err error) {
		file, err = f.FS.ReuseForWrite(oldname, newname, cat)
		return err
	})
	if err != nil {
		return nil, err
	}
	return guardFile{file, f.g, newname}, nil
}

func (f guardFS) Link(oldname, newname string) error {
	return f.g.do("link", newname, false, func() error { return f.FS.Link(oldname, newname) })
}

func (f guardFS) Rename(oldname, newname string) error {
	return f.g.do("rename", newname, false, func() error { return f.FS.Rename(oldname, newname) })
}

func (f guardFS) MkdirAll(dir string, perm os.FileMode) error {
	return f.g.do("mkdir", dir, false, func() error { return f.FS.MkdirAll(dir, perm) })
}

// guardFile guards the writes of one file. A short write is retried from
// where it stopped.
type guardFile struct {
	vfs.File
	g    *guard
	name string
}

func (f guardFile) Write(p []byte) (int, error) {
	done := 0
	err := f.g.do("write", f.name, false, func() error {
		n, err := f.File.Write(p[done:])
		done += n
		return err
	})
	return done, err
}

func (f guardFile) WriteAt(p []byte, off int64) (int, error) {
	done := 0
	err := f.g.do("write", f.name, false, func() error {
		n, err := f.File.WriteAt(p[done:], off+int64(done))
		done += n
		return err
	})
	return done, err
}

func (f guardFile) Preallocate(off, length int64) error {
	return f.g.do("preallocate", f.name, false, func() error { return f.File.Preallocate(off, length) })
}

func (f guardFile) Sync() error {
	return f.g.do("sync", f.name, true, f.File.Sync)
}

func (f guardFile) SyncData() error {
	return f.g.do("sync", f.name, true, f.File.SyncData)
}

func (f guardFile) SyncTo(length int64) (full bool, err error) {
	err = f.g.do("sync", f.name, true, func() (err error) {
		full, err = f.File.SyncTo(length)
		return err
	})
	return full, err
}
