package client

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The kinds of error a call can return, to be checked with errors.Is.
var (
	// ErrUnavailable: sluice could not answer. It could not be reached, or
	// the call timed out or was cancelled (the error also wraps the
	// context's error), or sluice answered that its store cannot serve
	// ("ERR store unavailable: ...", "ERR store read failed; ...", "ERR
	// stored state is corrupt; ...", "ERR server is shutting down", "ERR
	// max number of clients reached", "ERR internal error", ...). The
	// request was not decided: fail open or closed.
	ErrUnavailable = errors.New("client: sluice is unavailable")
	// ErrAuth: sluice refused the connection's credentials or lack of them
	// (NOAUTH, WRONGPASS, DENIED in protected mode): a configuration error.
	ErrAuth = errors.New("client: sluice refused authentication")
	// ErrArgument: a parameter out of range, refused by this package
	// before anything was sent or by sluice ("ERR max_burst: -1: want 0 or
	// more", "ERR key is 16385 bytes, longer than --max-key-size 16384",
	// ...). Nothing was counted.
	ErrArgument = errors.New("client: invalid argument")
	// ErrUnsupported: the server does not know the command ("ERR unknown
	// command": an older sluice, or a Redis), HIT without a loaded policy,
	// or a reply that is not a sluice reply.
	ErrUnsupported = errors.New("client: not supported by the server")
)

// Error is the error of every call. errors.Is(err, ErrUnavailable) (or
// ErrAuth, ErrArgument, ErrUnsupported) tells its kind; errors.As finds the
// go-redis or network error it wraps, if any.
type Error struct {
	Kind    error  // ErrUnavailable, ErrAuth, ErrArgument or ErrUnsupported
	Command string // the command, such as "FW.PINCR"
	// Err is the server's error reply (a redis.Error), the transport's
	// error, or nil when this package refused the call itself.
	Err error
	// Msg says what was wrong when Err is nil.
	Msg string
}

// Error says the kind, the command and what went wrong.
func (e *Error) Error() string {
	text := e.Msg
	if e.Err != nil {
		text = e.Err.Error()
	}
	return e.Kind.Error() + ": " + e.Command + ": " + text
}

// Is reports whether target is e's kind.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap returns the go-redis or transport error.
func (e *Error) Unwrap() error { return e.Err }

// argError is a parameter this package refuses before sending anything.
func argError(cmd, msg string) error {
	return &Error{Kind: ErrArgument, Command: cmd, Msg: msg}
}

// classify wraps the error of a go-redis call in an *Error of its kind.
func classify(cmd string, err error) error {
	var re redis.Error
	if !errors.As(err, &re) || errors.Is(err, redis.Nil) {
		if errors.Is(err, redis.Nil) {
			return &Error{Kind: ErrUnsupported, Command: cmd, Err: err}
		}
		// Dial and I/O errors, timeouts, a cancelled context, a closed
		// pool: no answer.
		return &Error{Kind: ErrUnavailable, Command: cmd, Err: err}
	}
	return &Error{Kind: replyKind(re.Error()), Command: cmd, Err: err}
}

// replyKind sorts an error reply by its text, as sluice words it
// (docs/protocol.md, "Errors" of each command family, and the built-in
// commands). Only the server-side failures are listed: any other ERR is an
// argument error, since every argument error sluice answers starts with ERR
// and names the argument.
func replyKind(text string) error {
	code, rest, _ := strings.Cut(text, " ")
	switch code {
	case "NOAUTH", "WRONGPASS", "NOPERM", "DENIED":
		return ErrAuth
	case "ERR":
	default:
		// LOADING, BUSY, MASTERDOWN, TRYAGAIN, CLUSTERDOWN and codes this
		// package does not know: the server cannot answer now.
		return ErrUnavailable
	}
	for _, p := range unavailableReplies {
		if strings.HasPrefix(rest, p) {
			return ErrUnavailable
		}
	}
	switch {
	case strings.HasPrefix(rest, "unknown command"), strings.HasPrefix(rest, "no policy loaded"):
		return ErrUnsupported
	case strings.HasPrefix(rest, "AUTH "):
		return ErrAuth
	}
	return ErrArgument
}

// unavailableReplies start sluice's error replies (after "ERR ") that mean
// it cannot answer now, whatever the arguments.
var unavailableReplies = []string{
	"store unavailable",              // the store refuses writes (disk full, failed write)
	"store read failed",              // a read from disk failed
	"stored state is corrupt",        // this key's record cannot be decoded
	"stored bucket state is corrupt", // the same, as docs/protocol.md words it for RL
	"server is shutting down",        // the store is closed
	"internal error",                 // a bug, logged by sluice
	"max number of clients",          // --maxclients reached
	"client memory limit reached",    // --maxmemory-clients
	"reply buffer limit reached",     // --max-reply-buffer
}
