package rules

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImports keeps the package below server: it reaches the store only
// through the batch and the Env it is given, the cluster only through the
// Forward hook and the rule file only through policy.Load. No connections
// or files of its own.
func TestImports(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{
		"github.com/sluicehq/sluice/bucket":            true,
		"github.com/sluicehq/sluice/keyspace":          true,
		"github.com/sluicehq/sluice/policy":            true,
		"github.com/sluicehq/sluice/storage":           true,
		"github.com/sluicehq/sluice/internal/resp":     true,
		"github.com/sluicehq/sluice/internal/dispatch": true,
		"github.com/sluicehq/sluice/internal/cmddoc":   true,
	}
	banned := map[string]bool{"os": true, "io": true, "net": true}
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
				t.Errorf("%s imports %s: rules uses only the standard library without I/O, bucket, keyspace, policy, storage, internal/resp, internal/dispatch and internal/cmddoc", f, path)
			}
		}
	}
}
