package server

import (
	"errors"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
)

// Errors become replies here, and only here. Handlers of every protocol
// return Go errors, typed (package errs) where they are made; failure
// types the store's own conditions, and logs and counts what needs it,
// once; each protocol renders the typed error its own way: a RESP error
// reply (errorText), a line-protocol ERR (divvy.Reason), an HTTP status
// (check.HTTPStatus) and a gRPC status (envoy.StatusErr). No text is read to
// tell one error from another.

// typed returns err's typed error (engine.Typed).
func typed(err error) *errs.Error { return engine.Typed(err) }

// storeErr types an error of the store's records (engine.StoreErr).
func storeErr(err error) error { return engine.StoreErr(err) }

// failure returns the typed error of err for a reply, once it has logged
// what is not meant for clients and counted the store's errors.
func (s *Server) failure(err error) *errs.Error {
	e := typed(err)
	switch e.Kind {
	case errs.StoreUnavailable, errs.StoreFailed:
		s.stats.storeErrors.Add(1)
	case errs.Corrupt:
		s.stats.storeErrors.Add(1)
		s.log.Error("stored state is corrupt", "err", err)
	case errs.StoreRead:
		s.stats.storeErrors.Add(1)
		s.log.Error("store read failed", "err", err)
	case errs.Internal:
		s.log.Error("internal error", "err", err)
	}
	return e
}

// errorText renders err as the text of a RESP error reply: the RESP front
// end's own errors (resp.Error) as they are, the others typed.
func (s *Server) errorText(err error) string {
	var re resp.Error
	if errors.As(err, &re) {
		return string(re)
	}
	return resp.ErrorText(s.failure(err))
}

// maintenanceErr turns an error of a maintenance command into a reply: the
// store's own conditions as for every command, anything else logged.
func (s *Server) maintenanceErr(what string, err error) error {
	switch typed(err).Kind {
	case errs.Shutdown, errs.StoreFailed, errs.StoreUnavailable:
		return err
	}
	s.log.Error(what+" failed", "err", err)
	return &errs.Error{Kind: errs.Failed, Msg: what + " failed: " + err.Error(), Err: err}
}
