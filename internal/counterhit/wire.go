// Package counterhit is SLUICE.COUNTERHIT's reply on the wire between the
// nodes of a cluster: the owner of a rule's counter encodes the outcome of
// a forwarded hit, and the node that forwarded it reads it back. It is
// pure: it reads from the reader it is given and holds no state; the
// connections, the pool and the retries are server's forwarder.
package counterhit

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/policy"
)

// ReplyLen is the length of SLUICE.COUNTERHIT's reply: allowed (1 or 0),
// credits left, seconds until reset, limit, retry after (ms), reset after
// (ms), the fields of policy.Outcome in that order.
const ReplyLen = 6

// Reply is a SLUICE.COUNTERHIT reply: ReplyLen integers, or an error the
// owner answered (Err is a resp.Error).
type Reply struct {
	Ints [ReplyLen]int64
	Err  error
}

// AppendReply appends o as SLUICE.COUNTERHIT's reply.
func AppendReply(dst []byte, o policy.Outcome) []byte {
	allowed := int64(0)
	if o.Allowed {
		allowed = 1
	}
	dst = resp.AppendArray(dst, ReplyLen)
	dst = resp.AppendInt(dst, allowed)
	dst = resp.AppendInt(dst, o.CreditsLeft)
	dst = resp.AppendInt(dst, o.SecondsUntilReset)
	dst = resp.AppendInt(dst, o.Limit)
	dst = resp.AppendInt(dst, o.RetryAfterMs)
	return resp.AppendInt(dst, o.ResetAfterMs)
}

// Outcome is the Outcome the reply carries, without Quota and Rule, which
// the node that forwarded the hit sets.
func (r Reply) Outcome() policy.Outcome {
	return policy.Outcome{Allowed: r.Ints[0] == 1, CreditsLeft: r.Ints[1], SecondsUntilReset: r.Ints[2],
		Limit: r.Ints[3], RetryAfterMs: r.Ints[4], ResetAfterMs: r.Ints[5]}
}

// ReadReply reads a reply of ReplyLen integers, or an error reply. Its
// error is the reader's, or a reply of another shape.
func ReadReply(r *bufio.Reader) (Reply, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return Reply{}, err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "-"):
		return Reply{Err: resp.Error(line[1:])}, nil
	case line != "*"+strconv.Itoa(ReplyLen):
		return Reply{}, fmt.Errorf("unexpected reply %q", line)
	}
	var rep Reply
	for i := range rep.Ints {
		l, err := r.ReadString('\n')
		if err != nil {
			return Reply{}, err
		}
		l = strings.TrimRight(l, "\r\n")
		if len(l) < 2 || l[0] != ':' {
			return Reply{}, fmt.Errorf("unexpected reply element %q", l)
		}
		n, err := strconv.ParseInt(l[1:], 10, 64)
		if err != nil {
			return Reply{}, fmt.Errorf("unexpected reply element %q", l)
		}
		rep.Ints[i] = n
	}
	return rep, nil
}
