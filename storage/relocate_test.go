package storage

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const relocateKeys = 300

// oldLayout makes a volume laid out the old way: a store's files at its
// top, with some records in the tables and the rest only in the log, next
// to a backup directory and lost+found.
func oldLayout(t *testing.T) string {
	t.Helper()
	vol := t.TempDir()
	s, err := Open(vol, Options{Sync: SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	for i := range relocateKeys {
		add(t, b, fmt.Sprintf("k%d", i), uint64(i+1))
		if i == relocateKeys/2 {
			if err := b.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := s.db.Flush(); err != nil { // a table, not only the log
				t.Fatal(err)
			}
		}
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"backups", "lost+found"} {
		if err := os.Mkdir(filepath.Join(vol, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	return vol
}

// checkRecords opens the store in dir and checks every record of
// oldLayout.
func checkRecords(t *testing.T, dir string) {
	t.Helper()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	defer s.Close()
	for i := range relocateKeys {
		if got, found := read(t, s, fmt.Sprintf("k%d", i)); !found || got != uint64(i+1) {
			t.Fatalf("%s: k%d = %d (found %v), want %d", dir, i, got, found, i+1)
		}
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestRelocateMovesOldLayout(t *testing.T) {
	vol := oldLayout(t)
	to := filepath.Join(vol, "store")
	moved, err := Relocate(vol, to)
	if err != nil || !moved {
		t.Fatalf("Relocate: %v, %v; want a move", moved, err)
	}
	if got, want := dirNames(t, vol), []string{"backups", "lost+found", "store"}; !slices.Equal(got, want) {
		t.Errorf("the volume holds %v after the move, want %v", got, want)
	}
	if held, err := HoldsStore(vol); held || err != nil {
		t.Errorf("HoldsStore(volume) = %v, %v after the move", held, err)
	}
	checkRecords(t, to)
	// Done once: later starts find nothing to move.
	if moved, err := Relocate(vol, to); moved || err != nil {
		t.Errorf("second Relocate: %v, %v; want nothing to do", moved, err)
	}
	checkRecords(t, to)
	// A new volume has nothing to move either.
	fresh := t.TempDir()
	if moved, err := Relocate(fresh, filepath.Join(fresh, "store")); moved || err != nil {
		t.Errorf("Relocate on a new volume: %v, %v; want nothing to do", moved, err)
	}
}

var errCut = errors.New("cut short")

// cutOps are the real calls, the one numbered cut (from 0) and every call
// after it failing, as after a crash; n counts the calls.
func cutOps(cut int, n *int) relocateOps {
	real := osRelocateOps()
	step := func() error {
		*n++
		if cut >= 0 && *n > cut {
			return errCut
		}
		return nil
	}
	return relocateOps{
		lock: func(name string) (io.Closer, error) {
			if err := step(); err != nil {
				return nil, err
			}
			return real.lock(name)
		},
		mkdir: func(dir string) error {
			if err := step(); err != nil {
				return err
			}
			return real.mkdir(dir)
		},
		rename: func(o, n string) error {
			if err := step(); err != nil {
				return err
			}
			return real.rename(o, n)
		},
		syncDir: func(dir string) error {
			if err := step(); err != nil {
				return err
			}
			return real.syncDir(dir)
		},
		remove: func(name string) error {
			if err := step(); err != nil {
				return err
			}
			return real.remove(name)
		},
	}
}

// TestRelocateCutShort stops the move after each of its steps in turn, as
// a crash would, and checks what is left: the new directory is absent or
// whole, a sluice opening the old one as its store either finds the whole
// store or refuses (it never starts an empty one), and the next Relocate
// finishes the move with every record.
func TestRelocateCutShort(t *testing.T) {
	total := 0
	if _, err := relocate(oldLayout(t), filepath.Join(t.TempDir(), "x"), cutOps(-1, &total)); err == nil {
		t.Fatal("relocate into another directory: no error")
	}
	vol := oldLayout(t)
	if moved, err := relocate(vol, filepath.Join(vol, "store"), cutOps(-1, &total)); err != nil || !moved {
		t.Fatalf("relocate: %v, %v", moved, err)
	}
	if total < 8 {
		t.Fatalf("a whole move took %d steps; the test cuts nothing", total)
	}
	for cut := range total {
		t.Run(fmt.Sprintf("after_%d_of_%d", cut, total), func(t *testing.T) {
			vol := oldLayout(t)
			to := filepath.Join(vol, "store")
			n := 0
			moved, err := relocate(vol, to, cutOps(cut, &n))
			if !errors.Is(err, errCut) && !(cut == total-1 && moved) {
				t.Fatalf("relocate cut after %d steps: %v, %v", cut, moved, err)
			}
			_, err = os.Stat(to)
			done := err == nil
			if done {
				checkRecords(t, to)
			}
			// An older sluice, started on the volume now.
			if s, err := Open(vol, Options{}); err == nil {
				for i := range relocateKeys {
					if got, found := read(t, s, fmt.Sprintf("k%d", i)); !found || got != uint64(i+1) {
						t.Fatalf("the volume opened as a store with k%d = %d (found %v), want %d: a store missing records", i, got, found, i+1)
					}
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				t.Logf("the volume, opened as a store, is refused: %v", err)
			}
			if moved, err := Relocate(vol, to); err != nil || moved == done {
				t.Fatalf("the next Relocate: %v, %v", moved, err)
			}
			checkRecords(t, to)
			if held, _ := HoldsStore(vol); held {
				t.Errorf("the volume still holds store files: %v", dirNames(t, vol))
			}
		})
	}
}

func TestRelocateRefuses(t *testing.T) {
	t.Run("two stores", func(t *testing.T) {
		vol := oldLayout(t)
		to := filepath.Join(vol, "store")
		s, err := Open(to, Options{})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		before := dirNames(t, vol)
		if moved, err := Relocate(vol, to); moved || err == nil || !strings.Contains(err.Error(), "two stores") {
			t.Fatalf("Relocate onto a store: %v, %v; want a refusal naming two stores", moved, err)
		}
		if got := dirNames(t, vol); !slices.Equal(got, before) {
			t.Errorf("the refusal changed the volume: %v, was %v", got, before)
		}
	})
	t.Run("served", func(t *testing.T) {
		vol := oldLayout(t)
		s, err := Open(vol, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if moved, err := Relocate(vol, filepath.Join(vol, "store")); moved || !errors.Is(err, ErrLocked) {
			t.Fatalf("Relocate of a store in use: %v, %v; want ErrLocked", moved, err)
		}
		if _, err := os.Stat(filepath.Join(vol, "store.moving")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused move left store.moving: %v", err)
		}
	})
	t.Run("elsewhere", func(t *testing.T) {
		vol := oldLayout(t)
		if moved, err := Relocate(vol, filepath.Join(t.TempDir(), "store")); moved || err == nil || !strings.Contains(err.Error(), "directly inside") {
			t.Fatalf("Relocate into a directory outside the volume: %v, %v; want a refusal", moved, err)
		}
		if moved, err := Relocate(vol, vol); moved || err != nil {
			t.Fatalf("Relocate onto itself: %v, %v; want nothing to do", moved, err)
		}
		checkRecords(t, vol)
	})
	t.Run("empty target", func(t *testing.T) {
		vol := oldLayout(t)
		to := filepath.Join(vol, "store")
		if err := os.Mkdir(to, 0o750); err != nil {
			t.Fatal(err)
		}
		if moved, err := Relocate(vol, to); !moved || err != nil {
			t.Fatalf("Relocate onto an empty directory: %v, %v", moved, err)
		}
		checkRecords(t, to)
	})
}

// TestRelocateListsAfterLocking: a file a sluice wrote while it still held
// the lock, after the first look at the volume, moves with the rest.
func TestRelocateListsAfterLocking(t *testing.T) {
	vol := oldLayout(t)
	to := filepath.Join(vol, "store")
	ops := osRelocateOps()
	lock := ops.lock
	ops.lock = func(name string) (io.Closer, error) {
		if err := os.WriteFile(filepath.Join(vol, "late.log"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return lock(name)
	}
	if moved, err := relocate(vol, to, ops); !moved || err != nil {
		t.Fatalf("relocate: %v, %v", moved, err)
	}
	if _, err := os.Stat(filepath.Join(to, "late.log")); err != nil {
		t.Errorf("a file written before the lock was taken stayed behind: %v", err)
	}
	checkRecords(t, to)
}
