// Package settings is CONFIG GET's table: the configuration the server
// runs with, each setting under its redis.conf name where Redis has one
// and under its flag's name (Of.List). It reads what it is given and
// changes nothing.
package settings

import (
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/httpport"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/storage"
)

// Of is what CONFIG GET shows: the configuration of every front end and
// the server's own, with every default applied.
type Of struct {
	Addr    net.Addr // the RESP listener's; nil before Serve
	Store   *storage.Store
	Cluster bool // cluster mode
	// RESP is the RESP front end's configuration, which also holds the
	// server-wide settings INFO shows (--maxclients, --requirepass, ...).
	RESP   respserver.Config
	Check  check.Config
	Divvy  divvy.Config
	RLS    envoy.Config
	HTTP   httpport.Config
	Listen admit.Config     // what every listener shares
	Policy policycmd.Config // with the engine's defaults applied

	AcceptRepairedClusterState bool
	MaxConfigFile              int64
	ReloadTimeout              time.Duration
}

// List is every setting CONFIG GET answers: by its redis.conf name where
// Redis has one that means the same (docs/protocol.md lists them), and by
// its sluice flag's name, in the flag's syntax. Sizes are in bytes and
// durations in Go's syntax, which the flags take.
func (o *Of) List() []respserver.Setting {
	rc := &o.RESP
	i := strconv.Itoa
	i64 := func(n int64) string { return strconv.FormatInt(n, 10) }
	yesNo := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	atLeast0 := func(n int64) string { return i64(max(n, 0)) } // off: 0, as on the command line
	addr, host, port := "", "", ""
	if a := o.Addr; a != nil {
		addr = a.String()
		host, port, _ = net.SplitHostPort(addr)
	}
	bind := host
	if host == "" || host == "::" {
		bind = "* -::*" // Redis' default: every IPv4 and IPv6 interface
	}
	plainPort, tlsPort := port, "0"
	var tlsFiles admit.TLSFiles
	if o.Listen.TLS != nil {
		// TLS only, as Redis with port 0 and tls-port set.
		plainPort, tlsPort, tlsFiles = "0", port, *o.Listen.TLS
	}
	ck := o.Check
	proxies := make([]string, len(ck.TrustedProxies))
	for j, p := range ck.TrustedProxies {
		proxies[j] = p.String()
	}
	fields := make([]string, len(ck.FieldHeaders))
	for j, f := range ck.FieldHeaders {
		fields[j] = f.Field + "=" + f.Header
	}
	v4, v6 := ck.IPv4Bits, ck.IPv6Bits
	if v4 == 0 {
		v4 = 32
	}
	if v6 == 0 {
		v6 = 64
	}
	onStoreError := "deny"
	if rc.AllowOnStoreError {
		onStoreError = "allow"
	}
	return []respserver.Setting{
		// redis.conf's names.
		{Name: "appendfsync", Value: o.Store.Mode().String()},
		{Name: "appendonly", Value: "yes"}, // every write is in the store's log
		{Name: "bind", Value: bind},
		{Name: "client-output-buffer-limit", Value: "normal " + i(rc.MaxReplyBuffer) + " 0 0 slave 0 0 0 pubsub 0 0 0"},
		{Name: "client-query-buffer-limit", Value: i(rc.MaxQueryBuffer)},
		{Name: "cluster-enabled", Value: yesNo(o.Cluster)},
		{Name: "databases", Value: "1"},
		{Name: "dir", Value: o.Store.Dir()},
		{Name: "enable-debug-command", Value: [...]string{respserver.DebugRefused: "no", respserver.DebugLocal: "local", respserver.DebugAllowed: "yes"}[rc.Debug]},
		{Name: "maxclients", Value: i(rc.MaxClients)},
		{Name: "maxmemory", Value: "0"}, // nothing is evicted; see memory-limit
		{Name: "maxmemory-clients", Value: atLeast0(rc.MaxMemoryClients.N())},
		{Name: "maxmemory-policy", Value: "noeviction"},
		{Name: "port", Value: plainPort},
		{Name: "protected-mode", Value: yesNo(!o.Listen.AllowRemoteWithoutAuth)},
		{Name: "proto-max-bulk-len", Value: i64(rc.MaxBulk)},
		{Name: "requirepass", Value: rc.Password},
		{Name: "save", Value: ""}, // no snapshots: CHECKPOINT takes copies
		{Name: "timeout", Value: i64(int64(rc.IdleTimeout.Seconds()))},
		{Name: "tls-auth-clients", Value: yesNo(tlsFiles.CA != "")},
		{Name: "tls-ca-cert-file", Value: tlsFiles.CA},
		{Name: "tls-cert-file", Value: tlsFiles.Cert},
		{Name: "tls-key-file", Value: tlsFiles.Key},
		{Name: "tls-port", Value: tlsPort},
		// sluice's flags.
		{Name: "accept-repaired-cluster-state", Value: strconv.FormatBool(o.AcceptRepairedClusterState)},
		{Name: "addr", Value: addr},
		{Name: "backup-dir", Value: rc.BackupDir},
		{Name: "check-field-header", Value: strings.Join(fields, ",")},
		{Name: "check-header-style", Value: ck.HeaderStyle.String()},
		{Name: "check-identity-header", Value: ck.IdentityHeader},
		{Name: "check-ipv4-bits", Value: i(v4)},
		{Name: "check-ipv6-bits", Value: i(v6)},
		{Name: "check-trusted-proxies", Value: strings.Join(proxies, ",")},
		{Name: "data", Value: o.Store.Dir()},
		{Name: "divvy-max-line", Value: i(o.Divvy.MaxLine)},
		{Name: "divvy-max-pipeline", Value: i(o.Divvy.MaxPipeline)},
		{Name: "divvy-timeout", Value: i64(int64(o.Divvy.IdleTimeout.Seconds()))},
		{Name: "fsync", Value: o.Store.Mode().String()},
		{Name: "http-max-header-bytes", Value: i(o.HTTP.MaxHeaderBytes)},
		{Name: "max-args", Value: i(rc.MaxArgs)},
		{Name: "max-auth-failures", Value: atLeast0(int64(rc.MaxAuthFailures.N()))},
		{Name: "max-bulk", Value: i64(rc.MaxBulk)},
		{Name: "max-config-file", Value: i64(o.MaxConfigFile)},
		{Name: "max-inline", Value: i(rc.MaxInline)},
		{Name: "max-key-size", Value: i(rc.MaxKeySize)},
		{Name: "max-multi-bytes", Value: i(rc.MaxMultiBytes)},
		{Name: "max-query-buffer", Value: i(rc.MaxQueryBuffer)},
		{Name: "max-reply-buffer", Value: i(rc.MaxReplyBuffer)},
		{Name: "memory-limit", Value: i64(rc.MemoryLimit)},
		{Name: "on-store-error", Value: onStoreError},
		{Name: "policy", Value: o.Policy.File},
		{Name: "policy-max-overrides", Value: i(o.Policy.MaxOverrides)},
		{Name: "policy-stats-days", Value: i(o.Policy.StatsDays)},
		{Name: "reload-timeout", Value: o.ReloadTimeout.String()},
		{Name: "rls-config", Value: o.RLS.Dir},
		{Name: "rls-max-descriptors", Value: i(o.RLS.MaxDescriptors)},
		{Name: "rls-max-header-bytes", Value: i(o.RLS.MaxHeaderBytes)},
		{Name: "rls-max-message", Value: i(o.RLS.MaxMessage)},
		{Name: "rls-max-streams", Value: i(o.RLS.MaxStreams)},
		{Name: "rls-response-headers", Value: strconv.FormatBool(o.RLS.ResponseHeaders)},
		{Name: "shutdown-timeout", Value: o.Listen.ShutdownTimeout.String()},
		{Name: "sweep-interval", Value: max(rc.SweepInterval.N(), 0).String()},
		{Name: "sweep-rate", Value: atLeast0(int64(rc.SweepRate.N()))},
		{Name: "tls-ca", Value: tlsFiles.CA},
		{Name: "tls-cert", Value: tlsFiles.Cert},
		{Name: "tls-key", Value: tlsFiles.Key},
	}
}
