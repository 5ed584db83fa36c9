package storage

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// relocateOps are the filesystem calls Relocate makes, so that a test can
// stop it after any of them, as a crash would.
type relocateOps struct {
	lock    func(name string) (io.Closer, error)
	mkdir   func(dir string) error
	rename  func(oldname, newname string) error
	syncDir func(dir string) error
	remove  func(name string) error
}

// osRelocateOps are the real calls.
func osRelocateOps() relocateOps {
	return relocateOps{
		lock:    vfs.Default.Lock,
		mkdir:   func(dir string) error { return os.Mkdir(dir, 0o750) },
		rename:  os.Rename,
		syncDir: syncDir,
		remove:  os.Remove,
	}
}

// lockFile is the name of Pebble's lock file in a store's directory.
const lockFile = "LOCK"

// Relocate moves a store kept directly in from (its files at the top of
// the directory, as the shipped image laid out its volume before the store
// had a directory of its own on it) into to, a directory inside from, and
// reports whether it moved one. It does nothing when from holds no store
// and no move into to was cut short there, or when to is from.
//
// The files move into to+".moving" first, one rename each, and that
// directory becomes to in a last rename, each step synced: a move cut
// short (a crash, a failed rename) leaves the store whole in from and
// to+".moving" together, which the next call finishes, and to never
// appears with part of the store. The MANIFEST and the markers move first
// (see moveOrder), so that an older sluice started on from meanwhile
// refuses it rather than start an empty store there.
// Only files move: directories in from (the backup directory, lost+found,
// what sluice repair moved aside) stay where they are.
//
// It refuses, changing nothing, when to already holds files (two stores:
// keep one), when to is not directly inside from, and with ErrLocked while
// a server holds the store in from.
func Relocate(from, to string) (bool, error) {
	return relocate(from, to, osRelocateOps())
}

func relocate(from, to string, ops relocateOps) (bool, error) {
	absFrom, err1 := filepath.Abs(from)
	absTo, err2 := filepath.Abs(to)
	if err := errors.Join(err1, err2); err != nil {
		return false, fmt.Errorf("storage: relocate %s: %w", from, err)
	}
	staging := filepath.Join(absFrom, filepath.Base(absTo)+".moving")
	files, resuming, err := filesToMove(from, staging)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if (!resuming && !slices.ContainsFunc(files, isStoreMarker)) || absTo == absFrom {
		return false, nil // nothing to move, or the store is served where it is
	}
	if filepath.Dir(absTo) != absFrom {
		return false, fmt.Errorf("storage: relocate the store in %s into %s: the new directory must be directly inside the old one", from, to)
	}
	left, err := os.ReadDir(to)
	switch {
	case err == nil && len(left) > 0:
		return false, fmt.Errorf("storage: relocate the store in %s into %s: %s already holds files (%s, ...): two stores; keep one and move the other out of %s", from, to, to, left[0].Name(), from)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return false, fmt.Errorf("storage: relocate: read %s: %w", to, err)
	}
	emptyTo := err == nil

	// Pebble's own lock: a sluice serving from refuses the move, and a
	// sluice started meanwhile on from (an older image) is refused.
	lock, err := ops.lock(filepath.Join(from, lockFile))
	if err != nil {
		if lockHeld(err) {
			return false, fmt.Errorf("%w: %s (is a sluice serving it? stop it before moving its store into %s): %w", ErrLocked, from, to, err)
		}
		return false, fmt.Errorf("storage: relocate: lock %s: %w", from, err)
	}
	defer lock.Close()
	// Again, now that no sluice can be writing there: one that held the
	// lock until now may have written files since.
	if files, resuming, err = filesToMove(from, staging); err != nil {
		return false, err
	}
	if !resuming {
		if err := ops.mkdir(staging); err != nil {
			return false, fmt.Errorf("storage: relocate: %w", err)
		}
		// staging must exist after a crash before anything moves into it:
		// it is what tells the next start to finish the move.
		if err := ops.syncDir(from); err != nil {
			return false, fmt.Errorf("storage: relocate: sync %s: %w", from, err)
		}
	}
	slices.SortStableFunc(files, func(a, b string) int { return moveOrder(a) - moveOrder(b) })
	for _, name := range files {
		if err := ops.rename(filepath.Join(from, name), filepath.Join(staging, name)); err != nil {
			return false, fmt.Errorf("storage: relocate: %w", err)
		}
	}
	if err := ops.syncDir(staging); err != nil {
		return false, fmt.Errorf("storage: relocate: sync %s: %w", staging, err)
	}
	if err := ops.syncDir(from); err != nil {
		return false, fmt.Errorf("storage: relocate: sync %s: %w", from, err)
	}
	if emptyTo {
		// Made by hand, or by a start that failed; os.Rename does not
		// replace a directory.
		if err := ops.remove(to); err != nil {
			return false, fmt.Errorf("storage: relocate: %w", err)
		}
	}
	if err := ops.rename(staging, to); err != nil {
		return false, fmt.Errorf("storage: relocate: %w", err)
	}
	if err := ops.syncDir(from); err != nil {
		return false, fmt.Errorf("storage: relocate: sync %s: %w", from, err)
	}
	// The old lock file is the store's no longer. Left behind it is
	// harmless: an older sluice refuses from either way.
	if err := ops.remove(filepath.Join(from, lockFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return true, fmt.Errorf("storage: relocate: the store is in %s; removing the old lock file: %w", to, err)
	}
	return true, nil
}

// filesToMove lists the files directly in from, the lock file aside, and
// reports whether staging, the directory a move cut short left, is there.
func filesToMove(from, staging string) (files []string, resuming bool, err error) {
	names, err := os.ReadDir(from)
	if err != nil {
		return nil, false, fmt.Errorf("storage: relocate: read %s: %w", from, err)
	}
	for _, e := range names {
		switch {
		case e.Name() == filepath.Base(staging):
			resuming = true
		case e.IsDir(), e.Name() == lockFile:
		default:
			files = append(files, e.Name())
		}
	}
	return files, resuming, nil
}

// isStoreMarker reports whether name is one of the files by which checkDir
// recognizes a store.
func isStoreMarker(name string) bool {
	return name == "CURRENT" || strings.HasPrefix(name, "MANIFEST-") || strings.HasPrefix(name, "marker.manifest.")
}

// moveOrder ranks the files of a store in the order they move: the
// MANIFEST first, then the markers naming it, then the rest. Cut short
// after the MANIFEST, from still has a marker naming a MANIFEST that is not
// there, which Pebble refuses; cut short later, from holds no store marker
// and sluice refuses it. Neither starts an empty store beside the files.
func moveOrder(name string) int {
	switch {
	case strings.HasPrefix(name, "MANIFEST-"):
		return 0
	case isStoreMarker(name):
		return 1
	}
	return 2
}

// HoldsStore reports whether dir holds a store's files directly.
func HoldsStore(dir string) (bool, error) {
	names, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("storage: read %s: %w", dir, err)
	}
	return slices.ContainsFunc(names, func(e os.DirEntry) bool { return !e.IsDir() && isStoreMarker(e.Name()) }), nil
}
