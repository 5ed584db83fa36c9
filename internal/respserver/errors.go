package respserver

import (
	"errors"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
)

// ErrorText renders err as the text of a RESP error reply: the RESP front
// end's own errors (resp.Error) as they are, the others typed by h's
// Failure.
func ErrorText(err error, h interface{ Failure(error) *errs.Error }) string {
	var re resp.Error
	if errors.As(err, &re) {
		return string(re)
	}
	return resp.ErrorText(h.Failure(err))
}

// errorText is ErrorText with the Host.
func (s *Server) errorText(err error) string { return ErrorText(err, s.host) }

// maintenanceErr turns an error of a maintenance command into a reply: the
// store's own conditions as for every command, anything else logged.
func (s *Server) maintenanceErr(what string, err error) error {
	switch engine.Typed(err).Kind {
	case errs.Shutdown, errs.StoreFailed, errs.StoreUnavailable:
		return err
	}
	s.log.Error(what+" failed", "err", err)
	return &errs.Error{Kind: errs.Failed, Msg: what + " failed: " + err.Error(), Err: err}
}
