package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Pebble cannot survive a failed write to its log: the commit pipeline stops
// (Fatalf is called, or the next switch to a new log file panics in
// rotateWAL with the commit pipeline's mutex held; measured: one failed
// fsync of the log, then writes until the memtable is full. With the
// error EMFILE the same panic ended the adversarial run in "fatal error:
// sync: unlock of unlocked mutex", which no recover catches) and the DB
// can be neither used nor closed. So Pebble must never see a write fail for a
// reason that goes away by itself (a full disk, a quota, a transient I/O
// error, no file descriptor left). The guard sits between Pebble and the
// data directory: a write or file creation that fails that way is retried
// until it succeeds, so Pebble only ever waits. While any write is being
// retried the store refuses changes with ErrUnavailable, so no client waits
// on the stuck writer, and when the write finally goes through the store
// takes changes again by itself, with nothing lost.
//
// An fsync is never retried. After a failed fsync Linux may have dropped
// the dirty pages and reports the error only once, so a retry that succeeds
// proves nothing (measured: ext4 on a full thin-provisioned volume, where
// the "successful" retry left zero-filled sstables). Nor does Pebble see
// the error: for the log it panics as above, and a failed flush is retried
// at once, forever, at full CPU (measured: 176k attempts, 30 MB of log in a
// minute). So a failed fsync, like any other failure
// of a data-directory write that will not be retried (a write that keeps
// failing while the store closes, or one that fails while it opens), makes
// the store fail (ErrFailed: nothing more is acknowledged, main exits and a
// restart replays the log) and the call never returns: the goroutine that
// made it waits for the process to exit.
//
// Only files inside the data directory are guarded. CHECKPOINT writes
// elsewhere through the same filesystem; its failures go to the caller at
// once, and stop as soon as the store closes.

// ErrUnavailable means the store refuses changes for now because writes to
// its directory fail; they resume by themselves once a write succeeds.
var ErrUnavailable = errors.New("storage: writes to the data directory are failing (disk full or I/O error); changes are refused until a write succeeds")

// errCheckpointClosing fails a checkpoint's writes once the store closes.
var errCheckpointClosing = errors.New("storage: the store is closing")

// Retry pacing for failing writes, and how often a still-failing disk is
// logged again.
const (
	guardFirstRetry = time.Millisecond
	guardMaxRetry   = 250 * time.Millisecond
	guardLogEvery   = 10 * time.Second
)

// opKind says what a guarded call does, for retrying and for the log.
type opKind int

const (
	opWrite  opKind = iota // write, preallocate, rename, link, mkdir
	opCreate               // create or open a file for writing: needs a descriptor
	opSync
)

// guard counts and paces the writes being retried. Until arm, while the
// store opens, nothing is retried: a failure is reported to Open instead.
type guard struct {
	armed   atomic.Bool
	closing atomic.Bool  // Close has begun: checkpoints stop
	expired atomic.Bool  // Close's time is up: stop retrying
	failing atomic.Int64 // writes being retried now
	retries atomic.Int64 // failed attempts since Open
	spells  atomic.Int64 // times the store became unavailable
	log     *slog.Logger
	dir     string // as given to Open
	clean   string // filepath.Clean(dir): Pebble's files are its direct children

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
	// fatal makes the store fail with err; see giveUp.
	fatal func(err error)
}

func newGuard(dir string, log *slog.Logger) *guard {
	return &guard{log: log, dir: dir, clean: filepath.Clean(dir), sleep: time.Sleep}
}

// inDir reports whether name is the data directory or a file directly in
// it. Pebble keeps every file of the store there, named by joining the
// directory it was given (so "." gives "000002.log"); anything deeper, such
// as a --backup-dir inside --data, is not the store's and is not guarded.
func (g *guard) inDir(name string) bool {
	clean := filepath.Clean(name)
	return clean == g.clean || filepath.Dir(clean) == g.clean
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

// diskError reports whether err says the device or the process is out of
// something, or broken: the errors the guard acts on. Others (a missing
// file, a permission) go to Pebble as they are; it expects some of them.
func diskError(kind opKind, err error) bool {
	if kind == opSync {
		return true
	}
	for _, e := range []error{syscall.ENOSPC, syscall.EDQUOT, syscall.EIO, syscall.EMFILE, syscall.ENFILE, syscall.EROFS} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// retryable reports whether err may go away by itself. A failed fsync never
// does: see the comment at the top of the file.
func retryable(kind opKind, err error) bool {
	switch {
	case kind == opSync:
		return false
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EIO):
		return true
	case kind == opCreate:
		// Out of file descriptors, in the process or the system: one is
		// freed when a connection or an sstable reader closes.
		return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
	}
	return false
}

// do runs op, retrying it while it fails for a reason that goes away by
// itself; it returns only when op succeeds or fails with an error Pebble
// may see.
func (g *guard) do(kind opKind, what, name string, op func() error) error {
	err := op()
	if err == nil || !diskError(kind, err) {
		return err
	}
	if !g.armed.Load() || g.expired.Load() || !retryable(kind, err) {
		g.giveUp(what, name, err)
	}
	g.begin(what, name, err)
	wait := guardFirstRetry
	for {
		g.sleep(wait)
		wait = min(2*wait, guardMaxRetry)
		if g.expired.Load() {
			g.end(false)
			g.giveUp(what, name, fmt.Errorf("still failing when the store closed: %w", err))
		}
		err = op()
		if err == nil {
			g.end(true)
			return nil
		}
		if !diskError(kind, err) {
			g.end(true)
			return err
		}
		if !retryable(kind, err) {
			g.end(false)
			g.giveUp(what, name, err)
		}
		g.note(what, name, err)
	}
}

// giveUp makes the store fail with err and never returns: Pebble must see
// neither a failed fsync nor a failed log write (see the top of the file),
// and the process exits soon, since main stops on a failed store.
func (g *guard) giveUp(what, name string, err error) {
	if pe := (*fs.PathError)(nil); !errors.As(err, &pe) || pe.Path != name {
		err = fmt.Errorf("%s %s: %w", what, name, err)
	}
	if g.fatal != nil {
		g.fatal(err)
	}
	park()
}

// park blocks the calling goroutine until the process exits.
func park() { select {} }

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

// end closes a spell of retries; ok says whether the write went through.
func (g *guard) end(ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failing.Add(-1) == 0 && !g.mu.since.IsZero() {
		if ok {
			g.log.Warn("writes to the data directory succeed again; taking changes",
				"dir", g.dir, "after", time.Since(g.mu.since).Round(time.Millisecond))
		}
		g.mu.since = time.Time{}
		g.mu.lastErr = nil
	}
}

// guardFS is the filesystem Pebble sees: fs with its writes in the data
// directory guarded, and writes elsewhere (checkpoints) stopped once the
// store closes.
type guardFS struct {
	vfs.FS
	g *guard
}

func (f guardFS) Unwrap() vfs.FS { return f.FS }

// outside checks a write outside the data directory: it fails once the
// store closes, so that a checkpoint cannot hold up shutdown.
func (f guardFS) outside() error {
	if f.g.closing.Load() {
		return errCheckpointClosing
	}
	return nil
}

func (f guardFS) Create(name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	if !f.g.inDir(name) {
		if err := f.outside(); err != nil {
			return nil, err
		}
		file, err := f.FS.Create(name, cat)
		if err != nil {
			return nil, err
		}
		return outsideFile{file, f.g}, nil
	}
	var file vfs.File
	err := f.g.do(opCreate, "create", name, func() (err error) {
		file, err = f.FS.Create(name, cat)
		return err
	})
	if err != nil {
		return nil, err
	}
	return guardFile{file, f.g, name}, nil
}

func (f guardFS) OpenReadWrite(name string, cat vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	if !f.g.inDir(name) {
		if err := f.outside(); err != nil {
			return nil, err
		}
		file, err := f.FS.OpenReadWrite(name, cat, opts...)
		if err != nil {
			return nil, err
		}
		return outsideFile{file, f.g}, nil
	}
	var file vfs.File
	err := f.g.do(opCreate, "open", name, func() (err error) {
		file, err = f.FS.OpenReadWrite(name, cat, opts...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return guardFile{file, f.g, name}, nil
}

func (f guardFS) ReuseForWrite(oldname, newname string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	if !f.g.inDir(newname) {
		if err := f.outside(); err != nil {
			return nil, err
		}
		file, err := f.FS.ReuseForWrite(oldname, newname, cat)
		if err != nil {
			return nil, err
		}
		return outsideFile{file, f.g}, nil
	}
	var file vfs.File
	err := f.g.do(opCreate, "reuse", newname, func() (err error) {
		file, err = f.FS.ReuseForWrite(oldname, newname, cat)
		return err
	})
	if err != nil {
		return nil, err
	}
	return guardFile{file, f.g, newname}, nil
}

func (f guardFS) Link(oldname, newname string) error {
	if !f.g.inDir(newname) {
		if err := f.outside(); err != nil {
			return err
		}
		return f.FS.Link(oldname, newname)
	}
	return f.g.do(opWrite, "link", newname, func() error { return f.FS.Link(oldname, newname) })
}

func (f guardFS) Rename(oldname, newname string) error {
	if !f.g.inDir(newname) {
		if err := f.outside(); err != nil {
			return err
		}
		return f.FS.Rename(oldname, newname)
	}
	return f.g.do(opWrite, "rename", newname, func() error { return f.FS.Rename(oldname, newname) })
}

func (f guardFS) MkdirAll(dir string, perm os.FileMode) error {
	if !f.g.inDir(dir) {
		if err := f.outside(); err != nil {
			return err
		}
		return f.FS.MkdirAll(dir, perm)
	}
	return f.g.do(opWrite, "mkdir", dir, func() error { return f.FS.MkdirAll(dir, perm) })
}

// OpenDir guards the directory's fsync, which makes a new file's name
// durable: it is an fsync like any other.
func (f guardFS) OpenDir(name string) (vfs.File, error) {
	file, err := f.FS.OpenDir(name)
	if err != nil || !f.g.inDir(name) {
		return file, err
	}
	return guardFile{file, f.g, name}, nil
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
	err := f.g.do(opWrite, "write", f.name, func() error {
		n, err := f.File.Write(p[done:])
		done += n
		return err
	})
	return done, err
}

func (f guardFile) WriteAt(p []byte, off int64) (int, error) {
	done := 0
	err := f.g.do(opWrite, "write", f.name, func() error {
		n, err := f.File.WriteAt(p[done:], off+int64(done))
		done += n
		return err
	})
	return done, err
}

func (f guardFile) Preallocate(off, length int64) error {
	return f.g.do(opWrite, "preallocate", f.name, func() error { return f.File.Preallocate(off, length) })
}

func (f guardFile) Sync() error {
	return f.g.do(opSync, "fsync", f.name, f.File.Sync)
}

func (f guardFile) SyncData() error {
	return f.g.do(opSync, "fsync", f.name, f.File.SyncData)
}

func (f guardFile) SyncTo(length int64) (full bool, err error) {
	err = f.g.do(opSync, "fsync", f.name, func() (err error) {
		full, err = f.File.SyncTo(length)
		return err
	})
	return full, err
}

// outsideFile is a file a checkpoint writes: unguarded, but its writes fail
// once the store closes.
type outsideFile struct {
	vfs.File
	g *guard
}

func (f outsideFile) Write(p []byte) (int, error) {
	if f.g.closing.Load() {
		return 0, errCheckpointClosing
	}
	return f.File.Write(p)
}

func (f outsideFile) WriteAt(p []byte, off int64) (int, error) {
	if f.g.closing.Load() {
		return 0, errCheckpointClosing
	}
	return f.File.WriteAt(p, off)
}

func (f outsideFile) Sync() error {
	if f.g.closing.Load() {
		return errCheckpointClosing
	}
	return f.File.Sync()
}
