package engine

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/storage"
)

const overrideRules = `
[path=/api ip=*]
creditLimit = 2
resetSeconds = 60
actorField = ip
label = api

[path=/g user=*]
algorithm = gcra
creditLimit = 2
resetSeconds = 60
actorField = user
label = g

[path=/log user=*]
algorithm = slidingLog
creditLimit = 2
resetSeconds = 60
actorField = user
label = log

[path=/tb user=*]
algorithm = tokenBucket
creditLimit = 2
resetSeconds = 60
actorField = user
label = tb

[path=/q user=*]
creditLimit = 2
resetSeconds = 60
quotaField = quota
maxQuota = 10
actorField = user
label = q

[path=/shared]
creditLimit = 2
resetSeconds = 60
label = shared

[default]
creditLimit = 0
resetSeconds = 0
`

// An override changes what an actor's hits answer at once: on a counter
// it creates, and on the live one it has (divvy keeps a window's credits
// left, so a raised limit applies from the next window; gcra at once);
// RESET returns the actor to the rule's limit; a new engine on the same
// store has the counts, and the counters keep what they carry. The same
// holds on a cluster node that owns the counters, whose overrides are its
// own values, read at every hit.
func TestOverridesChangeHits(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) { testOverridesChangeHits(t, overridesConfig(mode)) })
	}
}

// overridesConfig is an engine's Config for mode: standalone, or cluster
// (a node owning every counter).
func overridesConfig(mode string) Config {
	if mode == "cluster" {
		return Config{Cluster: &cluster{}}
	}
	return Config{}
}

func testOverridesChangeHits(t *testing.T, cfg Config) {
	st := openStore(t, storage.NewMemDisk())
	cfg.Store = st
	e := New(cfg)
	lp := dialsFile(t, overrideRules).Current()
	r := e.NewRound()
	now := time.Unix(1_700_000_000, 0).UnixNano()

	if err := e.SetOverride(lp, "api", []byte("vip"), 5); err != nil {
		t.Fatal(err)
	}
	if n, out := hitN(t, r, lp, 7, now, "path", "/api", "ip", "vip"); n != 5 || out.Rate != 5 || out.Limit != 5 {
		t.Fatalf("override 5 on a new counter: %d of 7 allowed, rate %d limit %d; want 5, 5, 5", n, out.Rate, out.Limit)
	}
	if n, _ := hitN(t, r, lp, 3, now, "path", "/api", "ip", "other"); n != 2 {
		t.Fatalf("another actor: %d of 3 allowed, want the rule's 2", n)
	}
	// A live window: lowered at once.
	hitN(t, r, lp, 1, now, "path", "/api", "ip", "low") // 1 left
	if err := e.SetOverride(lp, "api", []byte("low"), 1); err != nil {
		t.Fatal(err)
	}
	if n, _ := hitN(t, r, lp, 1, now, "path", "/api", "ip", "low"); n != 0 {
		t.Fatal("override lowered to 1 on a live window that used 1: a hit allowed")
	}
	// slidingLog: a raised limit applies at once on the live counter.
	if n, _ := hitN(t, r, lp, 3, now, "path", "/log", "user", "u"); n != 2 {
		t.Fatalf("slidingLog: %d of 3 allowed, want 2", n)
	}
	if err := e.SetOverride(lp, "log", []byte("u"), 4); err != nil {
		t.Fatal(err)
	}
	if n, out := hitN(t, r, lp, 3, now, "path", "/log", "user", "u"); n != 2 || out.Limit != 4 {
		t.Fatalf("slidingLog override 4 on a live counter: %d of 3 allowed, limit %d; want 2 more, 4", n, out.Limit)
	}
	if byLabel, total := e.OverrideCounts(); total != 3 || byLabel["api"] != 2 || byLabel["log"] != 1 {
		t.Fatalf("counts %v, total %d; want api 2, log 1, total 3", byLabel, total)
	}

	// RESET: the live counter loses the override, the next window has the
	// rule's limit.
	had, err := e.ResetOverride(lp, "api", []byte("vip"))
	if err != nil || !had {
		t.Fatalf("ResetOverride = %v, %v; want true", had, err)
	}
	if had, err := e.ResetOverride(lp, "api", []byte("vip")); err != nil || had {
		t.Fatalf("ResetOverride again = %v, %v; want false", had, err)
	}
	if n, out := hitN(t, r, lp, 3, now+61e9, "path", "/api", "ip", "vip"); n != 2 || out.Rate != 2 {
		t.Fatalf("after RESET: %d of 3 allowed, rate %d; want 2, 2", n, out.Rate)
	}

	// A restart: the counts are read back; a counter created now reads the
	// override record.
	e2 := New(cfg)
	if err := e2.LoadOverrides(); err != nil {
		t.Fatal(err)
	}
	if byLabel, total := e2.OverrideCounts(); total != 2 || byLabel["api"] != 1 || byLabel["log"] != 1 {
		t.Fatalf("after restart: counts %v, total %d; want api 1, log 1", byLabel, total)
	}
	r2 := e2.NewRound()
	if n, _ := hitN(t, r2, lp, 3, now+61e9, "path", "/api", "ip", "low"); n != 1 {
		t.Fatalf("after restart, a new window of low: %d of 3 allowed, want its override 1", n)
	}
}

// The bad input of an override gets an error that names it, and nothing
// changes; past MaxOverrides a new override is refused, a change of one
// that exists is not, and a reset makes room.
func TestOverridesRefuse(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) { testOverridesRefuse(t, overridesConfig(mode)) })
	}
}

func testOverridesRefuse(t *testing.T, cfg Config) {
	cfg.Store, cfg.MaxOverrides, cfg.Tuning.MaxKeySize = openStore(t, storage.NewMemDisk()), 2, 16
	e := New(cfg)
	lp := dialsFile(t, overrideRules).Current()
	for _, c := range []struct {
		label, actor string
		limit        int64
		want         string
	}{
		{"nope", "a", 1, `label "nope" is not a label of the rules in use`},
		{"shared", "a", 1, "has no actorField"},
		{"q", "a", 1, "quotaField quota"},
		{"tb", "a", 1, "tokenBucket"},
		{"api", "a", -1, "creditLimit is -1; expected a non-negative integer"},
		{"log", "a", 100001, "100000"},
		{"api", strings.Repeat("x", 17), 1, "value of actor field ip is 17 bytes, longer than --max-key-size 16"},
	} {
		err := e.SetOverride(lp, c.label, []byte(c.actor), c.limit)
		if errs.KindOf(err) != errs.Request || !strings.Contains(err.Error(), c.want) {
			t.Errorf("SetOverride(%s, %.20s, %d) = %v; want a request error with %q", c.label, c.actor, c.limit, err, c.want)
		}
	}
	if _, total := e.OverrideCounts(); total != 0 {
		t.Fatalf("refused overrides counted: %d", total)
	}
	for _, a := range []string{"a", "b"} {
		if err := e.SetOverride(lp, "api", []byte(a), 3); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.SetOverride(lp, "g", []byte("c"), 3); errs.KindOf(err) != errs.Request || !strings.Contains(err.Error(), "--policy-max-overrides") {
		t.Fatalf("a third override past a bound of 2: %v", err)
	}
	if err := e.SetOverride(lp, "api", []byte("a"), 4); err != nil {
		t.Fatalf("changing an override at the bound: %v", err)
	}
	if _, err := e.ResetOverride(lp, "api", []byte("b")); err != nil {
		t.Fatal(err)
	}
	if err := e.SetOverride(lp, "g", []byte("c"), 3); err != nil {
		t.Fatalf("after a reset: %v", err)
	}
	if _, err := e.ResetOverride(lp, "nope", []byte("a")); err == nil {
		t.Error("ResetOverride of an unknown label without overrides: no error")
	}
}

// Overrides lists a label's overrides in actor order, a page at a time,
// and only that label's; a label dropped by a reload keeps them, and
// they can be reset. A cluster node lists its own.
func TestOverridesList(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) { testOverridesList(t, overridesConfig(mode)) })
	}
}

func testOverridesList(t *testing.T, cfg Config) {
	cfg.Store = openStore(t, storage.NewMemDisk())
	e := New(cfg)
	f := dialsFile(t, overrideRules)
	lp := f.Current()
	for i := range 25 {
		if err := e.SetOverride(lp, "api", fmt.Appendf(nil, "10.0.0.%02d", i), int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.SetOverride(lp, "g", []byte("10.0.0.00"), 9); err != nil {
		t.Fatal(err)
	}
	var got []Override
	var after []byte
	pages := 0
	for {
		list, next, err := e.Overrides(lp, "api", after, 10)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, list...)
		pages++
		if next == nil {
			break
		}
		after = next
	}
	if len(got) != 25 || pages != 3 {
		t.Fatalf("%d overrides in %d pages, want 25 in 3", len(got), pages)
	}
	for i, o := range got {
		if string(o.Actor) != fmt.Sprintf("10.0.0.%02d", i) || o.Limit != int64(i) {
			t.Fatalf("override %d: %s %d", i, o.Actor, o.Limit)
		}
	}
	if _, _, err := e.Overrides(lp, "api", nil, MaxOverridesPage+1); errs.KindOf(err) != errs.Request {
		t.Errorf("COUNT over the page bound: %v", err)
	}

	// A reload without the label: its overrides stay, and RESET works.
	reloadRules(t, f, strings.Replace(overrideRules, "label = api", "label = api2", 1))
	lp = f.Current()
	if err := e.SetOverride(lp, "api", []byte("x"), 1); err == nil {
		t.Error("SetOverride on a label the rules no longer have: no error")
	}
	if had, err := e.ResetOverride(lp, "api", []byte("10.0.0.03")); err != nil || !had {
		t.Fatalf("ResetOverride of an orphaned label = %v, %v", had, err)
	}
	if byLabel, _ := e.OverrideCounts(); byLabel["api"] != 24 {
		t.Fatalf("orphaned label api: %d overrides, want 24", byLabel["api"])
	}
}

// A change of an actor's override between a hit's read of it and the
// counter's creation: the hit reads it again, and the counter carries the
// change, not the value read before it.
func TestOverrideChangedWhileCreating(t *testing.T) {
	e := New(Config{Store: openStore(t, storage.NewMemDisk())})
	lp := dialsFile(t, overrideRules).Current()
	now := time.Unix(1_700_000_000, 0).UnixNano()
	if err := e.SetOverride(lp, "api", []byte("u"), 5); err != nil {
		t.Fatal(err)
	}
	changed := false
	e.afterOverrideRead = func() {
		if !changed {
			changed = true
			if err := e.SetOverride(lp, "api", []byte("u"), 1); err != nil {
				t.Error(err)
			}
		}
	}
	r := e.NewRound()
	if n, out := hitN(t, r, lp, 3, now, "path", "/api", "ip", "u"); n != 1 || out.Rate != 1 {
		t.Fatalf("override changed to 1 while the counter was created: %d of 3 allowed, rate %d; want 1, 1", n, out.Rate)
	}
}

// reloadRules rewrites f with text and loads it.
func reloadRules(t *testing.T, f *rules.File, text string) {
	t.Helper()
	if err := os.WriteFile(f.Path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.Load(); err != nil {
		t.Fatal(err)
	}
}

// Concurrent changes of one actor's override and hits creating its
// counter: once they are over, the override record holds the last change,
// and the counter carries the same.
func TestOverridesConcurrent(t *testing.T) {
	st := openStore(t, storage.NewMemDisk())
	e := New(Config{Store: st})
	lp := dialsFile(t, overrideRules).Current()
	now := time.Unix(1_700_000_000, 0).UnixNano()
	if err := e.SetOverride(lp, "g", []byte("seed"), 1); err != nil { // the label has overrides
		t.Fatal(err)
	}
	req := policy.Request{{Key: []byte("path"), Value: []byte("/g")}, {Key: []byte("user"), Value: []byte("u")}}
	rule, err := e.overrideRule(lp, "g")
	if err != nil {
		t.Fatal(err)
	}
	key := counterKey(nil, rule, []byte("u"))
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.NewRound()
			for i := range 200 {
				if w == 0 {
					if err := e.SetOverride(lp, "g", []byte("u"), int64(100+i)); err != nil {
						t.Error(err)
						return
					}
					continue
				}
				// Delete the counter, so that the hit creates it.
				if err := r.Apply(key, deleter{}); err != nil {
					t.Error(err)
					return
				}
				if _, err := r.Hit(lp, req, 1, now); err != nil {
					t.Error(err)
					return
				}
				if _, err := r.Commit(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	r := e.NewRound()
	out, err := r.Hit(lp, req, 0, now)
	if err != nil {
		t.Fatal(err)
	}
	r.Commit()
	if out.Limit != 299 {
		t.Fatalf("the counter's limit after the changes: %d; want the last override, 299", out.Limit)
	}
	if n, _ := e.Override("g", []byte("u")); n != 299 {
		t.Fatalf("the stored override: %d, want 299", n)
	}
}

// An actor without an override costs no allocation per hit, whether or
// not its label has overrides; nor does one with an override. The same
// for a limit of Envoy's rate limit service (rls-*: RLS.OVERRIDE, the
// label the domain's, the actor the descriptor's entries), hit as the
// service hits it.
func BenchmarkHitOverrides(b *testing.B) {
	cfg, err := rls.Parse([]rls.File{{Name: "api.yaml", Data: []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")}})
	if err != nil {
		b.Fatal(err)
	}
	rlsSet := &rules.Set{Counts: make([]*rules.Counts, len(cfg.Rules()))}
	for i := range rlsSet.Counts {
		rlsSet.Counts[i] = &rules.Counts{}
	}
	descriptor := func(user string) ([]byte, *policy.Rule) {
		entries := []rls.Entry{{Key: "user", Value: user}}
		return rls.AppendDescriptor(nil, entries), cfg.Find("api", entries).Rule
	}
	// cluster-: a cluster node owning the counters, which looks an
	// override up at every hit of a label that has some: its filter,
	// then the store for an actor the filter may hold.
	for _, front := range []string{"", "rls-", "cluster-"} {
		for _, c := range []struct {
			name, actor string
		}{
			{"none", "a"},        // no override in the label
			{"label-has", "a"},   // the label has overrides, the actor none
			{"actor-has", "vip"}, // the actor has one
		} {
			b.Run(front+c.name, func(b *testing.B) {
				cfg := Config{Store: openStore(b, storage.NewMemDisk())}
				if front == "cluster-" {
					cfg.Cluster = &cluster{}
				}
				e := New(cfg)
				if front != "rls-" {
					lp := dialsFile(b, overrideRules).Current()
					if c.name != "none" {
						if err := e.SetOverride(lp, "api", []byte("vip"), 5); err != nil {
							b.Fatal(err)
						}
					}
					benchWarmHit(b, e, lp, c.actor)
					return
				}
				if c.name != "none" {
					vip, rule := descriptor("vip")
					if err := e.SetRuleOverride(rule, vip, 5); err != nil {
						b.Fatal(err)
					}
				}
				actor, rule := descriptor(c.actor)
				req := policy.Request{{Key: []byte(rls.DescriptorField), Value: actor}}
				benchWarm(b, e, func(r *Round, hits, now int64) error {
					_, err := r.HitRule(rlsSet, rule, req, hits, false, now)
					return err
				})
			})
		}
	}
}

type deleter struct{}

func (deleter) Mutate([]byte, bool) ([]byte, storage.Op, error) { return nil, storage.Delete, nil }

// copyRecord is a mutator that puts val, as a slot's move or a shard's
// replication writes a record on another node.
type copyRecord struct{ val []byte }

func (m copyRecord) Mutate([]byte, bool) ([]byte, storage.Op, error) { return m.val, storage.Put, nil }

// On a cluster node the overrides are the node's own values, outside the
// slot-owned records, and the node that applies a hit reads the actor's
// at every hit: a counter copied in from another node (a move, a new
// leader) is decided under this node's override, not the copy the counter
// carries; a forwarded hit (ApplyCounter) is applied under it and answers
// the limit applied; a forwarded hit's answer on the node that sent it
// reports the owner's limit.
func TestOverridesClusterNode(t *testing.T) {
	lp := dialsFile(t, overrideRules).Current()
	now := time.Unix(1_700_000_000, 0).UnixNano()
	api := ruleByLabel(lp, "api")
	req := request("path", "/api", "ip", "m")
	key := counterKey(nil, api, []byte("m"))

	// A standalone server's counter of m carries its override, 5.
	src := New(Config{Store: openStore(t, storage.NewMemDisk())})
	if err := src.SetOverride(lp, "api", []byte("m"), 5); err != nil {
		t.Fatal(err)
	}
	hitN(t, src.NewRound(), lp, 1, now, "path", "/api", "ip", "m") // 4 left
	var moved []byte
	if err := src.store.Scan(key, append(key, 0), func(_, v []byte) bool { moved = bytes.Clone(v); return true }); err != nil || moved == nil {
		t.Fatalf("the counter of m: %q, %v", moved, err)
	}

	st := openStore(t, storage.NewMemDisk())
	cl := &cluster{owned: map[string]bool{}}
	e := New(Config{Store: st, Cluster: cl})
	if err := e.SetOverride(lp, "api", []byte("m"), 1); err != nil {
		t.Fatal(err)
	}
	if err := st.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := st.Records(); n != 0 {
		t.Fatalf("a cluster node's override is %d records; want none, it is the node's own value", n)
	}
	r := e.NewRound()
	if err := r.Apply(key, copyRecord{moved}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Commit(); err != nil {
		t.Fatal(err)
	}
	if n, out := hitN(t, r, lp, 1, now, "path", "/api", "ip", "m"); n != 0 || out.Rate != 1 {
		t.Fatalf("a counter copied in carrying 5, under this node's override 1 with 1 used: %d allowed, rate %d; want 0, 1", n, out.Rate)
	}

	// The owner's side of a forwarded hit: sent under the rule's limit,
	// applied under this node's override of the actor.
	if err := e.SetOverride(lp, "api", []byte("f"), 7); err != nil {
		t.Fatal(err)
	}
	fkey := counterKey(nil, api, []byte("f"))
	id := api.AppendCounterID(nil, request("ip", "f"))
	out, err := r.ApplyCounter(fkey, api, api.CreditLimit, 1, now, id)
	if _, cerr := r.Commit(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	if !out.Allowed || out.CreditsLeft != 6 || out.Limit != 7 || out.Rate != 7 {
		t.Fatalf("forwarded hit of f, overridden to 7: %+v; want allowed, 6 left, limit and rate 7", out)
	}
	if had, err := e.ResetOverride(lp, "api", []byte("f")); err != nil || !had {
		t.Fatalf("ResetOverride(f) = %v, %v", had, err)
	}
	if out, err = r.ApplyCounter(fkey, api, api.CreditLimit, 1, now, id); err != nil || !out.Allowed || out.Rate != api.CreditLimit || out.CreditsLeft != 0 {
		t.Fatalf("forwarded hit of f after RESET: %+v, %v; want allowed, rate %d, 0 left (the window's 6 capped at the rule's limit less one, then this hit)", out, err, api.CreditLimit)
	}
	if _, err := r.Commit(); err != nil {
		t.Fatal(err)
	}

	// The label's last override reset: the copy m's counter carries goes
	// with its next write.
	if had, err := e.ResetOverride(lp, "api", []byte("m")); err != nil || !had {
		t.Fatalf("ResetOverride(m) = %v, %v", had, err)
	}
	if n, out := hitN(t, r, lp, 1, now, "path", "/api", "ip", "m"); n != 1 || out.Rate != 2 {
		t.Fatalf("m after RESET, 1 used of the rule's 2: %d allowed, rate %d; want 1, 2", n, out.Rate)
	}
	if err := st.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := st.Scan(key, append(key, 0), func(_, v []byte) bool {
		if _, ok, _, err := keyspace.SplitMarked(v); ok || err != nil {
			t.Errorf("m's counter, its label without overrides: carries a copy still (%v)", err)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}

	// The sending side: the owner's limit is the one reported.
	cl.owned[string(key)] = true
	cl.out = policy.Outcome{Allowed: true, CreditsLeft: 8, Limit: 9, Rate: 9}
	o, err := r.Hit(lp, req, 1, now)
	if _, cerr := r.Commit(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	if o.Rate != 9 || o.Limit != 9 {
		t.Fatalf("a forwarded hit the owner applied under 9: rate %d, limit %d; want 9, 9", o.Rate, o.Limit)
	}
}

// A standalone store started as a cluster node: its overrides are
// records, which the node neither counts nor applies, and RecordOverrides
// counts them for the warning the server logs.
func TestOverridesClusterIgnoresRecords(t *testing.T) {
	lp := dialsFile(t, overrideRules).Current()
	st := openStore(t, storage.NewMemDisk())
	if err := New(Config{Store: st}).SetOverride(lp, "api", []byte("a"), 5); err != nil {
		t.Fatal(err)
	}
	e := New(Config{Store: st, Cluster: &cluster{}})
	if err := e.LoadOverrides(); err != nil {
		t.Fatal(err)
	}
	if n, err := e.RecordOverrides(); n != 1 || err != nil {
		t.Fatalf("RecordOverrides = %d, %v; want 1", n, err)
	}
	if _, total := e.OverrideCounts(); total != 0 {
		t.Fatalf("the node counts %d overrides; want none of the records", total)
	}
	if n, err := e.Override("api", []byte("a")); n != -1 || err != nil {
		t.Fatalf("Override(api, a) on the node = %d, %v; want none (-1)", n, err)
	}
	if n, _ := hitN(t, e.NewRound(), lp, 3, time.Unix(1_700_000_000, 0).UnixNano(), "path", "/api", "ip", "a"); n != 2 {
		t.Fatalf("a's hits on the node: %d of 3 allowed; want the rule's 2", n)
	}
}

// On a cluster node, a hit of an actor without an override does not read
// the store: the node's filter of its override keys answers it; an actor
// with one gets it. Once the removed outnumber the overrides left, the
// filter is built again without them, and their actors' hits read
// nothing either; a restart builds it from the store.
func TestOverridesClusterFilter(t *testing.T) {
	st := openStore(t, storage.NewMemDisk())
	cfg := Config{Store: st, Cluster: &cluster{}}
	e := New(cfg)
	if err := e.LoadOverrides(); err != nil {
		t.Fatal(err)
	}
	lp := dialsFile(t, overrideRules).Current()
	now := time.Unix(1_700_000_000, 0).UnixNano()
	reads := 0
	e.onNodeRead = func() { reads++ }
	for i := range 100 {
		if err := e.SetOverride(lp, "api", fmt.Appendf(nil, "o%d", i), int64(10+i)); err != nil {
			t.Fatal(err)
		}
	}
	// hits checks that actors prefix<from> to prefix<to-1> get limit(i)
	// on e, and returns how many store reads their hits made.
	hits := func(e *Engine, prefix string, from, to int, limit func(i int) int64) int {
		t.Helper()
		r, before := e.NewRound(), reads
		for i := from; i < to; i++ {
			actor := prefix + strconv.Itoa(i)
			if _, out := hitN(t, r, lp, 1, now, "path", "/api", "ip", actor); out.Limit != limit(i) {
				t.Fatalf("a hit of %s: limit %d; want %d", actor, out.Limit, limit(i))
			}
		}
		return reads - before
	}
	rule := func(int) int64 { return 2 }
	override := func(i int) int64 { return int64(10 + i) }
	if n := hits(e, "n", 0, 100, rule); n != 0 {
		t.Fatalf("hits of 100 actors without an override read the store %d times; want none", n)
	}
	if n := hits(e, "o", 0, 100, override); n != 100 {
		t.Fatalf("hits of 100 actors with an override read the store %d times; want 100", n)
	}
	r, req := e.NewRound(), request("path", "/api", "ip", "n0")
	if n := testing.AllocsPerRun(100, func() {
		if _, err := r.Hit(lp, req, 0, now); err != nil {
			t.Fatal(err)
		}
		r.settle(true)
	}); n != 0 {
		t.Fatalf("a warm hit of an actor without an override: %v allocations; want none", n)
	}

	// The 51st removal outnumbers the 49 left: the filter is built again.
	built := e.ov.filter.Load()
	for i := range 60 {
		if had, err := e.ResetOverride(lp, "api", fmt.Appendf(nil, "o%d", i)); err != nil || !had {
			t.Fatalf("ResetOverride(o%d) = %v, %v", i, had, err)
		}
	}
	if f := e.ov.filter.Load(); f == built || f.added != 49 || f.removed != 9 {
		t.Fatalf("after 60 removals of 100: the filter was not built again from the 49 left (%d keys added, %d removed since)", f.added, f.removed)
	}
	if n := hits(e, "o", 0, 51, rule); n != 0 {
		t.Fatalf("hits of 51 actors whose override was removed before the filter was built read the store %d times; want none", n)
	}
	hits(e, "o", 51, 60, rule) // removed since: they may read
	if n := hits(e, "o", 60, 100, override); n != 40 {
		t.Fatalf("hits of the 40 actors left with an override read the store %d times; want 40", n)
	}

	// A restart builds the filter from the store.
	e2 := New(cfg)
	e2.onNodeRead = func() { reads++ }
	if err := e2.LoadOverrides(); err != nil {
		t.Fatal(err)
	}
	if n := hits(e2, "o", 0, 60, rule) + hits(e2, "n", 0, 100, rule); n != 0 {
		t.Fatalf("after a restart, hits of 160 actors without an override read the store %d times; want none", n)
	}
	if n := hits(e2, "o", 60, 100, override); n != 40 {
		t.Fatalf("after a restart, hits of the 40 actors with an override read the store %d times; want 40", n)
	}
}

// A node's filter grows with its overrides: past the keys it was sized
// for, it is built again, bigger, and holds every override still.
func TestOverridesClusterFilterGrows(t *testing.T) {
	e := New(Config{Store: openStore(t, storage.NewMemDisk()), Cluster: &cluster{}})
	if err := e.LoadOverrides(); err != nil {
		t.Fatal(err)
	}
	lp := dialsFile(t, overrideRules).Current()
	const n = minFilterKeys + 100
	for i := range n {
		if err := e.SetOverride(lp, "api", fmt.Appendf(nil, "o%d", i), int64(10+i)); err != nil {
			t.Fatal(err)
		}
	}
	if f := e.ov.filter.Load(); f.capacity != 2*minFilterKeys || f.added != n {
		t.Fatalf("filter after %d overrides: sized for %d, %d added; want %d, %d", n, f.capacity, f.added, 2*minFilterKeys, n)
	}
	r := e.NewRound()
	now := time.Unix(1_700_000_000, 0).UnixNano()
	for i := 0; i < n; i += 37 {
		if _, out := hitN(t, r, lp, 1, now, "path", "/api", "ip", "o"+strconv.Itoa(i)); out.Limit != int64(10+i) {
			t.Fatalf("a hit of o%d after the filter grew: limit %d; want its override %d", i, out.Limit, 10+i)
		}
	}
}

// Overrides set, removed and set again while hits run, with the filter
// built again every round: a hit that began after a change was answered
// and ended before the next began applies what the change left, an
// override or none.
func TestOverridesClusterFilterConcurrent(t *testing.T) {
	e := New(Config{Store: openStore(t, storage.NewMemDisk()), Cluster: &cluster{}})
	if err := e.LoadOverrides(); err != nil {
		t.Fatal(err)
	}
	lp := dialsFile(t, overrideRules).Current()
	if err := e.SetOverride(lp, "api", []byte("seed"), 1); err != nil { // the label keeps overrides
		t.Fatal(err)
	}
	const actors, rounds = 32, 20
	// ver[a] is odd while a's override changes; set[a] says it has one.
	var ver [actors]atomic.Uint64
	var set [actors]atomic.Bool
	done := make(chan struct{})
	var checked atomic.Int64
	var wg sync.WaitGroup
	stop := sync.OnceFunc(func() { close(done); wg.Wait() })
	defer stop() // a Fatal below ends the hits too
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.NewRound()
			now := time.Unix(1_700_000_000, 0).UnixNano()
			for i := w; ; i += 7 {
				select {
				case <-done:
					return
				default:
				}
				a := i % actors
				v := ver[a].Load()
				has := set[a].Load()
				out, err := r.Hit(lp, request("path", "/api", "ip", "a"+strconv.Itoa(a)), 0, now)
				if _, cerr := r.Commit(); err != nil || cerr != nil {
					t.Error(err, cerr)
					return
				}
				if v%2 == 1 || ver[a].Load() != v {
					continue // a change ran during the hit: either answer stands
				}
				want := int64(2)
				if has {
					want = int64(100 + a)
				}
				if out.Limit != want {
					t.Errorf("a%d, override set %v before the hit: limit %d; want %d", a, has, out.Limit, want)
					return
				}
				checked.Add(1)
			}
		}()
	}
	builds := 0
	for range rounds {
		built := e.ov.filter.Load()
		for _, on := range []bool{true, false} {
			for a := range actors {
				ver[a].Add(1)
				actor := []byte("a" + strconv.Itoa(a))
				var err error
				if on {
					err = e.SetOverride(lp, "api", actor, int64(100+a))
				} else {
					_, err = e.ResetOverride(lp, "api", actor)
				}
				if err != nil {
					t.Fatal(err)
				}
				set[a].Store(on)
				ver[a].Add(1)
			}
		}
		if e.ov.filter.Load() != built {
			builds++
		}
	}
	stop()
	if builds != rounds || checked.Load() == 0 {
		t.Fatalf("the filter was built again in %d of %d rounds, %d hits checked; want every round, some", builds, rounds, checked.Load())
	}
}

// BenchmarkHitOverridesMillion is BenchmarkHitOverrides/cluster-actor-has
// and cluster-label-has on a store as a cluster node holds a million overrides:
// in tables on disk (compacted), not in the memtable, and hits spread
// over 10k actors with live counters, each with an override (actor-has)
// or none (actor-none). The node reads the override of an actor the
// filter may hold at every hit (nodeoverrides.go): a Pebble point read
// through the table's index and data blocks.
func BenchmarkHitOverridesMillion(b *testing.B) {
	st, err := storage.Open(b.TempDir(), storage.Options{Sync: storage.SyncEverySec, Partition: keyspace.Partition, Partitions: keyspace.Partitions})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	const n, actors = 1_000_000, 10_000
	for i := 0; i < n; i += 10_000 { // as POLICY OVERRIDE api <i> 1000000 would store them, fewer syncs
		put := map[string][]byte{}
		for j := i + 1; j <= i+10_000; j++ {
			put[string(keyspace.AppendOverrideMeta(nil, "api", []byte(strconv.Itoa(j))))] = keyspace.AppendUint(nil, 1_000_000)
		}
		if err := st.UpdateMeta(put, nil); err != nil {
			b.Fatal(err)
		}
	}
	if err := st.UpdateMeta(map[string][]byte{keyspace.OverrideCountMeta + "api": keyspace.AppendUint(nil, n)}, nil); err != nil {
		b.Fatal(err)
	}
	if err := st.Compact(context.Background()); err != nil {
		b.Fatal(err)
	}
	// A node's start with the million: their counts read, and the filter
	// of their keys built from a scan of them.
	b.Run("load", func(b *testing.B) {
		for b.Loop() {
			if err := New(Config{Store: st, Cluster: &cluster{}}).LoadOverrides(); err != nil {
				b.Fatal(err)
			}
		}
	})
	e := New(Config{Store: st, Cluster: &cluster{}})
	if err := e.LoadOverrides(); err != nil {
		b.Fatal(err)
	}
	lp := dialsFile(b, overrideRules).Current()
	r := e.NewRound()
	now := time.Unix(1_700_000_000, 0).UnixNano()
	for _, c := range []struct{ name, prefix string }{
		{"actor-has", ""},   // the actors 1 to 10k, of the million
		{"actor-none", "x"}, // x1 to x10k: none has an override
	} {
		reqs := make([]policy.Request, actors)
		for i := range reqs {
			reqs[i] = policy.Request{{Key: []byte("path"), Value: []byte("/api")}, {Key: []byte("ip"), Value: []byte(c.prefix + strconv.Itoa(i+1))}}
			if _, err := r.Hit(lp, reqs[i], 1, now); err != nil {
				b.Fatal(err)
			}
			if _, err := r.Commit(); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i = (i + 7919) % actors // a prime stride: every actor, in scattered order
				if _, err := r.Hit(lp, reqs[i], 0, now); err != nil {
					b.Fatal(err)
				}
				r.settle(true)
			}
		})
	}
}

// A cluster node's cache of the overrides its hits read: the second hit
// of an actor with an override reads no store and allocates nothing; a
// change is seen by the first hit after it returns; a removed override's
// key, which stays in the filter, is read once, then cached as none.
func TestOverridesClusterCache(t *testing.T) {
	e := New(Config{Store: openStore(t, storage.NewMemDisk()), Cluster: &cluster{}})
	if err := e.LoadOverrides(); err != nil {
		t.Fatal(err)
	}
	lp := dialsFile(t, overrideRules).Current()
	reads := 0
	e.onNodeRead = func() { reads++ }
	now := time.Unix(1_700_000_000, 0).UnixNano()
	r := e.NewRound()
	// hit hits vip and checks the limit applied and the store reads.
	hit := func(what string, limit int64, read int) {
		t.Helper()
		before := reads
		if _, out := hitN(t, r, lp, 1, now, "path", "/api", "ip", "vip"); out.Limit != limit || reads-before != read {
			t.Fatalf("%s: limit %d, %d store reads; want %d, %d", what, out.Limit, reads-before, limit, read)
		}
	}
	if err := e.SetOverride(lp, "api", []byte("vip"), 5); err != nil {
		t.Fatal(err)
	}
	hit("the first hit", 5, 1)
	hit("the second hit", 5, 0)
	req := request("path", "/api", "ip", "vip")
	if n := testing.AllocsPerRun(100, func() {
		if _, err := r.Hit(lp, req, 0, now); err != nil {
			t.Fatal(err)
		}
		r.settle(true)
	}); n != 0 {
		t.Fatalf("a warm hit of an actor with an override: %v allocations; want none", n)
	}
	if err := e.SetOverride(lp, "api", []byte("vip"), 7); err != nil {
		t.Fatal(err)
	}
	hit("the hit after a change", 7, 1)
	hit("the hit after it", 7, 0)
	if err := e.SetOverride(lp, "api", []byte("other"), 9); err != nil { // the label keeps overrides
		t.Fatal(err)
	}
	if had, err := e.ResetOverride(lp, "api", []byte("vip")); err != nil || !had {
		t.Fatalf("ResetOverride(vip) = %v, %v", had, err)
	}
	hit("the hit after the removal", 2, 1)
	hit("the hit after it", 2, 0)
}

// A hit that reads an override while a change of it is being written
// caches what it read, and the first hit after the change returns still
// applies the change: the cache's generation moves after the store write.
func TestOverridesClusterCacheDuringAChange(t *testing.T) {
	e := New(Config{Store: openStore(t, storage.NewMemDisk()), Cluster: &cluster{}})
	if err := e.LoadOverrides(); err != nil {
		t.Fatal(err)
	}
	lp := dialsFile(t, overrideRules).Current()
	now := time.Unix(1_700_000_000, 0).UnixNano()
	r := e.NewRound()
	if err := e.SetOverride(lp, "api", []byte("vip"), 5); err != nil {
		t.Fatal(err)
	}
	// The hit that runs just before the store write of the change to 7
	// reads (and caches) 5.
	e.beforeNodeWrite = func() {
		e.beforeNodeWrite = nil
		if _, out := hitN(t, e.NewRound(), lp, 1, now, "path", "/api", "ip", "vip"); out.Limit != 5 {
			t.Errorf("a hit during the change: limit %d; want 5, the override before it", out.Limit)
		}
	}
	if err := e.SetOverride(lp, "api", []byte("vip"), 7); err != nil {
		t.Fatal(err)
	}
	if _, out := hitN(t, r, lp, 1, now, "path", "/api", "ip", "vip"); out.Limit != 7 {
		t.Fatalf("the hit after the change returned: limit %d; want 7", out.Limit)
	}
}
