package server

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/storage"
)

// TestErrorKinds pins what every protocol answers for each kind of error:
// classify is the one classifier, and the RESP text, the line protocol's
// reason, /check's status and the rate limit service's gRPC code are
// renderings of its kind.
func TestErrorKinds(t *testing.T) {
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	fwd := forwardErr{resp.Error("ERR cluster: forwarding a counter of slot 7 to its owner a:1 failed: refused")}
	for _, tc := range []struct {
		err  error
		kind errKind
		resp string
		line string
		code codes.Code
		down bool // AllowOnStoreError lets a reply stand despite it
	}{
		{resp.ErrSyntax, kindClient, "ERR syntax error", "syntax error", codes.InvalidArgument, false},
		{fmt.Errorf("hit: %w", resp.Error(`ERR hits: "x"`)), kindClient, `ERR hits: "x"`, `hits: 'x'`, codes.InvalidArgument, false},
		{resp.Error("CROSSSLOT Keys in request don't hash to the same slot"), kindClient, "CROSSSLOT Keys in request don't hash to the same slot", "CROSSSLOT Keys in request don't hash to the same slot", codes.InvalidArgument, false},
		{fwd, kindForward, string(fwd.reply), string(fwd.reply)[4:], codes.Unavailable, false},
		{storage.ErrClosed, kindShutdown, "ERR server is shutting down", "server is shutting down", codes.Unavailable, false},
		{fmt.Errorf("commit: %w", storage.ErrUnavailable), kindStoreUnavailable, "ERR store unavailable: writes to the data directory are failing (disk full or I/O error); the server retries and takes changes again by itself", "store unavailable: writes to the data directory are failing (disk full or I/O error); the server retries and takes changes again by itself", codes.Unavailable, true},
		{storage.ErrFailed, kindStoreFailed, "ERR store unavailable: a write to the data directory failed; see the server log", "store unavailable: a write to the data directory failed; see the server log", codes.Unavailable, true},
		{wrapStoreErr(bucket.ErrCorrupt), kindCorrupt, "ERR stored state is corrupt; see the server log", "stored state is corrupt; see the server log", codes.Unavailable, false},
		{wrapStoreErr(errors.New("pebble: read")), kindStoreRead, "ERR store read failed; see the server log", "store read failed; see the server log", codes.Unavailable, true},
		{errors.New("a bug"), kindInternal, "ERR internal error", "internal error", codes.Unavailable, false},
	} {
		if k := classify(tc.err); k != tc.kind {
			t.Errorf("classify(%v) = %d, want %d", tc.err, k, tc.kind)
		}
		if got := s.errorText(tc.err); got != tc.resp {
			t.Errorf("errorText(%v) = %q, want %q", tc.err, got, tc.resp)
		}
		if got := s.lineReason(tc.err); got != tc.line {
			t.Errorf("lineReason(%v) = %q, want %q", tc.err, got, tc.line)
		}
		if got := checkHTTPStatus(classify(tc.err)); got != http.StatusServiceUnavailable {
			t.Errorf("checkHTTPStatus(%v) = %d, want 503", tc.err, got)
		}
		st := status.Convert(rlsStatusErr(s, 2, tc.err))
		if want := "descriptor 2: " + replyMessage(tc.resp); st.Code() != tc.code || st.Message() != want {
			t.Errorf("rlsStatusErr(%v) = %v %q, want %v %q", tc.err, st.Code(), st.Message(), tc.code, want)
		}
		if got := classify(tc.err).storeDown(); got != tc.down {
			t.Errorf("classify(%v).storeDown() = %v, want %v", tc.err, got, tc.down)
		}
		// wrapStoreErr leaves the store's conditions and replies as they are.
		if tc.kind != kindCorrupt && tc.kind != kindStoreRead && tc.kind != kindInternal && wrapStoreErr(tc.err) != tc.err {
			t.Errorf("wrapStoreErr(%v) wrapped it", tc.err)
		}
	}
}
