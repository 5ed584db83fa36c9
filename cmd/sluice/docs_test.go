package main

import (
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// docRow is one row of a flag table in docs/operations.md or docs/cluster.md.
type docRow struct {
	page        string
	line        int
	env, defVal string
}

func (r docRow) String() string { return fmt.Sprintf("%s:%d", r.page, r.line) }

var docFlagName = regexp.MustCompile("`--([a-z0-9-]+)`")

// flagRows adds to rows the markdown tables of page whose first column
// names flags (| `--a`, `--b` | env | default | meaning |), by flag name.
func flagRows(t *testing.T, page string, rows map[string]docRow) {
	t.Helper()
	raw, err := os.ReadFile("../../" + page)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(raw), "\n") {
		cells := strings.Split(l, "|")
		if len(cells) < 6 || !strings.HasPrefix(l, "| `--") {
			continue
		}
		def := strings.Trim(strings.TrimSpace(cells[3]), "`")
		for _, m := range docFlagName.FindAllStringSubmatch(cells[1], -1) {
			if prev, dup := rows[m[1]]; dup {
				t.Errorf("%s:%d: --%s has a second row (the first: %s)", page, i+1, m[1], prev)
			}
			rows[m[1]] = docRow{page: page, line: i + 1, env: cells[2], defVal: def}
		}
	}
}

// TestOperationsDocListsEveryFlag keeps the flag tables of
// docs/operations.md (and of docs/cluster.md, for sluice cluster's own) in
// step with the flags: every flag has a row with its environment variable
// and its default (in any spelling the flag accepts), and no row names a
// flag that does not exist.
func TestOperationsDocListsEveryFlag(t *testing.T) {
	rows := map[string]docRow{}
	flagRows(t, "docs/operations.md", rows)
	flagRows(t, "docs/cluster.md", rows)
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
			t.Errorf("docs/operations.md (or docs/cluster.md) has no row for --%s", f.Name)
			return
		}
		delete(rows, f.Name)
		if !noEnv[f.Name] && !strings.Contains(row.env, envName(f.Name)) {
			t.Errorf("%s: --%s: environment column %q lacks %s", row, f.Name, strings.TrimSpace(row.env), envName(f.Name))
		}
		if _, isBool := f.Value.(interface{ IsBoolFlag() bool }); isBool {
			return
		}
		if f.DefValue == "" {
			if row.defVal != "(none)" {
				t.Errorf("%s: --%s has no default, the doc says %q", row, f.Name, row.defVal)
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
			t.Errorf("%s: --%s default %q is not a valid value: %v", row, f.Name, row.defVal, err)
			return
		}
		if got := fresh.Lookup(f.Name).Value.String(); got != f.DefValue {
			t.Errorf("%s: --%s default is %s, the doc says %q", row, f.Name, f.DefValue, row.defVal)
		}
	})
	for name, row := range rows {
		t.Errorf("%s: --%s is not a flag of sluice", row, name)
	}
}

// fenceOpen is the line that opens (or, with nothing after the marker,
// closes) a fenced block: its indentation, marker and language.
var fenceOpen = regexp.MustCompile("^( *)(```+|~~~+)\\s*([^`\\s]*)")

// mdLink is a markdown link or image target: [text](target "title").
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// proseLine is a line of a markdown page outside its fenced blocks.
type proseLine struct {
	n    int // 1-based
	text string
}

// proseLines returns the lines of doc outside fenced blocks, in order.
func proseLines(doc string) []proseLine {
	var out []proseLine
	inFence := ""
	for i, l := range strings.Split(doc, "\n") {
		if m := fenceOpen.FindStringSubmatch(l); m != nil && (inFence == "" || strings.HasPrefix(strings.TrimLeft(l, " "), inFence)) {
			if inFence == "" {
				inFence = m[2]
			} else {
				inFence = ""
			}
			continue
		}
		if inFence == "" {
			out = append(out, proseLine{i + 1, l})
		}
	}
	return out
}

// headingAnchors returns the anchors GitHub gives the headings of a
// markdown page: lower case, punctuation but - and _ dropped, spaces
// turned into -, and -1, -2, ... after a repeated one.
func headingAnchors(doc string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, l := range proseLines(doc) {
		if !strings.HasPrefix(l.text, "#") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(strings.TrimLeft(l.text, "#"))) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// codeSpan is an inline code span, whose text is no link.
var codeSpan = regexp.MustCompile("`[^`]*`")

// TestDocLinks: every relative link in the repository's markdown pages
// names a file that exists, and every #anchor a heading of its page.
func TestDocLinks(t *testing.T) {
	var pages []string
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && path != "../..") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			pages = append(pages, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		anchors[page] = headingAnchors(string(raw))
		return anchors[page]
	}
	links := 0
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(page, "../../")
		for _, l := range proseLines(string(raw)) {
			n := l.n
			for _, m := range mdLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(l.text, "``"), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				file, anchor, _ := strings.Cut(target, "#")
				dest := page
				if file != "" {
					dest = filepath.Join(filepath.Dir(page), file)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link to %s: %v", name, n, target, err)
						continue
					}
				}
				if anchor != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d: link to %s: %s has no heading with the anchor #%s", name, n, target, strings.TrimPrefix(dest, "../../"), anchor)
				}
			}
		}
	}
	if links == 0 {
		t.Fatal("found no links: the pattern no longer matches")
	}
}
