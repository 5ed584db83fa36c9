package resp

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

var frTestLimits = Limits{
	MaxArgs:    1024,
	MaxBulk:    1 << 20,
	MaxInline:  64 << 10,
	MaxPending: 8 << 20,
}

// frFuzzLimits are small so that the fuzzer reaches every limit.
var frFuzzLimits = Limits{MaxArgs: 8, MaxBulk: 64, MaxInline: 128, MaxPending: 1024}

// resp is the canonical encoding of one command.
func frRESP(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

func frCmds(c ...[]string) [][]string { return c }
func frArgs(a ...string) []string     { return a }

// frFeedChunks feeds in through a new framer in chunks whose sizes next chooses. Each
// chunk goes through one reused buffer that is scribbled over after every feed, to
// catch a framer that keeps references into p.
func frFeedChunks(l Limits, in []byte, next func(remaining int) int) ([]byte, error) {
	f := NewFramer(l)
	var out []byte
	var scratch []byte
	for len(in) > 0 {
		n := min(max(next(len(in)), 1), len(in))
		scratch = append(scratch[:0], in[:n]...)
		in = in[n:]
		var err error
		out, err = f.Feed(out, scratch)
		for i := range scratch {
			scratch[i] = '#'
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

func frFeedAll(l Limits, in []byte) ([]byte, error) {
	return frFeedChunks(l, in, func(n int) int { return n })
}

func frFeedBytewise(l Limits, in []byte) ([]byte, error) {
	return frFeedChunks(l, in, func(int) int { return 1 })
}

func frFeedRandom(l Limits, in []byte, seed uint64) ([]byte, error) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return frFeedChunks(l, in, func(n int) int {
		if r.IntN(4) == 0 {
			return 1 + r.IntN(3)
		}
		return 1 + r.IntN(n)
	})
}

func frErrText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// frSplitCanonical splits framer output into raw commands, requiring the canonical form.
func frSplitCanonical(out []byte) ([][]byte, [][]string, error) {
	var raws [][]byte
	var all [][]string
	readNum := func(b []byte, prefix byte) (int, []byte, error) {
		if len(b) == 0 || b[0] != prefix {
			return 0, nil, fmt.Errorf("want %q at %q", prefix, b)
		}
		end := bytes.Index(b, []byte("\r\n"))
		if end < 0 {
			return 0, nil, fmt.Errorf("no CRLF in %q", b)
		}
		n, err := strconv.Atoi(string(b[1:end]))
		if err != nil || n < 0 || strconv.Itoa(n) != string(b[1:end]) {
			return 0, nil, fmt.Errorf("non-canonical number %q", b[1:end])
		}
		return n, b[end+2:], nil
	}
	for len(out) > 0 {
		rest := out
		n, rest, err := readNum(rest, '*')
		if err != nil {
			return nil, nil, err
		}
		var cmd []string
		for range n {
			var size int
			if size, rest, err = readNum(rest, '$'); err != nil {
				return nil, nil, err
			}
			if len(rest) < size+2 || string(rest[size:size+2]) != "\r\n" {
				return nil, nil, fmt.Errorf("bad bulk data in %q", rest)
			}
			cmd = append(cmd, string(rest[:size]))
			rest = rest[size+2:]
		}
		raws = append(raws, out[:len(out)-len(rest)])
		all = append(all, cmd)
		out = rest
	}
	return raws, all, nil
}

// frCheckOutput checks that out is a sequence of canonical commands within l, that
// NextCommand (which the connection loop uses) splits each the same way, alone and in
// sequence, and returns them.
func frCheckOutput(t *testing.T, out []byte, l Limits) [][]string {
	t.Helper()
	raws, all, err := frSplitCanonical(out)
	if err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	for i, raw := range raws {
		if n := len(all[i]); n < 1 || n > l.MaxArgs {
			t.Fatalf("command %q has %d arguments, want 1..%d", raw, n, l.MaxArgs)
		}
		for _, a := range all[i] {
			if int64(len(a)) > l.MaxBulk {
				t.Fatalf("command %q has a %d-byte argument, limit %d", raw, len(a), l.MaxBulk)
			}
		}
		args, rest := NextCommand(raw, nil)
		if len(rest) != 0 || !frSameArgs(args, all[i]) {
			t.Fatalf("NextCommand(%q) = %q, rest %q; want %q", raw, args, rest, all[i])
		}
	}
	var args [][]byte
	for i, rest := 0, out; len(rest) > 0; i++ {
		args, rest = NextCommand(rest, args)
		if i >= len(all) || !frSameArgs(args, all[i]) {
			t.Fatalf("NextCommand, command %d of %q: %q; want %d commands", i, out, args, len(all))
		}
	}
	return all
}

func frSameArgs(got [][]byte, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if string(got[i]) != want[i] {
			return false
		}
	}
	return true
}

type framingCase struct {
	name string
	in   string
	lim  *Limits // nil: frTestLimits
	want [][]string
	err  string // whole message; "" for none
}

const frPing = "*1\r\n$4\r\nPING\r\n"

var framingCases = []framingCase{
	// Valid multibulk.
	{name: "single", in: frPing, want: frCmds(frArgs("PING"))},
	{name: "pipeline", in: "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n" + frPing,
		want: frCmds(frArgs("GET", "k"), frArgs("SET", "k", ""), frArgs("PING"))},
	{name: "binary data", in: "*2\r\n$3\r\nSET\r\n$6\r\na\r\n\x00*$\r\n", want: frCmds(frArgs("SET", "a\r\n\x00*$"))},
	{name: "leading zeros", in: "*02\r\n$003\r\nGET\r\n$01\r\nk\r\n", want: frCmds(frArgs("GET", "k"))},
	{name: "empty commands ignored", in: "*0\r\n*-1\r\n" + frPing + "*-0\r\n*00\r\n*-9999999999999999999\r\n",
		want: frCmds(frArgs("PING"))},
	{name: "max args", in: "*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n", lim: &Limits{MaxArgs: 3, MaxBulk: 4, MaxInline: 16, MaxPending: 64},
		want: frCmds(frArgs("a", "b", "c"))},
	{name: "max bulk", in: "*1\r\n$4\r\nabcd\r\n", lim: &Limits{MaxArgs: 3, MaxBulk: 4, MaxInline: 16, MaxPending: 64}, want: frCmds(frArgs("abcd"))},
	{name: "max pending", in: "*2\r\n$1\r\na\r\n$10\r\n0123456789\r\n", lim: &Limits{MaxArgs: 3, MaxBulk: 16, MaxInline: 16, MaxPending: 26},
		want: frCmds(frArgs("a", "0123456789"))},

	// Inline.
	{name: "inline crlf", in: "PING\r\n", want: frCmds(frArgs("PING"))},
	{name: "inline lf", in: "PING\n", want: frCmds(frArgs("PING"))},
	{name: "inline whitespace", in: "  set \t k\t\tv  \r\n", want: frCmds(frArgs("set", "k", "v"))},
	{name: "blank lines", in: "\r\n\n   \r\n\t\n" + frPing + "\n", want: frCmds(frArgs("PING"))},
	{name: "inline then multibulk", in: "get k\n" + frPing + "PING\r\n", want: frCmds(frArgs("get", "k"), frArgs("PING"), frArgs("PING"))},
	{name: "double quotes", in: `set "a b" "c"` + "\r\n", want: frCmds(frArgs("set", "a b", "c"))},
	{name: "hex escape", in: `"\x41\x4a\x7e" "\x4g" "\xzz" "\x"` + "\n", want: frCmds(frArgs("AJ~", "x4g", "xzz", "x"))},
	{name: "uppercase hex escape", in: `"\x4A\x4b"` + "\n", want: frCmds(frArgs("JK"))},
	{name: "escapes", in: `"\n\r\t\b\a\\\"\q"` + "\n", want: frCmds(frArgs("\n\r\t\b\a\\\"q"))},
	{name: "single quotes", in: `'it\'s' 'a\nb' 'x"y'` + "\n", want: frCmds(frArgs("it's", `a\nb`, `x"y`))},
	{name: "empty argument", in: `set k ""` + "\n", want: frCmds(frArgs("set", "k", ""))},
	{name: "only empty argument", in: `''` + "\r\n", want: frCmds(frArgs(""))},
	{name: "quote inside token", in: `ab"c d" x'y'` + "\n", want: frCmds(frArgs("abc d", "xy"))},
	{name: "vertical tab", in: "\va\vb \fc\n", want: frCmds(frArgs("a\vb", "c"))},
	{name: "cr inside line", in: "a\rb\r\r\n", want: frCmds(frArgs("a", "b"))},
	{name: "quote then cr", in: "'a'\rb\n", want: frCmds(frArgs("a", "b"))},
	{name: "quote before crlf", in: "'a'\r\n", want: frCmds(frArgs("a"))},
	{name: "nul is data", in: "a\x00b\n", want: frCmds(frArgs("a\x00b"))},
	{name: "inline starting with $", in: "$3\r\n", want: frCmds(frArgs("$3"))},
	{name: "inline at max length", in: "0123456789abcdef\r\n", lim: &Limits{MaxArgs: 3, MaxBulk: 16, MaxInline: 16, MaxPending: 64},
		want: frCmds(frArgs("0123456789abcdef"))},
	{name: "inline max args", in: "a b c \r\n", lim: &Limits{MaxArgs: 3, MaxBulk: 16, MaxInline: 16, MaxPending: 64}, want: frCmds(frArgs("a", "b", "c"))},

	// Violations, each after a complete command that must still be emitted.
	{name: "huge bulk length", in: frPing + "*1\r\n$9223372036854775807\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: bulk length 9223372036854775807 exceeds the limit of 1048576 (--max-bulk)"},
	{name: "huge count", in: frPing + "*9223372036854775807\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: 9223372036854775807 arguments exceed the limit of 1024 (--max-args)"},
	{name: "2e9 count", in: frPing + "*2000000000\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: 2000000000 arguments exceed the limit of 1024 (--max-args)"},
	{name: "1e9 count", in: frPing + "*1000000000\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: 1000000000 arguments exceed the limit of 1024 (--max-args)"},
	{name: "20-digit bulk length", in: frPing + "*1\r\n$99999999999999999999\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: bulk length 99999999999999999999 exceeds the limit of 1048576 (--max-bulk)"},
	{name: "1 GiB bulk", in: frPing + "*1\r\n$1073741824\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: bulk length 1073741824 exceeds the limit of 1048576 (--max-bulk)"},
	{name: "count with leading zeros over limit", in: frPing + "*0001025\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: 1025 arguments exceed the limit of 1024 (--max-args)"},
	{name: "21-char count", in: frPing + "*000000000000000000001\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid multibulk length"},
	{name: "21-digit count", in: frPing + "*100000000000000000000\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid multibulk length"},
	{name: "21-digit bulk length", in: frPing + "*1\r\n$100000000000000000000\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid bulk length"},
	{name: "negative bulk length", in: frPing + "*1\r\n$-1\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid bulk length"},
	{name: "negative bulk length 2", in: frPing + "*2\r\n$1\r\na\r\n$-5\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid bulk length"},
	{name: "plus bulk length", in: frPing + "*1\r\n$+3\r\nabc\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid bulk length"},
	{name: "letters in bulk length", in: frPing + "*1\r\n$3x\r\nabc\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid bulk length"},
	{name: "empty bulk length", in: frPing + "*1\r\n$\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid bulk length"},
	{name: "bulk length lf only", in: frPing + "*1\r\n$3\nabc\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid bulk length"},
	{name: "bulk length cr without lf", in: frPing + "*1\r\n$3\rxabc\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid bulk length"},
	{name: "letters in count", in: frPing + "*x\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid multibulk length"},
	{name: "plus count", in: frPing + "*+1\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid multibulk length"},
	{name: "empty count", in: frPing + "*\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid multibulk length"},
	{name: "bare minus count", in: frPing + "*-\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid multibulk length"},
	{name: "digit then letter count", in: frPing + "*1x\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid multibulk length"},
	{name: "minus inside count", in: frPing + "*1-\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid multibulk length"},
	{name: "count lf only", in: frPing + "*1\n$4\r\nPING\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid multibulk length"},
	{name: "count cr without lf", in: frPing + "*1\rx", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid multibulk length"},
	{name: "missing dollar", in: frPing + "*1\r\nPING\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: expected '$', got 'P'"},
	{name: "missing dollar nul", in: frPing + "*1\r\n\x00", want: frCmds(frArgs("PING")),
		err: `Protocol error: expected '$', got '\x00'`},
	{name: "missing dollar crlf", in: frPing + "*1\r\n\r\n", want: frCmds(frArgs("PING")),
		err: `Protocol error: expected '$', got '\x0d'`},
	{name: "missing dollar high byte", in: frPing + "*1\r\n\xff", want: frCmds(frArgs("PING")),
		err: `Protocol error: expected '$', got '\xff'`},
	{name: "data too long", in: frPing + "*1\r\n$3\r\nabcd\r\n", want: frCmds(frArgs("PING")),
		err: `Protocol error: expected '\r\n' after bulk data, got 'd'`},
	{name: "data then cr without lf", in: frPing + "*1\r\n$3\r\nabc\rx", want: frCmds(frArgs("PING")),
		err: `Protocol error: expected '\r\n' after bulk data, got 'x'`},
	{name: "data then lf", in: frPing + "*1\r\n$3\r\nabc\n", want: frCmds(frArgs("PING")),
		err: `Protocol error: expected '\r\n' after bulk data, got '\x0a'`},
	{name: "too many args", in: frPing + "*4\r\n", lim: &Limits{MaxArgs: 3, MaxBulk: 4, MaxInline: 16, MaxPending: 64}, want: frCmds(frArgs("PING")),
		err: "Protocol error: 4 arguments exceed the limit of 3 (--max-args)"},
	{name: "bulk too big", in: frPing + "*1\r\n$5\r\n", lim: &Limits{MaxArgs: 3, MaxBulk: 4, MaxInline: 16, MaxPending: 64}, want: frCmds(frArgs("PING")),
		err: "Protocol error: bulk length 5 exceeds the limit of 4 (--max-bulk)"},
	{name: "pending exceeded", in: frPing + "*2\r\n$1\r\na\r\n$11\r\n", lim: &Limits{MaxArgs: 3, MaxBulk: 16, MaxInline: 16, MaxPending: 26},
		want: frCmds(frArgs("PING")),
		err:  "Protocol error: command exceeds the query buffer limit of 26 bytes (--max-query-buffer)"},
	{name: "pending exceeded by args", in: frPing + "*3\r\n$4\r\nabcd\r\n$4\r\nabcd\r\n$0\r\n",
		lim: &Limits{MaxArgs: 3, MaxBulk: 16, MaxInline: 16, MaxPending: 26}, want: frCmds(frArgs("PING")),
		err: "Protocol error: command exceeds the query buffer limit of 26 bytes (--max-query-buffer)"},
	{name: "header exceeds pending", in: "a\n*1\r\n", lim: &Limits{MaxArgs: 3, MaxBulk: 16, MaxInline: 16, MaxPending: 3}, want: frCmds(frArgs("a")),
		err: "Protocol error: command exceeds the query buffer limit of 3 bytes (--max-query-buffer)"},
	{name: "inline line exceeds pending", in: "a\nabcdefghi\n", lim: &Limits{MaxArgs: 3, MaxBulk: 16, MaxInline: 32, MaxPending: 8},
		want: frCmds(frArgs("a")),
		err:  "Protocol error: command exceeds the query buffer limit of 8 bytes (--max-query-buffer)"},
	{name: "21-char negative count", in: frPing + "*-10000000000000000000\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: invalid multibulk length"},
	{name: "unterminated double quote", in: frPing + `set "abc` + "\r\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: unbalanced quotes in request"},
	{name: "unterminated single quote", in: frPing + `'abc` + "\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: unbalanced quotes in request"},
	{name: "escaped closing quote", in: frPing + `"abc\"` + "\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: unbalanced quotes in request"},
	{name: "single quote backslashes", in: frPing + `'\\'` + "\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: unbalanced quotes in request"},
	{name: "text after closing quote", in: frPing + `set "a"b` + "\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: unbalanced quotes in request"},
	{name: "text after closing single quote", in: frPing + `'a''b'` + "\n", want: frCmds(frArgs("PING")),
		err: "Protocol error: unbalanced quotes in request"},
	{name: "inline too many args", in: frPing + "a b c d\n", lim: &Limits{MaxArgs: 3, MaxBulk: 16, MaxInline: 16, MaxPending: 64}, want: frCmds(frArgs("PING")),
		err: "Protocol error: inline request exceeds the limit of 3 arguments (--max-args)"},
	{name: "inline argument too big", in: frPing + "0123456789abcdefg\n", lim: &Limits{MaxArgs: 3, MaxBulk: 16, MaxInline: 32, MaxPending: 64},
		want: frCmds(frArgs("PING")),
		err:  "Protocol error: inline argument exceeds the limit of 16 bytes (--max-bulk)"},
	{name: "inline quoted argument too big", in: frPing + `"0123456789abcdef\x41"` + "\n", lim: &Limits{MaxArgs: 3, MaxBulk: 16, MaxInline: 32, MaxPending: 64},
		want: frCmds(frArgs("PING")),
		err:  "Protocol error: inline argument exceeds the limit of 16 bytes (--max-bulk)"},
	{name: "inline argument too big at \\x", in: "a\n" + `"ab\xz"` + "\n", lim: &Limits{MaxArgs: 3, MaxBulk: 2, MaxInline: 32, MaxPending: 64},
		want: frCmds(frArgs("a")),
		err:  "Protocol error: inline argument exceeds the limit of 2 bytes (--max-bulk)"},
	{name: "inline argument too big at \\xH", in: "a\n" + `"ab\x4z"` + "\n", lim: &Limits{MaxArgs: 3, MaxBulk: 2, MaxInline: 32, MaxPending: 64},
		want: frCmds(frArgs("a")),
		err:  "Protocol error: inline argument exceeds the limit of 2 bytes (--max-bulk)"},
	{name: "inline argument too big at \\x4 in x", in: "a\n" + `"a\x4z"` + "\n", lim: &Limits{MaxArgs: 3, MaxBulk: 2, MaxInline: 32, MaxPending: 64},
		want: frCmds(frArgs("a")),
		err:  "Protocol error: inline argument exceeds the limit of 2 bytes (--max-bulk)"},
	{name: "inline argument too big at backslash", in: "a\n" + `'ab\c'` + "\n", lim: &Limits{MaxArgs: 3, MaxBulk: 2, MaxInline: 32, MaxPending: 64},
		want: frCmds(frArgs("a")),
		err:  "Protocol error: inline argument exceeds the limit of 2 bytes (--max-bulk)"},
	{name: "inline too long", in: frPing + "0123456789abcdefg\r\n", lim: &Limits{MaxArgs: 3, MaxBulk: 16, MaxInline: 16, MaxPending: 64},
		want: frCmds(frArgs("PING")),
		err:  "Protocol error: too big inline request: line exceeds the limit of 16 bytes (--max-inline)"},
	{name: "inline too long by a cr", in: frPing + "0123456789abcdef\r\r\n", lim: &Limits{MaxArgs: 3, MaxBulk: 16, MaxInline: 16, MaxPending: 64},
		want: frCmds(frArgs("PING")),
		err:  "Protocol error: too big inline request: line exceeds the limit of 16 bytes (--max-inline)"},
}

func (c framingCase) limits() Limits {
	if c.lim != nil {
		return *c.lim
	}
	return frTestLimits
}

func TestFramerCases(t *testing.T) {
	for _, c := range framingCases {
		t.Run(c.name, func(t *testing.T) {
			l := c.limits()
			out, err := frFeedAll(l, []byte(c.in))
			if frErrText(err) != c.err {
				t.Fatalf("error %q, want %q", frErrText(err), c.err)
			}
			if err != nil {
				var pe *protocolError
				if !errors.As(err, &pe) {
					t.Fatalf("error %T, want *protocolError", err)
				}
			}
			got := frCheckOutput(t, out, l)
			if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", c.want) {
				t.Fatalf("commands %q, want %q", got, c.want)
			}
		})
	}
}

func TestFramerDeadAfterError(t *testing.T) {
	f := NewFramer(frTestLimits)
	out, err := f.Feed(nil, []byte(frPing+"*x\r\n"))
	if err == nil || string(out) != frPing {
		t.Fatalf("feed = %q, %v", out, err)
	}
	for range 3 {
		out2, err2 := f.Feed(out, []byte(frPing))
		if err2 != err || string(out2) != frPing {
			t.Fatalf("feed after error = %q, %v; want %q, %v", out2, err2, frPing, err)
		}
	}
}

func TestFramerOutputAppends(t *testing.T) {
	f := NewFramer(frTestLimits)
	out, err := f.Feed([]byte("prefix"), []byte(frPing+"*1\r\n$4\r\nPI"))
	if err != nil || string(out) != "prefix"+frPing {
		t.Fatalf("feed = %q, %v", out, err)
	}
	out, err = f.Feed(out[:0], []byte("NG\r\nPING"))
	if err != nil || string(out) != frPing {
		t.Fatalf("feed = %q, %v", out, err)
	}
	out, err = f.Feed(out[:0], []byte("\r\n"))
	if err != nil || string(out) != frPing {
		t.Fatalf("feed = %q, %v", out, err)
	}
}

// An inline line without a newline must be refused once it passes MaxInline, not held.
func TestFramerInlineTooLongChunked(t *testing.T) {
	l := frTestLimits
	f := NewFramer(l)
	chunk := bytes.Repeat([]byte("abcd"), 25)
	fed := 0
	for fed <= l.MaxInline {
		out, err := f.Feed(nil, chunk)
		fed += len(chunk)
		if len(out) != 0 {
			t.Fatalf("emitted %q", out)
		}
		if fed <= l.MaxInline && err != nil {
			t.Fatalf("error after %d bytes: %v", fed, err)
		}
		if fed > l.MaxInline {
			want := "Protocol error: too big inline request: line exceeds the limit of 65536 bytes (--max-inline)"
			if frErrText(err) != want {
				t.Fatalf("error after %d bytes: %q, want %q", fed, frErrText(err), want)
			}
		}
	}
}

// A command spanning many feeds is held without quadratic copying and emitted intact.
func TestFramerLargeCommandSpanningFeeds(t *testing.T) {
	data := strings.Repeat("0123456789", 100000)
	in := []byte(frRESP("SET", "k", data, "x") + frPing)
	out, err := frFeedChunks(frTestLimits, in, func(int) int { return 1000 })
	if err != nil || string(out) != string(in) {
		t.Fatalf("feed: %v, %d bytes out, want %d", err, len(out), len(in))
	}
}

func TestFramerLargeCommandBytewise(t *testing.T) {
	in := []byte(frRESP("SET", "k", strings.Repeat("v", 1<<20)) + frPing)
	out, err := frFeedBytewise(frTestLimits, in)
	if err != nil || string(out) != string(in) {
		t.Fatalf("feed: %v, %d bytes out, want %d", err, len(out), len(in))
	}
}

// frSplitInputs are inputs for the split-invariance tests beyond the table.
func frSplitInputs() []string {
	in := []string{
		strings.Repeat(frPing, 5) + "PING\r\n" + frRESP("SET", "key", "a\r\nb", ""),
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1000\r\n" + strings.Repeat("v", 1000) + "\r\n" + frPing,
		"*2\r\n$1\r\na\r\n$3\r\nab",         // incomplete at the end
		"set k \"a\\x41\\\"' b\" 'c\\'d'\r", // incomplete inline, pending CR
	}
	for _, c := range framingCases {
		in = append(in, c.in)
	}
	return in
}

func TestFramerSplitInvariance(t *testing.T) {
	limits := []Limits{frTestLimits, frFuzzLimits, {MaxArgs: 3, MaxBulk: 16, MaxInline: 16, MaxPending: 26}}
	for _, in := range frSplitInputs() {
		for _, l := range limits {
			want, wantErr := frFeedAll(l, []byte(in))
			check := func(how string, got []byte, err error) {
				t.Helper()
				if !bytes.Equal(got, want) || frErrText(err) != frErrText(wantErr) {
					t.Fatalf("%q %v fed %s: %q, %v; all at once: %q, %v", in, l, how, got, err, want, wantErr)
				}
			}
			got, err := frFeedBytewise(l, []byte(in))
			check("byte by byte", got, err)
			for seed := range uint64(20) {
				got, err := frFeedRandom(l, []byte(in), seed)
				check(fmt.Sprintf("randomly (seed %d)", seed), got, err)
			}
		}
	}
}

func FuzzFramer(f *testing.F) {
	for _, in := range frSplitInputs() {
		f.Add([]byte(in), uint64(1))
	}
	f.Add([]byte(strings.Repeat("a ", 9)+"\n"), uint64(2))
	f.Add([]byte(strings.Repeat("x", 200)), uint64(3))
	f.Add([]byte(frRESP("a", "b", "c", "d", "e", "f", "g", "h")+frRESP(strings.Repeat("z", 64))), uint64(4))
	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		l := frFuzzLimits
		want, wantErr := frFeedAll(l, in)
		got, err := frFeedRandom(l, in, seed)
		if !bytes.Equal(got, want) || frErrText(err) != frErrText(wantErr) {
			t.Fatalf("fed in chunks: %q, %v; all at once: %q, %v", got, err, want, wantErr)
		}
		frCheckOutput(t, want, l)

		// One command per feed, as before AUTH, gives the same commands.
		fo := NewFramer(l)
		var one []byte
		var oneErr error
		for rest := in; len(rest) > 0 && oneErr == nil; {
			var used int
			one, used, oneErr = fo.FeedSome(one, rest, true)
			if oneErr == nil && (used == 0 || used > len(rest)) {
				t.Fatalf("feedSome consumed %d of %d bytes", used, len(rest))
			}
			rest = rest[used:]
		}
		if !bytes.Equal(one, want) || frErrText(oneErr) != frErrText(wantErr) {
			t.Fatalf("fed one command at a time: %q, %v; all at once: %q, %v", one, oneErr, want, wantErr)
		}

		fr := NewFramer(l)
		out, err := fr.Feed(nil, in)
		if err == nil {
			return
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "Protocol error: ") || strings.ContainsAny(msg, "\r\n") {
			t.Fatalf("bad error message %q", msg)
		}
		n := len(out)
		out, err2 := fr.Feed(out, []byte(frPing))
		if len(out) != n || err2 != err {
			t.Fatalf("feed after error appended %q, returned %v", out[n:], err2)
		}
	})
}

// refSplitArgs is Redis' sdssplitargs translated directly, except that the line ends
// at len(line) rather than at a NUL byte.
func refSplitArgs(line []byte) ([][]byte, bool) {
	isspace := func(c byte) bool { return c == ' ' || c >= '\t' && c <= '\r' }
	at := func(i int) (byte, bool) {
		if i < len(line) {
			return line[i], true
		}
		return 0, false
	}
	var vector [][]byte
	p := 0
	for {
		for p < len(line) && isspace(line[p]) {
			p++
		}
		if p >= len(line) {
			return vector, true
		}
		inq, insq, done := false, false, false
		current := []byte{}
		for !done {
			c, ok := at(p)
			c1, ok1 := at(p + 1)
			switch {
			case inq:
				c2, _ := at(p + 2)
				c3, _ := at(p + 3)
				if ok && c == '\\' && c1 == 'x' && p+3 < len(line) && isHexDigit(c2) && isHexDigit(c3) {
					v, _ := strconv.ParseUint(string([]byte{c2, c3}), 16, 8)
					current = append(current, byte(v))
					p += 3
				} else if ok && c == '\\' && ok1 {
					p++
					e := line[p]
					switch e {
					case 'n':
						e = '\n'
					case 'r':
						e = '\r'
					case 't':
						e = '\t'
					case 'b':
						e = '\b'
					case 'a':
						e = '\a'
					}
					current = append(current, e)
				} else if ok && c == '"' {
					if ok1 && !isspace(c1) {
						return nil, false
					}
					done = true
				} else if !ok {
					return nil, false
				} else {
					current = append(current, c)
				}
			case insq:
				if ok && c == '\\' && ok1 && c1 == '\'' {
					p++
					current = append(current, '\'')
				} else if ok && c == '\'' {
					if ok1 && !isspace(c1) {
						return nil, false
					}
					done = true
				} else if !ok {
					return nil, false
				} else {
					current = append(current, c)
				}
			default:
				switch {
				case !ok || c == ' ' || c == '\n' || c == '\r' || c == '\t':
					done = true
				case c == '"':
					inq = true
				case c == '\'':
					insq = true
				default:
					current = append(current, c)
				}
			}
			if ok {
				p++
			}
		}
		vector = append(vector, current)
	}
}

// FuzzInlineSplit checks inline parsing against the direct translation of sdssplitargs.
func FuzzInlineSplit(f *testing.F) {
	for _, c := range framingCases {
		if line, ok := strings.CutSuffix(c.in, "\n"); ok && !strings.HasPrefix(line, "*") {
			f.Add([]byte(line), false)
		}
	}
	f.Add([]byte(`a"b c"d`), true)
	f.Add([]byte(`"\x4`), false)
	f.Fuzz(func(t *testing.T, line []byte, crlf bool) {
		line = bytes.ReplaceAll(line, []byte("\n"), nil)
		if len(line) > 0 && line[0] == '*' {
			line[0] = ' '
		}
		in := append(bytes.Clone(line), '\n')
		if crlf {
			in = append(bytes.Clone(line), '\r', '\n')
		} else if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1]
		}
		l := Limits{MaxArgs: 1 << 20, MaxBulk: 1 << 20, MaxInline: 1 << 20, MaxPending: 1 << 20}
		out, err := frFeedAll(l, in)
		want, ok := refSplitArgs(line)
		if !ok {
			if frErrText(err) != "Protocol error: unbalanced quotes in request" {
				t.Fatalf("line %q: got %q, %v; want unbalanced quotes", line, out, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		var wantOut []byte
		if len(want) > 0 {
			wantOut = fmt.Appendf(nil, "*%d\r\n", len(want))
			for _, a := range want {
				wantOut = fmt.Appendf(wantOut, "$%d\r\n%s\r\n", len(a), a)
			}
		}
		if !bytes.Equal(out, wantOut) {
			t.Fatalf("line %q: got %q, want %q", line, out, wantOut)
		}
	})
}

func frBenchPipeline() []byte {
	var b []byte
	for i := range 16 {
		b = append(b, frRESP("RL.PREDUCE", fmt.Sprintf("k:%06d", 123456+i), "100", "60000", "1")...)
	}
	return b
}

func BenchmarkFramerPipeline(b *testing.B) {
	in := frBenchPipeline()
	f := NewFramer(frTestLimits)
	out := make([]byte, 0, 2*len(in))
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		var err error
		if out, err = f.Feed(out[:0], in); err != nil || len(out) != len(in) {
			b.Fatal(err, len(out))
		}
	}
}

func BenchmarkFramerPipelineByteByByte(b *testing.B) {
	in := frBenchPipeline()
	f := NewFramer(frTestLimits)
	out := make([]byte, 0, 2*len(in))
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		out = out[:0]
		for i := range in {
			var err error
			if out, err = f.Feed(out, in[i:i+1]); err != nil {
				b.Fatal(err)
			}
		}
		if len(out) != len(in) {
			b.Fatal(len(out))
		}
	}
}

func BenchmarkFramerInline(b *testing.B) {
	in := bytes.Repeat([]byte("RL.PREDUCE k:123456 100 60000 1\r\n"), 16)
	f := NewFramer(frTestLimits)
	out := make([]byte, 0, 4*len(in))
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		var err error
		if out, err = f.Feed(out[:0], in); err != nil {
			b.Fatal(err)
		}
	}
}

// A command a node sends another is what the framer reads back.
func TestAppendCommand(t *testing.T) {
	args := [][]byte{[]byte("SLUICE.COUNTERHIT"), {0, 1, '\r', '\n'}, []byte("3"), {}}
	b := AppendCommand(nil, args)
	if want := "*4\r\n$17\r\nSLUICE.COUNTERHIT\r\n$4\r\n\x00\x01\r\n\r\n$1\r\n3\r\n$0\r\n\r\n"; string(b) != want {
		t.Fatalf("AppendCommand = %q, want %q", b, want)
	}
}
