package server

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/storage"
)

// TestProtocolDocListsStoreErrors keeps the error table of docs/protocol.md
// in step with errorText: each store error a client can get is documented
// word for word.
func TestProtocolDocListsStoreErrors(t *testing.T) {
	raw, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, e := range []error{
		storage.ErrClosed,
		storage.ErrUnavailable,
		storage.ErrFailed,
		&errs.Error{Kind: errs.Corrupt},
		&errs.Error{Kind: errs.StoreRead},
	} {
		text := s.errorText(e)
		if text == "ERR internal error" {
			t.Errorf("errorText(%v) is the generic error: this test lists an error errorText no longer knows", e)
			continue
		}
		if !strings.Contains(doc, "| `"+text+"` |") {
			t.Errorf("docs/protocol.md has no error table row for %q (for %v)", text, e)
		}
	}
}
