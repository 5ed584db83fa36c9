package storage

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"
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
