package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// These tests put the data directory on a filesystem that really fills up:
// a small tmpfs, or ext4 on a loop image kept on a full tmpfs (thin
// provisioning: writes succeed into the page cache, fsync fails). They
// skip only when the machine refuses to mount, and never under CI=true.

func refused(t *testing.T, what string, err error, out []byte) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: %v: %s", what, err, out)
	}
	t.Skipf("this machine refuses to %s: %v: %s", what, err, out)
}

// mountTmpfs mounts a tmpfs of size ("64m") on a new directory.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		refused(t, "mount a tmpfs", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fillDisk writes a file into dir until the filesystem is full, and returns
// its name.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	name := filepath.Join(dir, "fill")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return name
			}
			t.Fatal(err)
		}
	}
}

// waitExit waits for p to exit on its own, failing the test if it has not
// after a minute (it used to hang forever).
func waitExit(t *testing.T, p *proc, what string) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		p.cmd.Process.Kill()
		<-p.exited
		t.Fatalf("%s: sluice still running after a minute (hangs)\n%s", what, p.logs)
	}
}

// exitCode is the process' exit status, or -1 if it was killed by a signal.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err == nil {
		return 0
	}
	return -1
}

// runToExit runs sluice with args and returns its exit status and its
// output, failing the test if it has not exited after a minute.
func runToExit(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), execMainEnv+"=1")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("sluice %v still running after a minute (hangs); killed. Output (%d bytes), last lines:\n%s", args, len(out), tail(out, 5))
	}
	return exitCode(err), string(out)
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// reduceMany reduces n buckets through p.
func reduceMany(t *testing.T, p *proc, n int) {
	t.Helper()
	rdb := p.client(t)
	ctx := context.Background()
	pipe := rdb.Pipeline()
	for i := range n {
		pipe.Do(ctx, "RL.REDUCE", fmt.Sprintf("user:%05d", i), 100, 60, "AT", 1000)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestStartOnFullDiskExits1: a store whose log must be flushed at startup,
// on a full disk, stops startup with a message naming the directory and
// what to do, and exit status 1; it used to retry the flush forever at
// full CPU, without listening or heeding SIGTERM.
func TestStartOnFullDiskExits1(t *testing.T) {
	disk := mountTmpfs(t, "64m")
	data := filepath.Join(disk, "data")
	p := startProc(t, data)
	reduceMany(t, p, 300)
	p.stop(t, syscall.SIGTERM)
	if p.err != nil {
		t.Fatalf("first run: %v\n%s", p.err, p.logs)
	}
	fillDisk(t, disk)
	code, out := runToExit(t, "--addr", "127.0.0.1:0", "--http-addr", "", "--data", data)
	if code != 1 || !strings.Contains(out, "free space or grow the volume") || !strings.Contains(out, data) || strings.Contains(out, "panic") {
		t.Fatalf("start on a full disk: exit %d, want 1 with a message naming %s; output:\n%s", code, data, tail([]byte(out), 5))
	}
}

// TestStartOnCorruptStoreExits1: a corrupt table stops startup with a
// message naming the directory and the corruption, and exit status 1, not
// a Go panic (exit 2).
func TestStartOnCorruptStoreExits1(t *testing.T) {
	data := t.TempDir()
	p := startProc(t, data)
	reduceMany(t, p, 5000)
	if err := p.client(t).Do(context.Background(), "COMPACT").Err(); err != nil {
		t.Fatal(err)
	}
	p.stop(t, syscall.SIGTERM)
	tables, _ := filepath.Glob(filepath.Join(data, "*.sst"))
	if len(tables) == 0 {
		t.Fatalf("no table after COMPACT in %s", data)
	}
	for _, name := range tables {
		f, err := os.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := f.Stat()
		f.WriteAt(bytes.Repeat([]byte("X"), 64), fi.Size()/3)
		f.Close()
	}
	code, out := runToExit(t, "--addr", "127.0.0.1:0", "--http-addr", "", "--data", data)
	if code != 1 || !strings.Contains(out, "corrupt") || !strings.Contains(out, "sluice repair --data "+data) || strings.Contains(out, "panic") {
		t.Fatalf("start on a corrupt store: exit %d, want 1 with a message naming the corruption and sluice repair --data %s; output:\n%s", code, data, tail([]byte(out), 5))
	}
	code, out = runToExit(t, "inspect", "--data", data)
	if code != 1 || !strings.Contains(out, "corrupt table") || strings.Contains(out, "panic") {
		t.Fatalf("inspect of a corrupt store: exit %d, want 1 reporting the corrupt table; output:\n%s", code, tail([]byte(out), 5))
	}
}

// TestSigtermWhileDiskFull: SIGTERM while writes to a full disk are being
// retried ends the process within about --shutdown-timeout, with a non-zero
// status and a log line saying what may be lost; it used to wait for space.
func TestSigtermWhileDiskFull(t *testing.T) {
	disk := mountTmpfs(t, "64m")
	data := filepath.Join(disk, "data")
	p := startProc(t, data, "--shutdown-timeout", "2s", "--memtable-size", "1MiB")
	rdb := p.client(t)
	ctx := context.Background()
	fillDisk(t, disk)
	key := strings.Repeat("k", 1000)
	for i := 0; ; i++ {
		err := rdb.Do(ctx, "RL.REDUCE", fmt.Sprintf("%s%d", key, i), 100, 60, "AT", 1000).Err()
		if err != nil {
			if !strings.Contains(err.Error(), "store unavailable") {
				t.Fatalf("reduce on a full disk: %v", err)
			}
			break
		}
		if i > 1_000_000 {
			t.Fatal("a million writes to a full disk succeeded")
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExit(t, p, "SIGTERM while the disk is full")
	logs := p.logs.String()
	if code := exitCode(p.err); code != 1 || !strings.Contains(logs, "not closed cleanly") || !strings.Contains(logs, "may be lost") {
		t.Fatalf("exit %d after SIGTERM on a full disk, want 1 and a log of what may be lost:\n%s", code, tail([]byte(logs), 5))
	}
}

// mountThinExt4 mounts ext4 on a 256 MiB sparse loop image kept on a 48 MiB
// tmpfs, and returns the mount point, the tmpfs and the image.
func mountThinExt4(t *testing.T) (mnt, back, img string) {
	t.Helper()
	return mountThinExt4With(t, "loop")
}

// mountThinExt4With is mountThinExt4 with mount options (mountOpts, with
// "loop") and mkfs.ext4 options.
func mountThinExt4With(t *testing.T, mountOpts string, mkfsOpts ...string) (mnt, back, img string) {
	t.Helper()
	back = mountTmpfs(t, "48m")
	img = filepath.Join(back, "img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 256<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", append(append([]string{"-q", "-F"}, mkfsOpts...), img)...).CombinedOutput(); err != nil {
		refused(t, "make an ext4 image", err, out)
	}
	mnt = t.TempDir()
	if out, err := exec.Command("mount", "-o", mountOpts, img, mnt).CombinedOutput(); err != nil {
		refused(t, "mount a loop image", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })
	return mnt, back, img
}

// remountAfterFsck gives the thin volume its space back (removes fill),
// unmounts it, checks it with e2fsck -fy as an operator would, and mounts
// it again with mountOpts.
func remountAfterFsck(t *testing.T, mnt, fill, img, mountOpts string) {
	t.Helper()
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v: %s", err, out)
	}
	if out, err := exec.Command("e2fsck", "-fy", img).CombinedOutput(); err != nil && exitCode(err) > 2 {
		t.Fatalf("e2fsck: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", mountOpts, img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount again: %v: %s", err, out)
	}
}

// TestFsyncFailureOnThinVolume: with --fsync always on ext4 whose backing
// store fills up, fsync fails. No write whose fsync failed is acknowledged:
// the store fails, the server exits with status 1 on its own, and after
// space returns and fsck, every acknowledged write is there. (It used to
// retry the fsync, which "succeeded", acknowledge lost writes, and leave
// zero-filled tables; or panic.)
func TestFsyncFailureOnThinVolume(t *testing.T) {
	mnt, back, img := mountThinExt4(t)
	data := filepath.Join(mnt, "data")
	p := startProc(t, data, "--fsync", "always", "--shutdown-timeout", "2s")
	var (
		mu   sync.Mutex
		last = map[string]int64{}
		wg   sync.WaitGroup
	)
	filled := make(chan struct{})
	for w := range 4 {
		rdb := p.client(t)
		wg.Go(func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("c%d-k%d", w, i%50)
				v, err := rdb.Do(context.Background(), "RL.REDUCE", key, 1_000_000_000, 3600, "AT", 1000).Int64()
				if err != nil {
					return // refused, or the server exited
				}
				mu.Lock()
				last[key] = v
				mu.Unlock()
				if w == 0 && i == 500 {
					close(filled)
				}
			}
		})
	}
	<-filled
	fill := fillDisk(t, back)
	waitExit(t, p, "writes after fsync failed")
	wg.Wait()
	if code := exitCode(p.err); code != 1 || !strings.Contains(p.logs.String(), "store failed") {
		t.Fatalf("exit %d after fsync failed, want 1 after logging the failed store:\n%s", code, tail(p.logs.Bytes(), 8))
	}

	// Space returns; the volume is checked and mounted again.
	remountAfterFsck(t, mnt, fill, img, "loop")
	p2 := startProc(t, data)
	rdb := p2.client(t)
	for key, r := range last {
		got, err := rdb.Do(context.Background(), "RL.GET", key, 1_000_000_000, 3600, "AT", 1000).Int64()
		if err != nil {
			t.Fatal(err)
		}
		// r-1 is left after the acknowledged reduce; one more reduce may
		// have been in flight.
		if got > r-1 || got < r-2 {
			t.Fatalf("%s: %d tokens after the restart, the last acknowledged reply %d implies %d", key, got, r, r-1)
		}
	}
	if len(last) == 0 {
		t.Fatal("nothing was acknowledged")
	}
}

// TestCheckpointIntoFullBackupDir: CHECKPOINT into a --backup-dir whose
// disk is full answers an error naming the directory and the cause, leaves
// no copy, and leaves writes, READY and shutdown as they were. It used to
// never answer, refuse every write, and block SIGTERM.
func TestCheckpointIntoFullBackupDir(t *testing.T) {
	backups := mountTmpfs(t, "256k")
	p := startProc(t, t.TempDir(), "--backup-dir", backups, "--fsync", "always")
	reduceMany(t, p, 20000) // about 1 MiB of log: more than the tmpfs holds
	rdb := p.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := rdb.Do(ctx, "CHECKPOINT", "nightly").Err()
	if ctx.Err() != nil {
		t.Fatal("CHECKPOINT into a full backup directory: no answer after a minute (hangs)")
	}
	cp := filepath.Join(backups, "nightly")
	if err == nil || !strings.Contains(err.Error(), cp) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("CHECKPOINT into a full backup directory: %v, want an error naming %s and the full disk", err, cp)
	}
	if _, err := os.Stat(cp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a partial checkpoint was left behind: %v", err)
	}
	if n, err := rdb.Do(ctx, "READY").Int64(); err != nil || n != 1 {
		t.Fatalf("READY after a failed checkpoint: %d, %v; want 1", n, err)
	}
	if err := rdb.Do(ctx, "RL.REDUCE", "after", 10, 60, "AT", 1000).Err(); err != nil {
		t.Fatalf("a write after a failed checkpoint: %v", err)
	}
	p.stop(t, syscall.SIGTERM)
	if p.err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", p.err, tail(p.logs.Bytes(), 5))
	}
}
