package respserver

import (
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/resp"
)

// cmdPolicy implements POLICY RELOAD, and hands the other subcommands
// to internal/policycmd.
func cmdPolicy(s *Server, c *client, args [][]byte) {
	switch {
	case len(args) == 2 && resp.EqualFold(args[1], "reload"):
		if err := s.host.ReloadRules(); err != nil {
			s.replyErr(c, err)
			return
		}
		c.Out = resp.AppendSimple(c.Out, "OK")
	default: // the rules' dials and POLICY SHOW: internal/policycmd
		who := policycmd.Who{Via: "resp", Addr: c.addr}
		if s.cfg.Password != "" {
			who.User = "default" // the only user, once AUTH is done
		}
		if err := s.polCmds.Run(&c.Ctx, who, args); err != nil {
			s.replyErr(c, err)
		}
	}
}
