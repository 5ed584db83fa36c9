package divvy

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// failingCommit stands for a cluster whose code panics as a round
// commits (noting the keys written in slots being moved): a bug met
// inside Commit, before the round leaves the write gate.
type failingCommit struct{}

func (failingCommit) ForwardCounter([]byte, *policy.Rule, int64, int64, int64) (bool, policy.Outcome, error) {
	return false, policy.Outcome{}, nil
}

func (failingCommit) NoteWrites(*storage.Batch) { panic("injected: noting a round's writes") }

type host struct{}

func (host) Failure(err error) *errs.Error { return engine.Typed(err) }

// A round that panics still leaves the write gate: the connection is
// closed and the panic counted, as for any panic, but a later slot move's
// pause (WaitWriters) does not wait for the dead round until it times out.
func TestPanickedRoundLeavesWriteGate(t *testing.T) {
	dir := t.TempDir()
	st, err := storage.Open(filepath.Join(dir, "db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	eng := engine.New(engine.Config{Store: st, Cluster: failingCommit{}})
	f := &rules.File{Path: filepath.Join(dir, "p.ini"), MaxBytes: 1 << 10}
	if err := os.WriteFile(f.Path, []byte("[path=/x ip=*]\ncreditLimit = 5\nresetSeconds = 60\nactorField = ip\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.Load(); err != nil {
		t.Fatal(err)
	}
	var netIn, netOut, panics, idle, conns atomic.Int64
	s := New(Config{}, eng, f, host{}, Shared{NetIn: &netIn, NetOut: &netOut, Panics: &panics, IdleClosed: &idle, ConnsTotal: &conns})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() {
		_ = ln.Close()
		s.Finish()
		s.Force()
		s.Wait()
	})

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("HIT path=/x ip=10.0.0.1\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
		t.Fatalf("after the panic: read %q, %v; want the connection closed without a reply", b, err)
	}
	if panics.Load() != 1 {
		t.Fatalf("%d panics counted, want 1", panics.Load())
	}
	if !eng.WaitWriters(time.Now().Add(2 * time.Second)) {
		t.Fatal("WaitWriters gave up: the round that panicked is still counted in the write gate")
	}
}
