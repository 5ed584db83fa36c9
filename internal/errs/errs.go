// Package errs is what can go wrong with a request, as a typed error: a
// Kind (the request's fault, the store's, the cluster's, a shutdown, a
// bug) and its details (which argument, which limit and by how much, the
// cause). Errors are made where they happen (argument parsing, the rule
// engine, the engine's calls to the store) and rendered at the edge, by
// each front end in its own protocol: a RESP error reply, a line-protocol
// ERR, an HTTP status, a gRPC code. Nothing in between reads an error's
// text.
//
// The package imports only the standard library, so that every layer may
// use it. An *Error is not changed once made and is safe for concurrent
// use.
package errs

import (
	"errors"
	"strconv"
)

// Kind is what an error means to whoever sent the request, whatever the
// protocol.
type Kind uint8

const (
	// Internal is an error not meant for clients (a bug): logged, and
	// answered "internal error".
	Internal Kind = iota
	// Request is the request's fault: a bad argument, a key over a
	// limit, a rule that cannot take the hit. Its message is the answer.
	Request
	// Forward is a counter hit the cluster could not apply for reasons
	// that are not the request's (the counter's owner unreachable, slow,
	// or refusing it): its message is the answer, but front ends answer
	// it as they answer a store that is unavailable.
	Forward
	// Shutdown: the server is shutting down.
	Shutdown
	// StoreUnavailable: writes to the data directory fail (disk full, I/O
	// error) and the store retries by itself.
	StoreUnavailable
	// StoreFailed: a write failed for good.
	StoreFailed
	// Corrupt: a stored record does not decode.
	Corrupt
	// StoreRead: reading a record failed.
	StoreRead
	// Failed is an operation of the server's own (a checkpoint, a
	// compaction) that failed for a reason its message gives, such as a
	// directory it cannot write.
	Failed
)

// StoreDown reports whether the kind means the store cannot serve now, as
// opposed to a bad request, a corrupt record or a shutdown: the errors
// --on-store-error allow lets a computed answer stand despite.
func (k Kind) StoreDown() bool {
	return k == StoreUnavailable || k == StoreFailed || k == StoreRead
}

// Logged reports whether an error of the kind is worth the server log
// (its answer says "see the server log").
func (k Kind) Logged() bool { return k == Internal || k == Corrupt || k == StoreRead }

// message is the fixed message of the kinds that have one.
func (k Kind) message() string {
	switch k {
	case Shutdown:
		return "server is shutting down"
	case StoreUnavailable:
		return "store unavailable: writes to the data directory are failing (disk full or I/O error); the server retries and takes changes again by itself"
	case StoreFailed:
		return "store unavailable: a write to the data directory failed; see the server log"
	case Corrupt:
		return "stored state is corrupt; see the server log"
	case StoreRead:
		return "store read failed; see the server log"
	}
	return "internal error"
}

// Error is a typed error. The zero Kind is Internal.
type Error struct {
	Kind Kind
	// Code is the error code of a RESP reply when it is not ERR, such as
	// CLUSTERDOWN or MOVED: Redis clients act on it. Other protocols put
	// it before the message.
	Code string
	// Arg names what was wrong: an argument ("max_burst", "AT"), a key
	// ("key", "value of actor field ip"), a request field. Empty when the
	// message says it.
	Arg string
	// Msg says what was wrong with Arg and what was expected; empty for
	// the kinds with a fixed message (Shutdown and the store's).
	Msg string
	// Limit is the flag whose bound Size broke, and Max that bound:
	// "--max-key-size", 20000, 16384.
	Limit     string
	Size, Max int64
	// Err is the cause, for errors.Is and As and the log.
	Err error
}

// Message is the error's text without its code, as each protocol's answer
// carries it: "<arg> is <size> bytes, longer than <limit> <max>", or
// "<arg>: <msg>", or the message alone.
func (e *Error) Message() string {
	switch {
	case e.Limit != "":
		return e.Arg + " is " + strconv.FormatInt(e.Size, 10) + " bytes, longer than " + e.Limit + " " + strconv.FormatInt(e.Max, 10)
	case e.Msg == "" || e.Kind == Internal:
		return e.Kind.message()
	case e.Arg != "":
		return e.Arg + ": " + e.Msg
	}
	return e.Msg
}

// Text is the message with a code that is not ERR before it, as the line
// protocol, /check and gRPC give it: "CLUSTERDOWN Hash slot not served".
func (e *Error) Text() string {
	if e.Code != "" {
		return e.Code + " " + e.Message()
	}
	return e.Message()
}

// Error returns Text, and the cause of an internal error, which has no
// message of its own.
func (e *Error) Error() string {
	if e.Kind == Internal && e.Err != nil {
		return e.Err.Error()
	}
	return e.Text()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Of returns the typed error err is or wraps; an error with none is
// Internal, with err as its cause. Of(nil) is nil.
func Of(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Kind: Internal, Err: err}
}

// KindOf is Of(err).Kind.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return Internal
}

// New is an error of kind k whose message is msg.
func New(k Kind, msg string) *Error { return &Error{Kind: k, Msg: msg} }

// Errors of Redis' own wording, for the arguments of commands.
var (
	// NotInteger: an integer argument did not parse or is out of range.
	NotInteger = New(Request, "value is not an integer or out of range")
	// Syntax: the arguments do not follow the command's grammar.
	Syntax = New(Request, "syntax error")
)

// WrongArgs is Redis' error for a wrong argument count of command cmd
// (its lower-case name).
func WrongArgs(cmd string) *Error {
	return New(Request, "wrong number of arguments for '"+cmd+"' command")
}

// Arg is the request's error in argument arg: "<arg>: <msg>".
func Arg(arg, msg string) *Error { return &Error{Kind: Request, Arg: arg, Msg: msg} }

// MaxKeySizeFlag is the flag that bounds a key.
const MaxKeySizeFlag = "--max-key-size"

// KeyTooLong refuses a key of size bytes, over the bound max
// (--max-key-size); what names the key: "key", "value of actor field ip".
// Every front end words it so.
func KeyTooLong(what string, size, max int) *Error {
	return &Error{Kind: Request, Arg: what, Limit: MaxKeySizeFlag, Size: int64(size), Max: int64(max)}
}
