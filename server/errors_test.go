package server

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/storage"
)

// TestErrorKinds pins what every protocol answers for each kind of error:
// errors are typed where they are made (typed adds the store's own
// conditions), and the RESP text, the line protocol's reason, /check's
// status and the rate limit service's gRPC code are renderings of it.
func TestErrorKinds(t *testing.T) {
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	const fwdText = "ERR cluster: forwarding a counter of slot 7 to its owner a:1 failed: refused"
	fwd := &errs.Error{Kind: errs.Forward, Msg: fwdText[4:]} // as clusternode forwards it
	for _, tc := range []struct {
		err  error
		kind errs.Kind
		resp string
		line string
		code codes.Code
		down bool // AllowOnStoreError lets a reply stand despite it
	}{
		{errs.Syntax, errs.Request, "ERR syntax error", "syntax error", codes.InvalidArgument, false},
		{fmt.Errorf("hit: %w", errs.New(errs.Request, `hits: "x"`)), errs.Request, `ERR hits: "x"`, `hits: 'x'`, codes.InvalidArgument, false},
		{&errs.Error{Kind: errs.Request, Code: "CROSSSLOT", Msg: "Keys in request don't hash to the same slot"}, errs.Request, "CROSSSLOT Keys in request don't hash to the same slot", "CROSSSLOT Keys in request don't hash to the same slot", codes.InvalidArgument, false},
		{fwd, errs.Forward, fwdText, fwdText[4:], codes.Unavailable, false},
		{storage.ErrClosed, errs.Shutdown, "ERR server is shutting down", "server is shutting down", codes.Unavailable, false},
		{fmt.Errorf("commit: %w", storage.ErrUnavailable), errs.StoreUnavailable, "ERR store unavailable: writes to the data directory are failing (disk full or I/O error); the server retries and takes changes again by itself", "store unavailable: writes to the data directory are failing (disk full or I/O error); the server retries and takes changes again by itself", codes.Unavailable, true},
		{storage.ErrFailed, errs.StoreFailed, "ERR store unavailable: a write to the data directory failed; see the server log", "store unavailable: a write to the data directory failed; see the server log", codes.Unavailable, true},
		{engine.StoreErr(bucket.ErrCorrupt), errs.Corrupt, "ERR stored state is corrupt; see the server log", "stored state is corrupt; see the server log", codes.Unavailable, false},
		{engine.StoreErr(errors.New("pebble: read")), errs.StoreRead, "ERR store read failed; see the server log", "store read failed; see the server log", codes.Unavailable, true},
		{errors.New("a bug"), errs.Internal, "ERR internal error", "internal error", codes.Unavailable, false},
	} {
		if k := engine.Typed(tc.err).Kind; k != tc.kind {
			t.Errorf("engine.Typed(%v).Kind = %d, want %d", tc.err, k, tc.kind)
		}
		if got := s.errorText(tc.err); got != tc.resp {
			t.Errorf("errorText(%v) = %q, want %q", tc.err, got, tc.resp)
		}
		if got := divvy.Reason(s.failure(tc.err)); got != tc.line {
			t.Errorf("divvy.Reason(%v) = %q, want %q", tc.err, got, tc.line)
		}
		if got := check.HTTPStatus(engine.Typed(tc.err).Kind); got != http.StatusServiceUnavailable {
			t.Errorf("check.HTTPStatus(%v) = %d, want 503", tc.err, got)
		}
		st := status.Convert(envoy.StatusErr(s.failure(tc.err), 2))
		if want := "descriptor 2: " + strings.TrimPrefix(tc.resp, "ERR "); st.Code() != tc.code || st.Message() != want {
			t.Errorf("envoy.StatusErr(%v) = %v %q, want %v %q", tc.err, st.Code(), st.Message(), tc.code, want)
		}
		if got := engine.Typed(tc.err).Kind.StoreDown(); got != tc.down {
			t.Errorf("engine.Typed(%v).Kind.StoreDown() = %v, want %v", tc.err, got, tc.down)
		}
		// engine.StoreErr leaves the store's conditions and replies as they are.
		if tc.kind != errs.Corrupt && tc.kind != errs.StoreRead && tc.kind != errs.Internal && engine.StoreErr(tc.err) != tc.err {
			t.Errorf("engine.StoreErr(%v) wrapped it", tc.err)
		}
	}
}
