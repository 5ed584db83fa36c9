package main

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/storage"
)

// nobody is the user the read-only tests run sluice inspect as when they
// run as root, which file modes do not stop.
const nobody = 65534

// readOnlyBinary is a copy of this test binary that nobody may run: the
// go test build directory is root's alone.
func readOnlyBinary(t *testing.T) string {
	t.Helper()
	dir := worldReadableDir(t)
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	bin := filepath.Join(dir, "sluice.test")
	dst, err := os.OpenFile(bin, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return bin
}

// worldReadableDir is a new directory that every user can reach.
func worldReadableDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// inspectProc runs sluice inspect --data dir as a process of its own, as
// uid unless uid is -1, and returns its output and error.
func inspectProc(t *testing.T, bin string, uid int, dir string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, "inspect", "--data", dir, "--at", "1000")
	cmd.Env = append(os.Environ(), execMainEnv+"=1")
	if uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// makeReadOnly takes every write permission off dir's tree and gives
// everyone read access, as a copied or restored backup may have it; the
// cleanup gives the owner write access back.
func makeReadOnly(t *testing.T, dir string) {
	t.Helper()
	chmodTree(t, dir, 0o444, 0o555)
	t.Cleanup(func() { chmodTree(t, dir, 0o644, 0o755) })
}

// chmodTree sets the mode of every file and directory of a tree.
func chmodTree(t *testing.T, dir string, fileMode, dirMode fs.FileMode) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.Chmod(path, dirMode)
		}
		return os.Chmod(path, fileMode)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// readOnlyMount mounts dir again, read-only, on a new directory; root's
// writes fail there too.
func readOnlyMount(t *testing.T, dir string) string {
	t.Helper()
	mnt := worldReadableDir(t)
	if out, err := exec.Command("mount", "--bind", dir, mnt).CombinedOutput(); err != nil {
		refused(t, "bind mount", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	if out, err := exec.Command("mount", "-o", "remount,ro,bind", mnt).CombinedOutput(); err != nil {
		refused(t, "remount read-only", err, out)
	}
	return mnt
}

// snapshot is every file of a tree with its size and modification time.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v %d %s\n", path, info.Mode(), info.Size(), info.ModTime().Format(time.RFC3339Nano))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestInspectReadOnlyCopy: sluice inspect lists a store and a CHECKPOINT
// copy that it may not write to, without writing anything: one without
// write permissions, read by a user other than its owner, and one on a
// read-only mount. A store a server holds is still refused through a
// read-only view of it.
func TestInspectReadOnlyCopy(t *testing.T) {
	uid := -1 // not root: the file modes stop this user already
	if os.Geteuid() == 0 {
		uid = nobody
	}
	bin := readOnlyBinary(t)

	parent := worldReadableDir(t)
	dir := filepath.Join(parent, "store")
	fillStore(t, dir, [][]any{
		{"RL.REDUCE", "user:1", 10, 60, "AT", 1000},
		{"RL.REDUCE", "user:2", 10, 60, "TAKE", 3, "AT", 1000},
	})
	store, err := storage.Open(dir, server.StoreOptions(storage.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	checkpoint := filepath.Join(parent, "checkpoint")
	if err := store.Checkpoint(checkpoint); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}

	lists := func(t *testing.T, uid int, dir string) {
		t.Helper()
		before := snapshot(t, dir)
		out, err := inspectProc(t, bin, uid, dir)
		if err != nil || !strings.Contains(out, "2 records listed") || !strings.Contains(out, `"user:2"`) {
			t.Fatalf("sluice inspect --data %s (uid %d): %v\n%s", dir, uid, err, out)
		}
		if after := snapshot(t, dir); after != before {
			t.Errorf("sluice inspect changed %s:\nbefore:\n%s\nafter:\n%s", dir, before, after)
		}
	}
	for name, d := range map[string]string{"store": dir, "checkpoint": checkpoint} {
		t.Run(name+"/no write permission", func(t *testing.T) {
			makeReadOnly(t, d)
			lists(t, uid, d)
		})
		t.Run(name+"/read-only mount", func(t *testing.T) {
			lists(t, -1, readOnlyMount(t, d))
		})
	}

	// A server serving the store: refused through read-only views too.
	store, err = storage.Open(dir, server.StoreOptions(storage.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	refusedInUse := func(t *testing.T, uid int, d string) {
		t.Helper()
		out, err := inspectProc(t, bin, uid, d)
		if err == nil || !strings.Contains(out, "data directory in use by another process") || !strings.Contains(out, "is a sluice serving it?") {
			t.Errorf("sluice inspect of a served store through %s (uid %d): %v, want a refusal as in use\n%s", d, uid, err, out)
		}
	}
	t.Run("served/read-only mount", func(t *testing.T) {
		refusedInUse(t, -1, readOnlyMount(t, dir))
	})
	t.Run("served/no write permission", func(t *testing.T) {
		if uid < 0 {
			t.Skip("the server's files are this user's own: nothing to take away")
		}
		// Another user, who may read the store but not write to it.
		makeReadOnly(t, dir)
		refusedInUse(t, uid, dir)
	})
}
