package client_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestModuleHasNoPebble: users of the client module build only what its
// go.mod requires, and the server's store (Pebble) must not be part of it.
// The module graph is the client's alone (GOWORK=off), as a user's build
// sees it: the repository's go.work puts the server module, and so Pebble,
// into every graph in the checkout.
func TestModuleHasNoPebble(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no go on PATH: %v", err)
		}
		t.Skipf("no go on PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goCmd, "list", "-m", "all")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		t.Fatalf("go list -m all: %v\n%s", err, ee.Stderr)
	} else if err != nil {
		t.Fatalf("go list -m all: %v", err)
	}
	mods := strings.Fields(string(out))
	if len(mods) == 0 || mods[0] != "github.com/sluicehq/sluice/client" {
		t.Fatalf("go list -m all did not list the client module first:\n%s", out)
	}
	for line := range strings.Lines(string(out)) {
		if strings.HasPrefix(line, "github.com/cockroachdb/pebble") || strings.HasPrefix(line, "github.com/sluicehq/sluice ") {
			t.Errorf("the client module's build list has %s", strings.TrimSpace(line))
		}
	}
}
