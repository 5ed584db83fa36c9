package respserver

import (
	"strings"
	"testing"
)

// TestKeyedCommandsDeclareKeys: every command with keys declares them at
// position 1, so that cluster clients route it by its first argument.
func TestKeyedCommandsDeclareKeys(t *testing.T) {
	for name, cmd := range commandTable(nil) {
		// SLUICE.COUNTERHIT's argument is a store key, whose slot is in
		// its first two bytes: it checks the slot itself.
		// DEL and WATCH take any number of keys, as in Redis.
		// RLS.OVERRIDE(S) name an Envoy domain and descriptor, no key.
		many := name == "del" || name == "watch"
		keyed := (strings.Contains(name, ".") && name != "sluice.counterhit" && !strings.HasPrefix(name, "rls.")) || many
		if keyed != (cmd.First > 0) {
			t.Errorf("%s: first key %d", name, cmd.First)
		}
		if keyed && (cmd.First != 1 || cmd.Step != 1 || (cmd.Last != 1 && !many) || (many && cmd.Last != -1)) {
			t.Errorf("%s: keys %d %d %d", name, cmd.First, cmd.Last, cmd.Step)
		}
	}
}

// TestCommandsHaveDocs: every command of the table has a Doc with a
// summary and a group, which COMMAND DOCS answers (the server's
// TestLimiterCommandInfo checks that it does).
func TestCommandsHaveDocs(t *testing.T) {
	for name, cmd := range commandTable(nil) {
		if cmd.Doc == nil || cmd.Doc.Summary == "" || cmd.Doc.Group == "" {
			t.Errorf("command %s has no COMMAND DOCS record", name)
		}
	}
}
