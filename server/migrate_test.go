package server

import (
	"context"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/keyspace"
)

// TestMigrateCommands: the source side of a slot move notes the keys
// written in migrating slots and hands them over with their values,
// answers TRYAGAIN while paused and serves again after CANCEL; RESTORE,
// DROP and MIGRATE START refuse slots on the wrong side; a node that has
// forgotten a migration (restarted) refuses PAUSE and DIRTY.
func TestMigrateCommands(t *testing.T) {
	srv := startServer(t, Config{Cluster: &ClusterConfig{Nodes: []string{"127.0.0.1:7000", "127.0.0.1:7001"}, Self: "127.0.0.1:7000"}})
	rdb := newClient(t, srv)
	ctx := context.Background()
	expectErr := func(want string, args ...any) {
		t.Helper()
		if err := rdb.Do(ctx, args...).Err(); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%v: %v, want an error containing %q", args, err, want)
		}
	}
	expectErr("no slot of this node is migrating", "CLUSTER", "MIGRATE", "DIRTY", 10)
	expectErr("no slot of this node is migrating", "CLUSTER", "MIGRATE", "PAUSE")
	expectErr("is not this node's", "CLUSTER", "MIGRATE", "START", "8000-8200")
	expectErr("is this node's", "CLUSTER", "DROP", "0-10")
	expectErr("is this node's", "CLUSTER", "RESTORE", "\x00\x05bkey", "v")

	key := keyIn(100, 199)
	if err := rdb.Do(ctx, "RL.REDUCE", key, 10, 60, "AT", 1000).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "START", "100-199").Err(); err != nil {
		t.Fatal(err)
	}
	dump, err := rdb.Do(ctx, "CLUSTER", "DUMP", 100, 199, "", 10).Slice()
	if err != nil || len(dump) != 3 || dump[0] != "" {
		t.Fatalf("DUMP: %q %v", dump, err)
	}
	if k := dump[1].(string); len(k) < 2 || int(k[0])<<8|int(k[1]) != int(keyspace.Slot([]byte(key))) {
		t.Fatalf("DUMP key %q", k)
	}
	if err := rdb.Do(ctx, "RL.REDUCE", key, 10, 60, "AT", 1000).Err(); err != nil {
		t.Fatal(err)
	}
	dirty, err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "DIRTY", 10).Slice()
	if err != nil || len(dirty) != 2 || dirty[0] != dump[1] || dirty[1] == dump[2] {
		t.Fatalf("DIRTY after a write: %q %v (dump %q)", dirty, err, dump)
	}
	if dirty, _ := rdb.Do(ctx, "CLUSTER", "MIGRATE", "DIRTY", 10).Slice(); len(dirty) != 0 {
		t.Fatalf("DIRTY again: %q", dirty)
	}
	if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "PAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	expectErr("TRYAGAIN", "RL.REDUCE", key, 10, 60)
	if err := rdb.Do(ctx, "RL.REDUCE", keyIn(300, 399), 10, 60).Err(); err != nil {
		t.Fatalf("a slot not migrating: %v", err)
	}
	if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "CANCEL").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "RL.REDUCE", key, 10, 60).Err(); err != nil {
		t.Fatalf("after CANCEL: %v", err)
	}
}
