package policy

import (
	"errors"
	"strings"
	"testing"
)

// WithLimit keeps the rule's counter identity and refuses what a rule
// file's rule could not have.
func TestWithLimit(t *testing.T) {
	p, err := ParseINI("t.ini", []byte("[a=1]\ncreditLimit=5\nresetSeconds=60\nalgorithm=slidingLog\nshadow=true\nlabel=a\n\n[b=1]\ncreditLimit=5\nresetSeconds=60\nquotaField=q\nmaxQuota=10\n\n[default]\ncreditLimit=0\nresetSeconds=0\n"))
	if err != nil {
		t.Fatal(err)
	}
	rs := p.Rules()
	a, b := rs[0], rs[1]
	if !a.Shadow || b.Shadow {
		t.Fatalf("shadow fields: %v, %v; want true, false", a.Shadow, b.Shadow)
	}
	w, err := a.WithLimit(7, 30)
	if err != nil {
		t.Fatal(err)
	}
	if w.CreditLimit != 7 || w.ResetSeconds != 30 || w.FileRule() != a || a.FileRule() != a || !w.Shadow {
		t.Fatalf("WithLimit: %+v", w)
	}
	if got, want := string(w.AppendCounterID(nil, nil)), string(a.AppendCounterID(nil, nil)); got != want {
		t.Fatal("WithLimit changed the counter identity")
	}
	// Of a runtime rule, from the file's.
	if w2, err := w.WithLimit(8, 60); err != nil || w2.FileRule() != a {
		t.Fatalf("WithLimit of a WithLimit: %v, file rule %p, want %p", err, w2.FileRule(), a)
	}
	for _, c := range []struct {
		r             *Rule
		credit, reset int64
		field, want   string
	}{
		{a, -1, 60, "creditLimit", "creditLimit is -1"},
		{a, 1, -1, "resetSeconds", "resetSeconds is -1"},
		{a, 200_000, 60, "creditLimit", "expected at most 100000"},
		{a, 1, 1 << 62, "resetSeconds", "fits in int64 milliseconds"},
		{b, 11, 60, "creditLimit", "maxQuota is 10, less than creditLimit 11"},
	} {
		_, err := c.r.WithLimit(c.credit, c.reset)
		var le *LimitError
		if !errors.As(err, &le) || le.Field != c.field || !strings.Contains(le.Problem, c.want) {
			t.Errorf("WithLimit(%d, %d): %v; want a LimitError on %s saying %q", c.credit, c.reset, err, c.field, c.want)
		}
	}
}

// shadow is a boolean field in JSON too, and a string is refused.
func TestShadowFieldJSON(t *testing.T) {
	p, err := ParseJSON("t.json", []byte(`{"default": {"creditLimit": 1, "resetSeconds": 1, "shadow": true}}`))
	if err != nil || !p.Rules()[0].Shadow {
		t.Fatalf("JSON shadow true: %v", err)
	}
	if _, err := ParseJSON("t.json", []byte(`{"default": {"creditLimit": 1, "resetSeconds": 1, "shadow": "yes"}}`)); err == nil {
		t.Fatal(`JSON shadow "yes": accepted`)
	}
}
