package server

import (
	"errors"
	"strings"
)

// errForward is what errors.Is finds in every error of a counter hit the
// cluster could not apply for reasons that are not the request's: the
// counter's owner unreachable or slower than the forward timeout, its
// slot not served, or the owner refusing the hit (another rule set, a
// store that takes no writes, a shutdown). Front ends answer it as they
// answer a store that is unavailable (Envoy's UNAVAILABLE, /check's 503),
// not as a bad request.
var errForward = errors.New("server: counter hit not applied by the cluster")

// forwardErr is such an error. Its text is the RESP error reply, as a
// replyErr's: errorText finds the replyErr through Unwrap, so HIT, the
// line protocol and /check tell clients the same text as before.
type forwardErr struct{ reply replyErr }

func (e forwardErr) Error() string   { return string(e.reply) }
func (e forwardErr) Unwrap() []error { return []error{e.reply, errForward} }

// ownerErr is the error of an owner's error reply msg (without its "-"):
// a replyErr, as this node would have answered, when the hit itself is
// what the rule cannot take (policy.ErrHits or arithmetic out of range,
// hitErr's texts), else a forwardErr.
func ownerErr(msg string) error {
	if strings.HasPrefix(msg, "ERR hits: ") || strings.HasPrefix(msg, "ERR rule arithmetic out of range") {
		return replyErr(msg)
	}
	return forwardErr{replyErr(msg)}
}
