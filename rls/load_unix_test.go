//go:build unix

package rls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/conffile"
)

// TestLoadReadsOnlyRegularFilesWithinTheLimit: a named pipe or a symlink
// to a device named *.yaml is refused without being read (a named pipe
// used to block Load in open(2) until a writer came), and the files
// together may hold at most the limit.
func TestLoadReadsOnlyRegularFilesWithinTheLimit(t *testing.T) {
	const conf = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	dir := writeDir(t, map[string]string{"a.yaml": conf})
	if _, err := Load(dir, 0); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "b.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mkfifo: %v", err)
		}
		t.Skipf("mkfifo: %v", err)
	}
	loaded := make(chan error, 1)
	go func() {
		_, err := Load(dir, 0)
		loaded <- err
	}()
	select {
	case err := <-loaded:
		if !errors.Is(err, conffile.ErrNotRegular) || !strings.Contains(err.Error(), fifo+" is a named pipe (FIFO); expected a regular file") {
			t.Fatalf("Load with a named pipe: %v", err)
		}
	case <-time.After(time.Minute):
		// Unblock the goroutine, so that the test ends.
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		t.Fatal("Load blocked on a named pipe")
	}
	if err := os.Remove(fifo); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", fifo); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir, 0); !errors.Is(err, conffile.ErrNotRegular) || !strings.Contains(err.Error(), "a symlink to /dev/zero, is a character device") {
		t.Fatalf("Load with a symlink to /dev/zero: %v", err)
	}
	if err := os.Remove(fifo); err != nil {
		t.Fatal(err)
	}
	conf2 := strings.Replace(conf, "domain: d", "domain: e", 1)
	if err := os.WriteFile(fifo, []byte(conf2), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir, int64(len(conf)+len(conf2))); err != nil {
		t.Fatalf("Load at the limit: %v", err)
	}
	_, err := Load(dir, int64(len(conf)+len(conf2)-1))
	var ce *ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), fmt.Sprintf("hold %d bytes up to b.yaml, 1 over the limit of %d for them together", len(conf)+len(conf2), len(conf)+len(conf2)-1)) {
		t.Fatalf("Load over the limit together: %v", err)
	}
	if _, err := Load(fifo, 0); !errors.Is(err, conffile.ErrNotDir) {
		t.Fatalf("Load of a file: %v, want %v", err, conffile.ErrNotDir)
	}
}
