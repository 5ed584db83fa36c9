package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/client/ratelimitheader"
	"github.com/sluicehq/sluice/internal/check"
)

// checkFlags are the flags of the forward-auth endpoint /check.
type checkFlags struct {
	addr           string
	trusted        prefixList
	identityHeader string
	fieldHeaders   fieldHeaderList
	headerStyle    string
	ipv4Bits       int
	ipv6Bits       int
}

func addCheckFlags(fs *flag.FlagSet, c *checkFlags) {
	addrVar(fs, &c.addr, "check-addr", "", "127.0.0.1:9051", true, "listen address of the forward-auth endpoint /check for reverse proxies (needs --policy); empty turns it off")
	fs.Var(&c.trusted, "check-trusted-proxies", "comma-separated networks (CIDR, or single addresses) of the proxies whose X-Forwarded-For /check believes; others' is ignored and the peer is the client")
	fs.StringVar(&c.identityHeader, "check-identity-header", "", "header holding the caller's identity, which /check passes to the rules as the user field; empty: no user field")
	fs.Var(&c.fieldHeaders, "check-field-header", "FIELD=Header: /check passes the value of Header to the rules as FIELD (e.g. quota=X-Quota); repeat the flag, or separate pairs with commas")
	fs.StringVar(&c.headerStyle, "check-header-style", "github", "rate-limit header fields /check answers with: github (X-RateLimit-*), ietf (RateLimit, RateLimit-Policy), both or none")
	intVar(fs, &c.ipv4Bits, "check-ipv4-bits", 32, "prefix length that names an IPv4 client in /check's ip field (1 to 32; 24 keys a client by its /24)")
	intVar(fs, &c.ipv6Bits, "check-ipv6-bits", 64, "prefix length that names an IPv6 client in /check's ip field (1 to 128): one customer usually holds a whole /64")
}

// validate checks the flags against the rest of the configuration.
func (c *checkFlags) validate(policyFile string) error {
	if c.addr != "" && policyFile == "" {
		return errors.New("--check-addr needs --policy: /check answers from a rule file")
	}
	if _, err := ratelimitheader.ParseStyle(c.headerStyle); err != nil {
		return fmt.Errorf("--check-header-style %q: want github, ietf, both or none", c.headerStyle)
	}
	if c.ipv4Bits < 1 || c.ipv4Bits > 32 {
		return fmt.Errorf("--check-ipv4-bits %d: want a prefix length from 1 to 32", c.ipv4Bits)
	}
	if c.ipv6Bits < 1 || c.ipv6Bits > 128 {
		return fmt.Errorf("--check-ipv6-bits %d: want a prefix length from 1 to 128", c.ipv6Bits)
	}
	return nil
}

// serverConfig is the server's CheckConfig; validate has passed.
func (c *checkFlags) serverConfig() check.Config {
	style, _ := ratelimitheader.ParseStyle(c.headerStyle)
	return check.Config{
		TrustedProxies: c.trusted,
		IdentityHeader: c.identityHeader,
		FieldHeaders:   c.fieldHeaders,
		HeaderStyle:    style,
		IPv4Bits:       c.ipv4Bits,
		IPv6Bits:       c.ipv6Bits,
	}
}

// prefixList is a comma-separated list of networks; each Set adds to it.
type prefixList []netip.Prefix

func (p *prefixList) String() string {
	s := make([]string, len(*p))
	for i, x := range *p {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

// notNetwork is prefixList's error for part of the value v.
func notNetwork(part, v string) error {
	return &badValue{problem: partOf(part, v) + "want networks (CIDR) or addresses, comma-separated"}
}

// partOf names the part of a comma-separated value v an error is about,
// when v has others.
func partOf(part, v string) string {
	if part == strings.TrimSpace(v) {
		return ""
	}
	return strconv.Quote(part) + ": "
}

func (p *prefixList) example() string { return "10.0.0.0/8,192.168.1.7" }

func (p *prefixList) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if strings.Contains(part, "/") {
			x, err := netip.ParsePrefix(part)
			if err != nil {
				return notNetwork(part, v)
			}
			*p = append(*p, x.Masked())
			continue
		}
		a, err := netip.ParseAddr(part)
		if err != nil {
			return notNetwork(part, v)
		}
		*p = append(*p, netip.PrefixFrom(a, a.BitLen()))
	}
	return nil
}

// fieldHeaderList is FIELD=Header pairs; each Set adds to it.
type fieldHeaderList []check.FieldHeader

func (f *fieldHeaderList) String() string {
	s := make([]string, len(*f))
	for i, x := range *f {
		s[i] = x.Field + "=" + x.Header
	}
	return strings.Join(s, ",")
}

func (f *fieldHeaderList) example() string { return "quota=X-Quota" }

func (f *fieldHeaderList) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		field, header, ok := strings.Cut(part, "=")
		if !ok {
			return &badValue{problem: partOf(part, v) + "want FIELD=Header"}
		}
		fh := check.FieldHeader{Field: strings.TrimSpace(field), Header: strings.TrimSpace(header)}
		if err := check.ValidateFieldHeader(fh); err != nil {
			return fmt.Errorf("%q: %w", part, err)
		}
		for _, old := range *f {
			if old.Field == fh.Field {
				return fmt.Errorf("%q: field %s is already taken from header %s", part, fh.Field, old.Header)
			}
		}
		*f = append(*f, fh)
	}
	return nil
}
