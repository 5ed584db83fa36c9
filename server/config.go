package server

import (
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
)

// cmdConfig answers CONFIG GET with the server's settings (read-only: they
// are flags), so that tools like redis-benchmark and redis_exporter can
// read them.
func cmdConfig(s *Server, c *client, args [][]byte) {
	switch strings.ToLower(string(args[1])) {
	case "get":
		if len(args) < 3 {
			s.replyErr(c, errs.WrongArgs("config|get"))
			return
		}
		got := s.configGet(args[2:])
		c.Out = resp.AppendMap(c.Out, len(got), c.resp == 3)
		for _, e := range got {
			c.Out = resp.AppendBulkString(c.Out, e.name)
			c.Out = resp.AppendBulkString(c.Out, e.value)
		}
	case "set", "rewrite", "resetstat":
		s.replyErr(c, resp.Error("ERR CONFIG "+strings.ToUpper(string(args[1]))+" is not supported: sluice is configured by flags and SLUICE_* environment variables at startup"))
	default:
		s.replyErr(c, resp.Error("ERR unknown subcommand '"+resp.Preview(args[1])+"'. Try CONFIG GET."))
	}
}

// setting is a name CONFIG GET knows, with its value.
type setting struct{ name, value string }

// configGet returns the settings the patterns match, as Redis 7's CONFIG
// GET: a pattern without *, ? or [ is a name, any case, answered under
// the name as given; another is a glob (globMatch) over every name. A
// setting matched twice is given once. Unknown names match nothing.
func (s *Server) configGet(patterns [][]byte) []setting {
	all := s.settings()
	var out []setting
	seen := make(map[string]bool)
	for _, pat := range patterns {
		p := string(pat)
		exact := !strings.ContainsAny(p, "*?[")
		for _, e := range all {
			switch {
			case seen[e.name]:
			case exact && strings.EqualFold(p, e.name):
				out = append(out, setting{p, e.value})
				seen[e.name] = true
			case !exact && globMatch(p, e.name):
				out = append(out, e)
				seen[e.name] = true
			}
		}
	}
	slices.SortFunc(out, func(a, b setting) int { return strings.Compare(strings.ToLower(a.name), strings.ToLower(b.name)) })
	return out
}

// settings is every setting CONFIG GET answers: by its redis.conf name
// where Redis has one that means the same (docs/protocol.md lists them),
// and by its sluice flag's name, in the flag's syntax. Sizes are in bytes
// and durations in Go's syntax, which the flags take.
func (s *Server) settings() []setting {
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
	return []setting{
		// redis.conf's names.
		{"appendfsync", s.store.Mode().String()},
		{"appendonly", "yes"}, // every write is in the store's log
		{"bind", bind},
		{"client-output-buffer-limit", "normal " + i(cfg.RESP.MaxReplyBuffer) + " 0 0 slave 0 0 0 pubsub 0 0 0"},
		{"client-query-buffer-limit", i(cfg.RESP.MaxQueryBuffer)},
		{"cluster-enabled", yesNo(s.clus != nil)},
		{"databases", "1"},
		{"dir", s.store.Dir()},
		{"enable-debug-command", [...]string{DebugRefused: "no", DebugLocal: "local", DebugAllowed: "yes"}[cfg.Debug]},
		{"maxclients", i(cfg.MaxClients)},
		{"maxmemory", "0"}, // nothing is evicted; see memory-limit
		{"maxmemory-clients", atLeast0(cfg.MaxMemoryClients.N())},
		{"maxmemory-policy", "noeviction"},
		{"port", plainPort},
		{"protected-mode", yesNo(!cfg.AllowRemoteWithoutAuth)},
		{"proto-max-bulk-len", i64(cfg.RESP.MaxBulk)},
		{"requirepass", cfg.Password},
		{"save", ""}, // no snapshots: CHECKPOINT takes copies
		{"timeout", i64(int64(cfg.RESP.IdleTimeout.Seconds()))},
		{"tls-auth-clients", yesNo(tlsFiles.CA != "")},
		{"tls-ca-cert-file", tlsFiles.CA},
		{"tls-cert-file", tlsFiles.Cert},
		{"tls-key-file", tlsFiles.Key},
		{"tls-port", tlsPort},
		// sluice's flags.
		{"accept-repaired-cluster-state", strconv.FormatBool(cfg.AcceptRepairedClusterState)},
		{"addr", addr},
		{"backup-dir", cfg.BackupDir},
		{"check-field-header", strings.Join(fields, ",")},
		{"check-header-style", ck.HeaderStyle.String()},
		{"check-identity-header", ck.IdentityHeader},
		{"check-ipv4-bits", i(v4)},
		{"check-ipv6-bits", i(v6)},
		{"check-trusted-proxies", strings.Join(proxies, ",")},
		{"data", s.store.Dir()},
		{"divvy-max-line", i(cfg.Divvy.MaxLine)},
		{"divvy-max-pipeline", i(cfg.Divvy.MaxPipeline)},
		{"divvy-timeout", i64(int64(cfg.Divvy.IdleTimeout.Seconds()))},
		{"fsync", s.store.Mode().String()},
		{"http-max-header-bytes", i(cfg.HTTPMaxHeaderBytes)},
		{"max-args", i(cfg.RESP.MaxArgs)},
		{"max-auth-failures", atLeast0(int64(cfg.RESP.MaxAuthFailures.N()))},
		{"max-bulk", i64(cfg.RESP.MaxBulk)},
		{"max-config-file", i64(cfg.MaxConfigFile)},
		{"max-inline", i(cfg.RESP.MaxInline)},
		{"max-key-size", i(cfg.MaxKeySize)},
		{"max-multi-bytes", i(cfg.RESP.MaxMultiBytes)},
		{"max-query-buffer", i(cfg.RESP.MaxQueryBuffer)},
		{"max-reply-buffer", i(cfg.RESP.MaxReplyBuffer)},
		{"memory-limit", i64(cfg.MemoryLimit)},
		{"on-store-error", onStoreError},
		{"policy", cfg.PolicyFile},
		{"policy-max-overrides", i(cfg.PolicyMaxOverrides)},
		{"policy-stats-days", i(cfg.PolicyStatsDays)},
		{"reload-timeout", cfg.ReloadTimeout.String()},
		{"rls-config", cfg.RLS.Dir},
		{"rls-max-descriptors", i(cfg.RLS.MaxDescriptors)},
		{"rls-max-header-bytes", i(cfg.RLS.MaxHeaderBytes)},
		{"rls-max-message", i(cfg.RLS.MaxMessage)},
		{"rls-max-streams", i(cfg.RLS.MaxStreams)},
		{"rls-response-headers", strconv.FormatBool(cfg.RLS.ResponseHeaders)},
		{"shutdown-timeout", cfg.ShutdownTimeout.String()},
		{"sweep-interval", max(cfg.SweepInterval.N(), 0).String()},
		{"sweep-rate", atLeast0(int64(cfg.SweepRate.N()))},
		{"tls-ca", tlsFiles.CA},
		{"tls-cert", tlsFiles.Cert},
		{"tls-key", tlsFiles.Key},
	}
}

// globMatch reports whether name matches the glob pattern p as Redis'
// stringmatchlen matches CONFIG GET's patterns (case-insensitively): * is
// any run of bytes, ? one byte, [abc] one of those (a-z a range, ^ first
// negates, a class without ] runs to the pattern's end), \x the byte x.
// Every token but * matches exactly one byte, so backtracking to the last
// * is enough, and the time is at most the product of the lengths, where
// Redis' recursion could take exponential time (it caps its depth).
func globMatch(p, name string) bool {
	pi, ni := 0, 0
	star, mark := -1, 0
	for ni < len(name) {
		if pi < len(p) && p[pi] == '*' {
			star, mark = pi, ni
			pi++
			continue
		}
		if pi < len(p) {
			if n, ok := globOne(p[pi:], name[ni]); ok {
				pi, ni = pi+n, ni+1
				continue
			}
		}
		if star < 0 {
			return false
		}
		mark++
		pi, ni = star+1, mark
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// globOne matches the byte b against the token p starts with (not *): it
// returns the token's length and whether b matches it.
func globOne(p string, b byte) (n int, ok bool) {
	lower := func(c byte) byte {
		if 'A' <= c && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	switch p[0] {
	case '?':
		return 1, true
	case '\\':
		if len(p) >= 2 {
			return 2, lower(p[1]) == lower(b)
		}
	case '[':
		i := 1
		not := i < len(p) && p[i] == '^'
		if not {
			i++
		}
		match := false
		for ; i < len(p); i++ {
			switch {
			case p[i] == '\\' && i+1 < len(p):
				i++
				match = match || p[i] == b // as Redis: an escaped byte is compared as is
			case p[i] == ']':
				return i + 1, match != not
			case i+2 < len(p) && p[i+1] == '-':
				lo, hi := lower(p[i]), lower(p[i+2])
				if lo > hi {
					lo, hi = hi, lo
				}
				match = match || lo <= lower(b) && lower(b) <= hi
				i += 2
			default:
				match = match || lower(p[i]) == lower(b)
			}
		}
		return len(p), match != not
	}
	return 1, lower(p[0]) == lower(b)
}
