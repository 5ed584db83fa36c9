// Package transcript runs transcript files, tests written as documents: a
// request a front end receives, then the exact reply it sends, one after
// the other, as a reader would follow a session. A test gives Run the file
// and a function that sends one request to a server listening on
// 127.0.0.1:0 and returns what came back; Run compares each reply with
// the file's, byte for byte.
//
// A file is lines of three sorts: "# " comments and blank lines, which
// are skipped; "> request", whose text the test's function interprets (a
// RESP command line, line-protocol bytes, an HTTP request); and, right
// after a request, its reply as a Go string literal ("+PONG\r\n"), so that
// every byte, control characters included, is visible and exact.
//
// The package is for tests; it is safe for concurrent use.
package transcript

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Case is one request of a file and the reply it expects.
type Case struct {
	Line    int    // of the request, for messages
	Request string // after "> "
	Want    string // the reply, unquoted
}

// Parse reads the cases of a file's text; name is for errors.
func Parse(name string, data []byte) ([]Case, error) {
	lines := strings.Split(string(data), "\n")
	var cases []Case
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
			continue
		case !strings.HasPrefix(l, "> "):
			return nil, fmt.Errorf("%s:%d: %q is neither a comment nor a request (\"> ...\")", name, i+1, l)
		case i+1 >= len(lines):
			return nil, fmt.Errorf("%s:%d: request without a reply line after it", name, i+1)
		}
		want, err := strconv.Unquote(lines[i+1])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: reply %q is not a Go string literal: %w", name, i+2, lines[i+1], err)
		}
		cases = append(cases, Case{Line: i + 1, Request: l[2:], Want: want})
		i++
	}
	return cases, nil
}

// Run runs the cases of file in order through do and reports every reply
// that differs from the file's. With rewrite, it writes the replies do
// gave into the file instead, keeping its comments, for a change of
// behaviour meant to be reviewed as a diff of the file.
func Run(t testing.TB, file string, rewrite bool, do func(request string) string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cases, err := Parse(file, data)
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatalf("%s has no requests", file)
	}
	lines := strings.Split(string(data), "\n")
	for _, c := range cases {
		got := do(c.Request)
		if rewrite {
			lines[c.Line] = strconv.Quote(got)
			continue
		}
		if got != c.Want {
			t.Errorf("%s:%d: > %s\n got  %q\n want %q", file, c.Line, c.Request, got, c.Want)
		}
	}
	if rewrite {
		if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
