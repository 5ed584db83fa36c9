package internal

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// TestOneKeyLayout fails when a package other than keyspace builds or
// parses a store key: bucket and policy declare no key function or
// constant (their arithmetic and identities are keyed by keyspace), and
// no package reads or writes a two-byte big-endian number, the slot that
// starts every record key: everyone else asks keyspace (RecordSlot,
// Parse, SlotRange), and the store partitions keys by the function it is
// opened with (keyspace.Partition).
func TestOneKeyLayout(t *testing.T) {
	for dir, files := range packages(t) {
		for _, f := range files {
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			if dir == "bucket" || dir == "policy" {
				for _, name := range topLevelNames(af) {
					if strings.Contains(name, "Key") {
						t.Errorf("%s declares %s: store keys are keyspace's to build and parse", f, name)
					}
				}
			}
			if dir == "keyspace" {
				continue
			}
			ast.Inspect(af, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				switch sel.Sel.Name {
				case "Uint16", "PutUint16", "AppendUint16":
				default:
					return true
				}
				if x, ok := sel.X.(*ast.SelectorExpr); ok && x.Sel.Name == "BigEndian" {
					t.Errorf("%s calls binary.BigEndian.%s: a record key's slot is keyspace's to read and write (keyspace.RecordSlot)", f, sel.Sel.Name)
				}
				return true
			})
		}
	}
}

// topLevelNames returns the names of f's functions, methods, constants
// and variables.
func topLevelNames(f *ast.File) []string {
	var names []string
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			names = append(names, d.Name.Name)
		case *ast.GenDecl:
			if d.Tok != token.CONST && d.Tok != token.VAR {
				continue
			}
			for _, s := range d.Specs {
				for _, n := range s.(*ast.ValueSpec).Names {
					names = append(names, n.Name)
				}
			}
		}
	}
	return names
}
