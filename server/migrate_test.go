package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
)

// TestMigrateCommands: the source side of a slot move notes the keys
// written in migrating slots and hands them over with their values,
// answers TRYAGAIN while paused and serves again after CANCEL; RESTORE,
// DROP and MIGRATE START refuse slots on the wrong side; a node that has
// forgotten a migration (restarted) refuses PAUSE and DIRTY.
func TestMigrateCommands(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: []string{"127.0.0.1:7000", "127.0.0.1:7001"}, Self: "127.0.0.1:7000"}}})
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

// TestMigrateRuleCounters: a slot move hands over rule counters of every
// kind AppendRuleKey makes, not only divvy's: hits forwarded to the owner
// of a migrating slot are noted by DIRTY with their values, and DUMP
// copies the same records.
func TestMigrateRuleCounters(t *testing.T) {
	path := filepath.Join("..", "policy", "testdata", "algorithms.ini")
	clock := newTestClock(t0)
	nodes := startClusterServers(t, 2, Config{Policy: policycmd.Config{File: path}, Clock: clock.now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	rules := nodes[0].pol.Current().Policy.Rules()
	// One counter of each kind in a slot of node 0.
	var lines, slots []string
	want := map[string]bool{}
	kinds := map[byte]bool{}
	for _, f := range []string{"path=/fws user=u%d", "path=/tb user=u%d", "path=/gcra-quota user=u%d quota=7", "path=/log user=u%d", "path=/quota user=u%d quota=4"} {
		for u := 0; ; u++ {
			line := fmt.Sprintf(f, u)
			req, _ := policy.ParseArgs(bytesFields(line), nil)
			r, _ := nodes[0].pol.Current().Policy.Match(req, nil)
			lim, _ := r.Limit(req)
			key := keyspace.AppendRuleKey(nil, r, lim, r.AppendCounterID(nil, req))
			slot := binary.BigEndian.Uint16(key)
			if _, mine := nodes[0].clus.Owner(slot); mine {
				lines, slots = append(lines, line), append(slots, strconv.Itoa(int(slot)))
				want[string(key)], kinds[key[2]] = true, true
				break
			}
		}
	}
	if len(kinds) != 5 || len(rules) == 0 {
		t.Fatalf("kinds %v; want 5", kinds)
	}
	rdb := newClient(t, nodes[0])
	ctx := context.Background()
	if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "START", strings.Join(slots, ",")).Err(); err != nil {
		t.Fatal(err)
	}
	for i, line := range lines {
		if _, _, err := hitDirect(t, nodes[i%2], line, 1); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
	}
	dirty, err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "DIRTY", 100).StringSlice()
	if err != nil || len(dirty) != 2*len(want) {
		t.Fatalf("DIRTY: %q %v; want the %d counters", dirty, err, len(want))
	}
	for i := 0; i < len(dirty); i += 2 {
		k := dirty[i]
		if !want[k] || dirty[i+1] == "" {
			t.Fatalf("DIRTY noted %q = %q; want one of the counters, with its value", k, dirty[i+1])
		}
		slot := int(binary.BigEndian.Uint16([]byte(k)))
		dump, err := rdb.Do(ctx, "CLUSTER", "DUMP", slot, slot, "", 10).StringSlice()
		if err != nil || len(dump) != 3 || dump[1] != k || dump[2] != dirty[i+1] {
			t.Fatalf("DUMP of slot %d: %q %v; want %q and DIRTY's value", slot, dump, err, k)
		}
	}
	if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "CANCEL").Err(); err != nil {
		t.Fatal(err)
	}
}

// TestMigrateDirtyWhileQueued: a key written again while its earlier
// change still waits in the commit queue (write-behind: up to a sync
// interval) is noted again, so that the DIRTY after the pause hands the
// latest value to the target.
func TestMigrateDirtyWhileQueued(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: []string{"127.0.0.1:7000", "127.0.0.1:7001"}, Self: "127.0.0.1:7000"}}})
	rdb := newClient(t, srv)
	ctx := context.Background()
	key := keyIn(100, 199)
	if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "START", "100-199").Err(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{1, 1} {
		if err := rdb.Do(ctx, "RL.REDUCE", key, 10, 60, "AT", 1000).Err(); err != nil {
			t.Fatal(err)
		}
		dirty, err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "DIRTY", 10).Slice()
		if err != nil || len(dirty) != 2*want {
			t.Fatalf("DIRTY after write %d: %d keys (%v); want %d: the change would not reach the target", i+1, len(dirty)/2, err, want)
		}
	}
	if err := rdb.Do(ctx, "CLUSTER", "MIGRATE", "CANCEL").Err(); err != nil {
		t.Fatal(err)
	}
}
