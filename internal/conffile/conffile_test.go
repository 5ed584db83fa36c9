//go:build unix

package conffile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bounded runs f and fails the test if it has not returned after a
// minute: a named pipe opened for reading blocks until a writer comes.
func bounded[T any](t *testing.T, f func() (T, error)) (T, error) {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-time.After(time.Minute):
		t.Fatal("blocked: still reading after a minute")
		panic("unreachable")
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mkfifo: %v", err)
		}
		t.Skipf("mkfifo: %v", err)
	}
}

func wantErr(t *testing.T, err, sentinel error, parts ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %v, want %v", err, sentinel)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not say %q", err, p)
		}
	}
}

func TestReadRegularAndSymlink(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.yaml")
	if err := os.WriteFile(path, []byte("domain: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A ConfigMap's file: a symlink to a symlinked directory's file.
	if err := os.Mkdir(filepath.Join(dir, "..2024"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path, filepath.Join(dir, "..2024", "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..2024", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "a.yaml"), path); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path, 0)
	if err != nil || string(got) != "domain: x\n" {
		t.Fatalf("Read through symlinks: %q, %v", got, err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(empty, 0); err != nil || len(got) != 0 {
		t.Fatalf("Read of an empty file: %q, %v", got, err)
	}
}

// TestReadRefusesWhatIsNotARegularFile: a named pipe is refused without
// blocking, a symlink to a device without reading it, each naming the
// file, what it is and what was expected.
func TestReadRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "pipe.yaml")
	mkfifo(t, fifo)
	_, err := bounded(t, func() ([]byte, error) { return Read(fifo, 0) })
	wantErr(t, err, ErrNotRegular, fifo, "a named pipe (FIFO)", "expected a regular file")

	_, err = Read(dir, 0)
	wantErr(t, err, ErrNotRegular, dir, "a directory", "expected a regular file")

	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skipf("no /dev/zero: %v", err)
	}
	zero := filepath.Join(dir, "zero.yaml")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	_, err = bounded(t, func() ([]byte, error) { return Read(zero, 0) })
	wantErr(t, err, ErrNotRegular, zero, "a symlink to /dev/zero", "a character device", "expected a regular file")
}

// TestReadLimit: a file of the limit is read, one byte more is refused
// with both sizes, and so is a file whose size Stat does not tell.
func TestReadLimit(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.ini")
	if err := os.WriteFile(path, make([]byte, 100), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(path, 100); err != nil || len(got) != 100 {
		t.Fatalf("Read of a file at the limit: %d bytes, %v", len(got), err)
	}
	_, err := Read(path, 99)
	wantErr(t, err, ErrTooBig, path, "100 bytes, 1 over the limit of 99", "--max-config-file")

	// /proc's files say size 0 and hold more.
	const status = "/proc/self/status"
	if fi, err := os.Stat(status); err != nil || fi.Size() != 0 {
		t.Skipf("no %s of size 0 (%v)", status, err)
	}
	_, err = Read(status, 16)
	wantErr(t, err, ErrTooBig, status, "more than 16 bytes")
}

func TestReadDir(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"b.yaml", "a.yaml", "c.yml"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(t.TempDir(), "config")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	ents, err := ReadDir(link)
	if err != nil || len(ents) != 3 || ents[0].Name() != "a.yaml" || ents[2].Name() != "c.yml" {
		t.Fatalf("ReadDir through a symlink: %v, %v", ents, err)
	}
	fifo := filepath.Join(dir, "pipe")
	mkfifo(t, fifo)
	_, err = bounded(t, func() ([]os.DirEntry, error) { return ReadDir(fifo) })
	wantErr(t, err, ErrNotDir, fifo, "a named pipe (FIFO)", "expected a directory")
}
