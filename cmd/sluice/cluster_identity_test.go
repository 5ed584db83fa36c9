package main

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/keyspace"
)

// TestClusterNodeRefusesAnotherOrdinal is issue 25's item 7: node 1
// restarted with node 0's ordinal on its own data directory exits with
// status 1, naming both nodes, instead of answering as node 0 from its
// records; restarted with its own ordinal (a pod rescheduled with its
// volume) it serves its buckets; --cluster-reassign-from re-assigns the
// directory on purpose.
func TestClusterNodeRefusesAnotherOrdinal(t *testing.T) {
	addrs := freePorts(t, 2)
	nodes := strings.Join(addrs, ",")
	dir := t.TempDir()
	as := func(ordinal int, extra ...string) []string {
		return append([]string{"--addr", addrs[1], "--cluster-nodes", nodes, "--cluster-ordinal", strconv.Itoa(ordinal)}, extra...)
	}
	p := startProc(t, dir, as(1)...)
	key := "k"
	for i := 0; keyspace.Slot([]byte(key)) < cluster.Slots/2; i++ {
		key = "k" + strconv.Itoa(i)
	}
	ctx := context.Background()
	if err := p.client(t).Do(ctx, "RL.REDUCE", key, 10, 60, "TAKE", 1, "AT", clusterAt).Err(); err != nil {
		t.Fatal(err)
	}
	p.stop(t, syscall.SIGTERM)

	p = startProcAsync(t, dir, nil, as(0)...)
	select {
	case <-p.exited:
	case addr := <-p.addrc:
		t.Fatalf("node 1's data directory started as node 0: it serves on %s as %s", addr, addrs[0])
	case <-time.After(time.Minute): // a hang fails, not blocks the suite
		t.Fatal("node 1's data directory started as node 0 neither served nor exited within a minute")
	}
	var exit *exec.ExitError
	if !errors.As(p.err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v; want status 1\n%s", p.err, p.logs)
	}
	for _, want := range []string{"belongs to node " + addrs[1], "as node " + addrs[0], "--cluster-reassign-from " + addrs[1]} {
		if !strings.Contains(p.logs.String(), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, p.logs)
		}
	}

	p = startProc(t, dir, as(1)...)
	if n, err := p.client(t).Do(ctx, "RL.GET", key, 10, 60, "AT", clusterAt).Int64(); err != nil || n != 9 {
		t.Fatalf("restarted with its own ordinal, RL.GET %s: %d %v; want 9", key, n, err)
	}
	p.stop(t, syscall.SIGTERM)

	p = startProc(t, dir, as(0, "--cluster-reassign-from", addrs[1])...)
	if id, err := p.client(t).Do(ctx, "CLUSTER", "MYID").Text(); err != nil || id != cluster.NodeID(addrs[0]) {
		t.Fatalf("re-assigned to node 0: CLUSTER MYID %s %v; want node 0's ID", id, err)
	}
}

// TestClusterShowNamesImpostor: a node started on a fresh volume with
// another node's ordinal answers with that node's ID; `sluice cluster
// show` names it and fails, and `move` refuses to run.
func TestClusterShowNamesImpostor(t *testing.T) {
	addrs := freePorts(t, 2)
	nodes := strings.Join(addrs, ",")
	for _, a := range addrs {
		startProc(t, t.TempDir(), "--addr", a, "--cluster-nodes", nodes, "--cluster-ordinal", "0")
	}
	ctx := context.Background()
	var out bytes.Buffer
	err := runReloading(ctx, nil, []string{"cluster", "show", "--nodes", nodes}, noEnvLookup, nil, &out, &out)
	t.Logf("show: %v\n%s", err, out.String())
	if err == nil || !strings.Contains(out.String(), "node "+addrs[1]+": answers as "+addrs[0]) {
		t.Fatalf("show with node 1 started as node 0: %v; want an error and a line naming %s answering as %s", err, addrs[1], addrs[0])
	}
	out.Reset()
	err = runReloading(ctx, nil, []string{"cluster", "move", "--nodes", nodes, "--slots", "0-9", "--to", addrs[1]}, noEnvLookup, nil, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "answer as another node") {
		t.Fatalf("move with node 1 started as node 0: %v\n%s; want it refused", err, out.String())
	}
}
