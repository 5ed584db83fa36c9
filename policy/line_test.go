package policy

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// fields renders a request as k=v pairs joined by "|", for comparisons.
func fields(q Request) string {
	var parts []string
	for _, f := range q {
		parts = append(parts, string(f.Key)+"="+string(f.Value))
	}
	return strings.Join(parts, "|")
}

func TestParseLine(t *testing.T) {
	tests := []struct {
		line string
		cmd  Command
		want string // fields, or the ERR reply without its newline
	}{
		{"", CmdNone, ""},
		{"\r\n", CmdNone, ""},
		{" \t \r\n", CmdNone, ""},
		{"HIT", CmdHit, ""},
		{"hit\n", CmdHit, ""},
		{"HiT  \r\n", CmdHit, ""},
		{"HIT method=GET path=/pantry/cookies ip=1.2.3.4\n", CmdHit, "method=GET|path=/pantry/cookies|ip=1.2.3.4"},
		{"  HIT \t a=1    b=2  \r\n", CmdHit, "a=1|b=2"},
		{`HIT method="POST" path="/cgi-bin/upload.cgi"`, CmdHit, "method=POST|path=/cgi-bin/upload.cgi"},
		{`HIT "a key"="a = value" x=""`, CmdHit, "a key=a = value|x="},
		{`HIT a= b=2`, CmdHit, "a=|b=2"},
		{`HIT =1 ""=2`, CmdHit, "=1|=2"},
		{`HIT a=1 a=2`, CmdHit, "a=1|a=2"}, // Get takes the last
		{`HIT a=*/x'y`, CmdHit, "a=*/x'y"},
		{`HIT a=""`, CmdHit, "a="},
		{"HIT a=\"\t\"", CmdHit, "a=\t"},
		{"GET a=1", CmdNone, `ERR unknown-command "Unrecognized command: GET"`},
		{"hits a=1", CmdNone, `ERR unknown-command "Unrecognized command: HITS"`},
		{"héllo", CmdNone, `ERR unknown-command "Unrecognized command: HéLLO"`},
		{"HIT=a", CmdNone, `ERR unknown-command "Unrecognized command: HIT=A"`},
		{`"HIT" a=1`, CmdNone, `ERR unknown-command "Unrecognized command: "HIT""`},
		{"HIT a", CmdNone, `ERR unknown "Unexpected end of input string."`},
		{"HIT a b=1", CmdNone, `ERR unknown "Expected '=', found ' '"`},
		{"HIT a=1=2", CmdNone, `ERR unknown "Expected whitespace, found '='"`},
		{`HIT a="1"b`, CmdNone, `ERR unknown "Expected whitespace, found 'b'"`},
		{`HIT "a"b=1`, CmdNone, `ERR unknown "Expected '=', found 'b'"`},
		{`HIT a="1`, CmdNone, `ERR unknown "Unexpected end of quoted string."`},
		{"HIT a=\"1\nb\"", CmdNone, `ERR unknown "Unexpected end of quoted string."`},
		{`HIT a=b"c`, CmdNone, `ERR unknown "Unexpected '"' in unquoted string."`},
		{"HIT a=1 é", CmdNone, `ERR unknown "Unexpected end of input string."`},
		{"HIT é", CmdNone, `ERR unknown "Unexpected end of input string."`},
		{"HIT aé=1 b\x00c", CmdNone, `ERR unknown "Unexpected end of input string."`},
		{"HIT a\xff", CmdNone, `ERR unknown "Unexpected end of input string."`},
		{"HIT a=1\x00b", CmdHit, "a=1\x00b"},
		{"HIT \"a\"é", CmdNone, `ERR unknown "Expected '=', found 'é'"`},
		{"HIT \"a\"\rb=1", CmdNone, `ERR unknown "Expected '=', found '\r'"`},
		{"HIT \"a\"\n", CmdNone, `ERR unknown "Unexpected end of input string."`},
		{"HIT \"\"\n0", CmdNone, `ERR unknown "Expected '=', found '\n'"`},
		{"HIT a=\"b\"\x00", CmdNone, `ERR unknown "Expected whitespace, found '\x00'"`},
	}
	for _, tt := range tests {
		cmd, q, err := ParseLine([]byte(tt.line), Request{{Key: []byte("stale")}})
		var got string
		if err != nil {
			var pe *ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("%q: %T %v", tt.line, err, err)
			}
			got = strings.TrimSuffix(string(pe.AppendReply(nil)), "\n")
		} else {
			got = fields(q)
		}
		if cmd != tt.cmd || got != tt.want {
			t.Errorf("%q: got %v %q, want %v %q", tt.line, cmd, got, tt.cmd, tt.want)
		}
	}
}

func TestProtocolError(t *testing.T) {
	e := &ProtocolError{Code: CodeUnknown, Reason: "line too long"}
	if got := string(e.AppendReply([]byte("x"))); got != "x"+`ERR unknown "line too long"`+"\n" {
		t.Errorf("reply %q", got)
	}
	if e.Error() != "policy: unknown: line too long" {
		t.Errorf("Error() %q", e.Error())
	}
}

func TestParseArgs(t *testing.T) {
	args := [][]byte{[]byte("method=GET"), []byte("path=/a=b c"), []byte("=v"), []byte("k=")}
	q, err := ParseArgs(args, nil)
	if err != nil || fields(q) != "method=GET|path=/a=b c|=v|k=" {
		t.Fatalf("%q %v", fields(q), err)
	}
	if q, err := ParseArgs(nil, q); err != nil || len(q) != 0 {
		t.Fatalf("no args: %v %v", q, err)
	}
	_, err = ParseArgs([][]byte{[]byte("a=1"), []byte("oops")}, nil)
	var pe *ProtocolError
	if !errors.As(err, &pe) || pe.Code != CodeUnknown || pe.Reason != "argument 2 is not key=value" {
		t.Fatalf("%v", err)
	}
}

func FuzzParseLine(f *testing.F) {
	for _, s := range []string{"HIT a=1 b=\"x y\"\r\n", "hit", "", "GET x", `HIT "=" = ""=""`, "HIT a=\"1", "HIT a=b\"c"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		cmd, q, err := ParseLine(line, nil)
		if err != nil {
			var pe *ProtocolError
			if !errors.As(err, &pe) || (pe.Code != CodeUnknown && pe.Code != CodeUnknownCommand) {
				t.Fatalf("%T %v", err, err)
			}
			if strings.ContainsAny(pe.Reason, "\r\n") {
				t.Fatalf("reply spans lines: %q", pe.Reason)
			}
			return
		}
		if cmd == CmdNone {
			if len(trimSpace(line)) != 0 {
				t.Fatalf("%q ignored", line)
			}
			return
		}
		// Quoting every key and value gives the same request back.
		var b strings.Builder
		b.WriteString("hIt")
		for _, fl := range q {
			if bytes.ContainsAny(fl.Key, "\"\n") || bytes.ContainsAny(fl.Value, "\"\n") {
				t.Fatalf("field %q=%q holds a quote or newline", fl.Key, fl.Value)
			}
			b.WriteString(` "` + string(fl.Key) + `"="` + string(fl.Value) + `"`)
		}
		cmd2, q2, err := ParseLine([]byte(b.String()), q[:0:0])
		if err != nil || cmd2 != CmdHit || fields(q2) != fields(q) {
			t.Fatalf("%q -> %q: %v %q, want %q", line, b.String(), err, fields(q2), fields(q))
		}
	})
}
