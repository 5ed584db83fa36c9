// Package conffile reads the files an operator gives sluice: the rule
// file, Envoy's rate limit configuration, TLS certificates and keys,
// password files. It reads regular files only, symlinks followed (a
// Kubernetes ConfigMap's files are symlinks), and at most a given number
// of bytes: a named pipe would block the reader in open(2) until some
// writer came, for ever if none does, and a device such as /dev/zero
// would be read until memory ran out. It holds no state and is safe for
// concurrent use.
package conffile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultLimit is the most bytes Read reads when given no limit: more than
// any real rule file, configuration directory or certificate bundle needs.
const DefaultLimit = 4 << 20

// Errors of a file Read refuses, for errors.Is; the error says which file,
// what it is and what was expected.
var (
	ErrNotRegular = errors.New("conffile: not a regular file")
	ErrTooBig     = errors.New("conffile: file too big")
	ErrNotDir     = errors.New("conffile: not a directory")
)

// limitFlag names the setting of the limit in errors: the flag of sluice
// and of its subcommands.
const limitFlag = "--max-config-file"

// Read returns the contents of the regular file at path (a symlink to one
// is followed), or an error when it is not one or holds more than limit
// bytes (0 or less: DefaultLimit).
func Read(path string, limit int64) ([]byte, error) {
	if limit <= 0 {
		limit = DefaultLimit
	}
	f, err := open(path, func(fi fs.FileInfo) error { return check(path, fi, limit) })
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// One byte more than the limit tells a file that grew since Stat, or
	// one whose size Stat does not tell (as in /proc), from one that fits.
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w: %s holds more than %d bytes, the limit (%s); expected a smaller file, or a higher limit", ErrTooBig, path, limit, limitFlag)
	}
	return data, nil
}

// open opens path for reading if ok accepts what it is, asked before the
// open, as opening a named pipe blocks in open(2) itself, and again once
// open, as the path may have been replaced since. The open does not block
// (O_NONBLOCK changes nothing for the reads of a regular file or a
// directory).
func open(path string, ok func(fs.FileInfo) error) (*os.File, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := ok(fi); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|openFlags, 0)
	if err != nil {
		return nil, err
	}
	if fi, err = f.Stat(); err == nil {
		err = ok(fi)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// check refuses what is not a regular file, or is bigger than limit.
func check(path string, fi fs.FileInfo, limit int64) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s%s is %s; expected a regular file or a symlink to one", ErrNotRegular, path, target(path), describe(fi.Mode()))
	}
	if fi.Size() > limit {
		return fmt.Errorf("%w: %s is %d bytes, %d over the limit of %d (%s); expected a smaller file, or a higher limit", ErrTooBig, path, fi.Size(), fi.Size()-limit, limit, limitFlag)
	}
	return nil
}

// target names where a symlink at path leads, for errors: ", a symlink to
// /dev/zero,"; "" when path is not a symlink.
func target(path string) string {
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		return ""
	}
	if t, err := filepath.EvalSymlinks(path); err == nil {
		return ", a symlink to " + t + ","
	}
	return ", a symlink,"
}

// describe names a kind of file: "a named pipe (FIFO)", "a directory".
func describe(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return "not a regular file (mode " + m.String() + ")"
}

// ReadDir returns the entries of the directory at path, sorted by name,
// as os.ReadDir does, or an error when path is not a directory (a symlink
// to one is followed): opening a named pipe in its place would block.
func ReadDir(path string) ([]fs.DirEntry, error) {
	f, err := open(path, func(fi fs.FileInfo) error {
		if !fi.IsDir() {
			return fmt.Errorf("%w: %s%s is %s; expected a directory or a symlink to one", ErrNotDir, path, target(path), describe(fi.Mode()))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return ents, err
}
