package clusternode

import (
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/logrec"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/storage"
)

// openNode opens a node (cfg; nil: standalone) on st, or on a store of
// its own when st is nil.
func openNode(t *testing.T, st *storage.Store, cfg *Config) (*Node, *storage.Store, error) {
	t.Helper()
	if st == nil {
		var err error
		if st, err = storage.Open("db", storage.Options{Disk: storage.NewMemDisk()}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
	}
	n, err := Open(Options{Store: st, Mode: Mode{Node: cfg}})
	return n, st, err
}

var nodes = []string{"127.0.0.1:7000", "127.0.0.1:7001"}

// caller is a connection with nothing under way.
type caller struct{}

func (caller) Commit() error          { return nil }
func (caller) Quiesce(time.Time) bool { return true }
func (caller) RESP3() bool            { return false }

// command runs a CLUSTER subcommand on n and returns its error.
func command(n *Node, args ...string) error {
	a := make([][]byte, len(args))
	for i, s := range args {
		a[i] = []byte(s)
	}
	x := dispatch.Ctx{Round: engine.New(engine.Config{Store: n.store}).NewRound()}
	return n.Command(&x, a, caller{})
}

// TestOpenStandalone: without a Config, Open checks the store and
// returns no node; a store a cluster node owning some slots recorded is
// then refused.
func TestOpenStandalone(t *testing.T) {
	if n, _, err := openNode(t, nil, nil); n != nil || err != nil {
		t.Fatalf("standalone on a fresh store: %v, %v; want no node, no error", n, err)
	}
	_, st, err := openNode(t, nil, &Config{Nodes: nodes, Self: nodes[1]})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := openNode(t, st, nil); !errors.Is(err, ErrClusterIdentity) {
		t.Fatalf("standalone on node 1's store: %v; want ErrClusterIdentity", err)
	}
}

// TestRoute: node 0 of two serves slots 0-8191, answers the address of
// node 1 for the others, CLUSTERDOWN once a topology leaves a slot to
// nobody, and TRYAGAIN for a slot paused by a move.
func TestRoute(t *testing.T) {
	n, _, err := openNode(t, nil, &Config{Nodes: nodes, Self: nodes[0]})
	if err != nil {
		t.Fatal(err)
	}
	if moved, err := n.Route(0); moved != "" || err != nil {
		t.Errorf("slot 0: %q %v; want served", moved, err)
	}
	if moved, err := n.Route(8192); moved != nodes[1] || err != nil {
		t.Errorf("slot 8192: %q %v; want moved to %s", moved, err, nodes[1])
	}
	if err := command(n, "CLUSTER", "SETTOPOLOGY", "1", nodes[0], "0-8191", nodes[1], "8192-16382"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Route(16383); err == nil || err.Error() != "CLUSTERDOWN Hash slot not served" {
		t.Errorf("slot 16383, owned by nobody: %v; want CLUSTERDOWN", err)
	}
	for _, args := range [][]string{{"CLUSTER", "MIGRATE", "START", "100"}, {"CLUSTER", "MIGRATE", "PAUSE"}} {
		if err := command(n, args...); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	if _, err := n.Route(100); err == nil || err.Error() != errTryAgain.Error() {
		t.Errorf("slot 100, paused: %v; want TRYAGAIN", err)
	}
	if !n.SlotMigrating(100) || n.SlotMigrating(101) {
		t.Errorf("migrating: slot 100 %v, 101 %v; want true, false", n.SlotMigrating(100), n.SlotMigrating(101))
	}
	if moved, err := n.Route(101); moved != "" || err != nil {
		t.Errorf("slot 101, not moving: %q %v; want served", moved, err)
	}
}

// TestRefusalsTyped: the node's own refusals are typed errors (package
// errs), which the front end words as it did when they were RESP strings:
// a bad CLUSTER subcommand is the request's, a slot nobody serves or one
// paused by a move the cluster's, and a key of another node's slot a MOVED.
func TestRefusalsTyped(t *testing.T) {
	n, _, err := openNode(t, nil, &Config{Nodes: nodes, Self: nodes[0]})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error, kind errs.Kind, text string) {
		t.Helper()
		var e *errs.Error
		if !errors.As(err, &e) || e.Kind != kind || resp.ErrorText(e) != text {
			t.Errorf("%s: %#v; want kind %d answered %q", what, err, kind, text)
		}
	}
	check("CLUSTER NOSUCH", command(n, "CLUSTER", "NOSUCH"), errs.Request,
		"ERR unknown subcommand or wrong number of arguments for 'NOSUCH'. Try CLUSTER HELP.")
	check("CLUSTER MIGRATE PAUSE, no move", command(n, "CLUSTER", "MIGRATE", "PAUSE"), errs.Request,
		"ERR no slot of this node is migrating (did it restart since CLUSTER MIGRATE START?): start the move again")
	moved, err := n.Route(8192)
	check("slot 8192", routeErr(8192, moved, err), errs.Request, "MOVED 8192 "+nodes[1])
	if err := command(n, "CLUSTER", "SETTOPOLOGY", "1", nodes[0], "0-8191", nodes[1], "8192-16382"); err != nil {
		t.Fatal(err)
	}
	_, err = n.Route(16383)
	check("slot 16383, owned by nobody", err, errs.Forward, "CLUSTERDOWN Hash slot not served")
	for _, args := range [][]string{{"CLUSTER", "MIGRATE", "START", "100"}, {"CLUSTER", "MIGRATE", "PAUSE"}} {
		if err := command(n, args...); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	_, err = n.Route(100)
	check("slot 100, paused", err, errs.Forward, "TRYAGAIN Slot is being handed over to another node; retry shortly")
}

// TestOpenWarnsOfTLSWithoutCA: a cluster node serving RESP over TLS
// without --tls-ca cannot forward a counter's hit to another node (it
// could not verify it); Open says so once, at warn, naming the flag. With
// the CA, or standalone, it says nothing.
func TestOpenWarnsOfTLSWithoutCA(t *testing.T) {
	cert, key := filepath.Join("..", "admit", "testdata", "node-a.pem"), filepath.Join("..", "admit", "testdata", "node-a-key.pem")
	for _, c := range []struct {
		name    string
		ca      string
		cluster bool
		warned  bool
	}{
		{"cluster, no CA", "", true, true},
		{"cluster, a CA", cert, true, false},
		{"standalone, no CA", "", false, false},
	} {
		tt, err := admit.NewTLS(admit.TLSFiles{Cert: cert, Key: key, CA: c.ca}, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		st, err := storage.Open("db", storage.Options{Disk: storage.NewMemDisk()})
		if err != nil {
			t.Fatal(err)
		}
		rec := &logrec.Recorder{Level: slog.LevelWarn}
		o := Options{Store: st, Logger: slog.New(rec), TLS: tt}
		if c.cluster {
			o.Mode.Node = &Config{Nodes: nodes, Self: nodes[0]}
		}
		if _, err := Open(o); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		st.Close()
		warned := false
		for _, r := range rec.Records() {
			warned = warned || strings.Contains(r["msg"], "--tls-ca") && strings.Contains(r["msg"], "HIT, /check and Envoy's calls")
		}
		if warned != c.warned {
			t.Errorf("%s: warned %v, want %v; logged %v", c.name, warned, c.warned, rec.Records())
		}
	}
}
