package internal

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// layers are the module's packages from the bottom up (docs/architecture.md):
// a package imports only packages of the layers below its own, so that
// every call goes down, from a front end to the engine to the store, and
// nothing below calls back up but through an interface it declares
// (engine.Cluster).
var layers = [][]string{
	// A data structure below the store: its filter of keys, and a cluster
	// node's of its overrides.
	{"internal/bloom"},
	// The pure domain, the store, and what tests share (transcript,
	// faultnet, logrec, redistest): they import no package of this
	// module but internal/bloom.
	{"bucket", "cluster", "storage", "internal/errs", "internal/conffile", "internal/reload", "internal/transcript", "internal/faultnet", "internal/logrec", "internal/redistest", "internal/peakstats", "cmd/sluice/internal/earlyhup"},
	// Rules over the limiters; the RESP codec over typed errors; a shard's
	// records replicated over the store; every front end's listener, whose
	// TLS files are read as every configuration file is.
	{"policy", "internal/resp", "replication", "internal/admit"},
	// The store's key layout, Envoy's rule configuration, the rule sets in
	// use; the protocol pieces of RESP's replies.
	{"keyspace", "rls", "internal/rules", "internal/cmddoc", "internal/clustercmd", "internal/counterhit"},
	// The engine every front end runs its limit operations in.
	{"internal/engine"},
	// The RESP front end's seam, then its command families and the
	// cluster node (routing, forwarded counters, slot moves), which the
	// engine reaches through engine.Cluster.
	{"internal/dispatch"},
	{"internal/limitcmd", "internal/conncmd", "internal/clusternode", "internal/policycmd"},
	// The front ends, each in a package of its own, and the HTTP
	// listeners' server.
	{"internal/respserver", "internal/divvy", "internal/check", "internal/envoy", "internal/httpport", "internal/policyhttp"},
	// What reads every front end's counters or configuration: /metrics'
	// collector, CONFIG GET's table.
	{"internal/metrics", "internal/settings"},
	// The composition root.
	{"server"},
	// The binaries.
	{"cmd/sluice", "bench"},
}

// domain are the packages that know no protocol: they make typed errors
// (package errs), and the front ends render them.
var domain = []string{"bucket", "cluster", "storage", "replication", "policy", "keyspace", "rls", "internal/errs", "internal/rules", "internal/engine", "internal/peakstats"}

// protocols are the packages a domain package must not import.
var protocols = []string{mod + "internal/resp", mod + "internal/dispatch", mod + "internal/cmddoc", "net/http", "google.golang.org/grpc"}

// respCodes are the codes a RESP error reply starts with.
var respCodes = []string{"ERR", "WRONGPASS", "NOAUTH", "NOPROTO", "MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "EXECABORT", "LOADING", "BUSY", "NOPERM", "WRONGTYPE", "READONLY", "DENIED"}

// notRESP are string literals of domain packages that look like a RESP
// error and are not one, by file: the divvy line protocol's own ERR line,
// whose codec is policy's.
var notRESP = map[string][]string{
	"policy/line.go": {"ERR "},
}

// packages returns the module's packages (directories with non-test Go
// files, outside the client module and testdata) and their non-test files.
func packages(t *testing.T) map[string][]string {
	t.Helper()
	pkgs := map[string][]string{}
	root := ".."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch d.Name() {
			case "testdata", "node_modules", ".git":
				return filepath.SkipDir
			}
			if rel == "client" || strings.HasPrefix(rel, "client/") {
				return filepath.SkipDir // a module of its own
			}
			return nil
		}
		if strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") {
			dir := filepath.ToSlash(filepath.Dir(rel))
			pkgs[dir] = append(pkgs[dir], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// TestLayers fails when a package imports a package of its own layer or
// of a layer above, or a domain package imports a protocol, and when a
// package of the module has no layer (add it to layers, where it
// belongs).
func TestLayers(t *testing.T) {
	layer := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			layer[p] = i
		}
	}
	for dir, files := range packages(t) {
		if dir == "." || strings.HasPrefix(dir, "scripts") || strings.HasPrefix(dir, "deploy") || dir == "internal" {
			continue // tests and tools only
		}
		own, ok := layer[dir]
		if !ok {
			t.Errorf("package %s has no layer in TestLayers", dir)
			continue
		}
		isDomain := contains(domain, dir)
		for _, f := range files {
			for _, path := range fileImports(t, f) {
				if isDomain {
					for _, p := range protocols {
						if path == p || strings.HasPrefix(path, p+"/") {
							t.Errorf("%s imports %s: the domain package %s knows no protocol", f, path, dir)
						}
					}
				}
				dep, ok := strings.CutPrefix(path, mod)
				if !ok || strings.HasPrefix(dep, "client/") {
					continue
				}
				if l, ok := layer[dep]; ok && l >= own {
					t.Errorf("%s imports %s: %s (layer %d) may import only packages of the layers below it, and %s is in layer %d", f, dep, dir, own, dep, l)
				}
			}
		}
	}
}

// TestNoRESPErrorInDomain fails when a domain package builds a RESP error
// reply: a string literal that starts with a RESP error code ("ERR ...",
// "-ERR ...", "MOVED ..."). Domain packages make typed errors; only the
// front ends word them in a protocol.
func TestNoRESPErrorInDomain(t *testing.T) {
	pkgs := packages(t)
	for _, dir := range domain {
		files := pkgs[dir]
		if len(files) == 0 {
			t.Fatalf("no Go files in %s", dir)
		}
		for _, f := range files {
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			rel := dir + "/" + filepath.Base(f)
			ast.Inspect(af, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil || contains(notRESP[rel], s) {
					return true
				}
				if code, ok := respError(s); ok {
					t.Errorf("%s: %s builds a RESP error reply (%s ...): return a typed error (package errs) and let the front end word it", rel, lit.Value, code)
				}
				return true
			})
		}
	}
}

// fileImports returns the import paths of the Go file f.
func fileImports(t *testing.T, f string) []string {
	t.Helper()
	af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, imp := range af.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		out = append(out, p)
	}
	return out
}

// respError reports whether s starts as a RESP error reply does, with its
// code.
func respError(s string) (string, bool) {
	s = strings.TrimPrefix(s, "-")
	for _, c := range respCodes {
		if strings.HasPrefix(s, c+" ") {
			return c, true
		}
	}
	return "", false
}

// The checks of TestNoRESPErrorInDomain see what they must.
func TestRESPErrorShapes(t *testing.T) {
	for s, want := range map[string]bool{
		"ERR max_burst: -1":              true,
		"-ERR syntax error\r\n":          true,
		"MOVED 3999 127.0.0.1:6381":      true,
		"CLUSTERDOWN Hash slot":          true,
		"error: max_burst":               false,
		"ERRATA":                         false,
		"value is not an integer or out": false,
	} {
		if _, got := respError(s); got != want {
			t.Errorf("respError(%q) = %v, want %v", s, got, want)
		}
	}
}
