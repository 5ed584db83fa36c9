package engine

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// counter is a limit of n: each Mutate takes one, and notes the count it
// saw, as a limiter's mutator notes its outcome.
type counter struct {
	n    byte
	seen byte
}

func (m *counter) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	m.seen = 0
	if found && len(old) == 1 {
		m.seen = old[0]
	}
	if m.seen >= m.n {
		return nil, storage.Keep, nil
	}
	return []byte{m.seen + 1}, storage.Put, nil
}

func openStore(t testing.TB, disk *storage.MemDisk) *storage.Store {
	t.Helper()
	st, err := storage.Open("db", storage.Options{Sync: storage.SyncAlways, Disk: disk, Partition: keyspace.Partition, Partitions: keyspace.Partitions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// A round's changes are committed by Commit; when the store refuses them,
// the answers that showed them stand only under --on-store-error allow,
// which counts them, one per operation.
func TestCommitOnStoreError(t *testing.T) {
	for _, mode := range []OnStoreError{Refuse, Allow} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			disk := storage.NewMemDisk()
			e := New(Config{Store: openStore(t, disk), Tuning: Tuning{OnStoreError: mode}})
			t.Cleanup(func() { disk.FailWrites(nil) }) // before the store closes
			r := e.NewRound()
			m := &counter{n: 5}
			if err := r.Limit([]byte("k"), m); err != nil || m.seen != 0 {
				t.Fatalf("first take: seen %d, %v; want 0, nil", m.seen, err)
			}
			if ok, err := r.Commit(); !ok || err != nil {
				t.Fatalf("first commit: %v, %v; want true, nil", ok, err)
			}
			disk.FailWrites(fmt.Errorf("injected: %w", syscall.ENOSPC))
			if err := r.Limit([]byte("k"), m); err != nil || m.seen != 1 {
				t.Fatalf("take as the disk fills: seen %d, %v; want 1, nil", m.seen, err)
			}
			ok, err := r.Commit()
			if errs.KindOf(StoreErr(err)) != errs.StoreUnavailable && !errors.Is(err, storage.ErrUnavailable) {
				t.Fatalf("commit as the disk fills: %v; want the store's unavailability", err)
			}
			if ok != (mode == Allow) {
				t.Fatalf("commit as the disk fills: answers stand %v; want %v", ok, mode == Allow)
			}
			if want := map[OnStoreError]int64{Refuse: 0, Allow: 1}[mode]; e.StoreAllowed() != want {
				t.Fatalf("StoreAllowed %d, want %d", e.StoreAllowed(), want)
			}
		})
	}
}

// cluster stands for the other nodes: it owns the counters whose keys it
// is told, and notes what the rounds write.
type cluster struct {
	owned    map[string]bool
	out      policy.Outcome
	err      error
	forwards int
	noted    []string
}

func (c *cluster) ForwardCounter(key []byte, r *policy.Rule, limit, hits, now int64) (bool, policy.Outcome, error) {
	if !c.owned[string(key)] {
		return false, policy.Outcome{}, nil
	}
	c.forwards++
	out := c.out
	if out.Rate == 0 {
		out.Rate = limit // the owner applied the limit sent: no override there
	}
	return true, out, c.err
}

func (c *cluster) NoteWrites(b *storage.Batch) {
	b.Keys(func(k []byte) { c.noted = append(c.noted, string(k)) })
}

func loadRules(t *testing.T) *rules.Set {
	t.Helper()
	f := rules.File{Path: filepath.Join("..", "..", "policy", "testdata", "algorithms.ini"), MaxBytes: 1 << 20}
	if err := f.Load(); err != nil {
		t.Fatal(err)
	}
	return f.Current()
}

func request(kv ...string) policy.Request {
	var req policy.Request
	for i := 0; i < len(kv); i += 2 {
		req = append(req, policy.Field{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
	}
	return req
}

// A hit of a counter another node owns goes to it through Cluster and
// writes nothing here; a hit of one this node owns is applied here, and
// its key is noted for the cluster before the commit. The rule's metrics
// count both once committed.
func TestHitForwardsThroughCluster(t *testing.T) {
	lp := loadRules(t)
	cl := &cluster{owned: map[string]bool{}, out: policy.Outcome{Allowed: true, CreditsLeft: 41, Limit: 42}}
	e := New(Config{Store: openStore(t, storage.NewMemDisk()), Cluster: cl})
	r := e.NewRound()
	now := time.Unix(1700000000, 0).UnixNano()

	// Find the counter key of user a's hits on /tb, then have the
	// cluster own it.
	out, err := r.Hit(lp, request("path", "/tb", "user", "a"), 1, now)
	if err != nil || !out.Allowed || out.Rule == nil || out.Rule.Label != "tb" {
		t.Fatalf("local hit: %+v, %v", out, err)
	}
	if r.Len() != 1 {
		t.Fatalf("local hit queued %d changes, want 1", r.Len())
	}
	key := string(r.key)
	if ok, err := r.Commit(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if len(cl.noted) != 1 || cl.noted[0] != key {
		t.Fatalf("noted %q before the commit, want [%q]", cl.noted, key)
	}

	cl.owned[key] = true
	out, err = r.Hit(lp, request("path", "/tb", "user", "a"), 1, now)
	if err != nil || cl.forwards != 1 || out.CreditsLeft != 41 || out.Rule == nil || out.Rule.Label != "tb" {
		t.Fatalf("forwarded hit: %+v, %v after %d forwards; want the owner's outcome, with the rule", out, err, cl.forwards)
	}
	if r.Len() != 0 {
		t.Fatalf("a forwarded hit queued %d changes here", r.Len())
	}
	if _, err := r.Commit(); err != nil {
		t.Fatal(err)
	}
	if c := lp.Counts[out.Rule.Pos-1]; c.Accepted.Load() != 2 {
		t.Fatalf("rule tb counted %d accepted hits, want 2", c.Accepted.Load())
	}

	// The owner's failure is the hit's error, typed as it came.
	cl.err = &errs.Error{Kind: errs.Forward, Code: "CLUSTERDOWN", Msg: "Hash slot not served"}
	if _, err := r.Hit(lp, request("path", "/tb", "user", "a"), 1, now); errs.KindOf(err) != errs.Forward {
		t.Fatalf("hit the owner refused: %v; want a Forward error", err)
	}
}

// A request whose answer was not told (Fail) still commits what it
// changed, but its hits that wrote are not counted as answered.
func TestFailedRoundCountsNoWrites(t *testing.T) {
	lp := loadRules(t)
	e := New(Config{Store: openStore(t, storage.NewMemDisk())})
	r := e.NewRound()
	now := time.Unix(1700000000, 0).UnixNano()
	out, err := r.Hit(lp, request("path", "/fw", "user", "b"), 1, now)
	if err != nil {
		t.Fatal(err)
	}
	r.Fail()
	if ok, err := r.Commit(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	c := lp.Counts[out.Rule.Pos-1]
	if c.Accepted.Load()+c.Rejected.Load() != 0 {
		t.Fatalf("a failed round counted %d hits", c.Accepted.Load()+c.Rejected.Load())
	}
	// Committed: the next hit sees the first.
	if out, err = r.Hit(lp, request("path", "/fw", "user", "b"), 1, now); err != nil || out.CreditsLeft != 0 {
		t.Fatalf("second hit: %+v, %v; want 0 credits left", out, err)
	}
	if _, err := r.Commit(); err != nil || c.Accepted.Load() != 1 {
		t.Fatalf("after a told round: %d accepted, %v; want 1", c.Accepted.Load(), err)
	}
}

// Every key is checked before the first rule takes its credit, with the
// one wording of --max-key-size.
func TestHitChecksActorKey(t *testing.T) {
	lp := loadRules(t)
	e := New(Config{Store: openStore(t, storage.NewMemDisk()), Tuning: Tuning{MaxKeySize: 4}})
	r := e.NewRound()
	_, err := r.Hit(lp, request("path", "/tb", "user", "abcde"), 1, 0)
	var te *errs.Error
	if !errors.As(err, &te) || te.Kind != errs.Request || te.Message() != "value of actor field user is 5 bytes, longer than --max-key-size 4" {
		t.Fatalf("hit with a long actor: %v", err)
	}
	if r.Len() != 0 {
		t.Fatalf("a refused hit queued %d changes", r.Len())
	}
}

// WaitWriters waits for the rounds Begin counted in before it, and only
// until they commit.
func TestWaitWriters(t *testing.T) {
	e := New(Config{Store: openStore(t, storage.NewMemDisk())})
	r := e.NewRound()
	r.Begin()
	if e.WaitWriters(time.Now()) {
		t.Fatal("WaitWriters returned true with a round under way")
	}
	if _, err := r.Commit(); err != nil {
		t.Fatal(err)
	}
	if !e.WaitWriters(time.Now()) {
		t.Fatal("WaitWriters returned false with no round under way")
	}
}

// End leaves the write gate for a round that did not commit (it
// panicked), and is a no-op after Commit: the gate never counts below the
// rounds under way.
func TestEndLeavesWriteGate(t *testing.T) {
	e := New(Config{Store: openStore(t, storage.NewMemDisk())})
	r, other := e.NewRound(), e.NewRound()
	r.Begin()
	r.End()
	if !e.WaitWriters(time.Now()) {
		t.Fatal("WaitWriters returned false after End")
	}
	r.Begin()
	if _, err := r.Commit(); err != nil {
		t.Fatal(err)
	}
	r.End()
	other.Begin()
	if e.WaitWriters(time.Now()) {
		t.Fatal("WaitWriters returned true with a round under way: End after Commit left the gate twice")
	}
	other.End()
}

// A warm Round runs a rule hit that writes, and commits it, without
// allocating: the engine adds nothing to a command's cost in allocations.
func TestRoundAllocatesNothing(t *testing.T) {
	lp := loadRules(t)
	e := New(Config{Store: openStore(t, storage.NewMemDisk())})
	r := e.NewRound()
	req := request("path", "/tb", "user", "a")
	now := time.Unix(1700000000, 0).UnixNano()
	hit := func() {
		now += 10 * int64(time.Second) // a full bucket again: every hit writes
		if _, err := r.Hit(lp, req, 1, now); err != nil {
			t.Fatal(err)
		}
		if ok, err := r.Commit(); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	for range 10 {
		hit()
	}
	if n := testing.AllocsPerRun(200, hit); n != 0 {
		t.Fatalf("a hit and its commit allocate %v times", n)
	}
}

// TestNotReplicatedIsRetried: a change whose shard's group did not commit
// it is answered as the cluster's condition, with the code cluster
// clients retry on, not as an internal error.
func TestNotReplicatedIsRetried(t *testing.T) {
	e := Typed(fmt.Errorf("commit: %w: leadership lost", storage.ErrNotReplicated))
	if e.Kind != errs.Forward || e.Code != "TRYAGAIN" {
		t.Fatalf("typed as %v %q (%v); want Forward, TRYAGAIN", e.Kind, e.Code, e)
	}
}
