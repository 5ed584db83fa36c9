package admit

import (
	"log/slog"
	"net"
)

// Guard is what protected mode decides by: whether it is turned off,
// whether a password is required, and TLS (client certificates from a CA
// keep strangers out as a password does).
type Guard struct {
	Off      bool // --protected-mode no
	Password bool // a password is required (--requirepass)
	TLS      *TLS // nil without TLS
}

// CertsRequired reports whether TLS admits only clients with a
// certificate from the configured CA.
func (g Guard) CertsRequired() bool {
	return g.TLS != nil && g.TLS.files.CA != ""
}

// Protected reports whether protected mode applies: on, and neither a
// password nor client certificates keep strangers out.
func (g Guard) Protected() bool {
	return !g.Off && !g.Password && !g.CertsRequired()
}

// DeniedMessage is the refusal of a client protected mode keeps out, as
// a RESP error and the text of an HTTP 403.
const DeniedMessage = "DENIED sluice is running in protected mode because protected mode is enabled and no password is set. " +
	"In this mode connections are only accepted from the loopback interface. To accept others, set a password " +
	"(--requirepass or --requirepass-file), require TLS client certificates (--tls-ca), or, if this server is " +
	"only reachable from a network you trust, start it with --protected-mode no."

// WarnIfExposed logs loudly when the listener is reachable from other
// machines and nothing but the network keeps strangers out.
func (g Guard) WarnIfExposed(log *slog.Logger, a net.Addr) {
	if g.Password || g.CertsRequired() {
		return
	}
	if ta, ok := a.(*net.TCPAddr); ok && ta.IP.IsLoopback() {
		return
	}
	if g.Off {
		log.Warn("WARNING: listening on a non-loopback address with no password and no TLS client certificates, and protected mode is off: anyone who can reach this port can use and exhaust every limit",
			"addr", a.String())
		return
	}
	log.Warn("WARNING: listening on a non-loopback address with no password and no TLS client certificates: protected mode refuses every client that is not on loopback (set --requirepass-file, or --tls-ca, or --protected-mode no)",
		"addr", a.String())
}
