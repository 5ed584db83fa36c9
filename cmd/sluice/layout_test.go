package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/storage"
)

// TestRefusesNewStoreBelowOldLayout: --data naming a new directory inside
// a volume that holds a store directly (the old layout) without
// --move-store-from is refused, naming both ways out, rather than serving
// an empty store; with it, the store moves and is served.
func TestRefusesNewStoreBelowOldLayout(t *testing.T) {
	vol := t.TempDir()
	fillStore(t, vol, [][]any{{"RL.REDUCE", "user:1", 10, 60, "AT", 1000}})
	data := filepath.Join(vol, "store")
	noEnv := func(string) (string, bool) { return "", false }
	// Cancelled: a start that is not refused stops instead of serving.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := run(ctx, []string{"--data", data, "--addr", "127.0.0.1:0", "--http-addr", ""}, noEnv, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--move-store-from "+vol) || !strings.Contains(err.Error(), "--data "+vol) {
		t.Fatalf("a new --data below a store: %v; want a refusal naming --move-store-from and --data %s", err, vol)
	}
	if held, _ := storage.HoldsStore(data); held {
		t.Fatalf("the refused start made a store in %s", data)
	}

	p := startProc(t, data, "--move-store-from", vol)
	if n, err := p.client(t).Do(context.Background(), "RL.REDUCE", "user:1", 10, 60, "AT", 1000).Int64(); err != nil || n != 9 {
		t.Fatalf("RL.REDUCE after the move: %d, %v; want 9, the state before it", n, err)
	}
}
