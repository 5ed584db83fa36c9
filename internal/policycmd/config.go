package policycmd

import (
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/rules"
)

// Config configures the divvy rules (HIT, the line protocol, /check) and
// their dials (POLICY). A zero field means the default given.
type Config struct {
	// File is a divvy rule file (.ini or .json) for HIT and the line
	// protocol. The server loads it at start and fails with its
	// validation error; a reload reads it again. Empty: no rules, and
	// HIT answers an error.
	File string
	// MaxOverrides is the most per-actor overrides (POLICY OVERRIDE) the
	// server keeps; default engine.DefaultMaxOverrides, which the engine
	// applies (engine.Config.MaxOverrides).
	MaxOverrides int
	// StatsDays is the days of threshold data (POLICY STATS) kept;
	// default engine.DefaultStatsDays, at most engine.MaxStatsDays, which
	// the engine applies (engine.Config.StatsDays).
	StatsDays int
}

// ReloadFile reads the --policy file again and, if it is valid, puts it
// in use at once for every new hit; hits under way finish with the rules
// they started with. A bad file keeps the rules in use, is logged and
// counted, and its error is returned. Without a policy file it does
// nothing and returns rules.ErrNoPolicy. The server runs it as one of its
// reloads (SIGHUP, POLICY RELOAD).
func (c *Commands) ReloadFile() error {
	f := c.Rules
	if f.Path == "" {
		return rules.ErrNoPolicy
	}
	if err := f.Reload(); err != nil {
		c.log().Error("policy reload failed; keeping the rules in use", "file", f.Path, "err", err)
		return err
	}
	c.log().Info("policy reloaded", "file", f.Path, "rules", len(f.Current().Counts))
	return nil
}

// Load puts the dials the store holds in use (the engine's), and logs
// the enforcement mode when it is not on. On a cluster node (cluster
// true) it warns of the per-actor overrides a standalone server kept in
// the store: they are records, which a node does not use (it keeps its
// own values).
func (c *Commands) Load(cluster bool) error {
	if err := c.Engine.LoadDials(); err != nil {
		return err
	}
	if err := c.Engine.LoadOverrides(); err != nil {
		return err
	}
	if cluster {
		if n, err := c.Engine.RecordOverrides(); err != nil {
			return err
		} else if n > 0 {
			c.log().Warn("cluster: this store holds per-actor overrides a standalone server kept; a cluster node does not use them: list them (POLICY OVERRIDES) standalone, or read them with sluice inspect --kind override, and set them on every node", "overrides", n)
		}
	}
	if m := c.Engine.Enforcement(); m != engine.Enforce {
		LogMode(c.log(), m)
	}
	return nil
}
