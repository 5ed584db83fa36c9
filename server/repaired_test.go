package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/storage"
)

// TestRepairedClusterStateRefused: a node imports slots 0-99, then its
// IMPORT DONE and the push to epoch 1 land in a table of their own, which
// is lost (zero-filled) and taken out by sluice repair. The repair brings
// the node's cluster records back as they were (epoch 0, slots 0-99 being
// copied) and names them; the node then refuses to start, in cluster mode
// or standalone, rather than act on them: as they are, it would run at
// epoch 0 and drop its copy of slots it owns at epoch 1 as an interrupted
// move (the review's reproduction). With AcceptRepairedClusterState it
// starts, and the mark is gone.
func TestRepairedClusterStateRefused(t *testing.T) {
	nodes := []string{"127.0.0.1:7000", "127.0.0.1:7001"}
	ctx := context.Background()
	src := startServer(t, Config{})
	rs := newClient(t, src)
	for _, k := range []string{keyIn(0, 49), keyIn(50, 99)} {
		if err := rs.Do(ctx, "RL.REDUCE", k, 10, 60, "TAKE", 3).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.store.Flush(); err != nil {
		t.Fatal(err)
	}
	restore := []any{"CLUSTER", "RESTORE"}
	src.store.Scan(nil, []byte{0xff}, func(k, v []byte) bool { restore = append(restore, string(k), string(v)); return true })

	dir := t.TempDir()
	cc := &clusternode.Config{Nodes: nodes, Self: nodes[1]}
	tgt, closeTgt, err := newAt(t, dir, cc)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go tgt.Serve(ln)
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1})
	do := func(args ...any) {
		t.Helper()
		if err := rdb.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
	}
	do("CLUSTER", "IMPORT", "START", "0-99")
	do(restore...)
	if err := tgt.store.Compact(ctx); err != nil { // the copy and "copying" in the bottom level
		t.Fatal(err)
	}
	do("CLUSTER", "IMPORT", "DONE", "0-99", 1)
	do("CLUSTER", "SETTOPOLOGY", 1, nodes[0], "100-8191", nodes[1], "0-99,8192-16383")
	rdb.Close()
	closeTgt()

	// The table the last two went into, flushed alone, is lost.
	db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: pebble.FormatNewest, DisableAutomaticCompactions: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	levels, err := db.SSTables()
	if err != nil {
		t.Fatal(err)
	}
	var lost string
	for _, tab := range levels[0] {
		if bytes.HasPrefix(tab.Smallest.UserKey, []byte{0xff}) {
			lost = filepath.Join(dir, fmt.Sprintf("%s.sst", tab.BackingSSTNum))
		}
	}
	db.Close()
	fi, err := os.Stat(lost)
	if lost == "" || err != nil {
		t.Fatalf("no level-0 table of the cluster records alone (%q): %v", lost, err)
	}
	if err := os.WriteFile(lost, make([]byte, fi.Size()), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := storage.Repair(ctx, dir, storage.RepairOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.StaleMeta, clusternode.MetaTopology) || !slices.Contains(rep.StaleMeta, clusternode.MetaImport) {
		t.Fatalf("repair names %v as brought back older; want %s and %s", rep.StaleMeta, clusternode.MetaTopology, clusternode.MetaImport)
	}

	for _, c := range []*clusternode.Config{cc, nil} {
		_, _, err := newAt(t, dir, c)
		if !errors.Is(err, clusternode.ErrClusterStateRepaired) || !strings.Contains(err.Error(), "epoch 0") || !strings.Contains(err.Error(), "--accept-repaired-cluster-state") {
			t.Fatalf("start (cluster %v) on repaired cluster state: %v; want ErrClusterStateRepaired naming epoch 0 and the flag", c != nil, err)
		}
	}
	store, err := storage.Open(dir, StoreOptions(storage.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Store: store, Cluster: clusternode.Mode{Node: cc, AcceptRepairedState: true}})
	if err != nil {
		store.Close()
		t.Fatalf("start with AcceptRepairedClusterState: %v", err)
	}
	srv.Close()
	store.Close()
	if _, closeSrv, err := newAt(t, dir, cc); err != nil {
		t.Fatalf("a start after the accepted one: %v; want the mark gone", err)
	} else {
		closeSrv()
	}
}
