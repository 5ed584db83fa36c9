package counterhit

import (
	"bufio"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/policy"
)

// What the owner encodes, the forwarding node reads back; an error reply
// is the owner's text; anything else is an error, not an outcome.
func TestReplyRoundTrip(t *testing.T) {
	// sent is the limit the hit was sent under: a reply carries the
	// limit applied (Rate) only when it is another, an override's.
	for _, c := range []struct {
		o    policy.Outcome
		sent int64
		n    string
	}{
		{policy.Outcome{Allowed: true, CreditsLeft: 9, SecondsUntilReset: 60, Limit: 10, RetryAfterMs: 0, ResetAfterMs: 60000, Rate: 10}, 10, "*6"},
		{policy.Outcome{Allowed: false, CreditsLeft: 0, SecondsUntilReset: 1, Limit: 1 << 62, RetryAfterMs: 999, ResetAfterMs: -1, Rate: 1 << 62}, 1 << 62, "*6"},
		{policy.Outcome{Allowed: true, CreditsLeft: 99, SecondsUntilReset: 60, Limit: 100, RetryAfterMs: -1, ResetAfterMs: 60000, Rate: 100}, 3, "*7"},
		{policy.Outcome{Allowed: false, CreditsLeft: 0, SecondsUntilReset: -1, Limit: 0, RetryAfterMs: -1, ResetAfterMs: -1, Rate: 0}, 3, "*7"},
	} {
		o := c.o
		b := AppendReply(nil, o, c.sent)
		if !strings.HasPrefix(string(b), c.n+"\r\n") {
			t.Fatalf("%+v sent under %d: %q; want %s elements", o, c.sent, b, c.n)
		}
		r := bufio.NewReader(strings.NewReader(string(b) + "+next\r\n"))
		rep, err := ReadReply(r)
		if err != nil || rep.Err != nil || rep.Outcome(c.sent) != o {
			t.Fatalf("%q read as %+v, %v; want %+v", b, rep, err, o)
		}
		if line, _ := r.ReadString('\n'); line != "+next\r\n" {
			t.Fatalf("read past the reply: next line %q", line)
		}
	}
	rep, err := ReadReply(bufio.NewReader(strings.NewReader("-MOVED 12 10.0.0.2:9049\r\n")))
	if err != nil || rep.Err != resp.Error("MOVED 12 10.0.0.2:9049") {
		t.Fatalf("error reply read as %+v, %v", rep, err)
	}
	for _, bad := range []string{"*5\r\n", "+OK\r\n", "*6\r\n:1\r\n$1\r\n", "*6\r\n:1\r\n:x\r\n", "*6\r\n:1\r\n", "*7\r\n:1\r\n:0\r\n:1\r\n:3\r\n:-1\r\n:1\r\n:-5\r\n", "*8\r\n"} {
		if rep, err := ReadReply(bufio.NewReader(strings.NewReader(bad))); err == nil {
			t.Errorf("%q read as %+v, want an error", bad, rep)
		}
	}
}
