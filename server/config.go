package server

import (
	"net"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/respserver"
)

// settings is every setting CONFIG GET answers: by its redis.conf name
// where Redis has one that means the same (docs/protocol.md lists them),
// and by its sluice flag's name, in the flag's syntax. Sizes are in bytes
// and durations in Go's syntax, which the flags take.
func (s *Server) settings() []respserver.Setting {
	cfg := &s.cfg
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
	if a := s.Addr(); a != nil {
		addr = a.String()
		host, port, _ = net.SplitHostPort(addr)
	}
	bind := host
	if host == "" || host == "::" {
		bind = "* -::*" // Redis' default: every IPv4 and IPv6 interface
	}
	plainPort, tlsPort := port, "0"
	var tlsFiles TLSFiles
	if cfg.TLS != nil {
		// TLS only, as Redis with port 0 and tls-port set.
		plainPort, tlsPort, tlsFiles = "0", port, *cfg.TLS
	}
	ck := cfg.Check
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
	if cfg.AllowOnStoreError {
		onStoreError = "allow"
	}
	return []respserver.Setting{
		// redis.conf's names.
		{Name: "appendfsync", Value: s.store.Mode().String()},
		{Name: "appendonly", Value: "yes"}, // every write is in the store's log
		{Name: "bind", Value: bind},
		{Name: "client-output-buffer-limit", Value: "normal " + i(cfg.RESP.MaxReplyBuffer) + " 0 0 slave 0 0 0 pubsub 0 0 0"},
		{Name: "client-query-buffer-limit", Value: i(cfg.RESP.MaxQueryBuffer)},
		{Name: "cluster-enabled", Value: yesNo(s.clus != nil)},
		{Name: "databases", Value: "1"},
		{Name: "dir", Value: s.store.Dir()},
		{Name: "enable-debug-command", Value: [...]string{DebugRefused: "no", DebugLocal: "local", DebugAllowed: "yes"}[cfg.Debug]},
		{Name: "maxclients", Value: i(cfg.MaxClients)},
		{Name: "maxmemory", Value: "0"}, // nothing is evicted; see memory-limit
		{Name: "maxmemory-clients", Value: atLeast0(cfg.MaxMemoryClients.N())},
		{Name: "maxmemory-policy", Value: "noeviction"},
		{Name: "port", Value: plainPort},
		{Name: "protected-mode", Value: yesNo(!cfg.AllowRemoteWithoutAuth)},
		{Name: "proto-max-bulk-len", Value: i64(cfg.RESP.MaxBulk)},
		{Name: "requirepass", Value: cfg.Password},
		{Name: "save", Value: ""}, // no snapshots: CHECKPOINT takes copies
		{Name: "timeout", Value: i64(int64(cfg.RESP.IdleTimeout.Seconds()))},
		{Name: "tls-auth-clients", Value: yesNo(tlsFiles.CA != "")},
		{Name: "tls-ca-cert-file", Value: tlsFiles.CA},
		{Name: "tls-cert-file", Value: tlsFiles.Cert},
		{Name: "tls-key-file", Value: tlsFiles.Key},
		{Name: "tls-port", Value: tlsPort},
		// sluice's flags.
		{Name: "accept-repaired-cluster-state", Value: strconv.FormatBool(cfg.AcceptRepairedClusterState)},
		{Name: "addr", Value: addr},
		{Name: "backup-dir", Value: cfg.BackupDir},
		{Name: "check-field-header", Value: strings.Join(fields, ",")},
		{Name: "check-header-style", Value: ck.HeaderStyle.String()},
		{Name: "check-identity-header", Value: ck.IdentityHeader},
		{Name: "check-ipv4-bits", Value: i(v4)},
		{Name: "check-ipv6-bits", Value: i(v6)},
		{Name: "check-trusted-proxies", Value: strings.Join(proxies, ",")},
		{Name: "data", Value: s.store.Dir()},
		{Name: "divvy-max-line", Value: i(cfg.Divvy.MaxLine)},
		{Name: "divvy-max-pipeline", Value: i(cfg.Divvy.MaxPipeline)},
		{Name: "divvy-timeout", Value: i64(int64(cfg.Divvy.IdleTimeout.Seconds()))},
		{Name: "fsync", Value: s.store.Mode().String()},
		{Name: "http-max-header-bytes", Value: i(cfg.HTTPMaxHeaderBytes)},
		{Name: "max-args", Value: i(cfg.RESP.MaxArgs)},
		{Name: "max-auth-failures", Value: atLeast0(int64(cfg.RESP.MaxAuthFailures.N()))},
		{Name: "max-bulk", Value: i64(cfg.RESP.MaxBulk)},
		{Name: "max-config-file", Value: i64(cfg.MaxConfigFile)},
		{Name: "max-inline", Value: i(cfg.RESP.MaxInline)},
		{Name: "max-key-size", Value: i(cfg.MaxKeySize)},
		{Name: "max-multi-bytes", Value: i(cfg.RESP.MaxMultiBytes)},
		{Name: "max-query-buffer", Value: i(cfg.RESP.MaxQueryBuffer)},
		{Name: "max-reply-buffer", Value: i(cfg.RESP.MaxReplyBuffer)},
		{Name: "memory-limit", Value: i64(cfg.MemoryLimit)},
		{Name: "on-store-error", Value: onStoreError},
		{Name: "policy", Value: cfg.PolicyFile},
		{Name: "policy-max-overrides", Value: i(cfg.PolicyMaxOverrides)},
		{Name: "policy-stats-days", Value: i(cfg.PolicyStatsDays)},
		{Name: "reload-timeout", Value: cfg.ReloadTimeout.String()},
		{Name: "rls-config", Value: cfg.RLS.Dir},
		{Name: "rls-max-descriptors", Value: i(cfg.RLS.MaxDescriptors)},
		{Name: "rls-max-header-bytes", Value: i(cfg.RLS.MaxHeaderBytes)},
		{Name: "rls-max-message", Value: i(cfg.RLS.MaxMessage)},
		{Name: "rls-max-streams", Value: i(cfg.RLS.MaxStreams)},
		{Name: "rls-response-headers", Value: strconv.FormatBool(cfg.RLS.ResponseHeaders)},
		{Name: "shutdown-timeout", Value: cfg.ShutdownTimeout.String()},
		{Name: "sweep-interval", Value: max(cfg.SweepInterval.N(), 0).String()},
		{Name: "sweep-rate", Value: atLeast0(int64(cfg.SweepRate.N()))},
		{Name: "tls-ca", Value: tlsFiles.CA},
		{Name: "tls-cert", Value: tlsFiles.Cert},
		{Name: "tls-key", Value: tlsFiles.Key},
	}
}
