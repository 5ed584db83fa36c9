package storage

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mountTmpfs mounts a tmpfs of size (mount's syntax: "256k", "8m") on a
// new directory, for a disk that really fills up. It skips only when the
// machine refuses, and never under CI=true.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount a tmpfs: %v: %s", err, out)
		}
		t.Skipf("this machine refuses to mount a tmpfs: %v: %s", err, out)
	}
	// Lazily: a store that failed keeps its files open until the test
	// process exits.
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fillDisk writes a file into dir until the filesystem is full.
func fillDisk(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			t.Fatal(err)
		}
	}
}

// waitFor returns what ch delivers, and fails the test if nothing comes
// for a minute: for calls that used to hang forever.
func waitFor[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("%s: no answer after a minute (hangs)", what)
	}
	panic("unreachable")
}

// TestCheckpointIntoFullDirFailsAlone: a checkpoint into a directory whose
// disk is full answers an error naming the directory and the cause,
// leaves no partial copy, and neither makes the store refuse changes nor
// holds up Close.
func TestCheckpointIntoFullDirFailsAlone(t *testing.T) {
	backups := mountTmpfs(t, "256k")
	s, err := Open(t.TempDir(), Options{Sync: SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	for i := range 20000 { // about 1 MiB of log: more than the tmpfs holds
		add(t, b, fmt.Sprintf("key%05d", i), uint64(i+1))
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(backups, "nightly")
	done := make(chan error, 1)
	go func() { done <- s.Checkpoint(cp) }()
	err = waitFor(t, "Checkpoint into a full directory", done)
	if err == nil || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), cp) {
		t.Fatalf("Checkpoint into a full directory: %v, want an error naming %s and ENOSPC", err, cp)
	}
	if _, err := os.Stat(cp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a partial checkpoint was left behind: stat %s: %v", cp, err)
	}
	if err := s.Unavailable(); err != nil {
		t.Fatalf("the store refuses changes after a failed checkpoint: %v", err)
	}
	if st := s.Stats(); st.WriteRetries != 0 || st.Failed != nil {
		t.Fatalf("the checkpoint's writes went through the data directory's guard: %+v", st)
	}
	add(t, b, "after", 1)
	if err := b.Commit(); err != nil {
		t.Fatalf("commit after a failed checkpoint: %v", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	if err := waitFor(t, "Close after a failed checkpoint", closed); err != nil {
		t.Fatalf("Close after a failed checkpoint: %v", err)
	}
}

// TestOutOfFileDescriptorsIsRetried: when the process has no file
// descriptor left, Pebble cannot create its next file. Given the error, it
// retries a flush at once, forever (measured: 237k attempts and log lines
// in 20 s), and for a new log file it panics (rotateWAL) with its mutex
// released, which kills the process. The guard instead retries the
// creation, paced; the store refuses changes meanwhile and takes them again
// once descriptors are free, losing nothing.
func TestOutOfFileDescriptorsIsRetried(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{Sync: SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	for i := range 100 {
		add(t, b, fmt.Sprint("k", i), uint64(i+1))
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}

	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = 512
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("this machine refuses a lower descriptor limit: %v", err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	var held []*os.File
	release := func() {
		for _, f := range held {
			f.Close()
		}
		held = nil
	}
	defer release()
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				t.Fatal(err)
			}
			break
		}
		held = append(held, f)
	}

	// A flush switches to a new log file, which needs a descriptor.
	flushed := make(chan error, 1)
	go func() { flushed <- s.db.Flush() }()
	eventually(t, "the store to refuse changes", func() bool { return s.Unavailable() != nil })
	err = b.Modify([]byte("refused"), &counter{delta: 1})
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("change while out of descriptors: %v, want ErrUnavailable wrapping EMFILE", err)
	}
	release()
	if err := waitFor(t, "Flush once descriptors are free", flushed); err != nil {
		t.Fatalf("flush after descriptors were freed: %v", err)
	}
	eventually(t, "the store to take changes again", func() bool { return s.Unavailable() == nil })
	add(t, b, "after", 1)
	if err := b.Commit(); err != nil {
		t.Fatalf("commit after recovery: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 100 {
		if got, _ := read(t, s, fmt.Sprint("k", i)); got != uint64(i+1) {
			t.Fatalf("after reopen k%d = %d, want %d", i, got, i+1)
		}
	}
	if got, _ := read(t, s, "after"); got != 1 {
		t.Fatalf("after reopen: after = %d, want 1", got)
	}
}

// corruptStore writes three tables of 2000 records each (keys a…, m…, z…)
// into a new store in dir, closes it, and overwrites bytes in the middle of
// the m… table. It returns that table's name.
func corruptStore(t *testing.T, dir string) string {
	t.Helper()
	return corruptTable(t, dir, 'm', func(size int64) int64 { return size / 3 })
}

// corruptTable writes a store of four tables, the format marker (0xff…),
// a, m and z keys, and overwrites 64 bytes at off(its size) of the one
// whose smallest key starts with first; it returns that table's path.
func corruptTable(t *testing.T, dir string, first byte, off func(size int64) int64) string {
	t.Helper()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The marker in a table of its own, which overlaps no other: a table
	// from 'a' to 0xff would overlap the next two, and be compacted with them.
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "m", "z"} {
		b := s.NewBatch()
		for i := range 2000 {
			add(t, b, fmt.Sprintf("%s%05d", p, i), 1)
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	tables, err := s.db.SSTables()
	if err != nil {
		t.Fatal(err)
	}
	var victim string
	n := 0
	for _, level := range tables {
		for _, tab := range level {
			n++
			if tab.Smallest.UserKey[0] == first {
				victim = filepath.Join(dir, fmt.Sprintf("%s.sst", tab.BackingSSTNum))
			}
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if victim == "" || n != 4 {
		t.Fatalf("want 4 tables, one starting with %q; got %d: %v", first, n, tables)
	}
	f, err := os.OpenFile(victim, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(strings.Repeat("X", 64)), off(fi.Size())); err != nil {
		t.Fatal(err)
	}
	return victim
}

// TestInspectSkipsCorruptTable: Inspect reports a table it cannot read,
// lists every record of the other tables, and returns ErrCorrupt.
func TestInspectSkipsCorruptTable(t *testing.T) {
	dir := t.TempDir()
	victim := corruptStore(t, dir)
	count := map[byte]int{}
	var bad []Corruption
	err := Inspect(dir, func(key, val []byte) bool {
		count[key[0]]++
		return true
	}, func(c Corruption) { bad = append(bad, c) })
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Inspect of a corrupt store: %v, want ErrCorrupt", err)
	}
	if len(bad) != 1 || bad[0].File != victim || bad[0].Err == nil || string(bad[0].Start) != "m00000" || string(bad[0].End) != "m01999" {
		t.Fatalf("corruptions reported: %+v, want one, of %s, keys m00000 to m01999", bad, victim)
	}
	if count['a'] != 2000 || count['z'] != 2000 || count['m'] >= 2000 {
		t.Fatalf("records listed by first letter: %v; want all 2000 a and z, fewer m", count)
	}
}

// TestInspectListsPastACorruptFormatMarker: when the table that holds the
// format marker cannot be read, Inspect says so, lists every record of the
// other tables, and returns ErrCorrupt.
func TestInspectListsPastACorruptFormatMarker(t *testing.T) {
	dir := t.TempDir()
	victim := corruptTable(t, dir, 0xff, func(int64) int64 { return 0 }) // the marker's key sorts last
	count := map[byte]int{}
	var bad []Corruption
	err := Inspect(dir, func(key, val []byte) bool {
		count[key[0]]++
		return true
	}, func(c Corruption) { bad = append(bad, c) })
	t.Logf("Inspect: %v; listed by first letter: %v", err, count)
	for _, c := range bad {
		t.Logf("corrupt: %s, keys %q to %q: %v", c.File, c.Start, c.End, c.Err)
	}
	if count['a'] != 2000 || count['m'] != 2000 || count['z'] != 2000 {
		t.Fatalf("records listed by first letter: %v; want all 2000 a, m and z", count)
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Inspect with the format marker's table corrupt: %v, want ErrCorrupt", err)
	}
	if len(bad) != 1 || bad[0].File != victim || !strings.Contains(bad[0].Err.Error(), "format marker could not be checked") {
		t.Fatalf("corruptions reported: %+v; want one, of %s, naming the format marker", bad, victim)
	}
}

// TestOpenCorruptStore: a store whose table is corrupt is refused with an
// error naming the directory and the corruption, not a panic.
func TestOpenCorruptStore(t *testing.T) {
	dir := t.TempDir()
	corruptStore(t, dir)
	s, err := Open(dir, Options{})
	if err == nil {
		s.Close()
		t.Fatal("a corrupt store opened")
	}
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Open of a corrupt store: %v, want ErrCorrupt naming %s", err, dir)
	}
}

// TestOpenOnFullDiskFails: opening a store whose log must be flushed, on a
// disk that is full, fails at once with an error that says what to do,
// instead of retrying the flush forever.
func TestOpenOnFullDiskFails(t *testing.T) {
	disk := mountTmpfs(t, "64m")
	dir := filepath.Join(disk, "data")
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	for i := range 300 {
		add(t, b, fmt.Sprint("k", i), 1)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fillDisk(t, disk)
	opened := make(chan error, 1)
	go func() {
		s, err := Open(dir, Options{})
		if err == nil {
			s.Close()
		}
		opened <- err
	}()
	err = waitFor(t, "Open on a full disk", opened)
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "free space or grow the volume") {
		t.Fatalf("Open on a full disk: %v, want ENOSPC, naming %s, saying what to do", err, dir)
	}
}
