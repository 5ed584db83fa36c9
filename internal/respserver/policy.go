package respserver

import (
	"errors"
	"strconv"

	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/reload"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/internal/rules"
)

// cmdPolicy implements POLICY RELOAD, and hands the other subcommands
// to internal/policycmd.
func cmdPolicy(s *Server, c *client, args [][]byte) {
	switch {
	case len(args) == 2 && resp.EqualFold(args[1], "reload"):
		if err := reloadReply(s.host.ReloadRules()); err != nil {
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

// ReloadError is what POLICY RELOAD found bad, each kept as it was: the
// --policy file's error, the --rls-config directory's; nil when good.
type ReloadError struct{ Policy, RLS error }

func (e *ReloadError) Error() string   { return errors.Join(e.Policy, e.RLS).Error() }
func (e *ReloadError) Unwrap() []error { return []error{e.Policy, e.RLS} }

// reloadReply words POLICY RELOAD's error: a bad file says which, and
// that nothing changed (the policy file's first: a client fixes one at a
// time); a reload past --reload-timeout says so.
func reloadReply(err error) error {
	var re *ReloadError
	switch {
	case errors.As(err, &re) && re.Policy != nil:
		if errors.Is(re.Policy, rules.ErrNoPolicy) {
			return re.Policy
		}
		return resp.Error("ERR " + resp.OneLine(re.Policy.Error()) + "; the rules in use are kept")
	case re != nil && re.RLS != nil:
		return resp.Error("ERR --rls-config: " + resp.OneLine(re.RLS.Error()) + "; the configuration in use is kept")
	case errors.Is(err, reload.ErrTimeout):
		return resp.Error("ERR " + resp.OneLine(err.Error()))
	}
	return err
}

// policyInfo writes INFO's policy section but the other front ends'
// lines (Host.PolicyInfo): the rules in use, their reloads and dials.
func (s *Server) policyInfo(kv func(k, v string)) {
	ps := s.pol
	lp := ps.Current()
	kv("policy_file", ps.Path)
	if lp != nil {
		kv("policy_rules", strconv.Itoa(len(lp.Counts)))
		kv("policy_loaded_at", strconv.FormatInt(lp.At.Unix(), 10))
	} else {
		kv("policy_rules", "0")
		kv("policy_loaded_at", "0")
	}
	kv("policy_reloads", strconv.FormatInt(ps.Reloads.Load(), 10))
	kv("policy_reload_failures", strconv.FormatInt(ps.ReloadFailures.Load(), 10))
	kv("policy_last_reload_error", ps.LastError())
	s.polCmds.Info(kv)
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
