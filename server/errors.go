package server

import (
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/respserver"
)

// Errors become replies here, and only here. Handlers of every protocol
// return Go errors, typed (package errs) where they are made; failure
// types the store's own conditions, and logs and counts what needs it,
// once; each protocol renders the typed error its own way: a RESP error
// reply (errorText), a line-protocol ERR (divvy.Reason), an HTTP status
// (check.HTTPStatus) and a gRPC status (envoy.StatusErr). No text is read to
// tell one error from another.

// failure returns the typed error of err for a reply, once it has logged
// what is not meant for clients and counted the store's errors.
func (s *Server) failure(err error) *errs.Error {
	e := engine.Typed(err)
	switch e.Kind {
	case errs.StoreUnavailable, errs.StoreFailed:
		s.stats.StoreErrors.Add(1)
	case errs.Corrupt:
		s.stats.StoreErrors.Add(1)
		s.log.Error("stored state is corrupt", "err", err)
	case errs.StoreRead:
		s.stats.StoreErrors.Add(1)
		s.log.Error("store read failed", "err", err)
	case errs.Internal:
		s.log.Error("internal error", "err", err)
	}
	return e
}

// errorText renders err as the text of a RESP error reply
// (respserver.ErrorText).
func (s *Server) errorText(err error) string { return respserver.ErrorText(err, (*frontHost)(s)) }
