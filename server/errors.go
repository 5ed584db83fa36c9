package server

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// Errors become replies here, and only here. Handlers of every protocol
// return Go errors; classify says what an error means to whoever sent the
// request (errKind), failure words it once (logging and counting what
// needs it), and each protocol renders the kind its own way: a RESP error
// reply (errorText), a line-protocol ERR (lineReason), an HTTP status
// (checkHTTPStatus) and a gRPC status (rlsStatusErr).

// errKind is what an error means for a reply, whatever the protocol.
type errKind uint8

const (
	// kindInternal is an error not meant for clients: logged, and answered
	// "ERR internal error".
	kindInternal errKind = iota
	// kindClient is the request's fault (a resp.Error): its text is the reply.
	kindClient
	// kindForward is a counter hit the cluster could not apply for reasons
	// that are not the request's (a forwardErr): its text is the reply, but
	// front ends answer it as a store that is unavailable.
	kindForward
	// kindShutdown is storage.ErrClosed: the server is shutting down.
	kindShutdown
	// kindStoreUnavailable is storage.ErrUnavailable: writes are failing
	// (disk full, I/O error) and the store retries by itself.
	kindStoreUnavailable
	// kindStoreFailed is storage.ErrFailed: a write failed for good.
	kindStoreFailed
	// kindCorrupt is a stored record that does not decode (errCorruptState).
	kindCorrupt
	// kindStoreRead is any other error of reading a record (errStoreRead).
	kindStoreRead
)

// storeDown reports whether the kind means the store cannot serve now, as
// opposed to a bad request, a corrupt record or a shutdown: the errors
// --on-store-error allow lets a computed reply stand despite.
func (k errKind) storeDown() bool {
	return k == kindStoreUnavailable || k == kindStoreFailed || k == kindStoreRead
}

var (
	errCorruptState = errors.New("corrupt stored state")
	errStoreRead    = errors.New("store read")
)

// classify is the one classifier of errors into reply kinds. A resp.Error
// (the request's fault) comes first: its text is the reply whatever else
// the error wraps.
func classify(err error) errKind {
	var re resp.Error
	switch {
	case errors.As(err, &re):
		if errors.Is(err, errForward) {
			return kindForward
		}
		return kindClient
	case errors.Is(err, storage.ErrClosed):
		return kindShutdown
	case errors.Is(err, storage.ErrUnavailable):
		return kindStoreUnavailable
	case errors.Is(err, storage.ErrFailed):
		return kindStoreFailed
	case errors.Is(err, errCorruptState):
		return kindCorrupt
	case errors.Is(err, errStoreRead):
		return kindStoreRead
	}
	return kindInternal
}

// failure classifies err and words it as the text of a RESP error reply,
// which the other protocols derive theirs from. Errors that are not meant
// for clients are logged and answered generically; store errors are
// counted.
func (s *Server) failure(err error) (errKind, string) {
	k := classify(err)
	switch k {
	case kindClient, kindForward:
		var re resp.Error
		errors.As(err, &re)
		return k, string(re)
	case kindShutdown:
		return k, "ERR server is shutting down"
	case kindStoreUnavailable:
		s.stats.storeErrors.Add(1)
		return k, "ERR store unavailable: writes to the data directory are failing (disk full or I/O error); the server retries and takes changes again by itself"
	case kindStoreFailed:
		s.stats.storeErrors.Add(1)
		return k, "ERR store unavailable: a write to the data directory failed; see the server log"
	case kindCorrupt:
		s.stats.storeErrors.Add(1)
		s.log.Error("stored state is corrupt", "err", err)
		return k, "ERR stored state is corrupt; see the server log"
	case kindStoreRead:
		s.stats.storeErrors.Add(1)
		s.log.Error("store read failed", "err", err)
		return k, "ERR store read failed; see the server log"
	}
	s.log.Error("internal error", "err", err)
	return k, "ERR internal error"
}

// errorText renders err as the text of a RESP error reply.
func (s *Server) errorText(err error) string {
	_, t := s.failure(err)
	return t
}

// replyMessage is a reply's text without RESP's "ERR " prefix, for the
// protocols that have their own way of saying it is an error.
func replyMessage(text string) string {
	if len(text) > 4 && text[:4] == "ERR " {
		text = text[4:]
	}
	return text
}

// lineReason renders err as the quoted reason of a line-protocol ERR.
func (s *Server) lineReason(err error) string {
	return divvyReason(s.errorText(err))
}

// divvyReason is the quoted part of a line-protocol ERR for a server error:
// the reply's text without its "ERR " and without characters the line
// cannot hold.
func divvyReason(text string) string {
	b := []byte(replyMessage(text))
	for i, c := range b {
		if c == '"' || c == '\n' || c == '\r' {
			b[i] = '\''
		}
	}
	return string(b)
}

// checkHTTPStatus is /check's HTTP status for a hit that failed: 503, with
// Retry-After, whatever the kind. sluice could not decide, and the proxy's
// own failure policy takes over; a request /check can refuse as malformed
// is refused before any hit (400, validateCheckRequest), so an error of
// the hit itself is the rule's or the store's, never the request's.
func checkHTTPStatus(errKind) int { return http.StatusServiceUnavailable }

// rlsCode is the gRPC code of a rate limit call that failed: Unavailable
// for the store, a shutdown or a cluster that could not apply a counter's
// hit (Envoy's failure_mode_deny decides), InvalidArgument for a hit the
// rule cannot take.
func rlsCode(k errKind) codes.Code {
	if k == kindClient {
		return codes.InvalidArgument
	}
	return codes.Unavailable
}

// rlsStatusErr renders an evaluation or commit error as a gRPC status;
// i >= 0 names the descriptor it came from.
func rlsStatusErr(s *Server, i int, err error) error {
	k, t := s.failure(err)
	msg := replyMessage(t)
	if i >= 0 {
		msg = "descriptor " + strconv.Itoa(i) + ": " + msg
	}
	return status.Error(rlsCode(k), msg)
}

// allowDespite reports whether n replies computed despite store error err
// stand, as AllowOnStoreError asks, and counts them.
func (s *Server) allowDespite(err error, n int) bool {
	if !s.cfg.AllowOnStoreError || !classify(err).storeDown() {
		return false
	}
	s.stats.storeAllowed.Add(int64(n))
	return true
}

// wrapStoreErr marks an error of the store's records (a Modify, a read) so
// that classify can tell a corrupt record from a failed read; the store's
// own conditions and replies pass as they are.
func wrapStoreErr(err error) error {
	switch classify(err) {
	case kindShutdown, kindStoreFailed, kindStoreUnavailable, kindClient, kindForward:
		return err
	}
	if errors.Is(err, bucket.ErrCorrupt) || errors.Is(err, policy.ErrCorrupt) {
		return fmt.Errorf("%w: %w", errCorruptState, err)
	}
	return fmt.Errorf("%w: %w", errStoreRead, err)
}

// maintenanceErr turns an error of a maintenance command into a reply: the
// store's own conditions as for every command, anything else logged.
func (s *Server) maintenanceErr(what string, err error) error {
	switch classify(err) {
	case kindShutdown, kindStoreFailed, kindStoreUnavailable:
		return err
	}
	s.log.Error(what+" failed", "err", err)
	return resp.Error("ERR " + what + " failed: " + err.Error())
}

// errForward is what errors.Is finds in every error of a counter hit the
// cluster could not apply for reasons that are not the request's: the
// counter's owner unreachable or slower than the forward timeout, its
// slot not served, or the owner refusing the hit (another rule set, a
// store that takes no writes, a shutdown). Front ends answer it as they
// answer a store that is unavailable (Envoy's UNAVAILABLE, /check's 503),
// not as a bad request.
var errForward = errors.New("server: counter hit not applied by the cluster")

// forwardErr is such an error. Its text is the RESP error reply, as a
// resp.Error's: classify finds the resp.Error through Unwrap, so HIT, the
// line protocol and /check tell clients the same text as before.
type forwardErr struct{ reply resp.Error }

func (e forwardErr) Error() string   { return string(e.reply) }
func (e forwardErr) Unwrap() []error { return []error{e.reply, errForward} }

// ownerErr is the error of an owner's error reply msg (without its "-"):
// a resp.Error, as this node would have answered, when the hit itself is
// what the rule cannot take (policy.ErrHits or arithmetic out of range,
// rules.Err's texts), else a forwardErr.
func ownerErr(msg string) error {
	if strings.HasPrefix(msg, "ERR hits: ") || strings.HasPrefix(msg, "ERR rule arithmetic out of range") {
		return resp.Error(msg)
	}
	return forwardErr{resp.Error(msg)}
}
