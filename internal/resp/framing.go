// Package resp is sluice's side of the Redis serialization protocol: a
// framer that checks every byte a client sends and passes on only complete,
// canonical commands within limits (Framer), a reader of its output
// (NextCommand), and reply encoders that append to a caller's buffer
// (Append*). It does no I/O and knows nothing of commands; a Framer is for
// one connection, the functions are safe for concurrent use, and none of
// them allocates on the common path.
package resp

import (
	"fmt"
	"strconv"
)

// Limits bounds what one client may send; zero fields are invalid (callers fill defaults).
type Limits struct {
	MaxArgs    int   // most arguments in one command (multibulk count or inline tokens), e.g. 1024
	MaxBulk    int64 // most bytes in one bulk argument, e.g. 1 MiB
	MaxInline  int   // most bytes in one inline line, newline excluded, e.g. 64 KiB
	MaxPending int   // most bytes of one incomplete command held between reads, e.g. 8 MiB

	// Unauth words the errors for a client that has not authenticated:
	// these limits are then fixed ones, not the flags.
	Unauth bool
}

// flag names what sets a limit, for error messages.
func (l *Limits) flag(name string) string {
	if l.Unauth {
		return "for clients that have not authenticated; AUTH first"
	}
	return name
}

// protocolError is a framing violation. Error() returns a single line with no CR/LF, starting
// with "Protocol error: ", suitable as the text of a RESP error reply after "ERR ".
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return e.msg }

func framingErrorf(format string, args ...any) *protocolError {
	return &protocolError{msg: "Protocol error: " + fmt.Sprintf(format, args...)}
}

// frameMaxNumLen is the longest count or length we accept, in characters (sign included).
// Longer ones are malformed, so digit parsing is bounded.
const frameMaxNumLen = 20

// frameKeepBuf is the largest internal buffer kept for reuse; one huge command should not
// pin its memory for the life of the connection.
const frameKeepBuf = 64 << 10

type frameState uint8

const (
	fsStart   frameState = iota // between commands
	fsCount                     // after '*': reading the argument count
	fsCountLF                   // count ended by CR, expecting LF
	fsDollar                    // expecting the '$' of the next argument
	fsLen                       // reading a bulk length
	fsLenLF                     // length ended by CR, expecting LF
	fsData                      // reading bulk data
	fsDataCR                    // after bulk data, expecting CR
	fsDataLF                    // after bulk data and CR, expecting LF
	fsInline                    // inside an inline line
)

// frameInlineState follows Redis' sdssplitargs one byte at a time.
type frameInlineState uint8

const (
	fiBlank  frameInlineState = iota // between arguments
	fiToken                          // unquoted part of an argument
	fiDQ                             // inside "..."
	fiDQEsc                          // inside "..." after a backslash
	fiDQHex                          // inside "..." after \x
	fiDQHex2                         // inside "..." after \x and one hex digit
	fiSQ                             // inside '...'
	fiSQEsc                          // inside '...' after a backslash
	fiClosed                         // just after a closing quote
)

// Framer checks a client's byte stream incrementally and passes on only complete,
// canonical RESP multibulk commands within its limits; everything the client sends
// goes through it before any command is parsed, so malformed input can neither crash
// nor hang the server. Output and errors do not depend on how the stream is split into
// feeds, and work is linear in the input. For that reason MaxPending bounds every
// command, refused as soon as it is known to need more than MaxPending bytes before
// completing, even if it happens to arrive in one read. Not safe for concurrent use;
// one per connection.
type Framer struct {
	lim   Limits
	err   *protocolError
	state frameState

	// Count or bulk length being read; parsed once complete so it never overflows.
	num    [frameMaxNumLen]byte
	numLen int

	nargs     int   // arguments announced by the current multibulk
	argi      int   // arguments of it completed
	remaining int64 // bulk data bytes still expected

	// held keeps the canonical bytes of a multibulk command that spans feeds.
	held []byte

	// Inline line state. Arguments are decoded into args (ends marks where each
	// finished one ends) because the count must be written before them.
	ist     frameInlineState
	cr      bool // a CR that may yet turn out to end the line
	lineLen int
	hex     byte
	tokPos  int // where the current argument starts in args
	args    []byte
	ends    []int
}

// NewFramer returns a framer that enforces l.
func NewFramer(l Limits) *Framer {
	return &Framer{lim: l}
}

// SetLimits replaces the limits for the commands that follow, as AUTH
// lifts the small ones of a client that has not authenticated.
func (f *Framer) SetLimits(l Limits) { f.lim = l }

// Feed consumes p (the next bytes read from the client) and appends to out, in order,
// the canonical RESP encoding (`*N\r\n` then `$len\r\nbytes\r\n` per argument) of every
// command that p completes, and returns out. Bytes of a command that is not complete yet are
// kept inside the framer (copied; p may be reused by the caller) and emitted when it completes.
// On a violation it returns out holding every command completed before the violation and a
// *protocolError; after that the framer is dead and every later feed returns the same error
// and appends nothing.
func (f *Framer) Feed(out, p []byte) ([]byte, error) {
	out, _, err := f.FeedSome(out, p, false)
	return out, err
}

// FeedSome is Feed that, with one set, stops after the first command p completes and
// also returns how many bytes of p it consumed; the caller feeds the rest later (after
// running that command, which may change the limits). Without one it consumes all of p.
func (f *Framer) FeedSome(out, p []byte, one bool) ([]byte, int, error) {
	if f.err != nil {
		return out, 0, f.err
	}
	// The current command is written straight into out while it stays within this
	// feed; one already in progress continues in held, so no held byte is copied twice.
	held := f.state >= fsDollar && f.state <= fsDataLF
	w := out
	if held {
		w = f.held
	}
	start := len(w) // where the current command starts in w
	if held {
		start = 0
	}
	var err *protocolError
	i := 0
loop:
	for i < len(p) {
		done := false
		switch f.state {
		case fsStart:
			if p[i] != '*' {
				f.state = fsInline
				f.ist = fiBlank
				continue
			}
			if v, m := frameFastNum(p[i+1:]); m > 0 && v > 0 && v <= uint64(f.lim.MaxArgs) &&
				len(w)-start+1+m <= f.lim.MaxPending {
				w = append(w, '*')
				w = strconv.AppendUint(w, v, 10)
				w = append(w, '\r', '\n')
				i += 1 + m
				f.nargs = int(v)
				f.argi = 0
				f.state = fsDollar
				break
			}
			i++
			f.numLen = 0
			f.state = fsCount

		case fsCount:
			for i < len(p) {
				c := p[i]
				i++
				if c == '\r' {
					if f.numLen == 0 || f.numLen == 1 && f.num[0] == '-' {
						err = framingErrorf("invalid multibulk length")
						break loop
					}
					f.state = fsCountLF
					break
				}
				if !(c >= '0' && c <= '9' || c == '-' && f.numLen == 0) || f.numLen == frameMaxNumLen {
					err = framingErrorf("invalid multibulk length")
					break loop
				}
				f.num[f.numLen] = c
				f.numLen++
			}

		case fsCountLF:
			if p[i] != '\n' {
				err = framingErrorf("invalid multibulk length")
				break loop
			}
			i++
			if f.num[0] == '-' {
				f.state = fsStart // negative count: empty command, ignored like Redis
				break
			}
			n := frameNumValue(f.num[:f.numLen])
			if n == 0 {
				f.state = fsStart
				break
			}
			if n > uint64(f.lim.MaxArgs) {
				err = framingErrorf("%s arguments exceed the limit of %d (%s)",
					frameNumText(f.num[:f.numLen]), f.lim.MaxArgs, f.lim.flag("--max-args"))
				break loop
			}
			w = append(w, '*')
			w = strconv.AppendUint(w, n, 10)
			w = append(w, '\r', '\n')
			if len(w)-start > f.lim.MaxPending {
				err = f.pendingError()
				break loop
			}
			f.nargs = int(n)
			f.argi = 0
			f.state = fsDollar

		case fsDollar:
			if w, i, done = f.fastArgs(w, start, p, i); done {
				f.state = fsStart
				break
			}
			if i == len(p) {
				break
			}
			if c := p[i]; c != '$' {
				err = framingErrorf("expected '$', got '%s'", printableByte(c))
				break loop
			}
			i++
			f.numLen = 0
			f.state = fsLen

		case fsLen:
			for i < len(p) {
				c := p[i]
				i++
				if c == '\r' {
					if f.numLen == 0 {
						err = framingErrorf("invalid bulk length")
						break loop
					}
					f.state = fsLenLF
					break
				}
				if c < '0' || c > '9' || f.numLen == frameMaxNumLen {
					err = framingErrorf("invalid bulk length")
					break loop
				}
				f.num[f.numLen] = c
				f.numLen++
			}

		case fsLenLF:
			if p[i] != '\n' {
				err = framingErrorf("invalid bulk length")
				break loop
			}
			i++
			n := frameNumValue(f.num[:f.numLen])
			if n > uint64(f.lim.MaxBulk) {
				err = framingErrorf("bulk length %s exceeds the limit of %d (%s)",
					frameNumText(f.num[:f.numLen]), f.lim.MaxBulk, f.lim.flag("--max-bulk"))
				break loop
			}
			w = append(w, '$')
			w = strconv.AppendUint(w, n, 10)
			w = append(w, '\r', '\n')
			// Every data byte is held before the closing CRLF completes anything, so
			// the whole argument must fit: reject now rather than after buffering it.
			if uint64(len(w)-start)+n > uint64(f.lim.MaxPending) {
				err = f.pendingError()
				break loop
			}
			f.remaining = int64(n)
			if n == 0 {
				f.state = fsDataCR
			} else {
				f.state = fsData
			}

		case fsData:
			n := len(p) - i
			if int64(n) > f.remaining {
				n = int(f.remaining)
			}
			w = frameAppend(w, p[i:i+n])
			i += n
			f.remaining -= int64(n)
			if f.remaining == 0 {
				f.state = fsDataCR
			}

		case fsDataCR, fsDataLF:
			want := byte('\r')
			if f.state == fsDataLF {
				want = '\n'
			}
			if c := p[i]; c != want {
				err = framingErrorf(`expected '\r\n' after bulk data, got '%s'`, printableByte(c))
				break loop
			}
			i++
			if f.state == fsDataCR {
				f.state = fsDataLF
				break
			}
			w = append(w, '\r', '\n')
			f.argi++
			if f.argi < f.nargs {
				f.state = fsDollar
				break
			}
			f.state = fsStart
			done = true

		case fsInline:
			c := p[i]
			i++
			if f.cr {
				f.cr = false
				if c == '\n' {
					if w, err = f.endInline(w); err != nil {
						break loop
					}
					done = true
					break
				}
				if err = f.inlineByte('\r'); err != nil {
					break loop
				}
			}
			switch c {
			case '\n':
				if w, err = f.endInline(w); err != nil {
					break loop
				}
				done = true
			case '\r':
				f.cr = true
			default:
				if err = f.inlineByte(c); err != nil {
					break loop
				}
			}
		}
		if done {
			if held {
				if len(out) == 0 && cap(w) > cap(out) {
					// The first command of this feed: hand its buffer over
					// rather than copy a command that may be megabytes long.
					out, w = w, out[:0]
				} else {
					out = append(out, w...)
				}
				f.held = frameTrimBuf(w[:0])
				held = false
				w = out
			}
			start = len(w)
			if one {
				break loop
			}
		}
	}

	if err != nil {
		f.err = err
		f.held = nil
		f.args, f.ends = nil, nil
		if held {
			return out, i, err
		}
		return w[:start], i, err
	}
	if held {
		f.held = w
		return out, i, nil
	}
	if len(w) > start {
		f.held = append(f.held[:0], w[start:]...)
		w = w[:start]
	}
	return w, i, nil
}

// Between reports whether the framer is between commands: nothing of an
// incomplete command is held.
func (f *Framer) Between() bool {
	return f.state == fsStart && f.err == nil
}

// Trim lets go of internal buffers larger than keep; call it between
// commands, so an idle connection holds little whatever it sent before.
func (f *Framer) Trim(keep int) {
	if cap(f.held) > keep {
		f.held = nil
	}
	if cap(f.args) > keep {
		f.args = nil
	}
	if cap(f.ends)*8 > keep {
		f.ends = nil
	}
}

// Pending is the bytes held of an incomplete command.
func (f *Framer) Pending() int {
	if f.Between() {
		return 0
	}
	return len(f.held) + len(f.args)
}

// Footprint is the bytes of the framer's buffers.
func (f *Framer) Footprint() int {
	return cap(f.held) + cap(f.args) + 8*cap(f.ends)
}

// fastArgs consumes from p[i:] the arguments that are entirely present and well
// formed, the common case, and reports whether that completed the command. It leaves
// anything else, including every violation, to the byte-wise states.
func (f *Framer) fastArgs(w []byte, start int, p []byte, i int) ([]byte, int, bool) {
	for i < len(p) && p[i] == '$' {
		v, m := frameFastNum(p[i+1:])
		if m == 0 || v > uint64(f.lim.MaxBulk) || v > uint64(len(p)-i) {
			break
		}
		data := i + 1 + m
		end := data + int(v)
		// The raw header is at least as long as the canonical one, so this never
		// accepts what the byte-wise check would refuse.
		if end+2 > len(p) || p[end] != '\r' || p[end+1] != '\n' ||
			uint64(len(w)-start+1+m)+v > uint64(f.lim.MaxPending) {
			break
		}
		if p[i+1] != '0' || m == 3 {
			w = append(w, p[i:end+2]...) // already canonical
		} else {
			w = append(w, '$')
			w = strconv.AppendUint(w, v, 10)
			w = append(w, '\r', '\n')
			w = append(w, p[data:end+2]...)
		}
		i = end + 2
		f.argi++
		if f.argi == f.nargs {
			return w, i, true
		}
	}
	return w, i, false
}

// frameFastNum parses the common short form of a count or length, 1 to 18 digits then
// CRLF, at the start of p, returning its value and length; m is 0 if p does not
// start with one, and the caller falls back to the byte-wise states.
func frameFastNum(p []byte) (v uint64, m int) {
	j := 0
	for ; j < len(p) && j < 18; j++ {
		c := p[j]
		if c < '0' || c > '9' {
			break
		}
		v = v*10 + uint64(c-'0')
	}
	if j == 0 || j+1 >= len(p) || p[j] != '\r' || p[j+1] != '\n' {
		return 0, 0
	}
	return v, j + 2
}

func (f *Framer) pendingError() *protocolError {
	return framingErrorf("command exceeds the query buffer limit of %d bytes (%s)",
		f.lim.MaxPending, f.lim.flag("--max-query-buffer"))
}

// inlineByte takes one byte of an inline line (never the line's terminator).
func (f *Framer) inlineByte(c byte) *protocolError {
	f.lineLen++
	if f.lineLen > f.lim.MaxInline {
		return framingErrorf("too big inline request: line exceeds the limit of %d bytes (%s)",
			f.lim.MaxInline, f.lim.flag("--max-inline"))
	}
	if f.lineLen > f.lim.MaxPending {
		return f.pendingError()
	}
	for {
		switch f.ist {
		case fiBlank:
			if splitArgSpace(c) {
				return nil
			}
			if len(f.ends) >= f.lim.MaxArgs {
				return framingErrorf("inline request exceeds the limit of %d arguments (%s)",
					f.lim.MaxArgs, f.lim.flag("--max-args"))
			}
			f.tokPos = len(f.args)
			f.ist = fiToken
			continue // c is the argument's first byte
		case fiToken:
			// sdssplitargs ends an unquoted argument only on these; \v and \f stay in it.
			switch c {
			case ' ', '\t', '\r':
				f.ends = append(f.ends, len(f.args))
				f.ist = fiBlank
				return nil
			case '"':
				f.ist = fiDQ
				return nil
			case '\'':
				f.ist = fiSQ
				return nil
			}
			return f.argByte(c)
		case fiDQ:
			switch c {
			case '\\':
				f.ist = fiDQEsc
				return nil
			case '"':
				f.ist = fiClosed
				return nil
			}
			return f.argByte(c)
		case fiDQEsc:
			f.ist = fiDQ
			switch c {
			case 'x':
				f.ist = fiDQHex
				return nil
			case 'n':
				c = '\n'
			case 'r':
				c = '\r'
			case 't':
				c = '\t'
			case 'b':
				c = '\b'
			case 'a':
				c = '\a'
			}
			return f.argByte(c)
		case fiDQHex:
			if isHexDigit(c) {
				f.hex = c
				f.ist = fiDQHex2
				return nil
			}
			// Not \xHH: sdssplitargs keeps the x and reads on normally.
			f.ist = fiDQ
			if err := f.argByte('x'); err != nil {
				return err
			}
			continue
		case fiDQHex2:
			f.ist = fiDQ
			if isHexDigit(c) {
				return f.argByte(hexDigitValue(f.hex)<<4 | hexDigitValue(c))
			}
			if err := f.argByte('x'); err != nil {
				return err
			}
			if err := f.argByte(f.hex); err != nil {
				return err
			}
			continue
		case fiSQ:
			switch c {
			case '\\':
				f.ist = fiSQEsc
				return nil
			case '\'':
				f.ist = fiClosed
				return nil
			}
			return f.argByte(c)
		case fiSQEsc:
			f.ist = fiSQ
			if c == '\'' {
				return f.argByte(c)
			}
			if err := f.argByte('\\'); err != nil {
				return err
			}
			continue
		case fiClosed:
			if !splitArgSpace(c) {
				return framingErrorf("unbalanced quotes in request")
			}
			f.ends = append(f.ends, len(f.args))
			f.ist = fiBlank
			return nil
		}
	}
}

func (f *Framer) argByte(c byte) *protocolError {
	if int64(len(f.args)-f.tokPos) >= f.lim.MaxBulk {
		return framingErrorf("inline argument exceeds the limit of %d bytes (%s)", f.lim.MaxBulk, f.lim.flag("--max-bulk"))
	}
	f.args = append(f.args, c)
	return nil
}

// endInline finishes an inline line and appends its command, if any, to w.
func (f *Framer) endInline(w []byte) ([]byte, *protocolError) {
	switch f.ist {
	case fiToken, fiClosed:
		f.ends = append(f.ends, len(f.args))
	case fiBlank:
	default:
		return w, framingErrorf("unbalanced quotes in request")
	}
	if len(f.ends) > 0 {
		w = append(w, '*')
		w = strconv.AppendInt(w, int64(len(f.ends)), 10)
		w = append(w, '\r', '\n')
		pos := 0
		for _, end := range f.ends {
			w = append(w, '$')
			w = strconv.AppendInt(w, int64(end-pos), 10)
			w = append(w, '\r', '\n')
			w = append(w, f.args[pos:end]...)
			w = append(w, '\r', '\n')
			pos = end
		}
	}
	f.state = fsStart
	f.lineLen = 0
	f.args = frameTrimBuf(f.args)
	if cap(f.ends) > frameKeepBuf/8 {
		f.ends = nil
	} else {
		f.ends = f.ends[:0]
	}
	return w, nil
}

// frameAppend is append, except that a buffer that must grow doubles:
// append grows big slices by about 1.25×, which, while a command of
// megabytes arrives a read at a time, leaves about four times its size in
// garbage; doubling leaves at most its size.
func frameAppend(w, p []byte) []byte {
	if need := len(w) + len(p); need > cap(w) {
		grown := make([]byte, len(w), max(need, 2*cap(w)))
		copy(grown, w)
		w = grown
	}
	return append(w, p...)
}

func frameTrimBuf(b []byte) []byte {
	if cap(b) > frameKeepBuf {
		return nil
	}
	return b[:0]
}

// frameNumValue parses the digits in d (at most frameMaxNumLen), saturating at a value above any
// int64 rather than overflowing.
func frameNumValue(d []byte) uint64 {
	var v uint64
	for _, c := range d {
		if v >= 1e18 {
			return 1<<64 - 1
		}
		v = v*10 + uint64(c-'0')
	}
	return v
}

// frameNumText is the number in d as it should be shown: without leading zeros.
func frameNumText(d []byte) string {
	for len(d) > 1 && d[0] == '0' {
		d = d[1:]
	}
	return string(d)
}

// printable shows c in an error message without ever putting raw control bytes in it.
func printableByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return string(rune(c))
	}
	return fmt.Sprintf(`\x%02x`, c)
}

// splitArgSpace is C's isspace in the C locale, which sdssplitargs uses between arguments.
func splitArgSpace(c byte) bool {
	return c == ' ' || c >= '\t' && c <= '\r'
}

func isHexDigit(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func hexDigitValue(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// NextCommand splits the first command off cmds, a Framer's output, into
// args (reused) and returns the rest. The framer has checked every byte
// and written canonical RESP, `*N\r\n` then `$len\r\nbytes\r\n` per
// argument, so this only reads the lengths back; each argument is a slice
// of cmds, capped so that appending to it cannot touch the next.
func NextCommand(cmds []byte, args [][]byte) ([][]byte, []byte) {
	i := 1
	n := 0
	for ; cmds[i] != '\r'; i++ {
		n = n*10 + int(cmds[i]-'0')
	}
	i += 2
	args = args[:0]
	for range n {
		l := 0
		for i++; cmds[i] != '\r'; i++ {
			l = l*10 + int(cmds[i]-'0')
		}
		i += 2
		args = append(args, cmds[i:i+l:i+l])
		i += l + 2
	}
	return args, cmds[i:]
}
