package cmddoc

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPure keeps the package pure: the standard library and resp's
// encoders, and no locks, I/O or clock. The command table these records
// describe is server's.
func TestPure(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{"github.com/sluicehq/sluice/internal/resp": true}
	banned := map[string]bool{"sync": true, "sync/atomic": true, "os": true, "io": true, "net": true, "time": true}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(path, "/"); banned[path] || strings.Contains(first, ".") && !allowed[path] {
				t.Errorf("%s imports %s: cmddoc is pure and uses only the standard library and internal/resp", f, path)
			}
		}
	}
}
