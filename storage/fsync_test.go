package storage

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// syncFailFS fails the next fsync of a log file once, after which fsyncs
// succeed again: what Linux does after a writeback error, which it reports
// once and then forgets, with the dirty pages dropped.
type syncFailFS struct {
	vfs.FS
	next  atomic.Pointer[error] // the error for the next fsync of a log
	fails atomic.Int64          // fsyncs failed
}

func (f *syncFailFS) failNextSync(err error) { f.next.Store(&err) }

func (f *syncFailFS) wrap(name string, file vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return file, err
	}
	return syncFailFile{file, f}, nil
}

func (f *syncFailFS) Create(name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.Create(name, cat)
	return f.wrap(name, file, err)
}

func (f *syncFailFS) ReuseForWrite(oldname, newname string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.ReuseForWrite(oldname, newname, cat)
	return f.wrap(newname, file, err)
}

func (f *syncFailFS) OpenReadWrite(name string, cat vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	file, err := f.FS.OpenReadWrite(name, cat, opts...)
	return f.wrap(name, file, err)
}

type syncFailFile struct {
	vfs.File
	fs *syncFailFS
}

func (f syncFailFile) fail() error {
	if p := f.fs.next.Swap(nil); p != nil {
		f.fs.fails.Add(1)
		return *p
	}
	return nil
}

func (f syncFailFile) Sync() error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f syncFailFile) SyncData() error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.File.SyncData()
}

func (f syncFailFile) SyncTo(length int64) (bool, error) {
	if err := f.fail(); err != nil {
		return false, err
	}
	return f.File.SyncTo(length)
}

// TestFailedFsyncIsNeverAcknowledged: an fsync of the log that fails once,
// for any reason, is not retried into a false success. In SyncAlways the
// write waiting for it gets ErrFailed, never OK; in SyncEverySec the
// periodic sync fails the store; either way the store refuses every change
// after, tells FailedC, and Shutdown reports what may be lost without
// hanging.
func TestFailedFsyncIsNeverAcknowledged(t *testing.T) {
	for _, c := range []struct {
		mode SyncMode
		err  error
	}{
		{SyncAlways, syscall.ENOSPC}, // thin provisioning: what the issue saw
		{SyncAlways, syscall.EIO},
		{SyncEverySec, syscall.ENOSPC},
	} {
		t.Run(fmt.Sprint(c.mode, "/", c.err), func(t *testing.T) {
			fs := &syncFailFS{FS: vfs.NewMem()}
			s, err := Open("db", Options{Sync: c.mode, fs: fs, MaxQueued: 64})
			if err != nil {
				t.Fatal(err)
			}
			s.guard.sleep = func(time.Duration) {}
			b := s.NewBatch()
			add(t, b, "before", 1)
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}

			fs.failNextSync(fmt.Errorf("injected: %w", c.err))
			add(t, b, "lost", 2)
			err = b.Commit()
			if c.mode == SyncEverySec {
				if err != nil {
					t.Fatalf("everysec commit: %v", err)
				}
				if err := s.Flush(); err != nil {
					t.Fatal(err)
				}
				go s.syncApplied() // what the once-a-second syncer does
				<-s.FailedC()
			} else if err == nil {
				t.Fatalf("commit whose fsync failed with %v was acknowledged (the retried fsync \"succeeded\")", c.err)
			}
			select {
			case <-s.FailedC():
			default:
				t.Fatalf("store not failed after a failed fsync; commit returned %v", err)
			}
			if c.mode == SyncAlways && !errors.Is(err, ErrFailed) {
				t.Fatalf("commit after a failed fsync: %v, want ErrFailed", err)
			}
			if fs.fails.Load() != 1 {
				t.Fatalf("%d fsyncs failed, want 1", fs.fails.Load())
			}
			if err := b.Modify([]byte("after"), &counter{delta: 1}); !errors.Is(err, ErrFailed) {
				t.Fatalf("change after the store failed: %v, want ErrFailed", err)
			}
			st := s.Stats() // must not block on Pebble
			if st.Failed == nil || !errors.Is(st.Failed, c.err) {
				t.Fatalf("Stats().Failed = %v, want the fsync error", st.Failed)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = s.Shutdown(ctx)
			var ce *CloseError
			if !errors.As(err, &ce) || !errors.Is(err, c.err) {
				t.Fatalf("Shutdown of a failed store: %v, want a CloseError wrapping %v", err, c.err)
			}
			if ctx.Err() != nil {
				t.Fatal("Shutdown waited for its deadline instead of giving up on the failed store")
			}
			// The key is in a round that never finished: unwritten for
			// the store's counts, or written and not synced.
			if ce.Unwritten+ce.Unsynced < 1 {
				t.Fatalf("CloseError does not count the key whose fsync failed: %+v", ce)
			}
		})
	}
}

// TestFatalfParksAndFails: Pebble's Fatalf makes the store fail and never
// returns; it does not panic.
func TestFatalfParksAndFails(t *testing.T) {
	s := openMem(t, vfs.NewMem(), SyncAlways)
	returned := make(chan any, 1)
	go func() {
		defer func() { returned <- recover() }()
		pebbleLogger{l: s.log, fail: s.fail}.Fatalf("injected %s", "fatal")
	}()
	<-s.FailedC()
	if err := s.Failed(); err == nil || !strings.Contains(err.Error(), "injected fatal") {
		t.Fatalf("Failed() = %v", err)
	}
	select {
	case r := <-returned:
		t.Fatalf("Fatalf returned (recovered %v)", r)
	default:
	}
	s.Stats()
	var ce *CloseError
	if err := s.Close(); !errors.As(err, &ce) {
		t.Fatalf("Close after Fatalf: %v, want a CloseError", err)
	}
}

// gateFS blocks the first write outside dir ("db") until gate is closed,
// after telling started.
type gateFS struct {
	vfs.FS
	once    atomic.Bool
	started chan struct{}
	gate    chan struct{}
}

func (f *gateFS) Create(name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.Create(name, cat)
	if err != nil || strings.HasPrefix(name, "db/") {
		return file, err
	}
	return gateFile{file, f}, nil
}

type gateFile struct {
	vfs.File
	fs *gateFS
}

func (f gateFile) Write(p []byte) (int, error) {
	if f.fs.once.CompareAndSwap(false, true) {
		close(f.fs.started)
		<-f.fs.gate
	}
	return f.File.Write(p)
}

// TestShutdownStopsCheckpoint: Shutdown during a checkpoint makes the
// checkpoint fail (leaving no copy) instead of waiting for it to finish.
func TestShutdownStopsCheckpoint(t *testing.T) {
	fs := &gateFS{FS: vfs.NewMem(), started: make(chan struct{}), gate: make(chan struct{})}
	s := openMem(t, fs, SyncAlways)
	b := s.NewBatch()
	for i := range 1000 {
		add(t, b, fmt.Sprint("k", i), 1)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	checkpointed := make(chan error, 1)
	go func() { checkpointed <- s.Checkpoint("backup/cp") }()
	<-fs.started
	closed := make(chan error, 1)
	go func() { closed <- s.Shutdown(context.Background()) }()
	eventually(t, "Shutdown to begin", s.guard.closing.Load)
	close(fs.gate)
	if err := <-checkpointed; !errors.Is(err, ErrClosed) {
		t.Fatalf("checkpoint during Shutdown: %v, want ErrClosed", err)
	}
	if _, err := fs.Stat("backup/cp"); err == nil {
		t.Fatal("the stopped checkpoint left its copy")
	}
	if err := <-closed; err != nil {
		t.Fatalf("Shutdown during a checkpoint: %v", err)
	}
}

// TestOpenContextStops: a signal (a done context) ends a slow Open at once.
func TestOpenContextStops(t *testing.T) {
	fs := &gateFS{FS: vfs.NewMem(), started: make(chan struct{}), gate: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	opened := make(chan error, 1)
	go func() {
		// The store in "slow" is outside gateFS' "db/": its first write waits.
		_, err := OpenContext(ctx, "slow", Options{fs: fs})
		opened <- err
	}()
	<-fs.started
	cancel()
	if err := <-opened; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "slow") {
		t.Fatalf("OpenContext cancelled while opening: %v, want context.Canceled naming the directory", err)
	}
	close(fs.gate) // the abandoned open finishes and closes what it opened
}
