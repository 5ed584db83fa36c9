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
	for _, o := range []policy.Outcome{
		{Allowed: true, CreditsLeft: 9, SecondsUntilReset: 60, Limit: 10, RetryAfterMs: 0, ResetAfterMs: 60000},
		{Allowed: false, CreditsLeft: 0, SecondsUntilReset: 1, Limit: 1 << 62, RetryAfterMs: 999, ResetAfterMs: -1},
	} {
		b := AppendReply(nil, o)
		r := bufio.NewReader(strings.NewReader(string(b) + "+next\r\n"))
		rep, err := ReadReply(r)
		if err != nil || rep.Err != nil || rep.Outcome() != o {
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
	for _, bad := range []string{"*5\r\n", "+OK\r\n", "*6\r\n:1\r\n$1\r\n", "*6\r\n:1\r\n:x\r\n", "*6\r\n:1\r\n"} {
		if rep, err := ReadReply(bufio.NewReader(strings.NewReader(bad))); err == nil {
			t.Errorf("%q read as %+v, want an error", bad, rep)
		}
	}
}
