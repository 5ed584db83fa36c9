// Package clientip finds the client address of an HTTP request behind
// reverse proxies, from its peer address and X-Forwarded-For, and names it
// in a rate-limit key. It imports only the standard library, so that both
// the Go middleware (client/httplimit) and the sluice server's forward-auth
// endpoint use this one implementation.
package clientip

import (
	"errors"
	"net/netip"
	"strings"
)

// Resolve returns the address of the client a request comes from, given
// the request's RemoteAddr (the TCP peer, "host:port"), its
// X-Forwarded-For field lines in order, and the proxies trusted to append
// to X-Forwarded-For.
//
// A peer that is not a trusted proxy is the client, whatever the request
// says: anyone can send an X-Forwarded-For. A trusted peer appended the
// address it received the request from to the end of the field, so the
// entries are read from right to left, through trusted proxies only: the
// first entry that is not a trusted proxy is the client. The leftmost entry
// is never taken blindly; it is the client only when every hop to its
// right is trusted. An entry that is not an address (garbage, "unknown",
// an obfuscated name) stops the walk at the trusted hop to its right,
// which is then keyed as the client, since nothing left of it can be
// believed. Entries may carry a port and IPv6 brackets
// ("[2001:db8::1]:443"). IPv4-mapped IPv6 addresses are returned as IPv4,
// and zones are dropped.
//
// It returns the zero Addr when RemoteAddr is not an IP address (a Unix
// socket).
func Resolve(remoteAddr string, forwardedFor []string, trusted []netip.Prefix) netip.Addr {
	peer := parseAddr(remoteAddr)
	if !peer.IsValid() || !contains(trusted, peer) {
		return peer
	}
	client := peer
	for i := len(forwardedFor) - 1; i >= 0; i-- {
		line := forwardedFor[i]
		for {
			entry := line
			j := strings.LastIndexByte(line, ',')
			if j >= 0 {
				entry, line = line[j+1:], line[:j]
			}
			entry = strings.TrimSpace(entry)
			if entry != "" {
				a := parseAddr(entry)
				if !a.IsValid() {
					return client
				}
				client = a
				if !contains(trusted, a) {
					return a
				}
			}
			if j < 0 {
				break
			}
		}
	}
	return client
}

// parseAddr parses "ip", "ipv4:port", "[ipv6]" or "[ipv6]:port". It
// picks the form by its colons before parsing: netip's parse errors
// allocate, and RemoteAddr always carries a port.
func parseAddr(s string) netip.Addr {
	if s == "" {
		return netip.Addr{}
	}
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 || (end+1 < len(s) && (s[end+1] != ':' || !isPort(s[end+2:]))) {
			return netip.Addr{}
		}
		a, err := netip.ParseAddr(s[1:end])
		if err != nil || !a.Is6() {
			return netip.Addr{}
		}
		return norm(a)
	}
	v4port := false
	if i := strings.IndexByte(s, ':'); i >= 0 && strings.IndexByte(s[i+1:], ':') < 0 {
		if !isPort(s[i+1:]) {
			return netip.Addr{}
		}
		s, v4port = s[:i], true
	}
	a, err := netip.ParseAddr(s)
	if err != nil || (v4port && !a.Is4()) {
		return netip.Addr{}
	}
	return norm(a)
}

func isPort(s string) bool {
	if s == "" || len(s) > 5 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func norm(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

func contains(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// AppendKey appends the part of a rate-limit key that names the client
// address a: the address itself for IPv4 with v4Bits 32, else the network
// of v4Bits (IPv4) or v6Bits (IPv6) around it, as a prefix
// ("2001:db8:1:2::/64"). One IPv6 customer usually holds a whole /64, so
// keying single IPv6 addresses would let them rotate through 2^64 limits.
// An invalid a appends "unknown".
func AppendKey(b []byte, a netip.Addr, v4Bits, v6Bits int) []byte {
	if !a.IsValid() {
		return append(b, "unknown"...)
	}
	bits := v6Bits
	if a.Is4() {
		bits = v4Bits
	}
	if bits >= a.BitLen() {
		return a.AppendTo(b)
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return a.AppendTo(b)
	}
	return p.AppendTo(b)
}

// Trusted checks and normalises the networks of trusted proxies for
// Resolve: IPv4 peers are compared unmapped, so ::ffff:a.b.c.d/n becomes
// a.b.c.d/(n-96), and every prefix is masked.
func Trusted(prefixes []netip.Prefix) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(prefixes))
	for _, p := range prefixes {
		if !p.IsValid() {
			return nil, errors.New("clientip: an invalid prefix among the trusted proxies")
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
