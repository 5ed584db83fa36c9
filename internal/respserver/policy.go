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
		if err := s.polCmds.Run(&c.Ctx, s.policyWho(c), args); err != nil {
			s.replyErr(c, err)
		}
	}
}

// policyWho is the client c, for the audit of a change.
func (s *Server) policyWho(c *client) policycmd.Who {
	who := policycmd.Who{Via: "resp", Addr: c.addr}
	if s.cfg.Password != "" {
		who.User = "default" // the only user, once AUTH is done
	}
	return who
}

// cmdRLSOverride implements RLS.OVERRIDE, per-descriptor overrides of
// Envoy's limits: internal/policycmd.
func cmdRLSOverride(s *Server, c *client, args [][]byte) {
	if err := s.polCmds.RLSOverrideCmd(&c.Ctx, s.policyWho(c), args[1:]); err != nil {
		s.replyErr(c, err)
	}
}

// cmdRLSOverrides implements RLS.OVERRIDES: internal/policycmd.
func cmdRLSOverrides(s *Server, c *client, args [][]byte) {
	if err := s.polCmds.RLSOverridesCmd(&c.Ctx, args[1:]); err != nil {
		s.replyErr(c, err)
	}
}
