package respserver

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/resp"
)

// DebugAccess says who may run DEBUG (Config.Debug), as Redis 7's
// enable-debug-command.
type DebugAccess int

const (
	// DebugRefused refuses DEBUG to every client: the default.
	DebugRefused DebugAccess = iota
	// DebugLocal allows DEBUG to clients on loopback (or a Unix socket).
	DebugLocal
	// DebugAllowed allows DEBUG to every authenticated client.
	DebugAllowed
)

// MaxClockOffset bounds DEBUG CLOCK-OFFSET either way: 100 years, far
// past any test's jump, and far from int64 nanoseconds' 292 years.
const MaxClockOffset = 100 * 365 * 24 * time.Hour

var (
	errDebugRefused = resp.Error("ERR DEBUG command not allowed: start sluice with --enable-debug-command yes (or local, for clients on loopback)")
	errDebugLocal   = resp.Error("ERR DEBUG command not allowed from this address: --enable-debug-command is local, which allows clients on loopback only")
)

var debugHelp = []string{
	"DEBUG <subcommand> [<arg> ...]. Subcommands are:",
	"CLOCK-OFFSET [<milliseconds>]",
	"    Shift the server clock by <milliseconds> (negative: back; 0: none) from the",
	"    system clock, for every later decision on it; without an argument, reply",
	"    the shift in force.",
	"HELP",
	"    Print this help.",
}

// cmdDebug runs DEBUG, refused unless Config.Debug allows the client.
func cmdDebug(s *Server, c *client, args [][]byte) {
	switch s.cfg.Debug {
	case DebugAllowed:
	case DebugLocal:
		if c.conn == nil || !admit.IsLoopback(c.conn.nc.RemoteAddr()) {
			s.replyErr(c, errDebugLocal)
			return
		}
	default:
		s.replyErr(c, errDebugRefused)
		return
	}
	switch strings.ToLower(string(args[1])) {
	case "help":
		c.Out = appendHelp(c.Out, debugHelp)
	case "clock-offset":
		switch len(args) {
		case 2:
			c.Out = resp.AppendInt(c.Out, time.Duration(s.clockOffset.Load()).Milliseconds())
		case 3:
			ms, err := strconv.ParseInt(string(args[2]), 10, 64)
			if err != nil || ms > MaxClockOffset.Milliseconds() || ms < -MaxClockOffset.Milliseconds() {
				s.replyErr(c, resp.Error("ERR DEBUG CLOCK-OFFSET '"+resp.Preview(args[2])+"': want an integer of milliseconds from "+
					strconv.FormatInt(-MaxClockOffset.Milliseconds(), 10)+" to "+strconv.FormatInt(MaxClockOffset.Milliseconds(), 10)))
				return
			}
			s.clockOffset.Store(int64(time.Duration(ms) * time.Millisecond))
			s.log.Warn("server clock shifted by DEBUG CLOCK-OFFSET", "offset_ms", ms)
			c.Out = resp.AppendSimple(c.Out, "OK")
		default:
			s.replyErr(c, resp.Error("ERR wrong number of arguments for 'debug|clock-offset' command: want DEBUG CLOCK-OFFSET [<milliseconds>]"))
		}
	default:
		s.replyErr(c, resp.Error("ERR unknown subcommand '"+resp.Preview(args[1])+"'. Try DEBUG HELP."))
	}
}
