package storage

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// legacyKey is the format 1 key of record i: a 'b' or 'd' record, as
// format 1 had.
func legacyKey(i int) []byte {
	kind := byte('b')
	if i%3 == 0 {
		kind = 'd'
	}
	return fmt.Appendf(nil, "%cclient:%07d", kind, i)
}

// legacyVal is record i's value; every 997th is large (and a few bigger
// than an upgrade batch's byte bound in the tests that set one).
func legacyVal(i int) []byte {
	n := 10 + i%50
	if i%997 == 0 {
		n = 300<<10 + i
	}
	v := make([]byte, n)
	for j := range v {
		v[j] = byte(i + j)
	}
	return v
}

// writeFormat1 writes a format 1 store of n records into dir, as an older
// sluice left it: the legacy marker and keys starting with a letter.
func writeFormat1(t *testing.T, fs vfs.FS, dir string, n int) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{FS: fs, Logger: pebbleLogger{l: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	b := db.NewBatch()
	b.Set(legacyFormatKey, []byte(legacyFormatVersion), nil)
	for i := range n {
		b.Set(legacyKey(i), legacyVal(i), nil)
		if b.Len() > 8<<20 {
			if err := b.Commit(pebble.NoSync); err != nil {
				t.Fatal(err)
			}
			b = db.NewBatch()
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	// Some records in tables, some only in the log.
	if n > 10 {
		if err := db.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := db.Set(legacyKey(n/2), legacyVal(n/2), pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// fakeUpgrade puts two bytes of "slot" and a kind byte in front of a
// format 1 key, and reports a key that starts below 0x40 as upgraded.
func fakeUpgrade(dst, key []byte) ([]byte, bool, error) {
	if len(key) > 0 && key[0] < 0x40 {
		return nil, false, nil
	}
	if len(key) < 2 {
		return nil, false, fmt.Errorf("too short")
	}
	dst = append(dst, key[len(key)-1]&0x3f, key[len(key)-2], key[0])
	return append(dst, key[1:]...), true, nil
}

// upgradedKey is what fakeUpgrade makes of legacyKey(i).
func upgradedKey(i int) []byte {
	k, _, _ := fakeUpgrade(nil, legacyKey(i))
	return k
}

// kindClass counts upgraded records by their kind byte: 'b' in 1, 'd' in 2.
func kindClass(key []byte) int {
	if len(key) < 3 {
		return 0
	}
	switch key[2] {
	case 'b':
		return 1
	case 'd':
		return 2
	}
	return 0
}

// checkUpgraded fails unless the store holds exactly the n records of
// writeFormat1 under their upgraded keys, and the format 2 marker.
func checkUpgraded(t *testing.T, s *Store, n int) {
	t.Helper()
	want := map[string]int{}
	for i := range n {
		want[string(upgradedKey(i))] = i
	}
	seen := 0
	err := s.Scan(nil, nil, func(key, val []byte) bool {
		i, ok := want[string(key)]
		if !ok {
			t.Errorf("unexpected key %q after the upgrade", key)
			return false
		}
		delete(want, string(key))
		if !bytes.Equal(val, legacyVal(i)) {
			t.Errorf("record %d (%q): value of %d bytes, want %d bytes", i, key, len(val), len(legacyVal(i)))
			return false
		}
		seen++
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 0 || seen != n {
		t.Fatalf("%d records found, %d missing, want %d", seen, len(want), n)
	}
	if got := s.Records(); got != int64(n) {
		t.Fatalf("Records() = %d, want %d", got, n)
	}
	if v, err := getString(s.db, formatKey); err != nil || v != formatVersion {
		t.Fatalf("format marker %q, %v; want %q", v, err, formatVersion)
	}
	if v, err := getString(s.db, legacyFormatKey); err != nil || v != "" {
		t.Fatalf("legacy format marker %q, %v; want none", v, err)
	}
}

// logBuffer collects a store's log lines.
type logBuffer struct{ bytes.Buffer }

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(&b.Buffer, nil)) }

// TestUpgradeMovesEveryRecord: a format 1 store opens as format 2 with
// every record under its new key, with its value, counted, and the new
// marker in place of the old one.
func TestUpgradeMovesEveryRecord(t *testing.T) {
	const n = 5000
	fs := vfs.NewMem()
	writeFormat1(t, fs, "db", n)
	var log logBuffer
	o := Options{fs: fs, Upgrade: fakeUpgrade, Class: kindClass, Logger: log.logger(), upgradeChunk: 700, upgradeChunkBytes: 256 << 10}
	s, err := Open("db", o)
	if err != nil {
		t.Fatal(err)
	}
	checkUpgraded(t, s, n)
	byClass := s.RecordsByClass()
	if want := [MaxClasses]int64{1: n - (n+2)/3, 2: (n + 2) / 3}; byClass != want {
		t.Fatalf("RecordsByClass = %v, want %v", byClass, want)
	}
	// The records read back through the store's own path.
	for _, i := range []int{0, 1, 997, n - 1} {
		var got []byte
		s.NewBatch().Modify(upgradedKey(i), mutatorFunc(func(old []byte, found bool) ([]byte, Op, error) {
			got = append([]byte(nil), old...)
			return nil, Keep, nil
		}))
		if !bytes.Equal(got, legacyVal(i)) {
			t.Fatalf("record %d read back: %d bytes, want %d", i, len(got), len(legacyVal(i)))
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	line := ""
	for l := range strings.Lines(log.String()) {
		if strings.Contains(l, "store upgraded") {
			line = l
		}
	}
	if !strings.Contains(line, "from_format=1") || !strings.Contains(line, "to_format=2") || !strings.Contains(line, "records_moved="+strconv.Itoa(n)) || !strings.Contains(line, "took=") {
		t.Fatalf("log: no store upgraded line with the formats, %d records moved and the time taken:\n%s", n, log.String())
	}
	// Now format 2: it opens without Upgrade.
	s, err = Open("db", Options{fs: fs, Class: kindClass})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkUpgraded(t, s, n)
	if got := s.RecordsByClass(); got != byClass {
		t.Fatalf("RecordsByClass after reopening = %v, want %v", got, byClass)
	}
}

// TestUpgradeErrorThenResume: an Upgrade error refuses the open, names the
// key and leaves the store as it was but for the batches already applied;
// the next open with a working Upgrade finishes, losing and duplicating
// nothing.
func TestUpgradeErrorThenResume(t *testing.T) {
	const n = 3000
	fs := vfs.NewMem()
	writeFormat1(t, fs, "db", n)
	boom := errors.New("boom")
	calls := 0
	var failedKey string
	failing := func(dst, key []byte) ([]byte, bool, error) {
		if calls++; calls > 1050 {
			failedKey = string(key)
			return nil, false, boom
		}
		return fakeUpgrade(dst, key)
	}
	_, err := Open("db", Options{fs: fs, Upgrade: failing, upgradeChunk: 100})
	if !errors.Is(err, boom) || failedKey == "" || !strings.Contains(err.Error(), strconv.Quote(failedKey)) ||
		!strings.Contains(err.Error(), "left as it was, except for the 1000 records already moved") {
		t.Fatalf("Open with a failing Upgrade: %v; want boom, naming key %q and the 1000 records moved", err, failedKey)
	}
	// What the failed open left: ten batches moved, the rest untouched.
	db, err := pebble.Open("db", &pebble.Options{FS: fs, Logger: pebbleLogger{l: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	old, moved := 0, 0
	for i := range n {
		if v, _ := getString(db, legacyKey(i)); v != "" {
			old++
		}
		if v, _ := getString(db, upgradedKey(i)); v != "" {
			moved++
		}
	}
	legacy, _ := getString(db, legacyFormatKey)
	current, _ := getString(db, formatKey)
	db.Close()
	if old != n-1000 || moved != 1000 || legacy != upgradingVersion || current != "" {
		t.Fatalf("after the failed upgrade: %d old keys, %d moved, markers %q and %q; want %d, 1000, the format 1 marker only, saying the upgrade began", old, moved, legacy, current, n-1000)
	}

	s, err := Open("db", Options{fs: fs, Upgrade: fakeUpgrade, upgradeChunk: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkUpgraded(t, s, n)
}

// TestFormat1RefusedWithoutUpgrade: without Upgrade, Open refuses a format
// 1 store, and so does Inspect, saying how to upgrade it; neither changes it.
func TestFormat1RefusedWithoutUpgrade(t *testing.T) {
	dir := t.TempDir()
	writeFormat1(t, vfs.Default, dir, 100)
	_, err := Open(dir, Options{})
	if !errors.Is(err, ErrNotStore) || !strings.Contains(err.Error(), "format 1") || !strings.Contains(err.Error(), "upgrades the store in place") {
		t.Fatalf("Open of a format 1 store without Upgrade: %v; want ErrNotStore saying format 1 and how to upgrade", err)
	}
	listed := 0
	err = Inspect(dir, func(key, val []byte) bool { listed++; return true }, nil)
	if !errors.Is(err, ErrNotStore) || !strings.Contains(err.Error(), "format 1") || !strings.Contains(err.Error(), "upgrades the store in place") || listed != 0 {
		t.Fatalf("Inspect of a format 1 store: %v, %d records listed; want ErrNotStore saying format 1 and how to upgrade, none listed", err, listed)
	}
	s, err := Open(dir, Options{Upgrade: fakeUpgrade})
	if err != nil {
		t.Fatal(err)
	}
	checkUpgraded(t, s, 100)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	listed = 0
	if err := Inspect(dir, func(key, val []byte) bool { listed++; return true }, nil); err != nil || listed != 100 {
		t.Fatalf("Inspect after the upgrade: %v, %d records; want 100", err, listed)
	}
}

// TestUnknownFormatRefused: a marker of a version this build does not know
// is refused, in either place.
func TestUnknownFormatRefused(t *testing.T) {
	for _, c := range []struct{ key, val string }{
		{string(formatKey), "3"},
		{string(legacyFormatKey), "0"},
	} {
		fs := vfs.NewMem()
		db, err := pebble.Open("db", &pebble.Options{FS: fs, Logger: pebbleLogger{l: slog.New(slog.DiscardHandler)}})
		if err != nil {
			t.Fatal(err)
		}
		db.Set([]byte(c.key), []byte(c.val), pebble.Sync)
		db.Close()
		_, err = Open("db", Options{fs: fs, Upgrade: fakeUpgrade})
		if !errors.Is(err, ErrNotStore) || !strings.Contains(err.Error(), strconv.Quote(c.val)) {
			t.Errorf("Open with %q = %q: %v; want ErrNotStore naming the version", c.key, c.val, err)
		}
	}
}

// TestNewStoreIsFormat2: a new store gets the format 2 marker, among the
// store's own keys, and Modify refuses keys there.
func TestNewStoreIsFormat2(t *testing.T) {
	fs := vfs.NewMem()
	s := openMem(t, fs, SyncAlways)
	defer s.Close()
	if v, err := getString(s.db, formatKey); err != nil || v != "2" {
		t.Fatalf("marker of a new store: %q, %v; want \"2\"", v, err)
	}
	if v, _ := getString(s.db, legacyFormatKey); v != "" {
		t.Fatalf("a new store has the format 1 marker, %q", v)
	}
	if s.Records() != 0 {
		t.Fatalf("a new store has %d records", s.Records())
	}
	b := s.NewBatch()
	for _, key := range []string{"\xffsluice.format", "\xff"} {
		err := b.Modify([]byte(key), &counter{delta: 1})
		if !errors.Is(err, ErrReservedKey) || !strings.Contains(err.Error(), strconv.Quote(key)) {
			t.Fatalf("Modify(%q): %v; want ErrReservedKey naming the key", key, err)
		}
	}
	// Slot 0 keys start with 0, where format 1's marker sorted.
	add(t, b, "\x00\x00bkey", 1)
	add(t, b, "\x00sluice.format", 1)
	add(t, b, "\xfe\xff", 1)
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if s.Records() != 3 || b.Len() != 0 {
		t.Fatalf("Records() = %d, want 3", s.Records())
	}
	s.Close()
	s = openMem(t, fs, SyncAlways)
	defer s.Close()
	if s.Records() != 3 {
		t.Fatalf("Records() after reopening = %d, want 3", s.Records())
	}
	if v, _ := read(t, s, "\x00sluice.format"); v != 1 {
		t.Fatalf("a record keyed like format 1's marker reads %d, want 1", v)
	}
}

// TestRecordsByClass: records are counted by class on every create and
// delete and by the scan at Open; a class out of range counts as 0.
func TestRecordsByClass(t *testing.T) {
	fs := vfs.NewMem()
	class := func(key []byte) int {
		switch key[0] {
		case 'a':
			return 1
		case 'z':
			return MaxClasses - 1
		case 'x':
			return MaxClasses // out of range
		case 'n':
			return -1
		}
		return 0
	}
	open := func() *Store {
		s, err := Open("db", Options{fs: fs, Class: class})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	b := s.NewBatch()
	for i := range 10 {
		add(t, b, fmt.Sprint("a", i), 1)
		add(t, b, fmt.Sprint("z", i), 1)
	}
	add(t, b, "a0", 1) // an update creates nothing
	add(t, b, "x", 1)
	add(t, b, "n", 1)
	add(t, b, "m", 1)
	b.Modify([]byte("a1"), &counter{del: true})
	b.Modify([]byte("a2"), &counter{del: true})
	b.Modify([]byte("z9"), &counter{del: true})
	b.Modify([]byte("znever"), &counter{del: true}) // nothing to delete
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	want := [MaxClasses]int64{0: 3, 1: 8, MaxClasses - 1: 9}
	if got := s.RecordsByClass(); got != want {
		t.Fatalf("RecordsByClass = %v, want %v", got, want)
	}
	if st := s.Stats(); st.RecordsByClass != want || st.Records != 20 || s.Records() != 20 {
		t.Fatalf("Stats: %v, %d records; Records() %d; want %v, 20", st.RecordsByClass, st.Records, s.Records(), want)
	}
	s.Close()
	s = open()
	if got := s.RecordsByClass(); got != want {
		t.Fatalf("RecordsByClass after reopening = %v, want %v", got, want)
	}
	s.Close()
	// Without Class, everything is class 0.
	s = openMem(t, fs, SyncEverySec)
	defer s.Close()
	if got := s.RecordsByClass(); got != [MaxClasses]int64{0: 20} {
		t.Fatalf("RecordsByClass without Class = %v, want 20 in class 0", got)
	}
}

// TestScan: Scan lists what Pebble holds in [lower, upper), in key order,
// stops when told, sees committed changes after Flush, never lists the
// store's own keys, and refuses once the store is closed.
func TestScan(t *testing.T) {
	fs := vfs.NewMem()
	s := openMem(t, fs, SyncNo)
	b := s.NewBatch()
	for i := range 100 {
		add(t, b, fmt.Sprintf("k%03d", i), uint64(i+1))
	}
	add(t, b, "\x00\x00slot0", 1)
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	list := func(lower, upper string, max int) []string {
		t.Helper()
		var keys []string
		var lo, up []byte
		if lower != "" {
			lo = []byte(lower)
		}
		if upper != "" {
			up = []byte(upper)
		}
		if err := s.Scan(lo, up, func(key, val []byte) bool {
			keys = append(keys, string(key))
			return len(keys) < max
		}); err != nil {
			t.Fatal(err)
		}
		return keys
	}
	if got := list("k010", "k013", 100); strings.Join(got, ",") != "k010,k011,k012" {
		t.Fatalf("Scan [k010, k013): %q", got)
	}
	if got := list("k050", "", 2); strings.Join(got, ",") != "k050,k051" {
		t.Fatalf("Scan from k050, stopping after 2: %q", got)
	}
	all := list("", "", 1000)
	if len(all) != 101 || all[0] != "\x00\x00slot0" || all[100] != "k099" {
		t.Fatalf("Scan of everything: %d keys, %q first, %q last; want 101, slot 0 first, k099 last", len(all), all[0], all[len(all)-1])
	}
	if got := list("", "\xff\xff", 1000); len(got) != 101 {
		t.Fatalf("Scan up to \\xff\\xff: %d keys, want 101 (never the marker)", len(got))
	}
	if got := list("\xff", "", 1000); len(got) != 0 {
		t.Fatalf("Scan of the store's own keys: %q, want nothing", got)
	}
	var val []byte
	if err := s.Scan([]byte("k007"), []byte("k008"), func(key, v []byte) bool { val = append(val, v...); return true }); err != nil || len(val) != 8 || val[7] != 8 {
		t.Fatalf("Scan of k007: value %x, %v; want 8", val, err)
	}

	b.Modify([]byte("k010"), &counter{del: true})
	add(t, b, "k010a", 1)
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := list("k010", "k012", 100); strings.Join(got, ",") != "k010a,k011" {
		t.Fatalf("Scan [k010, k012) after a delete, a create and Flush: %q", got)
	}
	s.Close()
	if err := s.Scan(nil, nil, func(key, val []byte) bool { return true }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Scan after Close: %v, want ErrClosed", err)
	}
}

// killEnv names the store the child of TestUpgradeSurvivesSIGKILL upgrades.
const killEnv = "SLUICE_STORAGE_UPGRADE_CHILD"

// TestUpgradeSurvivesSIGKILL: a process killed in the middle of an upgrade
// leaves a store that the next open finishes upgrading, with every record
// once, under its new key. The child upgrades in batches of 1000 records;
// after the third it makes what it wrote durable and tells the parent,
// which kills it while it goes on; it never gets to the last batches.
func TestUpgradeSurvivesSIGKILL(t *testing.T) {
	const n, chunk = 20_000, 1000
	if dir := os.Getenv(killEnv); dir != "" {
		_, err := Open(dir, Options{Upgrade: fakeUpgrade, upgradeChunk: chunk, afterUpgradeChunk: func(db *pebble.DB, moved int64) {
			switch {
			case moved == 3*chunk:
				if err := db.LogData(nil, pebble.Sync); err != nil {
					fmt.Println("sync:", err)
					os.Exit(2)
				}
				fmt.Println("ready")
			case moved >= n-5*chunk:
				for {
					time.Sleep(time.Hour) // parked until killed
				}
			}
		}})
		fmt.Println("open returned:", err)
		os.Exit(2)
	}
	dir := filepath.Join(t.TempDir(), "db")
	writeFormat1(t, vfs.Default, dir, n)
	cmd := exec.Command(os.Args[0], "-test.run=^TestUpgradeSurvivesSIGKILL$")
	cmd.Env = append(os.Environ(), killEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child: %q, %v; stderr: %s", line, err, stderr.String())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	db, err := pebble.Open(dir, &pebble.Options{Logger: pebbleLogger{l: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	old, moved := 0, 0
	for i := range n {
		o, _ := getString(db, legacyKey(i))
		m, _ := getString(db, upgradedKey(i))
		if (o == "") == (m == "") {
			t.Errorf("record %d after the kill: under its old key: %v, its new key: %v; want exactly one", i, o != "", m != "")
		}
		if o != "" {
			old++
		} else if m != "" {
			moved++
		}
	}
	legacy, _ := getString(db, legacyFormatKey)
	db.Close()
	t.Logf("killed after moving %d of %d records (%d batches of %d)", moved, n, moved/chunk, chunk)
	if moved < 3*chunk || old < 5*chunk || moved%chunk != 0 || legacy != upgradingVersion {
		t.Fatalf("after the kill: %d moved, %d not, format 1 marker %q; want at least %d moved, whole batches, %d not, the marker saying the upgrade began", moved, old, legacy, 3*chunk, 5*chunk)
	}
	s, err := Open(dir, Options{Upgrade: fakeUpgrade})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkUpgraded(t, s, n)
}

// BenchmarkCreateDeleteClassed creates and deletes records, each of which
// is counted in its class (Options.Class).
func BenchmarkCreateDeleteClassed(b *testing.B) {
	s, err := Open(b.TempDir(), Options{Sync: SyncEverySec, Class: func(key []byte) int { return int(key[len(key)-1] & 7) }})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	keys := make([][]byte, 1<<14)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "bench-key-%08d", i)
	}
	bt := s.NewBatch()
	create, del := &counter{delta: 1}, &counter{del: true}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m := create
		if i/len(keys)%2 == 1 {
			m = del
		}
		if err := bt.Modify(keys[i%len(keys)], m); err != nil {
			b.Fatal(err)
		}
		if i%16 == 15 {
			if err := bt.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	}
}
