package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// repairTables names the tables of the store layeredStore writes.
type repairTables struct {
	old, mid, top string // paths
}

// layeredStore writes a store in dir of three tables, closed:
//   - old, in the last level: k0000…k0999 at 1, and the format marker;
//   - mid, above it: every fifth key of k0000…k0500 at 2;
//   - top, above that: k0050 at 3.
//
// It writes through Pebble itself, with automatic compactions off, which
// would otherwise merge the tables.
func layeredStore(t *testing.T, dir string) repairTables {
	t.Helper()
	db := openRawPebble(t, dir)
	write := func(keys []string, n uint64) {
		t.Helper()
		b := db.NewBatch()
		for _, k := range keys {
			b.Set([]byte(k), binary.BigEndian.AppendUint64(nil, n), nil)
		}
		if err := b.Commit(pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if err := db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	keys := []string{string(formatKey)}
	for i := range 1000 {
		keys = append(keys, fmt.Sprintf("k%04d", i))
	}
	write(keys, 1)
	if err := db.Set(formatKey, []byte(formatVersion), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Compact(context.Background(), []byte("k"), []byte{0xff, 0xff}, false); err != nil {
		t.Fatal(err)
	}
	keys = keys[:0]
	for i := 0; i <= 500; i += 5 {
		keys = append(keys, fmt.Sprintf("k%04d", i))
	}
	write(keys, 2)
	write([]string{"k0050"}, 3)
	levels, err := db.SSTables()
	if err != nil {
		t.Fatal(err)
	}
	var tt repairTables
	n := 0
	for _, level := range levels {
		for _, tab := range level {
			n++
			path := filepath.Join(dir, fmt.Sprintf("%s.sst", tab.BackingSSTNum))
			switch string(tab.Smallest.UserKey) {
			case "k0050":
				tt.top = path
			case "k0000":
				if tab.Largest.UserKey[0] == 0xff {
					tt.old = path
				} else {
					tt.mid = path
				}
			}
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if n != 3 || tt.old == "" || tt.mid == "" || tt.top == "" {
		t.Fatalf("want three tables, got %d: %v", n, levels)
	}
	return tt
}

// damage damages the table file path as the field did.
func damage(t *testing.T, path, how string) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	switch how {
	case "zeroed":
		err = os.WriteFile(path, make([]byte, fi.Size()), 0o644)
	case "truncated":
		err = os.Truncate(path, fi.Size()/2)
	case "garbled":
		var f *os.File
		if f, err = os.OpenFile(path, os.O_RDWR, 0); err == nil {
			_, err = f.WriteAt(bytes.Repeat([]byte("X"), 64), fi.Size()/3)
			f.Close()
		}
	case "missing":
		err = os.Remove(path)
	default:
		t.Fatalf("unknown damage %q", how)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// dirState is the names and contents of the files directly in dir.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range entries {
		if e.IsDir() {
			m[e.Name()] = "dir"
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = string(b)
	}
	return m
}

// expectValues opens dir and checks the counter of every key k0000…k0999
// against want (absent: 0).
func expectValues(t *testing.T, dir string, want func(i int) uint64) {
	t.Helper()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("open after repair: %v", err)
	}
	defer s.Close()
	for i := range 1000 {
		k := fmt.Sprintf("k%04d", i)
		got, found := read(t, s, k)
		if got != want(i) || found != (want(i) != 0) {
			t.Fatalf("%s after repair: %d (found %v), want %d", k, got, found, want(i))
		}
	}
}

// TestRepairDropsAnUnreadableTable: with the middle of three overlapping
// tables zero-filled, truncated, garbled in a block or missing, Repair
// moves it aside and drops it, and only it: the records it changed
// (k0000, k0005, … k0500) are back as the older table holds them, the one
// written after it (k0050 at 3) is kept, and the rest of the store is as it
// was. The store then opens, and the report says what was kept.
func TestRepairDropsAnUnreadableTable(t *testing.T) {
	for _, how := range []string{"zeroed", "truncated", "garbled", "missing"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			tt := layeredStore(t, dir)
			damage(t, tt.mid, how)
			if s, err := Open(dir, Options{}); err == nil {
				s.Close()
				t.Fatal("the damaged store opened")
			} else if !strings.Contains(err.Error(), "sluice repair --data "+dir) {
				t.Fatalf("open of a damaged store: %v; want it to name sluice repair --data %s", err, dir)
			}
			var damaged []byte
			if how != "missing" {
				damaged, _ = os.ReadFile(tt.mid)
			}

			before := dirState(t, dir)
			dry, err := Repair(context.Background(), dir, RepairOptions{DryRun: true})
			if err != nil {
				t.Fatalf("dry run: %v", err)
			}
			if after := dirState(t, dir); !maps.Equal(before, after) {
				t.Fatal("a dry run changed the data directory")
			}

			var dropped []string
			at := time.Date(2026, 11, 28, 4, 35, 0, 0, time.UTC)
			rep, err := Repair(context.Background(), dir, RepairOptions{
				Now:     func() time.Time { return at },
				Dropped: func(k []byte) { dropped = append(dropped, string(k)) },
			})
			if err != nil {
				t.Fatalf("repair: %v", err)
			}
			for _, r := range []RepairReport{dry, rep} {
				if len(r.Tables) != 1 || len(r.Ranges) != 1 || r.Checked != 3 {
					t.Fatalf("report: %+v; want one lost table and one range of three checked", r)
				}
			}
			lt, cr := rep.Tables[0], rep.Ranges[0]
			if lt.File != filepath.Base(tt.mid) || lt.Level != 0 || string(lt.Smallest) != "k0000" || string(lt.Largest) != "k0500" ||
				lt.LargestExclusive || lt.Err == nil || lt.Missing != (how == "missing") {
				t.Fatalf("lost table: %+v", lt)
			}
			// The garbled table's properties survive: 101 records.
			if wantRecords := map[string]int64{"garbled": 101}[how]; lt.Records != wantRecords && !(wantRecords == 0 && lt.Records == -1) {
				t.Fatalf("records of the lost table: %d, want %d (-1: unknown)", lt.Records, wantRecords)
			}
			wantEntries := []TableEntries{{filepath.Base(tt.old), 501}, {filepath.Base(tt.top), 1}}
			if string(cr.Start) != "k0000" || string(cr.End) != "k0500\x00" || cr.Dropped != 0 || cr.Kept != 501 || cr.Older != 500 ||
				!slices.Equal(cr.Lost, []string{lt.File}) || !slices.Equal(sortEntries(cr.Entries), wantEntries) || cr.NoKeep {
				t.Fatalf("range: %+v; want k0000…k0500, 501 kept, 500 of them older than the lost table, none dropped, entries %v", cr, wantEntries)
			}
			if dry.Ranges[0].Dropped != 0 || dry.Ranges[0].Kept != 501 || dry.Ranges[0].Older != 500 || dry.LostDir != "" || dry.Tables[0].SavedAs != "" {
				t.Fatalf("dry run report: %+v", dry)
			}
			if len(dropped) != 0 {
				t.Fatalf("%d records of readable tables dropped, from %q: want none", len(dropped), dropped[0])
			}

			lost := filepath.Join(dir, "lost", "20261128T043500Z")
			if rep.LostDir != lost || rep.MarkerRewritten {
				t.Fatalf("lost dir %q (marker rewritten %v), want %s", rep.LostDir, rep.MarkerRewritten, lost)
			}
			if _, err := os.Stat(tt.mid); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the lost table is still in the store: %v", err)
			}
			if how != "missing" {
				saved, err := os.ReadFile(lt.SavedAs)
				if err != nil || !bytes.Equal(saved, damaged) || filepath.Dir(lt.SavedAs) != lost {
					t.Fatalf("the lost table was not moved aside intact to %s: %v", lt.SavedAs, err)
				}
			}
			if m, _ := filepath.Glob(filepath.Join(lost, "MANIFEST-*")); len(m) != 1 {
				t.Fatalf("no copy of the MANIFEST in %s: %v", lost, m)
			}
			expectValues(t, dir, func(i int) uint64 {
				if i == 50 {
					return 3
				}
				return 1
			})

			// Once repaired, nothing is left to repair.
			again, err := Repair(context.Background(), dir, RepairOptions{})
			if err != nil || len(again.Tables) != 0 || again.LostDir != "" {
				t.Fatalf("second repair: %+v, %v; want nothing to do", again, err)
			}
		})
	}
}

// TestRepairRewritesTheFormatMarker: when the lost table held the format
// marker (the oldest, with every key), Repair keeps the records written
// after it, writes the marker again, and the store opens.
func TestRepairRewritesTheFormatMarker(t *testing.T) {
	dir := t.TempDir()
	tt := layeredStore(t, dir)
	damage(t, tt.old, "zeroed")
	rep, err := Repair(context.Background(), dir, RepairOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Ranges) != 1 || !rep.MarkerRewritten {
		t.Fatalf("report: %+v; want one range and the marker rewritten", rep)
	}
	if cr := rep.Ranges[0]; cr.Dropped != 0 || cr.Kept != 101 || string(cr.Start) != "k0000" || cr.End[0] != 0xff {
		t.Fatalf("cleared range: %+v; want k0000 to the marker, 101 kept, none dropped", cr)
	}
	expectValues(t, dir, func(i int) uint64 {
		switch {
		case i == 50:
			return 3
		case i <= 500 && i%5 == 0:
			return 2
		}
		return 0
	})
}

// TestRepairInterruptedKeepsTheMarker: a repair stopped right after the
// MANIFEST edit that took out the table holding the format marker (a
// crash, or a full disk failing the next write) leaves a store that
// opens, or that a second repair mends.
func TestRepairInterruptedKeepsTheMarker(t *testing.T) {
	dir := t.TempDir()
	tt := layeredStore(t, dir)
	damage(t, tt.old, "zeroed")
	crash := errors.New("crash")
	_, err := Repair(context.Background(), dir, RepairOptions{afterRange: func() error { return crash }})
	if !errors.Is(err, crash) {
		t.Fatalf("repair: %v, want it stopped after the first range", err)
	}
	if _, err := Repair(context.Background(), dir, RepairOptions{}); err != nil {
		t.Fatalf("repair again: %v", err)
	}
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("open after an interrupted repair and a second one: %v", err)
	}
	s.Close()
}

// TestRepairHealthyStore: a store without damage is left as it is.
func TestRepairHealthyStore(t *testing.T) {
	dir := t.TempDir()
	layeredStore(t, dir)
	before := dirState(t, dir)
	rep, err := Repair(context.Background(), dir, RepairOptions{})
	if err != nil || len(rep.Tables) != 0 || rep.Checked != 3 || rep.LostDir != "" {
		t.Fatalf("repair of a healthy store: %+v, %v", rep, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "lost")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("repair of a healthy store made a lost directory: %v", err)
	}
	after := dirState(t, dir)
	for name, content := range before {
		if strings.HasSuffix(name, ".sst") && after[name] != content {
			t.Fatalf("repair of a healthy store changed %s", name)
		}
	}
}

// TestRepairRefusesAStoreInUse: Repair refuses a store another process (or
// this one) has open, and a directory that holds no store.
func TestRepairRefusesAStoreInUse(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := Repair(context.Background(), dir, RepairOptions{}); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("repair of a store in use: %v, want ErrLocked naming %s", err, dir)
	}
	empty := t.TempDir()
	if _, err := Repair(context.Background(), empty, RepairOptions{}); !errors.Is(err, ErrNotStore) {
		t.Fatalf("repair of an empty directory: %v, want ErrNotStore", err)
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Fatalf("repair of an empty directory left files in it: %v", entries)
	}
}

func sortEntries(e []TableEntries) []TableEntries {
	e = slices.Clone(e)
	slices.SortFunc(e, func(a, b TableEntries) int { return strings.Compare(a.File, b.File) })
	return e
}

// TestRepairDamagedManifest: a store whose MANIFEST is damaged cannot be
// repaired, and Repair says that no table is to blame.
func TestRepairDamagedManifest(t *testing.T) {
	dir := t.TempDir()
	layeredStore(t, dir)
	manifests, _ := filepath.Glob(filepath.Join(dir, "MANIFEST-*"))
	for _, m := range manifests {
		if err := os.WriteFile(m, bytes.Repeat([]byte{0xff}, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Repair(context.Background(), dir, RepairOptions{})
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "no table is to blame") {
		t.Fatalf("repair with a damaged MANIFEST: %v, want ErrCorrupt saying no table is to blame", err)
	}
}

// openRawPebble opens a Pebble store in dir as sluice's tests write one
// by hand, with automatic compactions off, which would merge its tables.
func openRawPebble(t *testing.T, dir string) *pebble.DB {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{
		FormatMajorVersion:          pebble.FormatNewest,
		DisableAutomaticCompactions: true,
		Logger:                      pebbleLogger{l: slog.New(slog.DiscardHandler)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// TestRepairRefusesFormat1WithoutMarker: a store of format 1 (an older
// sluice's: no format 2 marker, record keys starting with a letter)
// whose table holding the format 1 marker cannot be read is refused,
// changing nothing: stamping it format 2 would have the server read its
// records as keys of another layout (and without the marker, the
// "repaired" store would not open).
func TestRepairRefusesFormat1WithoutMarker(t *testing.T) {
	dir := t.TempDir()
	db := openRawPebble(t, dir)
	for _, kv := range [][2]string{{string(legacyFormatKey), legacyFormatVersion}, {"rl:a", "x"}} {
		if err := db.Set([]byte(kv[0]), []byte(kv[1]), pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if err := db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	levels, err := db.SSTables()
	if err != nil {
		t.Fatal(err)
	}
	var markerTable string
	for _, level := range levels {
		for _, tab := range level {
			if bytes.Equal(tab.Smallest.UserKey, legacyFormatKey) {
				markerTable = filepath.Join(dir, fmt.Sprintf("%s.sst", tab.BackingSSTNum))
			}
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if markerTable == "" {
		t.Fatalf("no table starts with the format 1 marker: %v", levels)
	}
	damage(t, markerTable, "zeroed")
	_, err = Repair(context.Background(), dir, RepairOptions{})
	if !errors.Is(err, ErrNotStore) {
		t.Fatalf("repair of a format 1 store without its marker: %v; want ErrNotStore", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "lost")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused repair moved tables aside: %v", err)
	}
	db, err = pebble.Open(dir, &pebble.Options{ReadOnly: true, DisableConsistencyCheck: true, Logger: pebbleLogger{l: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if v, err := getString(db, formatKey); v != "" || err != nil {
		t.Fatalf("a refused repair left the format marker %q (%v)", v, err)
	}
}
