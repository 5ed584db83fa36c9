package clustercmd

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImports keeps the package below server and pure: the standard
// library (no locks, I/O or clock), the topology (cluster) and resp's
// encoders, nothing else.
func TestImports(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{
		"github.com/sluicehq/sluice/cluster":       true,
		"github.com/sluicehq/sluice/internal/resp": true,
	}
	// net is allowed for net.ParseIP, which does no I/O.
	banned := map[string]bool{"sync": true, "sync/atomic": true, "os": true, "io": true, "time": true}
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
				t.Errorf("%s imports %s: clustercmd uses only the standard library, cluster and internal/resp", f, path)
			}
		}
	}
}
