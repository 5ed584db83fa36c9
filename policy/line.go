package policy

import (
	"bytes"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Error codes of the line protocol, as divvy clients and the
// divvy_errors_total metric know them.
const (
	CodeUnknownCommand = "unknown-command"
	CodeUnknown        = "unknown"
)

// ProtocolError is a request the line protocol cannot execute. The server
// answers it with AppendReply and then closes the connection.
type ProtocolError struct {
	Code   string // CodeUnknownCommand or CodeUnknown
	Reason string
}

// Error returns "policy: code: reason"; the wire form is AppendReply's.
func (e *ProtocolError) Error() string { return "policy: " + e.Code + ": " + e.Reason }

// AppendReply appends the line protocol's reply: ERR, the code, and the
// reason in double quotes, e.g. `ERR unknown "line too long"` and a newline.
// The reason is not escaped, as in divvy.
func (e *ProtocolError) AppendReply(dst []byte) []byte {
	dst = append(dst, "ERR "...)
	dst = append(dst, e.Code...)
	dst = append(dst, " \""...)
	dst = append(dst, e.Reason...)
	return append(dst, "\"\n"...)
}

// Command is what a line asks for.
type Command uint8

const (
	// CmdNone: the line is blank and must be ignored, without a reply.
	CmdNone Command = iota
	// CmdHit: check and take a credit for the request.
	CmdHit
)

// ParseLine parses one line of the line protocol, with or without its "\n"
// or "\r\n". The request's fields are appended to dst[:0] and alias line.
// A non-nil error is a *ProtocolError.
//
// The command word runs to the first white space and is case-insensitive;
// HIT is the only command. Then come key=value tokens separated by white
// space. A key or value is either quoted, `"` up to the next `"` (no escape,
// no newline inside), or unquoted: any bytes but white space, `=` and `"`.
// Both may be empty. White space is ASCII: space, \t, \n, \v, \f, \r.
func ParseLine(line []byte, dst Request) (Command, Request, error) {
	dst = dst[:0]
	s := trimSpace(line)
	if len(s) == 0 {
		return CmdNone, dst, nil
	}
	i := 0
	for i < len(s) && !isSpace(s[i]) {
		i++
	}
	if !isHitWord(s[:i]) {
		return CmdNone, dst, &ProtocolError{Code: CodeUnknownCommand, Reason: "Unrecognized command: " + upperASCII(s[:i])}
	}
	req, err := parseFields(trimSpace(s[i:]), dst)
	if err != nil {
		return CmdNone, dst, err
	}
	return CmdHit, req, nil
}

// parseFields reads the key=value tokens of a HIT line, which has no
// leading or trailing white space. The messages are divvy's.
func parseFields(s []byte, dst Request) (Request, error) {
	for len(s) > 0 {
		var f Field
		var err error
		if f.Key, s, err = readString(s); err != nil {
			return nil, err
		}
		if len(s) == 0 {
			return nil, parseError("Unexpected end of input string.")
		}
		if s[0] != '=' {
			return nil, parseError(fmt.Sprintf("Expected '=', found '%s'", firstRune(s)))
		}
		if f.Value, s, err = readString(s[1:]); err != nil {
			return nil, err
		}
		dst = append(dst, f)
		if len(s) > 0 && !isSpace(s[0]) {
			return nil, parseError(fmt.Sprintf("Expected whitespace, found '%s'", firstRune(s)))
		}
		s = trimSpace(s)
	}
	return dst, nil
}

// readString reads a quoted or unquoted string at the start of s.
func readString(s []byte) (str, rest []byte, err error) {
	if len(s) > 0 && s[0] == '"' {
		end := bytes.IndexAny(s[1:], "\"\n")
		if end < 0 || s[1+end] != '"' {
			return nil, nil, parseError("Unexpected end of quoted string.")
		}
		return s[1 : 1+end], s[2+end:], nil
	}
	i := 0
	for ; i < len(s) && !isSpace(s[i]) && s[i] != '='; i++ {
		if s[i] == '"' {
			// divvy's README: an unquoted string is /^[^"=\s]+$/.
			return nil, nil, parseError("Unexpected '\"' in unquoted string.")
		}
	}
	return s[:i], s[i:], nil
}

func parseError(reason string) error { return &ProtocolError{Code: CodeUnknown, Reason: reason} }

// ParseArgs reads the arguments of HIT over RESP, one key=value pair each,
// into dst[:0]. An argument is split at its first `=`: keys cannot hold one,
// values can; there is no quoting, RESP being binary-safe. The fields alias
// args. A non-nil error is a *ProtocolError.
func ParseArgs(args [][]byte, dst Request) (Request, error) {
	dst = dst[:0]
	for i, a := range args {
		j := bytes.IndexByte(a, '=')
		if j < 0 {
			return dst[:0], parseError(fmt.Sprintf("argument %d is not key=value", i+1))
		}
		dst = append(dst, Field{Key: a[:j], Value: a[j+1:]})
	}
	return dst, nil
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

func trimSpace(s []byte) []byte {
	for len(s) > 0 && isSpace(s[0]) {
		s = s[1:]
	}
	for len(s) > 0 && isSpace(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}

func isHitWord(w []byte) bool {
	return len(w) == 3 && w[0]|0x20 == 'h' && w[1]|0x20 == 'i' && w[2]|0x20 == 't'
}

func upperASCII(w []byte) string {
	b := []byte(string(w))
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// firstRune shows the first character of s in a message; control
// characters are escaped so that the reply stays on one line.
func firstRune(s []byte) string {
	r, n := utf8.DecodeRune(s)
	if r != utf8.RuneError && !unicode.IsPrint(r) {
		q := strconv.QuoteRune(r)
		return q[1 : len(q)-1]
	}
	return string(s[:n])
}
