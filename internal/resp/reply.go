package resp

import (
	"strconv"

	"github.com/sluicehq/sluice/internal/errs"
)

// Reply encoders. Each appends one RESP value to b and returns it, so a
// whole pipeline's replies build up in one reused buffer without allocating.

// AppendSimple appends a simple string reply; s must not hold CR or LF.
func AppendSimple(b []byte, s string) []byte {
	b = append(b, '+')
	b = append(b, s...)
	return append(b, '\r', '\n')
}

// AppendError appends an error reply. CR and LF in msg, which may quote
// client input, become spaces so that a reply can never inject another.
func AppendError(b []byte, msg string) []byte {
	b = append(b, '-')
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return append(b, '\r', '\n')
}

// AppendInt appends an integer reply.
func AppendInt(b []byte, n int64) []byte {
	b = append(b, ':')
	b = strconv.AppendInt(b, n, 10)
	return append(b, '\r', '\n')
}

// AppendBulk appends a bulk string reply holding p.
func AppendBulk(b []byte, p []byte) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(p)), 10)
	b = append(b, '\r', '\n')
	b = append(b, p...)
	return append(b, '\r', '\n')
}

// AppendBulkString appends a bulk string reply holding s.
func AppendBulkString(b []byte, s string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, '\r', '\n')
	b = append(b, s...)
	return append(b, '\r', '\n')
}

// AppendArray starts an array of n elements, which the caller appends next.
func AppendArray(b []byte, n int) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '\r', '\n')
}

// AppendMap starts a map of n pairs: a RESP3 map, or a flat array of 2n
// elements in RESP2.
func AppendMap(b []byte, n int, resp3 bool) []byte {
	if !resp3 {
		return AppendArray(b, 2*n)
	}
	b = append(b, '%')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '\r', '\n')
}

// AppendNull appends a null: RESP3's, or RESP2's null bulk string.
func AppendNull(b []byte, resp3 bool) []byte {
	if resp3 {
		return append(b, '_', '\r', '\n')
	}
	return append(b, '$', '-', '1', '\r', '\n')
}

// AppendCommand appends args as a command, the way a client sends it: an
// array of bulk strings.
func AppendCommand(b []byte, args [][]byte) []byte {
	b = AppendArray(b, len(args))
	for _, a := range args {
		b = AppendBulk(b, a)
	}
	return b
}

// AppendErr appends e as an error reply: its code (ERR when it has none)
// and its message.
func AppendErr(b []byte, e *errs.Error) []byte { return AppendError(b, ErrorText(e)) }

// ErrorText is e as the text of an error reply, without the "-": "ERR
// syntax error", "CLUSTERDOWN Hash slot not served".
func ErrorText(e *errs.Error) string {
	if e.Code != "" {
		return e.Code + " " + e.Message()
	}
	return "ERR " + e.Message()
}
