//go:build unix

package storage

import (
	"fmt"
	"io"
	"os"
	"syscall"
)

// lockTaken returns an error wrapping EAGAIN, as a failed lock does, when
// another process holds a write lock on f, which may be open read-only
// (F_GETLK, unlike F_SETLK, needs no write access). The lock Pebble takes
// is such a lock on the whole file.
func lockTaken(f *os.File) error {
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &lk); err != nil {
		return fmt.Errorf("check for a lock: %w", err)
	}
	if lk.Type != syscall.F_UNLCK {
		return fmt.Errorf("held by process %d: %w", lk.Pid, syscall.EAGAIN)
	}
	return nil
}
