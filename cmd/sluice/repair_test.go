package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/sluicehq/sluice/keyspace"
)

// The keys of the repair tests: two groups in hash slots of their own, the
// "{b}" keys (slot 3300) sorting before the "{a}" keys (slot 15495), so
// that each group compacts into a table of its own.
func groupKey(group string, i int) string { return fmt.Sprintf("{%s}user:%d", group, i) }

const groupSize = 3000

// twoTableStore serves a new store in data, puts the "{a}" keys at 99
// tokens (of 100) and compacts them into a table, then the "{b}" keys at 98
// into another, then takes 5 more tokens of {a}user:7 (94 left), which stays
// in the log; it stops the server and returns the two tables' paths.
func twoTableStore(t *testing.T, data string) (tableA, tableB string) {
	t.Helper()
	if a, b := keyspace.Slot([]byte("a")), keyspace.Slot([]byte("b")); a <= b {
		t.Fatalf("slots of {a} %d and {b} %d: the tests want {b} first", a, b)
	}
	p := startProc(t, data)
	rdb := p.client(t)
	ctx := context.Background()
	group := func(g string, take int) []string {
		t.Helper()
		pipe := rdb.Pipeline()
		for i := range groupSize {
			pipe.Do(ctx, "RL.REDUCE", groupKey(g, i), 100, 60, "TAKE", take, "AT", 1000)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if err := rdb.Do(ctx, "COMPACT").Err(); err != nil {
			t.Fatal(err)
		}
		tables, _ := filepath.Glob(filepath.Join(data, "*.sst"))
		return tables
	}
	first := group("a", 1)
	second := group("b", 2)
	if err := rdb.Do(ctx, "RL.REDUCE", groupKey("a", 7), 100, 60, "TAKE", 5, "AT", 1000).Err(); err != nil {
		t.Fatal(err)
	}
	p.stop(t, syscall.SIGTERM)
	if p.err != nil {
		t.Fatalf("stop: %v\n%s", p.err, p.logs)
	}
	if len(first) != 1 || len(second) != 2 || !slices.Contains(second, first[0]) {
		t.Fatalf("want one table after the {a} keys and a second one after the {b} keys; got %v, then %v", first, second)
	}
	tableA = first[0]
	for _, tab := range second {
		if tab != tableA {
			tableB = tab
		}
	}
	return tableA, tableB
}

// damageTable damages the table file path as the field did.
func damageTable(t *testing.T, path, how string) {
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
			_, err = f.WriteAt(bytes.Repeat([]byte("X"), 64), fi.Size()/2)
			f.Close()
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestRepairMovesUnreadableTablesAside: a store with a table zero-filled,
// truncated or garbled in a block does not start, and its startup error and
// sluice inspect name sluice repair; sluice repair --dry-run reports and
// changes nothing; sluice repair moves the table aside into DIR/lost/,
// says which keys and records it held, and the server then starts: the
// limits of the lost table start afresh, except one written after it, and
// the other table's limits are intact.
func TestRepairMovesUnreadableTablesAside(t *testing.T) {
	for _, tc := range []struct {
		how    string
		victim string // the group whose table is damaged
	}{
		{"zeroed", "a"}, // the table that also holds the format marker
		{"truncated", "b"},
		{"garbled", "b"},
	} {
		t.Run(tc.how, func(t *testing.T) {
			data := t.TempDir()
			tableA, tableB := twoTableStore(t, data)
			victim, other := tableA, "b"
			if tc.victim == "b" {
				victim, other = tableB, "a"
			}
			damageTable(t, victim, tc.how)

			hint := "sluice repair --data " + data
			code, out := runToExit(t, "--addr", "127.0.0.1:0", "--http-addr", "", "--data", data)
			if code != 1 || !strings.Contains(out, hint) {
				t.Fatalf("start on the damaged store: exit %d, want 1 naming %q; output:\n%s", code, hint, tail([]byte(out), 5))
			}
			code, out = runToExit(t, "inspect", "--data", data)
			if code != 1 || !strings.Contains(out, hint) {
				t.Fatalf("inspect of the damaged store: exit %d, want 1 naming %q; output:\n%s", code, hint, tail([]byte(out), 5))
			}

			name := filepath.Base(victim)
			code, out = runToExit(t, "repair", "--data", data, "--dry-run")
			if code != 0 || !strings.Contains(out, "table "+name+" (level 6") || !strings.Contains(out, "dry run: nothing changed") {
				t.Fatalf("repair --dry-run: exit %d, want 0 reporting %s; output:\n%s", code, name, out)
			}
			if _, err := os.Stat(victim); err != nil {
				t.Fatalf("the dry run moved the table: %v", err)
			}
			if _, err := os.Stat(filepath.Join(data, "lost")); err == nil {
				t.Fatal("the dry run made a lost directory")
			}

			code, out = runToExit(t, "repair", "--data", data)
			t.Logf("sluice repair:\n%s", out)
			slot := fmt.Sprintf("slot %d bucket", keyspace.Slot([]byte(tc.victim)))
			if code != 0 || !strings.Contains(out, "table "+name+" (level 6") || !strings.Contains(out, "keys from "+slot) ||
				!strings.Contains(out, "repaired: the store opens") {
				t.Fatalf("repair: exit %d, want 0, naming %s and its keys in %s; output:\n%s", code, name, slot, out)
			}
			if tc.victim == "a" && (!strings.Contains(out, "1 record of readable tables kept") || !strings.Contains(out, "format marker was in a lost table")) {
				t.Fatalf("repair: want the {a}user:7 record kept and the format marker rewritten; output:\n%s", out)
			}
			if _, err := os.Stat(victim); err == nil {
				t.Fatal("the unreadable table is still in the store")
			}
			saved, _ := filepath.Glob(filepath.Join(data, "lost", "*", name))
			reports, _ := filepath.Glob(filepath.Join(data, "lost", "*", "report.txt"))
			if len(saved) != 1 || len(reports) != 1 {
				t.Fatalf("in %s/lost: tables %v, reports %v; want the table moved there and a report", data, saved, reports)
			}
			if report, _ := os.ReadFile(reports[0]); string(report) != out {
				t.Fatalf("the saved report differs from the printed one:\n%s", report)
			}

			p := startProc(t, data)
			rdb := p.client(t)
			ctx := context.Background()
			want := map[string]int64{tc.victim: 100, other: 99}
			if other == "b" {
				want[other] = 98
			}
			for _, g := range []string{"a", "b"} {
				for i := range groupSize {
					k := groupKey(g, i)
					w := want[g]
					if g == "a" && i == 7 {
						w = 94 // written after the table: kept, or intact
					}
					got, err := rdb.Do(ctx, "RL.GET", k, 100, 60, "AT", 1000).Int64()
					if err != nil || got != w {
						t.Fatalf("%s after the repair: %d, %v; want %d", k, got, err, w)
					}
				}
			}
		})
	}
}

// TestRepairHealthyOrServedStore: sluice repair leaves a readable store
// alone (exit 0, saying so), and refuses one a server holds (exit 1).
func TestRepairHealthyOrServedStore(t *testing.T) {
	data := t.TempDir()
	p := startProc(t, data)
	reduceMany(t, p, 100)
	code, out := runToExit(t, "repair", "--data", data)
	if code != 1 || !strings.Contains(out, "in use") {
		t.Fatalf("repair of a store a server holds: exit %d, want 1 saying it is in use; output:\n%s", code, out)
	}
	p.stop(t, syscall.SIGTERM)
	code, out = runToExit(t, "repair", "--data", data)
	if code != 0 || !strings.Contains(out, "nothing to repair") {
		t.Fatalf("repair of a healthy store: exit %d, want 0 saying nothing needs repair; output:\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(data, "lost")); err == nil {
		t.Fatal("repair of a healthy store made a lost directory")
	}
}
