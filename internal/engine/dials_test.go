package engine

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

const dialsRules = `
[path=/api ip=*]
creditLimit = 2
resetSeconds = 60
actorField = ip
label = api

[path=/fw]
creditLimit = 2
resetSeconds = 60
algorithm = fixedWindow
label = fw

[path=/try]
creditLimit = 1
resetSeconds = 60
shadow = true
label = try

[default]
creditLimit = 0
resetSeconds = 0
`

// dialsFile writes a rule file of text and loads it.
func dialsFile(t testing.TB, text string) *rules.File {
	t.Helper()
	f := &rules.File{Path: filepath.Join(t.TempDir(), "rules.ini"), MaxBytes: 1 << 20}
	if err := os.WriteFile(f.Path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.Load(); err != nil {
		t.Fatal(err)
	}
	return f
}

// hitN hits req n times at now and returns the allowed answers and the
// last outcome.
func hitN(t *testing.T, r *Round, lp *rules.Set, n int, now int64, kv ...string) (allowed int, last policy.Outcome) {
	t.Helper()
	var req policy.Request
	for i := 0; i < len(kv); i += 2 {
		req = append(req, policy.Field{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
	}
	for range n {
		out, err := r.Hit(lp, req, 1, now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Commit(); err != nil {
			t.Fatal(err)
		}
		if out.Allowed {
			allowed++
		}
		last = out
	}
	return allowed, last
}

// A runtime limit, shadow and off change what a hit answers at once, on
// the counters the file's limit filled; RESET returns to the file's; the
// dials are read back from the store by a new engine.
func TestDialsChangeHits(t *testing.T) {
	disk := storage.NewMemDisk()
	st := openStore(t, disk)
	e := New(Config{Store: st})
	f := dialsFile(t, dialsRules)
	lp := f.Current()
	r := e.NewRound()
	now := time.Unix(1_700_000_000, 0).UnixNano()

	if n, _ := hitN(t, r, lp, 3, now, "path", "/api", "ip", "a"); n != 2 {
		t.Fatalf("file's limit: %d of 3 allowed, want 2", n)
	}
	if err := e.SetLimit(lp, "api", Limit{CreditLimit: 5, ResetSeconds: FileReset}); err != nil {
		t.Fatal(err)
	}
	// A divvy window keeps the credits it has left: a raised limit
	// applies to windows opened after it, a lowered one at once.
	if n, _ := hitN(t, r, lp, 1, now, "path", "/api", "ip", "a"); n != 0 {
		t.Fatal("runtime limit 5: an open window with no credit left took a hit")
	}
	if n, out := hitN(t, r, lp, 6, now, "path", "/api", "ip", "a2"); n != 5 || out.Rule.CreditLimit != 5 || out.Rule.FileRule().CreditLimit != 2 {
		t.Fatalf("runtime limit 5: %d of 6 allowed (want 5), rule limit %d", n, out.Rule.CreditLimit)
	}
	hitN(t, r, lp, 1, now, "path", "/api", "ip", "a3") // 4 left
	if err := e.SetLimit(lp, "api", Limit{CreditLimit: 1, ResetSeconds: FileReset}); err != nil {
		t.Fatal(err)
	}
	if n, _ := hitN(t, r, lp, 1, now, "path", "/api", "ip", "a3"); n != 0 {
		t.Fatal("runtime limit lowered to 1: an actor that used 1 took another hit")
	}
	if err := e.SetLimit(lp, "api", Limit{CreditLimit: 5, ResetSeconds: FileReset}); err != nil {
		t.Fatal(err)
	}

	if err := e.SetEnforcement(Shadow); err != nil {
		t.Fatal(err)
	}
	n, out := hitN(t, r, lp, 2, now, "path", "/api", "ip", "a")
	if n != 2 || !out.Shadowed || out.CreditsLeft != 0 {
		t.Fatalf("shadow: %d of 2 allowed, last %+v; want both allowed, shadowed, 0 left", n, out)
	}
	c := lp.Counts[0]
	rejected := c.Rejected.Load() // 1 + 1 + 1 + 1 enforced, 2 shadowed
	if c.Shadowed.Load() != 2 || rejected != 6 {
		t.Fatalf("shadow: counts shadowed %d rejected %d, want 2 and 6", c.Shadowed.Load(), rejected)
	}

	if err := e.SetEnforcement(Off); err != nil {
		t.Fatal(err)
	}
	if n, out := hitN(t, r, lp, 3, now, "path", "/api", "ip", "b"); n != 3 || out.CreditsLeft != 5 {
		t.Fatalf("off: %d of 3 allowed, %d left; want 3, 5 (nothing counted)", n, out.CreditsLeft)
	}
	if err := e.SetEnforcement(Enforce); err != nil {
		t.Fatal(err)
	}
	// Off counted nothing: b has its whole limit.
	if n, _ := hitN(t, r, lp, 6, now, "path", "/api", "ip", "b"); n != 5 {
		t.Fatalf("after off: %d of 6 allowed, want 5", n)
	}

	// The rule file's shadow field: the second hit is over, let through.
	if n, out := hitN(t, r, lp, 2, now, "path", "/try"); n != 2 || !out.Shadowed {
		t.Fatalf("shadow field: %d of 2 allowed, shadowed %v; want 2, true", n, out.Shadowed)
	}

	// A runtime window: a fixedWindow rule's counter keyed by its period.
	if err := e.SetLimit(lp, "fw", Limit{CreditLimit: 1, ResetSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	if _, out := hitN(t, r, lp, 1, now, "path", "/fw"); out.Rule.PeriodMillis() != 3600_000 || out.Limit != 1 {
		t.Fatalf("fw runtime window: period %d ms, limit %d; want 3600000, 1", out.Rule.PeriodMillis(), out.Limit)
	}

	// Restart: a new engine on the same store has the dials.
	e2 := New(Config{Store: st})
	if err := e2.LoadDials(); err != nil {
		t.Fatal(err)
	}
	if m := e2.Enforcement(); m != Enforce {
		t.Fatalf("after restart: mode %v, want on", m)
	}
	got := e2.Limits(lp)
	if len(got) != 2 || got[0].Label != "api" || got[0].CreditLimit != 5 || got[0].ResetSeconds != FileReset ||
		got[1].Label != "fw" || got[1].ResetSeconds != 3600 {
		t.Fatalf("after restart: limits %+v", got)
	}

	had, err := e.ResetLimit(lp, "api")
	if err != nil || !had {
		t.Fatalf("reset: %v, %v; want true, nil", had, err)
	}
	if n, _ := hitN(t, r, lp, 1, now, "path", "/api", "ip", "c"); n != 1 {
		t.Fatal("after reset: a new actor refused")
	}
	if n, _ := hitN(t, r, lp, 2, now, "path", "/api", "ip", "c"); n != 1 {
		t.Fatalf("after reset: %d of 2 more allowed, want 1 (the file's limit 2)", n)
	}
}

// A reload that drops a label keeps its runtime limit, orphaned; one that
// gives the label to a rule the limit does not fit keeps the file's limit
// and says why.
func TestDialsAcrossReload(t *testing.T) {
	e := New(Config{Store: openStore(t, storage.NewMemDisk())})
	f := dialsFile(t, dialsRules)
	if err := e.SetLimit(f.Current(), "api", Limit{CreditLimit: 200_000, ResetSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Path, []byte("[path=/api]\ncreditLimit=1\nresetSeconds=60\nalgorithm=slidingLog\nlabel=api\n\n[default]\ncreditLimit=0\nresetSeconds=0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.Reload(); err != nil {
		t.Fatal(err)
	}
	ls := e.Limits(f.Current())
	if len(ls) != 1 || ls[0].Rule == nil || ls[0].Problem == "" || ls[0].Effective != ls[0].Rule {
		t.Fatalf("reload to a slidingLog: %+v; want the file's rule and a problem", ls)
	}
	if err := os.WriteFile(f.Path, []byte("[default]\ncreditLimit=0\nresetSeconds=0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.Reload(); err != nil {
		t.Fatal(err)
	}
	if ls := e.Limits(f.Current()); len(ls) != 1 || ls[0].Rule != nil || ls[0].CreditLimit != 200_000 {
		t.Fatalf("reload without the label: %+v; want it orphaned and kept", ls)
	}
	// An orphan is reset by its label, which the rules no longer have.
	if had, err := e.ResetLimit(f.Current(), "api"); !had || err != nil {
		t.Fatalf("reset of an orphan: %v, %v", had, err)
	}
}

// Bad input is refused with the request's error, and changes nothing.
func TestDialsRefuseBadInput(t *testing.T) {
	e := New(Config{Store: openStore(t, storage.NewMemDisk())})
	f := dialsFile(t, dialsRules+"\n")
	lp := f.Current()
	for _, c := range []struct {
		label string
		l     Limit
	}{
		{"nope", Limit{CreditLimit: 1, ResetSeconds: FileReset}},
		{"", Limit{CreditLimit: 1, ResetSeconds: FileReset}},
		{"api", Limit{CreditLimit: -1, ResetSeconds: FileReset}},
		{"api", Limit{CreditLimit: 1, ResetSeconds: -5}},
		// fixedWindow's period must fit int64 milliseconds.
		{"fw", Limit{CreditLimit: 1, ResetSeconds: 1 << 62}},
	} {
		err := e.SetLimit(lp, c.label, c.l)
		if errs.KindOf(err) != errs.Request {
			t.Errorf("SetLimit(%q, %+v): %v; want a request error", c.label, c.l, err)
		}
	}
	if _, err := e.ResetLimit(lp, "nope"); errs.KindOf(err) != errs.Request {
		t.Errorf("ResetLimit(nope): %v; want a request error", err)
	}
	if _, err := e.ResetLimit(nil, "api"); !errors.Is(err, rules.ErrNoPolicy) {
		t.Errorf("ResetLimit without rules: %v; want ErrNoPolicy", err)
	}
	if ls := e.Limits(lp); len(ls) != 0 {
		t.Fatalf("refused changes left %+v", ls)
	}
}

// Concurrent changes of one rule's limit: one wins, and the store holds
// the winner, which a new engine reads back.
func TestDialsConcurrentChanges(t *testing.T) {
	st := openStore(t, storage.NewMemDisk())
	e := New(Config{Store: st})
	lp := dialsFile(t, dialsRules).Current()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.SetLimit(lp, "api", Limit{CreditLimit: int64(10 + i), ResetSeconds: FileReset}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	e2 := New(Config{Store: st})
	if err := e2.LoadDials(); err != nil {
		t.Fatal(err)
	}
	a, b := e.Limits(lp), e2.Limits(lp)
	if len(a) != 1 || len(b) != 1 || a[0].CreditLimit != b[0].CreditLimit {
		t.Fatalf("in memory %+v, in the store %+v; want the same winner", a, b)
	}
}

// A stored value that does not decode stops the load, naming it.
func TestLoadDialsCorrupt(t *testing.T) {
	st := openStore(t, storage.NewMemDisk())
	if err := st.SetMeta("policy.dials", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	if err := New(Config{Store: st}).LoadDials(); err == nil {
		t.Fatal("LoadDials of a corrupt value: nil error")
	}
}

// BenchmarkHitDials is a warm round's hit of a counted rule, read only
// (hits 0: no commit, so that the store's committers do not count),
// without dials, under a runtime limit, and in shadow mode: the dials
// add no allocation to a hit (run with -benchmem).
func BenchmarkHitDials(b *testing.B) {
	for _, c := range []struct {
		name  string
		setup func(e *Engine, lp *rules.Set) error
	}{
		{"none", func(*Engine, *rules.Set) error { return nil }},
		{"limit", func(e *Engine, lp *rules.Set) error {
			return e.SetLimit(lp, "api", Limit{CreditLimit: 5, ResetSeconds: 30})
		}},
		{"shadow", func(e *Engine, _ *rules.Set) error { return e.SetEnforcement(Shadow) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			e := New(Config{Store: openStore(b, storage.NewMemDisk())})
			lp := dialsFile(b, dialsRules).Current()
			if err := c.setup(e, lp); err != nil {
				b.Fatal(err)
			}
			benchWarmHit(b, e, lp, "a")
		})
	}
}

// benchWarmHit measures a read-only hit of /api by ip actor on its warm
// counter.
func benchWarmHit(b *testing.B, e *Engine, lp *rules.Set, actor string) {
	req := policy.Request{{Key: []byte("path"), Value: []byte("/api")}, {Key: []byte("ip"), Value: []byte(actor)}}
	benchWarm(b, e, func(r *Round, hits, now int64) error {
		_, err := r.Hit(lp, req, hits, now)
		return err
	})
}

// benchWarm runs hit once, counting, and commits, then measures it
// reading without counting.
func benchWarm(b *testing.B, e *Engine, hit func(r *Round, hits, now int64) error) {
	r := e.NewRound()
	now := time.Unix(1_700_000_000, 0).UnixNano()
	if err := hit(r, 1, now); err != nil {
		b.Fatal(err)
	}
	if _, err := r.Commit(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := hit(r, 0, now); err != nil {
			b.Fatal(err)
		}
		r.settle(true)
	}
}
