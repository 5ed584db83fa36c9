//go:build !unix

package storage

import (
	"errors"
	"os"
)

// lockTaken cannot tell here whether another process holds f's lock, so it
// says so.
func lockTaken(f *os.File) error {
	return errors.New("the lock file cannot be written, and this system cannot check it otherwise")
}
