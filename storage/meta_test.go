package storage

import (
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestMeta: a value SetMeta stores is read back by Meta after a reopen,
// is never listed as a record, and a missing name reads as nil.
func TestMeta(t *testing.T) {
	fs := vfs.NewMem()
	s := openMem(t, fs, SyncNo)
	if v, err := s.Meta("cluster.topology"); err != nil || v != nil {
		t.Fatalf("missing: %q, %v", v, err)
	}
	if err := s.SetMeta("cluster.topology", []byte("v1 3 a:1 0-16383")); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := s.Scan(nil, nil, func(k, v []byte) bool { n++; return true }); err != nil || n != 0 {
		t.Fatalf("Scan lists %d records (%v), want none", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openMem(t, fs, SyncNo)
	defer s.Close()
	if v, err := s.Meta("cluster.topology"); err != nil || string(v) != "v1 3 a:1 0-16383" {
		t.Fatalf("after reopen: %q, %v", v, err)
	}
	if s.Records() != 0 {
		t.Fatalf("Records() = %d, want 0", s.Records())
	}
}

// TestMetaScanUpdate: UpdateMeta sets and deletes at once, and ScanMeta
// lists the names under a prefix, in order, and nothing else, from a
// given name on with ScanMetaFrom; MetaAt reads one by its key.
func TestMetaScanUpdate(t *testing.T) {
	fs := vfs.NewMem()
	s := openMem(t, fs, SyncNo)
	if err := s.UpdateMeta(map[string][]byte{"p.b": []byte("2"), "p.a": []byte("1"), "q": []byte("x"), "p.c": []byte("3")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateMeta(map[string][]byte{"p.a": []byte("one")}, []string{"p.c", "p.none"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openMem(t, fs, SyncNo)
	defer s.Close()
	// scan lists ScanMetaFrom's names under p. from from on, as name=value.
	scan := func(from string) string {
		t.Helper()
		var got []string
		if err := s.ScanMetaFrom("p.", from, func(name string, v []byte) bool {
			got = append(got, name+"="+string(v))
			return true
		}); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(got)
	}
	if got, want := scan("p."), "[a=one b=2]"; got != want {
		t.Fatalf("ScanMeta(p.) = %v; want %s", got, want)
	}
	if v, err := s.Meta("q"); err != nil || string(v) != "x" {
		t.Fatalf("Meta(q) = %q, %v", v, err)
	}
	if got, want := scan("p.a\x00"), "[b=2]"; got != want {
		t.Fatalf("ScanMetaFrom(p., p.a\\x00) = %v; want %s", got, want)
	}
	// MetaAt reads a name by its key, appending to what it is given.
	key := append(AppendMetaKey(nil), "p.b"...)
	if v, ok, err := s.MetaAt([]byte("v="), key); err != nil || !ok || string(v) != "v=2" {
		t.Fatalf("MetaAt(p.b) = %q, %v, %v", v, ok, err)
	}
	if v, ok, err := s.MetaAt(nil, append(AppendMetaKey(nil), "p.c"...)); err != nil || ok || v != nil {
		t.Fatalf("MetaAt(p.c), deleted: %q, %v, %v", v, ok, err)
	}
}
