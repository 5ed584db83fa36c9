// Package counterhit is SLUICE.COUNTERHIT's reply on the wire between the
// nodes of a cluster: the owner of a rule's counter encodes the outcome of
// a forwarded hit, and the node that forwarded it reads it back. It is
// pure: it reads from the reader it is given and holds no state; the
// connection to each node and the retries are clusternode's forwarder.
package counterhit

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"

	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/policy"
)

// ReplyLen is the length of SLUICE.COUNTERHIT's reply: allowed (1 or 0),
// credits left, seconds until reset, limit, retry after (ms), reset after
// (ms), the fields of policy.Outcome in that order; then, only when the
// owner applied another limit than the one sent (the actor's override
// there), that limit, Outcome.Rate. A hit without one keeps the reply of
// nodes from before overrides in cluster mode.
const ReplyLen = 6

// Reply is a SLUICE.COUNTERHIT reply: ReplyLen integers and Rate (-1 when
// the reply has none: the limit sent applied), or an error the owner
// answered (Err is a resp.Error).
type Reply struct {
	Ints [ReplyLen]int64
	Rate int64
	Err  error
}

// AppendReply appends o as SLUICE.COUNTERHIT's reply to a hit sent under
// limit: with o.Rate when that is another.
func AppendReply(dst []byte, o policy.Outcome, limit int64) []byte {
	allowed := int64(0)
	if o.Allowed {
		allowed = 1
	}
	n := ReplyLen
	if o.Rate != limit {
		n++
	}
	dst = resp.AppendArray(dst, n)
	dst = resp.AppendInt(dst, allowed)
	dst = resp.AppendInt(dst, o.CreditsLeft)
	dst = resp.AppendInt(dst, o.SecondsUntilReset)
	dst = resp.AppendInt(dst, o.Limit)
	dst = resp.AppendInt(dst, o.RetryAfterMs)
	dst = resp.AppendInt(dst, o.ResetAfterMs)
	if n > ReplyLen {
		dst = resp.AppendInt(dst, o.Rate)
	}
	return dst
}

// Outcome is the Outcome the reply carries, without Quota and Rule, which
// the node that forwarded the hit sets, its Rate the limit the owner
// applied: limit, the one the hit was sent under, unless the reply says
// another.
func (r Reply) Outcome(limit int64) policy.Outcome {
	o := policy.Outcome{Allowed: r.Ints[0] == 1, CreditsLeft: r.Ints[1], SecondsUntilReset: r.Ints[2],
		Limit: r.Ints[3], RetryAfterMs: r.Ints[4], ResetAfterMs: r.Ints[5], Rate: limit}
	if r.Rate >= 0 {
		o.Rate = r.Rate
	}
	return o
}

// ReadReply reads a reply of ReplyLen integers (and, after them, the limit
// applied, when the owner applied another), or an error reply. Its error
// is the reader's, or a reply of another shape. It allocates only for an
// error reply: its lines are read in r's buffer, which must hold the
// longest (bufio.ErrBufferFull otherwise).
func ReadReply(r *bufio.Reader) (Reply, error) {
	line, err := readLine(r)
	if err != nil {
		return Reply{}, err
	}
	n := 0
	switch {
	case len(line) > 0 && line[0] == '-':
		return Reply{Err: resp.Error(line[1:])}, nil
	case string(line) == replyHead:
		n = ReplyLen
	case string(line) == replyHeadRate:
		n = ReplyLen + 1
	default:
		return Reply{}, fmt.Errorf("unexpected reply %q", line)
	}
	rep := Reply{Rate: -1}
	for i := range rep.Ints {
		if rep.Ints[i], err = readInt(r); err != nil {
			return Reply{}, err
		}
	}
	if n > ReplyLen {
		if rep.Rate, err = readInt(r); err != nil {
			return Reply{}, err
		}
		if rep.Rate < 0 {
			return Reply{}, fmt.Errorf("unexpected limit applied %d", rep.Rate)
		}
	}
	return rep, nil
}

// The array headers of a reply without and with Rate.
var replyHead, replyHeadRate = "*" + strconv.Itoa(ReplyLen), "*" + strconv.Itoa(ReplyLen+1)

// readLine reads a line, without its CR LF, in r's buffer: valid until
// the next read.
func readLine(r *bufio.Reader) ([]byte, error) {
	l, err := r.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	return bytes.TrimRight(l, "\r\n"), nil
}

// readInt reads one integer element of a reply.
func readInt(r *bufio.Reader) (int64, error) {
	l, err := readLine(r)
	if err != nil {
		return 0, err
	}
	if len(l) < 2 || l[0] != ':' {
		return 0, fmt.Errorf("unexpected reply element %q", l)
	}
	n, ok := resp.ParseInt(l[1:])
	if !ok {
		return 0, fmt.Errorf("unexpected reply element %q", l)
	}
	return n, nil
}
