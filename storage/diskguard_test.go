package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

var errDiskFull = fmt.Errorf("injected: %w", syscall.ENOSPC)

func openDisk(t *testing.T, d *MemDisk, mode SyncMode) *Store {
	t.Helper()
	s, err := Open("db", Options{Sync: mode, Disk: d, MaxQueued: 64})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// eventually waits, up to a generous deadline, for cond: for effects of a
// background goroutine that no channel announces.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestDiskErrorsRefuseThenRecover fills the disk under a store: changes get
// ErrUnavailable while reads still work, nothing crashes, and once writes
// succeed again the store takes changes by itself and loses none of those it
// accepted.
func TestDiskErrorsRefuseThenRecover(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncEverySec} {
		t.Run(mode.String(), func(t *testing.T) {
			disk := NewMemDisk()
			s := openDisk(t, disk, mode)
			failing := make(chan struct{}, 1)
			s.guard.sleep = func(time.Duration) {
				select {
				case failing <- struct{}{}:
				default:
				}
				time.Sleep(100 * time.Microsecond)
			}
			b := s.NewBatch()
			for i := range 100 {
				add(t, b, fmt.Sprint("k", i), uint64(i+1))
			}
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}

			disk.FailWrites(errDiskFull)
			// This change is accepted; the write behind it is what fails.
			add(t, b, "accepted", 7)
			err := b.Commit()
			if mode == SyncEverySec {
				if err != nil {
					t.Fatalf("everysec commit: %v", err)
				}
				go s.syncApplied() // what the once-a-second syncer does
			} else if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("always commit while the disk is full: got %v, want ErrUnavailable", err)
			}
			<-failing

			err = b.Modify([]byte("k1"), &counter{delta: 100})
			if !errors.Is(err, ErrUnavailable) || !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("change while the disk is full: got %v, want ErrUnavailable wrapping ENOSPC", err)
			}
			if got, _ := read(t, s, "k1"); got != 2 {
				t.Fatalf("read while the disk is full: k1 = %d, want 2 (refused change applied?)", got)
			}
			st := s.Stats()
			if st.Unavailable == nil || st.UnavailableSince.IsZero() || st.WriteRetries == 0 || st.UnavailableTimes != 1 {
				t.Fatalf("stats while failing: %+v", st)
			}

			disk.FailWrites(nil)
			eventually(t, "writes to succeed again", func() bool { return s.Stats().Unavailable == nil })
			add(t, b, "after", 1)
			if err := b.Commit(); err != nil {
				t.Fatalf("commit after recovery: %v", err)
			}
			if err := s.Close(); err != nil {
				t.Fatalf("close after recovery: %v", err)
			}

			s = openDisk(t, disk, mode)
			defer s.Close()
			for i := range 100 {
				if got, _ := read(t, s, fmt.Sprint("k", i)); got != uint64(i+1) {
					t.Fatalf("after reopen k%d = %d, want %d", i, got, i+1)
				}
			}
			for key, want := range map[string]uint64{"accepted": 7, "after": 1} {
				if got, _ := read(t, s, key); got != want {
					t.Fatalf("after reopen %s = %d, want %d", key, got, want)
				}
			}
		})
	}
}

func TestRetryable(t *testing.T) {
	for _, c := range []struct {
		kind opKind
		err  error
		want bool
	}{
		{opWrite, syscall.ENOSPC, true},
		{opWrite, fmt.Errorf("write x: %w", syscall.EDQUOT), true},
		{opWrite, syscall.EIO, true},
		{opCreate, syscall.EMFILE, true},
		{opCreate, syscall.ENFILE, true},
		{opWrite, syscall.EROFS, false},
		{opWrite, syscall.EACCES, false},
		{opWrite, errors.New("other"), false},
		// No fsync error is ever retried: the kernel may have dropped the
		// pages, and a retry that succeeds proves nothing.
		{opSync, syscall.ENOSPC, false},
		{opSync, syscall.EDQUOT, false},
		{opSync, syscall.EIO, false},
	} {
		if got := retryable(c.kind, c.err); got != c.want {
			t.Errorf("retryable(%v, %v) = %v, want %v", c.kind, c.err, got, c.want)
		}
	}
}

// TestOpenReportsDiskErrors: while opening, a failing write is an error, not
// a wait.
func TestOpenReportsDiskErrors(t *testing.T) {
	disk := NewMemDisk()
	disk.FailWrites(errDiskFull)
	_, err := Open("db", Options{Disk: disk})
	if err == nil || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("open on a full disk: got %v, want an ENOSPC error", err)
	}
}

// TestShutdownRetriesUntilItsDeadline: a disk that is full for a moment
// while the store shuts down loses nothing acknowledged. The failing write
// is retried until Shutdown's deadline, not given up the moment shutdown
// begins, and once it goes through the store closes cleanly with every
// change in it.
func TestShutdownRetriesUntilItsDeadline(t *testing.T) {
	disk := NewMemDisk()
	s := openDisk(t, disk, SyncEverySec)
	s.guard.sleep = func(time.Duration) { time.Sleep(100 * time.Microsecond) }
	b := s.NewBatch()
	add(t, b, "before", 3)
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	disk.FailWrites(errDiskFull)
	add(t, b, "acknowledged", 5)
	if err := b.Commit(); err != nil { // everysec: acknowledged once queued
		t.Fatal(err)
	}
	eventually(t, "the write to fail", func() bool { return s.Unavailable() != nil })
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		closed <- s.Shutdown(ctx)
	}()
	eventually(t, "shutdown to begin", s.guard.closing.Load)
	disk.FailWrites(nil)
	if err := <-closed; err != nil {
		t.Fatalf("Shutdown after the disk recovered: %v", err)
	}
	s = openDisk(t, disk, SyncEverySec)
	defer s.Close()
	for key, want := range map[string]uint64{"before": 3, "acknowledged": 5} {
		if got, _ := read(t, s, key); got != want {
			t.Fatalf("after reopening, %s = %d, want %d", key, got, want)
		}
	}
}

// TestGuardCoversOnlyTheDataDirectory: the guard retries and watches the
// writes of the store's own files, which Pebble names by joining the data
// directory (however it was spelled) and a file name, and nothing deeper:
// with --data . every file was unguarded, so a full disk crashed Pebble;
// and a --backup-dir inside --data made a checkpoint's failures the
// store's.
func TestGuardCoversOnlyTheDataDirectory(t *testing.T) {
	for _, c := range []struct {
		dir, name string
		want      bool
	}{
		{".", "000002.log", true},
		{".", ".", true},
		{".", "backups/nightly/000002.log", false},
		{"./data", "data/000002.log", true},
		{"data/", "data/MANIFEST-000001", true},
		{"/var/lib/sluice", "/var/lib/sluice/000002.log", true},
		{"/var/lib/sluice", "/var/lib/sluice", true},
		{"/var/lib/sluice", "/var/lib/sluice/backups/nightly/000002.log", false},
		{"/var/lib/sluice", "/var/lib/sluice-backups/nightly/000002.log", false},
		{"db", "db/000002.log", true},
	} {
		if got := newGuard(c.dir, nil).inDir(c.name); got != c.want {
			t.Errorf("data directory %q: inDir(%q) = %v, want %v", c.dir, c.name, got, c.want)
		}
	}
}

// TestDotDataDirIsGuarded: with the data directory given as ".", a failed
// fsync of the log fails the store, as it does for any other spelling,
// instead of reaching Pebble.
func TestDotDataDirIsGuarded(t *testing.T) {
	t.Chdir(t.TempDir())
	var failSync atomic.Bool
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if failSync.Load() && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo) {
			return fmt.Errorf("injected: %w", syscall.EIO)
		}
		return nil
	}))
	s, err := Open(".", Options{Sync: SyncAlways, fs: fs})
	if errors.Is(err, ErrLocked) && dotDirRuns.Load() > 0 {
		// The failed store of an earlier run (-count) is never closed, and
		// Pebble keys its in-process lock by the path ".".
		t.Skip("this process already ran the test; its failed store still holds the lock on \".\"")
	}
	if err != nil {
		t.Fatal(err)
	}
	dotDirRuns.Add(1)
	var faults []string
	s.guard.fatal = func(err error) { // observe, then fail the store as usual
		faults = append(faults, err.Error())
		s.fail(err)
	}
	failSync.Store(true)
	b := s.NewBatch()
	add(t, b, "k", 1)
	if err := b.Commit(); !errors.Is(err, ErrFailed) {
		t.Fatalf("commit whose fsync failed: %v, want ErrFailed", err)
	}
	if len(faults) == 0 {
		t.Fatalf("the failed fsync reached Pebble instead of the guard; store failed with: %v", s.Failed())
	}
}

// dotDirRuns counts the runs of TestDotDataDirIsGuarded in this process.
var dotDirRuns atomic.Int32

// TestCheckpointIntoDataDirRefused: a checkpoint inside the data
// directory is refused before anything is written, since its files would
// count as the store's (a failed fsync of one would fail the store), and
// the store goes on.
func TestCheckpointIntoDataDirRefused(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{Sync: SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := s.NewBatch()
	add(t, b, "k", 1)
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, into := range []string{filepath.Join(dir, "backups", "x"), filepath.Join(dir, "x"), dir} {
		err := s.Checkpoint(into)
		if err == nil || !strings.Contains(err.Error(), "inside the data directory") {
			t.Fatalf("checkpoint into %s: %v, want a refusal", into, err)
		}
	}
	if err := s.Checkpoint(dir + "-backups/x"); err != nil {
		t.Fatalf("checkpoint next to the data directory: %v", err)
	}
	add(t, b, "k", 1)
	if err := b.Commit(); err != nil || s.Failed() != nil {
		t.Fatalf("a write after the refused checkpoints: %v (store failed: %v)", err, s.Failed())
	}
}

// TestConcurrentCheckpointsKeepTheirCopies: of two checkpoints into one
// directory, one succeeds and one fails, and the failing one never
// removes the copy the other reported.
func TestConcurrentCheckpointsKeepTheirCopies(t *testing.T) {
	s, err := Open(t.TempDir(), Options{Sync: SyncEverySec})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := s.NewBatch()
	add(t, b, "k", 1)
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	backups := t.TempDir()
	for round := range 20 {
		into := filepath.Join(backups, fmt.Sprint(round))
		errs := make(chan error, 2)
		for range 2 {
			go func() { errs <- s.Checkpoint(into) }()
		}
		ok := 0
		for range 2 {
			if err := <-errs; err == nil {
				ok++
			} else if !errors.Is(err, os.ErrExist) {
				t.Fatalf("round %d: the losing checkpoint failed with %v, want ErrExist", round, err)
			}
		}
		manifests, err := filepath.Glob(filepath.Join(into, "MANIFEST-*"))
		if ok != 1 || err != nil || len(manifests) == 0 {
			t.Fatalf("round %d: %d checkpoints succeeded, and the copy has manifests %v (%v); want one complete copy", round, ok, manifests, err)
		}
	}
}
