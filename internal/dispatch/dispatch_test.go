package dispatch

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImports keeps the package a seam, below server and above the
// families: the standard library without locks or I/O, storage's Batch
// and Mutator, resp's encoders and cmddoc's records. The clock, the
// classifier and the store are the server's, reached through Env.
func TestImports(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{
		"github.com/sluicehq/sluice/storage":         true,
		"github.com/sluicehq/sluice/internal/resp":   true,
		"github.com/sluicehq/sluice/internal/cmddoc": true,
	}
	banned := map[string]bool{"sync": true, "sync/atomic": true, "os": true, "io": true, "net": true}
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
				t.Errorf("%s imports %s: dispatch uses only the standard library, storage, internal/resp and internal/cmddoc", f, path)
			}
		}
	}
}

type buf struct{ b []byte }

// A family's state is made once per connection, kept across commands,
// trimmed and counted with the connection's buffers, and told of commits.
func TestState(t *testing.T) {
	var tab Table
	plain := NewState[int](&tab, Hooks[int]{})
	commits := ""
	st := NewState(&tab, Hooks[buf]{
		Trim: func(v *buf, keep int) {
			if cap(v.b) > keep {
				v.b = nil
			}
		},
		Footprint: func(v *buf) int { return cap(v.b) },
		Committed: func(v *buf, ok bool) { commits += strconv.FormatBool(ok) + " " },
	})
	var x, y Ctx
	if v := st.Of(&x); v != st.Of(&x) {
		t.Fatal("Of made a second value for the same connection")
	}
	if st.Of(&x) == st.Of(&y) {
		t.Fatal("two connections share a value")
	}
	*plain.Of(&x) = 7
	st.Of(&x).b = make([]byte, 100)
	if *plain.Of(&x) != 7 || x.Footprint() != 100 {
		t.Fatalf("plain %d, footprint %d; want 7, 100", *plain.Of(&x), x.Footprint())
	}
	x.Trim(200)
	if x.Footprint() != 100 {
		t.Fatalf("footprint %d after trimming to 200, want 100", x.Footprint())
	}
	x.Trim(50)
	if x.Footprint() != 0 {
		t.Fatalf("footprint %d after trimming to 50, want 0", x.Footprint())
	}
	x.Committed(true)
	x.Committed(false)
	y.Committed(true)
	if commits != "true false true " {
		t.Fatalf("Committed hooks ran %q, want \"true false true \"", commits)
	}
	if allocs := testing.AllocsPerRun(100, func() { st.Of(&x).b = st.Of(&x).b[:0] }); allocs != 0 {
		t.Fatalf("Of allocates %v times once made", allocs)
	}
}
