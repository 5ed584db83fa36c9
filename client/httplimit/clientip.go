package httplimit

import (
	"net/netip"

	"github.com/sluicehq/sluice/client/clientip"
)

// ClientIP returns the address of the client a request comes from, given
// the request's RemoteAddr (the TCP peer, "host:port"), its
// X-Forwarded-For field lines in order, and the proxies trusted to append
// to X-Forwarded-For: the rightmost address that is not a trusted proxy,
// reading through trusted proxies only. See clientip.Resolve, which it
// calls, for the details.
func ClientIP(remoteAddr string, forwardedFor []string, trusted []netip.Prefix) netip.Addr {
	return clientip.Resolve(remoteAddr, forwardedFor, trusted)
}

// AppendIPKey appends the part of a rate-limit key that names the client
// address a: see clientip.AppendKey, which it calls.
func AppendIPKey(b []byte, a netip.Addr, v4Bits, v6Bits int) []byte {
	return clientip.AppendKey(b, a, v4Bits, v6Bits)
}
