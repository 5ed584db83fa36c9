package resp

import "math"

// The conventions of Redis' commands that every command family shares:
// how arguments are read, and the RESP front end's own errors (package
// errs has the typed errors of the requests every front end serves).

// Error is an error of the RESP front end itself whose text is the RESP
// error reply, "ERR ..." or another Redis error code (NOAUTH, MOVED): the
// request's fault, told to the client as is.
type Error string

func (e Error) Error() string { return string(e) }

// Preview is an argument as an error message may quote it: at most 128
// bytes of it.
func Preview(a []byte) string {
	if len(a) > 128 {
		a = a[:128]
	}
	return string(a)
}

// ParseInt parses a decimal int64: optional surrounding ASCII whitespace, an
// optional sign, digits only, overflow is an error.
func ParseInt(b []byte) (int64, bool) {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	neg := false
	if len(b) > 0 && (b[0] == '+' || b[0] == '-') {
		neg = b[0] == '-'
		b = b[1:]
	}
	if len(b) == 0 {
		return 0, false
	}
	// Accumulate as a negative number so that MinInt64 parses.
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if n < (math.MinInt64+d)/10 {
			return 0, false
		}
		n = n*10 - d
	}
	if neg {
		return n, true
	}
	if n == math.MinInt64 {
		return 0, false
	}
	return -n, true
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

// EqualFold compares b with a lower-case ASCII word, ignoring case.
func EqualFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// OneLine keeps an error message fit for a one-line reply: its line ends
// become spaces.
func OneLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '\r' || c == '\n' {
			b[i] = ' '
		}
	}
	return string(b)
}
