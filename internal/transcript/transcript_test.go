package transcript

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	cases, err := Parse("t", []byte("# a comment\n\n> PING\n\"+PONG\\r\\n\"\n> ECHO \"a b\"\n\"$3\\r\\na b\\r\\n\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Case{{3, "PING", "+PONG\r\n"}, {5, `ECHO "a b"`, "$3\r\na b\r\n"}}
	if len(cases) != len(want) || cases[0] != want[0] || cases[1] != want[1] {
		t.Fatalf("Parse: %+v, want %+v", cases, want)
	}
	for in, msg := range map[string]string{
		"PING\n":              "neither a comment nor a request",
		"> PING":              "without a reply line",
		"> PING\n+PONG\r\n\n": "not a Go string literal",
	} {
		if _, err := Parse("t", []byte(in)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("Parse(%q): %v, want an error saying %q", in, err, msg)
		}
	}
}
