package storage

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// errReadOnly refuses a write of Inspect's: it only reads.
var errReadOnly = errors.New("storage: inspect writes nothing")

// readOnlyFS is the filesystem Inspect opens a store through. It refuses
// every write, and where the store's lock file cannot be opened for
// writing (a read-only directory or mount, such as a mounted backup) it
// checks whether another process holds the lock instead of taking it: a
// server serving the store is still refused, and nothing is written.
type readOnlyFS struct{ vfs.FS }

func (readOnlyFS) Create(string, vfs.DiskWriteCategory) (vfs.File, error) { return nil, errReadOnly }
func (readOnlyFS) Link(string, string) error                              { return errReadOnly }
func (readOnlyFS) OpenReadWrite(string, vfs.DiskWriteCategory, ...vfs.OpenOption) (vfs.File, error) {
	return nil, errReadOnly
}
func (readOnlyFS) Remove(string) error         { return errReadOnly }
func (readOnlyFS) RemoveAll(string) error      { return errReadOnly }
func (readOnlyFS) Rename(string, string) error { return errReadOnly }
func (readOnlyFS) ReuseForWrite(string, string, vfs.DiskWriteCategory) (vfs.File, error) {
	return nil, errReadOnly
}
func (readOnlyFS) MkdirAll(string, os.FileMode) error { return errReadOnly }
func (f readOnlyFS) Unwrap() vfs.FS                   { return f.FS }

func (f readOnlyFS) Lock(name string) (io.Closer, error) {
	c, err := f.FS.Lock(name)
	if err == nil || !(errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS)) {
		return c, err
	}
	lf, oerr := os.Open(name)
	if errors.Is(oerr, fs.ErrNotExist) {
		// A server creates the file when it opens the store: none has
		// opened this copy (a checkpoint has no lock file).
		return nopCloser{}, nil
	}
	if oerr != nil {
		return nil, fmt.Errorf("%w; reading it to check for a server failed too: %w", err, oerr)
	}
	if herr := lockTaken(lf); herr != nil {
		lf.Close()
		return nil, fmt.Errorf("lock %s: %w", name, herr)
	}
	return lf, nil
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }
