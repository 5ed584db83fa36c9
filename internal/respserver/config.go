package respserver

import (
	"slices"
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
			c.Out = resp.AppendBulkString(c.Out, e.Name)
			c.Out = resp.AppendBulkString(c.Out, e.Value)
		}
	case "set", "rewrite", "resetstat":
		s.replyErr(c, resp.Error("ERR CONFIG "+strings.ToUpper(string(args[1]))+" is not supported: sluice is configured by flags and SLUICE_* environment variables at startup"))
	default:
		s.replyErr(c, resp.Error("ERR unknown subcommand '"+resp.Preview(args[1])+"'. Try CONFIG GET."))
	}
}

// Setting is a name CONFIG GET knows, with its value.
type Setting struct{ Name, Value string }

// configGet returns the settings the patterns match, as Redis 7's CONFIG
// GET: a pattern without *, ? or [ is a name, any case, answered under
// the name as given; another is a glob (globMatch) over every name. A
// setting matched twice is given once. Unknown names match nothing.
func (s *Server) configGet(patterns [][]byte) []Setting {
	all := s.host.Settings()
	var out []Setting
	seen := make(map[string]bool)
	for _, pat := range patterns {
		p := string(pat)
		exact := !strings.ContainsAny(p, "*?[")
		for _, e := range all {
			switch {
			case seen[e.Name]:
			case exact && strings.EqualFold(p, e.Name):
				out = append(out, Setting{p, e.Value})
				seen[e.Name] = true
			case !exact && globMatch(p, e.Name):
				out = append(out, e)
				seen[e.Name] = true
			}
		}
	}
	slices.SortFunc(out, func(a, b Setting) int { return strings.Compare(strings.ToLower(a.Name), strings.ToLower(b.Name)) })
	return out
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
