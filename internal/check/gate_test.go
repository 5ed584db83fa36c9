package check

import (
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// panicky stands for a cluster whose forwarding code panics: a bug met in
// the middle of a request's round, after its Begin.
type panicky struct{}

func (panicky) ForwardCounter([]byte, *policy.Rule, int64, int64, int64) (bool, policy.Outcome, error) {
	panic("injected: forwarding a counter")
}

func (panicky) NoteWrites(*storage.Batch) {}

type host struct{}

func (host) Failure(err error) *errs.Error { return engine.Typed(err) }

// A request whose round panics still leaves the write gate. The panic
// goes on to net/http, which logs it and drops the connection, as for any
// handler; but a later slot move's pause (WaitWriters) does not wait for
// the dead round until it times out.
func TestPanickedCheckLeavesWriteGate(t *testing.T) {
	st, err := storage.Open("db", storage.Options{Disk: storage.NewMemDisk()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	eng := engine.New(engine.Config{Store: st, Cluster: panicky{}})
	f := &rules.File{Path: filepath.Join("..", "..", "policy", "testdata", "algorithms.ini"), MaxBytes: 1 << 20}
	if err := f.Load(); err != nil {
		t.Fatal(err)
	}
	h := New(Config{IdentityHeader: "X-User"}, Options{Engine: eng, Rules: f, Host: host{}, AllowRemote: true})
	req := httptest.NewRequest("GET", "/check/tb", nil)
	req.Header.Set("X-User", "a")
	func() {
		defer func() {
			if p := recover(); p != "injected: forwarding a counter" {
				t.Fatalf("recovered %v; want the injected panic, which net/http must see", p)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), req)
	}()
	if !eng.WaitWriters(time.Now().Add(2 * time.Second)) {
		t.Fatal("WaitWriters gave up: the request that panicked is still counted in the write gate")
	}
}
