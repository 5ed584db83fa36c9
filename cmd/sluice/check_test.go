package main

import (
	"io"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/client/ratelimitheader"
	"github.com/sluicehq/sluice/internal/check"
)

// TestCheckFlags: the /check flags from the command line and the
// environment, and each refusal naming what was wrong.
func TestCheckFlags(t *testing.T) {
	env := map[string]string{
		"SLUICE_CHECK_TRUSTED_PROXIES": "10.0.0.0/8, 192.0.2.7",
		"SLUICE_CHECK_FIELD_HEADER":    "quota=X-Quota,plan=X-Plan",
		"SLUICE_CHECK_IPV6_BITS":       "56",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := parseConfig([]string{"--policy", "p.ini", "--check-addr", "127.0.0.1:0", "--check-identity-header", "X-User",
		"--check-field-header", "tier=X-Tier", "--check-header-style", "both", "--check-ipv4-bits", "24"}, lookup, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.check.serverConfig()
	want := check.Config{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32")},
		IdentityHeader: "X-User",
		FieldHeaders:   []check.FieldHeader{{Field: "quota", Header: "X-Quota"}, {Field: "plan", Header: "X-Plan"}, {Field: "tier", Header: "X-Tier"}},
		HeaderStyle:    ratelimitheader.Both,
		IPv4Bits:       24,
		IPv6Bits:       56,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	none := func(string) (string, bool) { return "", false }
	if cfg, err := parseConfig(nil, none, io.Discard); err != nil || cfg.check.ipv4Bits != 32 || cfg.check.ipv6Bits != 64 {
		t.Errorf("defaults: ipv4 %d ipv6 %d, %v; want 32 and 64", cfg.check.ipv4Bits, cfg.check.ipv6Bits, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--check-addr", "127.0.0.1:0"}, "--check-addr needs --policy"},
		{[]string{"--check-trusted-proxies", "10.0.0.0/33"}, `--check-trusted-proxies "10.0.0.0/33": want networks (CIDR) or addresses`},
		{[]string{"--check-trusted-proxies", "proxy.local"}, `"proxy.local": want networks`},
		{[]string{"--check-field-header", "quota"}, `"quota": want FIELD=Header`},
		{[]string{"--check-field-header", "ip=X-Real-IP"}, "one /check builds itself"},
		{[]string{"--check-field-header", "q=X-A", "--check-field-header", "q=X-B"}, "field q is already taken from header X-A"},
		{[]string{"--check-header-style", "draft"}, `--check-header-style "draft": want github, ietf, both or none`},
		{[]string{"--check-ipv4-bits", "33"}, "--check-ipv4-bits 33: want a prefix length from 1 to 32"},
		{[]string{"--check-ipv6-bits", "0"}, "--check-ipv6-bits 0: want a prefix length from 1 to 128"},
	} {
		_, err := parseConfig(tc.args, none, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
