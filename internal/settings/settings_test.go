package settings

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/storage"
)

// list returns o's settings by name, failing on a name given twice
// (CONFIG GET would answer it twice).
func list(t *testing.T, o Of) map[string]string {
	t.Helper()
	if o.Store == nil {
		s, err := storage.Open(t.TempDir(), storage.Options{Sync: storage.SyncAlways})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		o.Store = s
	}
	m := map[string]string{}
	for _, s := range o.List() {
		if _, dup := m[s.Name]; dup {
			t.Errorf("%s listed twice", s.Name)
		}
		m[s.Name] = s.Value
	}
	return m
}

// expect fails for every name of want whose value in got differs.
func expect(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s = %q, want %q", what, k, got[k], v)
		}
	}
}

// TestListListeners: the RESP address as Redis' bind and port, every
// interface shown as Redis does, and TLS as Redis with port 0 and
// tls-port set, its files under both names.
func TestListListeners(t *testing.T) {
	addr := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	expect(t, "loopback", list(t, Of{Addr: addr("127.0.0.1:6379")}), map[string]string{
		"addr": "127.0.0.1:6379", "bind": "127.0.0.1", "port": "6379", "tls-port": "0", "tls-auth-clients": "no",
	})
	expect(t, "every interface", list(t, Of{Addr: addr("[::]:6379")}), map[string]string{
		"addr": "[::]:6379", "bind": "* -::*", "port": "6379",
	})
	expect(t, "before Serve", list(t, Of{}), map[string]string{"addr": "", "port": "", "bind": "* -::*"})
	files := &admit.TLSFiles{Cert: "c.pem", Key: "k.pem", CA: "ca.pem"}
	expect(t, "TLS", list(t, Of{Addr: addr("127.0.0.1:6380"), Listen: admit.Config{TLS: files}}), map[string]string{
		"port": "0", "tls-port": "6380", "tls-auth-clients": "yes",
		"tls-cert-file": "c.pem", "tls-key-file": "k.pem", "tls-ca-cert-file": "ca.pem",
		"tls-cert": "c.pem", "tls-key": "k.pem", "tls-ca": "ca.pem",
	})
	expect(t, "TLS without client certificates", list(t, Of{Listen: admit.Config{TLS: &admit.TLSFiles{Cert: "c.pem", Key: "k.pem"}}}), map[string]string{
		"tls-auth-clients": "no", "tls-ca": "",
	})
}

// TestListOff: a bound turned off shows as its flag's 0 (which turns it
// off on the command line), never as a negative number.
func TestListOff(t *testing.T) {
	rc := respserver.Config{Tuning: respserver.Tuning{
		MaxMemoryClients: respserver.NoLimit[int64](),
		MaxAuthFailures:  respserver.NoLimit[int](),
		SweepInterval:    respserver.NoLimit[time.Duration](),
		SweepRate:        respserver.NoLimit[int](),
	}}
	expect(t, "off", list(t, Of{RESP: rc}), map[string]string{
		"maxmemory-clients": "0", "max-auth-failures": "0", "sweep-interval": "0s", "sweep-rate": "0",
	})
	rc = respserver.Config{Tuning: respserver.Tuning{
		MaxMemoryClients: respserver.LimitOf[int64](1 << 20),
		MaxAuthFailures:  respserver.LimitOf(3),
		SweepInterval:    respserver.LimitOf(time.Minute),
		SweepRate:        respserver.LimitOf(500),
	}}
	expect(t, "on", list(t, Of{RESP: rc}), map[string]string{
		"maxmemory-clients": "1048576", "max-auth-failures": "3", "sweep-interval": "1m0s", "sweep-rate": "500",
	})
}

// TestListCheck: /check's settings in its flags' syntax, its zero
// prefix lengths shown as the defaults they mean.
func TestListCheck(t *testing.T) {
	ck := check.Config{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")},
		FieldHeaders:   []check.FieldHeader{{Field: "plan", Header: "X-Plan"}, {Field: "quota", Header: "X-Quota"}},
		IdentityHeader: "X-User",
	}
	expect(t, "check", list(t, Of{Check: ck}), map[string]string{
		"check-trusted-proxies": "10.0.0.0/8,fd00::/8", "check-field-header": "plan=X-Plan,quota=X-Quota",
		"check-identity-header": "X-User", "check-ipv4-bits": "32", "check-ipv6-bits": "64",
	})
	ck = check.Config{IPv4Bits: 24, IPv6Bits: 48}
	expect(t, "prefix lengths", list(t, Of{Check: ck}), map[string]string{"check-ipv4-bits": "24", "check-ipv6-bits": "48"})
}

// TestListStore: the store's mode under Redis' name and the flag's, its
// directory under both, and what the RESP front end decides.
func TestListStore(t *testing.T) {
	s, err := storage.Open(t.TempDir(), storage.Options{Sync: storage.SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rc := respserver.Config{AllowOnStoreError: true, Tuning: respserver.Tuning{Debug: respserver.DebugLocal}, Password: "pw"}
	expect(t, "store", list(t, Of{Store: s, RESP: rc, Cluster: true, Listen: admit.Config{AllowRemoteWithoutAuth: true}}), map[string]string{
		"appendfsync": "always", "fsync": "always", "dir": s.Dir(), "data": s.Dir(),
		"on-store-error": "allow", "enable-debug-command": "local", "requirepass": "pw",
		"cluster-enabled": "yes", "protected-mode": "no",
	})
}
