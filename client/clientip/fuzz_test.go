package clientip

import (
	"net/netip"
	"strings"
	"testing"
)

// FuzzResolve: X-Forwarded-For is whatever a client sends. Whatever it
// holds, Resolve does not panic; an untrusted peer is always the answer;
// otherwise the answer is the peer or one of the entries, and every entry
// right of it, and the peer, are trusted proxies.
func FuzzResolve(f *testing.F) {
	f.Add("10.0.0.2:443", "6.6.6.6, 203.0.113.9, 10.1.1.1", "")
	f.Add("203.0.113.7:1", "198.51.100.1", "x")
	f.Add("[2001:db8:ffff::1]:443", "[2001:db8:1:2::7]:80, 2001:db8:ffff::2", "unknown,,")
	f.Add("10.0.0.2:443", "198.51.100.1:http, 10.1.1.1", "[::ffff:10.0.0.9]")
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	f.Fuzz(func(t *testing.T, remote, line1, line2 string) {
		lines := []string{line1, line2}
		got := Resolve(remote, lines, trusted)
		peer := parseAddr(remote)
		if !peer.IsValid() || !contains(trusted, peer) {
			if got != peer {
				t.Fatalf("untrusted peer %v: got %v", peer, got)
			}
			return
		}
		if got == peer {
			return
		}
		// The entries, right to left, up to the answer, must all be
		// trusted addresses.
		entries := strings.Split(line1+","+line2, ",")
		for i := len(entries) - 1; i >= 0; i-- {
			e := strings.TrimSpace(entries[i])
			if e == "" {
				continue
			}
			a := parseAddr(e)
			if a == got {
				return
			}
			if !a.IsValid() || !contains(trusted, a) {
				t.Fatalf("%q via %q: got %v, but %q right of it is not a trusted proxy", remote, lines, got, e)
			}
		}
		t.Fatalf("%q via %q: got %v, neither the peer nor an entry", remote, lines, got)
	})
}
