package main

import (
	"flag"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
)

// docRow is one row of a flag table in docs/operations.md.
type docRow struct {
	line        int
	env, defVal string
}

var docFlagName = regexp.MustCompile("`--([a-z0-9-]+)`")

// flagRows reads the markdown tables of doc whose first column names flags
// (| `--a`, `--b` | env | default | meaning |), by flag name.
func flagRows(t *testing.T, doc string) map[string]docRow {
	t.Helper()
	rows := map[string]docRow{}
	for i, l := range strings.Split(doc, "\n") {
		cells := strings.Split(l, "|")
		if len(cells) < 6 || !strings.HasPrefix(l, "| `--") {
			continue
		}
		def := strings.Trim(strings.TrimSpace(cells[3]), "`")
		for _, m := range docFlagName.FindAllStringSubmatch(cells[1], -1) {
			if _, dup := rows[m[1]]; dup {
				t.Errorf("docs/operations.md:%d: --%s has a second row", i+1, m[1])
			}
			rows[m[1]] = docRow{line: i + 1, env: cells[2], defVal: def}
		}
	}
	return rows
}

// TestOperationsDocListsEveryFlag keeps docs/operations.md in step with the
// flags: every flag has a row with its environment variable and its
// default (in any spelling the flag accepts), and no row names a flag that
// does not exist.
func TestOperationsDocListsEveryFlag(t *testing.T) {
	raw, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := flagRows(t, string(raw))
	fs := newFlagSet(&config{}, io.Discard)
	// The own flags of sluice health, backup, cluster and repair (the others
	// are the server's) have rows too.
	subFlags := map[string]func() *flag.FlagSet{}
	for _, sub := range []func() *flag.FlagSet{
		func() *flag.FlagSet { return newHealthFlagSet(&healthConfig{}, io.Discard) },
		func() *flag.FlagSet { return newBackupFlagSet(&backupConfig{}, io.Discard) },
		func() *flag.FlagSet { return newClusterFlagSet(&clusterToolConfig{}, io.Discard) },
		func() *flag.FlagSet { return newRepairFlagSet(&repairConfig{}, io.Discard) },
	} {
		sub().VisitAll(func(f *flag.Flag) {
			if fs.Lookup(f.Name) == nil {
				fs.Var(f.Value, f.Name, f.Usage)
				subFlags[f.Name] = sub
			}
		})
	}
	fs.VisitAll(func(f *flag.Flag) {
		row, ok := rows[f.Name]
		if !ok {
			t.Errorf("docs/operations.md has no row for --%s", f.Name)
			return
		}
		delete(rows, f.Name)
		if !noEnv[f.Name] && !strings.Contains(row.env, envName(f.Name)) {
			t.Errorf("docs/operations.md:%d: --%s: environment column %q lacks %s", row.line, f.Name, strings.TrimSpace(row.env), envName(f.Name))
		}
		if _, isBool := f.Value.(interface{ IsBoolFlag() bool }); isBool {
			return
		}
		if f.DefValue == "" {
			if row.defVal != "(none)" {
				t.Errorf("docs/operations.md:%d: --%s has no default, the doc says %q", row.line, f.Name, row.defVal)
			}
			return
		}
		// The doc may write 64MiB for 67108864 or 10m for 10m0s: set a
		// fresh flag to the documented value and compare.
		fresh := newFlagSet(&config{}, io.Discard)
		if sub, ok := subFlags[f.Name]; ok {
			fresh = sub()
		}
		if err := fresh.Set(f.Name, row.defVal); err != nil {
			t.Errorf("docs/operations.md:%d: --%s default %q is not a valid value: %v", row.line, f.Name, row.defVal, err)
			return
		}
		if got := fresh.Lookup(f.Name).Value.String(); got != f.DefValue {
			t.Errorf("docs/operations.md:%d: --%s default is %s, the doc says %q", row.line, f.Name, f.DefValue, row.defVal)
		}
	})
	for name, row := range rows {
		t.Errorf("docs/operations.md:%d: --%s is not a flag of sluice", row.line, name)
	}
}
