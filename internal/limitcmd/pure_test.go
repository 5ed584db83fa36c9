package limitcmd

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImports keeps the package below server: the standard library (no
// locks, I/O or clock), the arithmetic (bucket), the key layout
// (keyspace), storage's Mutator contract and Batch, resp's errors and
// encoders, and the dispatch seam and COMMAND DOCS records its commands
// are registered with, and nothing else: the clock, the store's errors
// and the limits come through the dispatch.Ctx; Pebble stays behind
// storage.
func TestImports(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{
		"github.com/sluicehq/sluice/bucket":            true,
		"github.com/sluicehq/sluice/keyspace":          true,
		"github.com/sluicehq/sluice/storage":           true,
		"github.com/sluicehq/sluice/internal/resp":     true,
		"github.com/sluicehq/sluice/internal/dispatch": true,
		"github.com/sluicehq/sluice/internal/cmddoc":   true,
	}
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
			first, _, _ := strings.Cut(path, "/")
			if banned[path] || strings.Contains(first, ".") && !allowed[path] {
				t.Errorf("%s imports %s: limitcmd uses only the standard library, bucket, keyspace, storage, internal/resp, internal/dispatch and internal/cmddoc", f, path)
			}
		}
	}
}
