package clusternode

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
)

// TestForwardErrorKeepsItsReplyText: a forwarding failure is of kind
// errs.Forward and still tells RESP clients its reply text unchanged; an
// owner's reply that the request's hit caused stays a plain reply error,
// any other owner reply is a forwarding failure.
func TestForwardErrorKeepsItsReplyText(t *testing.T) {
	rendered := func(err error) string { return resp.ErrorText(engine.Typed(err)) }
	const text = "ERR cluster: forwarding a counter of slot 7 to its owner 10.0.0.1:9049 failed: i/o timeout"
	err := forwardErr("", strings.TrimPrefix(text, "ERR "))
	if errs.KindOf(err) != errs.Forward || rendered(err) != text {
		t.Errorf("forwardErr: Forward %v, text %q; want true, %q", errs.KindOf(err) == errs.Forward, rendered(err), text)
	}
	if code := status.Code(envoy.StatusErr(engine.Typed(err), 0)); code != codes.Unavailable {
		t.Errorf("forwardErr as a gRPC status: %v; want Unavailable", code)
	}
	for _, tc := range []struct {
		reply   string
		forward bool
	}{
		{"ERR hits: 2; a slidingLog rule records one hit at a time (hits 0 or 1)", false},
		{"ERR rule arithmetic out of range: quantity: 9: too large", false},
		{"CLUSTERDOWN Hash slot not served", true},
		{"ERR store unavailable: writes to the data directory are failing", true},
		{"ERR server is shutting down", true},
		{"ERR cluster: this node has no rule with the counter identity of the sender's rule 3", true},
	} {
		err := ownerErr(tc.reply)
		if (errs.KindOf(err) == errs.Forward) != tc.forward || rendered(err) != tc.reply {
			t.Errorf("owner reply %q: forwarding failure %v, text %q; want %v and the reply", tc.reply, errs.KindOf(err) == errs.Forward, rendered(err), tc.forward)
		}
	}
}
