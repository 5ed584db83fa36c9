package respserver

import (
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// The front end's own tests run it without the composition root (package
// server, whose tests run it composed): a store in a temporary directory,
// an engine, and testHost for what the server would answer.

// testOptions are what a test server differs in.
type testOptions struct {
	Rules    string           // the text of a rule file (.ini) for HIT; empty: none
	Clock    func() time.Time // default time.Now
	Cluster  *clusternode.Config
	Password string
	Logger   *slog.Logger
}

// testHost is the Host of a front end served alone.
type testHost struct{ addr atomic.Pointer[net.Addr] }

func (*testHost) Failure(err error) *errs.Error { return engine.Typed(err) }
func (h *testHost) Addr() net.Addr {
	if a := h.addr.Load(); a != nil {
		return *a
	}
	return nil
}
func (*testHost) Settings() []Setting                 { return nil }
func (*testHost) PolicyInfo(func(k, v string))        {}
func (*testHost) ReloadRules() error                  { return rules.ErrNoPolicy }
func (noRLS) Rule(rules.ID) (*policy.Rule, int, bool) { return nil, 0, false }

// noRLS is a server without Envoy's rules.
type noRLS struct{}

// newTestServer returns a front end over a new store, as the server makes
// it with its defaults, closed when the test ends.
func newTestServer(tb testing.TB, o testOptions) *Server {
	tb.Helper()
	store, err := storage.Open(tb.TempDir(), storage.Options{
		Sync: storage.SyncEverySec, Upgrade: keyspace.UpgradeKey, Class: keyspace.Class,
		Partition: keyspace.Partition, Partitions: keyspace.Partitions,
	})
	if err != nil {
		tb.Fatal(err)
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	f := &rules.File{}
	if o.Rules != "" {
		f.Path = filepath.Join(tb.TempDir(), "rules.ini")
		if err := os.WriteFile(f.Path, []byte(o.Rules), 0o644); err != nil {
			tb.Fatal(err)
		}
		if err := f.Load(); err != nil {
			tb.Fatal(err)
		}
	}
	var clus *clusternode.Node
	ecfg := engine.Config{Store: store, Clock: o.Clock, Tuning: engine.Tuning{MaxKeySize: 16 << 10}, MaxOverrides: engine.DefaultMaxOverrides}
	if o.Cluster != nil {
		if clus, err = clusternode.Open(clusternode.Options{Store: store, Logger: o.Logger, Clock: o.Clock, Mode: clusternode.Mode{Node: o.Cluster}}); err != nil {
			tb.Fatal(err)
		}
		ecfg.Cluster = clus
	}
	eng := engine.New(ecfg)
	done := make(chan struct{})
	sh := &struct {
		stats   Stats
		gate    admit.Gate
		closing atomic.Bool
		offset  atomic.Int64
	}{}
	s := New(Config{Password: o.Password, Tuning: Tuning{BackupDir: tb.TempDir()}}, Options{
		Store: store, Engine: eng, Rules: f, Policy: &policycmd.Commands{Engine: eng, Rules: f, Log: o.Logger},
		Cluster: clus, RLS: noRLS{}, Logger: o.Logger, Clock: o.Clock, ClockOffset: &sh.offset,
		Host: &testHost{}, Stats: &sh.stats, Gate: &sh.gate, Closing: &sh.closing, Done: done,
	})
	tb.Cleanup(func() {
		sh.closing.Store(true)
		s.Close()
		close(done)
		if clus != nil {
			clus.Close()
		}
		if err := store.Close(); err != nil {
			tb.Errorf("store close: %v", err)
		}
	})
	return s
}

// serveTest serves s on 127.0.0.1:0 until the test ends, and returns its
// address.
func serveTest(tb testing.TB, s *Server) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	a := ln.Addr()
	s.host.(*testHost).addr.Store(&a)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	tb.Cleanup(func() {
		s.closing.Store(true)
		_ = ln.Close()
		s.Finish()
		s.Wait()
		if err := <-served; err != nil {
			tb.Errorf("Serve: %v", err)
		}
	})
	return a.String()
}

// newBenchClient is a connection's state for driving srv's command path
// directly, without a socket.
func newBenchClient(srv *Server) *client {
	return &client{resp: 2, Ctx: srv.newCtx(), authed: true, tally: make([]tally, len(srv.cmds))}
}

// runPipelined runs args through srv's command path once per b.Loop
// iteration, after before (if set), and commits and flushes the tallies
// every 16 commands, as the connection loop does when a pipeline of 16
// ends.
func runPipelined(b *testing.B, srv *Server, c *client, args [][]byte, before func()) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if before != nil {
			before()
		}
		c.Out = c.Out[:0]
		srv.exec(c, args)
		if i%16 == 15 {
			if _, err := c.Round.Commit(); err != nil {
				b.Fatal(err)
			}
			c.Committed(true)
			srv.flushTally(c)
		}
	}
}

// t0 is the tests' start on the server clock.
const t0 = int64(1_700_000_000_000)
