package engine

import (
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/peakstats"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

const statsRules = `
[path=/api user=*]
creditLimit = 100
resetSeconds = 60
actorField = user
label = api

[path=/fw user=*]
creditLimit = 10
resetSeconds = 60
algorithm = fixedWindow
actorField = user
label = fw

[path=/tb user=*]
creditLimit = 10
resetSeconds = 60
algorithm = tokenBucket
actorField = user
label = tb

[path=/big user=*]
creditLimit = 1000000000000
resetSeconds = 864000
actorField = user
label = big

[default]
creditLimit = 0
resetSeconds = 0
`

// testClock is an engine clock a test sets.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// statsDay0 is a UTC midnight: the workloads' first day.
var statsDay0 = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

// hitCredits takes credits from user's counter of the rule of path at at,
// committed, and reports whether it was allowed.
func hitCredits(t *testing.T, r *Round, lp *rules.Set, path, user string, credits int64, at time.Time) bool {
	t.Helper()
	out, err := r.Hit(lp, request("path", path, "user", user), credits, at.UnixNano())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := r.Commit(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	return out.Allowed
}

// TestStatsKnownWorkload is issue 30's must-show 3: actors with known peak
// usages over many windows, on an injected clock; POLICY STATS and WHATIF
// report the workload's counts and shares, exactly where the data are
// exact and within the stated error where a sketch answers.
func TestStatsKnownWorkload(t *testing.T) {
	const (
		actors  = 3000 // more than the sample holds: the sketches answer
		windows = 4
		limit   = 100
	)
	clk := &testClock{now: statsDay0}
	e := New(Config{Store: openStore(t, storage.NewMemDisk()), Clock: clk.Now})
	lp := dialsFile(t, statsRules).Current()
	r := e.NewRound()

	// Each actor's windows open an hour apart, so each has ended before
	// the next opens: the next's first hit ends it. Peaks are skewed: most
	// actors use little, a few reach the limit (and are refused: a last
	// hit asks for a credit more).
	rng := rand.New(rand.NewPCG(30, 4))
	var peaks []int64
	maxPeak := make([]int64, actors)
	refusedWindows, refusedActors := 0, 0
	for w := range windows + 1 {
		at := statsDay0.Add(time.Duration(w) * time.Hour)
		clk.Set(at)
		for a := range actors {
			user := "user" + strconv.Itoa(a)
			if w == windows {
				hitCredits(t, r, lp, "/api", user, 1, at) // ends the last window
				continue
			}
			p := min(int64(1+rng.ExpFloat64()*15), limit)
			if a%50 == 0 && w%2 == 0 {
				p = limit
			}
			if !hitCredits(t, r, lp, "/api", user, p, at) {
				t.Fatalf("window %d of %s: %d credits refused", w, user, p)
			}
			if p == limit {
				if hitCredits(t, r, lp, "/api", user, 1, at.Add(time.Second)) {
					t.Fatalf("%s: a hit past the limit was allowed", user)
				}
				refusedWindows++
				if maxPeak[a] < limit {
					refusedActors++
				}
			}
			peaks = append(peaks, p)
			maxPeak[a] = max(maxPeak[a], p)
		}
	}
	clk.Set(statsDay0.Add(windows*time.Hour + time.Minute))

	st, err := e.Stats(lp, "api")
	if err != nil {
		t.Fatal(err)
	}
	d := st.Day
	if d.Windows != uint64(len(peaks)) || d.Refused != uint64(refusedWindows) {
		t.Fatalf("windows %d, refused %d; the workload had %d and %d", d.Windows, d.Refused, len(peaks), refusedWindows)
	}
	within := func(what string, got, want, tol float64) {
		t.Helper()
		if math.Abs(got-want) > tol {
			t.Errorf("%s: %.4f; the workload's is %.4f, and the stated error allows %.4f", what, got, want, tol)
		} else {
			t.Logf("%s: %.4f; the workload's %.4f (allowed error %.4f)", what, got, want, tol)
		}
	}
	// Distinct actors: HyperLogLog, within three standard errors.
	n, exact := d.Actors()
	within("distinct actors", n, actors, 3*peakstats.ActorsStdErr*actors)
	if exact {
		t.Error("3000 actors counted as exact; the sample holds 1024")
	}
	n, _ = d.RefusedActors()
	within("distinct refused actors", n, float64(refusedActors), 3*peakstats.ActorsStdErr*float64(refusedActors))

	// Quantiles: exact below 64, within a bucket's width above.
	slices.Sort(peaks)
	for _, q := range StatsQuantiles {
		want := peaks[int(math.Ceil(q*float64(len(peaks))))-1]
		got, exact := d.Quantile(q)
		if got < want || float64(got) > float64(want)*(1+peakstats.RelativeWidth) || exact && got != want || want < 64 && !exact {
			t.Errorf("p%v: %d (exact %v); the workload's is %d", q*100, got, exact, want)
		}
	}

	// WHATIF: windows within the stated bound, actors within three
	// standard errors of the sample.
	for _, cand := range []int64{5, 10, 20, 50, 70, 99, 100} {
		overW, overA := 0, 0
		for _, p := range peaks {
			if p > cand {
				overW++
			}
		}
		for _, p := range maxPeak {
			if p > cand {
				overA++
			}
		}
		w := d.WhatIf(cand)
		c := strconv.FormatInt(cand, 10)
		within("WHATIF "+c+" windows", w.Windows, float64(overW)/float64(len(peaks)), w.WindowsErr+1e-12)
		if cand < 64 && w.WindowsErr != 0 {
			t.Errorf("WHATIF %d: windows error %v; want exact below 64", cand, w.WindowsErr)
		}
		p := float64(overA) / actors
		within("WHATIF "+c+" actors", w.Actors, p, 3*math.Sqrt(p*(1-p)/peakstats.SampleSize)+1e-12)
	}
}

// TestStatsFixedWindow: a fixedWindow rule's windows are summarised; a
// rule with no windows (tokenBucket) and an unknown label are refused with
// an error naming them.
func TestStatsFixedWindow(t *testing.T) {
	clk := &testClock{now: statsDay0}
	e := New(Config{Store: openStore(t, storage.NewMemDisk()), Clock: clk.Now})
	lp := dialsFile(t, statsRules).Current()
	r := e.NewRound()
	for w := range 3 {
		at := statsDay0.Add(time.Duration(w) * time.Minute)
		hitCredits(t, r, lp, "/fw", "a", int64(3*w+1), at) // 1, 4, 7
		for range 3 {                                      // b reaches 10, then is refused
			hitCredits(t, r, lp, "/fw", "b", 4, at)
		}
	}
	clk.Set(statsDay0.Add(3 * time.Minute))
	st, err := e.Stats(lp, "fw")
	if err != nil {
		t.Fatal(err)
	}
	// The third window of each is still open.
	if d := st.Day; d.Windows != 4 || d.Refused != 0 {
		t.Fatalf("windows %d refused %d; want 4 and 0 (b's windows peak at 8 of 10)", d.Windows, d.Refused)
	}
	if v, _ := st.Day.Quantile(1); v != 8 {
		t.Fatalf("max peak %d; want 8", v)
	}
	for _, label := range []string{"tb", "nope"} {
		if _, err := e.Stats(lp, label); errs.KindOf(err) != errs.Request {
			t.Errorf("Stats(%s): %v; want a request error", label, err)
		} else {
			t.Logf("Stats(%s): %v", label, err)
		}
	}
}

// TestStatsPersistAndRetain: the threshold data survive a restart of the
// store, and days past the retention are dropped, from the store too.
func TestStatsPersistAndRetain(t *testing.T) {
	disk := storage.NewMemDisk()
	clk := &testClock{now: statsDay0}
	st := openStore(t, disk)
	e := New(Config{Store: st, Clock: clk.Now, StatsDays: 3})
	lp := dialsFile(t, statsRules).Current()
	r := e.NewRound()
	// One window a day, peaking at day+1, for 5 days; the sixth day's hit
	// ends the fifth's.
	for day := range 6 {
		at := statsDay0.Add(time.Duration(day) * 24 * time.Hour)
		clk.Set(at)
		hitCredits(t, r, lp, "/api", "a", int64(day+1), at)
	}
	if err := e.FlushStats(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st = openStore(t, disk)
	e = New(Config{Store: st, Clock: clk.Now, StatsDays: 3})
	s, err := e.Stats(lp, "api")
	if err != nil {
		t.Fatal(err)
	}
	// Day 5 (today), 4 and 3 are kept: the windows of days 3 and 4,
	// peaking at 4 and 5.
	if s.Day.Windows != 2 || s.From != "2026-11-04" || s.To != "2026-11-06" {
		t.Fatalf("%d windows from %s to %s; want 2, 2026-11-04 to 2026-11-06", s.Day.Windows, s.From, s.To)
	}
	if lo, hi := s.Day.Quantile(0.01); lo != 4 || !hi {
		t.Fatalf("min peak %d; want 4", lo)
	}
	var names []string
	if err := st.ScanMeta(keyspace.StatsMeta, func(name string, _ []byte) bool {
		names = append(names, name)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"api.2026-11-04", "api.2026-11-05"}; !slices.Equal(names, want) {
		t.Fatalf("stored days %v; want %v (older ones dropped)", names, want)
	}
}

// TestStatsCorrupt: a stored day that does not decode is a clear error of
// POLICY STATS, not a panic or silence.
func TestStatsCorrupt(t *testing.T) {
	clk := &testClock{now: statsDay0}
	st := openStore(t, storage.NewMemDisk())
	e := New(Config{Store: st, Clock: clk.Now})
	lp := dialsFile(t, statsRules).Current()
	if err := st.SetMeta(keyspace.StatsMeta+"api.2026-11-01", []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	_, err := e.Stats(lp, "api")
	if !errors.Is(err, peakstats.ErrCorrupt) || errs.KindOf(err) != errs.Corrupt {
		t.Fatalf("Stats: %v; want a Corrupt error wrapping peakstats.ErrCorrupt", err)
	}
}

// BenchmarkHitStats: a warm round's hit and its commit (on a store that
// does not sync, so that the store's fsync does not count), by 10000
// actors in turn, each 61 s after its last: of windows that go on
// (within: a rule with a 10-day window) and of windows that end at each
// hit (ends: a 60 s window), whose commit adds the ended window to the
// threshold data. The clock moves 6.1 ms a hit, so a flush runs every
// 1640 hits or so, counted.
func BenchmarkHitStats(b *testing.B) {
	const actors = 10000
	for _, path := range []string{"/big", "/api"} {
		name := map[string]string{"/big": "within", "/api": "ends"}[path]
		b.Run(name, func(b *testing.B) {
			clk := &testClock{now: statsDay0}
			st, err := storage.Open("db", storage.Options{Sync: storage.SyncNo, Disk: storage.NewMemDisk(), Partition: keyspace.Partition, Partitions: keyspace.Partitions})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = st.Close() })
			e := New(Config{Store: st, Clock: clk.Now})
			lp := dialsFile(b, statsRules).Current()
			r := e.NewRound()
			reqs := make([]policy.Request, actors)
			for i := range reqs {
				reqs[i] = request("path", path, "user", "user"+strconv.Itoa(i))
			}
			at, i := statsDay0, 0
			step := 61 * time.Second / actors
			b.ReportAllocs()
			for b.Loop() {
				at = at.Add(step)
				clk.Set(at)
				if _, err := r.Hit(lp, reqs[i%actors], 1, at.UnixNano()); err != nil {
					b.Fatal(err)
				}
				if ok, err := r.Commit(); !ok || err != nil {
					b.Fatal(ok, err)
				}
				i++
			}
		})
	}
}

// TestStatsSweptAndForwarded: a window the idle sweep deletes is counted
// once, as one a hit ends is; and the owner of a forwarded counter hit
// (ApplyCounter) counts the windows of the counters it owns.
func TestStatsSweptAndForwarded(t *testing.T) {
	clk := &testClock{now: statsDay0}
	st := openStore(t, storage.NewMemDisk())
	e := New(Config{Store: st, Clock: clk.Now})
	lp := dialsFile(t, statsRules).Current()
	r := e.NewRound()
	hitCredits(t, r, lp, "/api", "a", 2, statsDay0)
	hitCredits(t, r, lp, "/api", "b", 100, statsDay0)
	hitCredits(t, r, lp, "/fw", "c", 10, statsDay0)

	// The owner's side: c's window of /fw, hit through ApplyCounter, ended
	// by its next hit a minute later.
	fw := lp.Policy.Rules()[1]
	id := fw.AppendCounterID(nil, request("user", "d"))
	key := keyspace.AppendRuleKey(nil, fw, fw.CreditLimit, id)
	for _, at := range []time.Time{statsDay0, statsDay0.Add(time.Minute)} {
		if _, err := r.ApplyCounter(key, fw, fw.CreditLimit, 4, at.UnixNano(), id); err != nil {
			t.Fatal(err)
		}
		if ok, err := r.Commit(); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}

	now := statsDay0.Add(2 * time.Minute)
	clk.Set(now)
	sweep := func() int {
		n := 0
		for cursor := []byte(nil); ; {
			next, res, err := st.SweepThen(cursor, 100, func(k, v []byte) bool { return keyspace.Idle(k, v, now.UnixNano()) }, func(k, v []byte) { e.Swept(lp, k, v) })
			if err != nil {
				t.Fatal(err)
			}
			n += res.Deleted
			if cursor = next; cursor == nil {
				return n
			}
		}
	}
	if n := sweep(); n != 4 {
		t.Fatalf("the sweep deleted %d counters; want 4 (a, b, c and d's second window)", n)
	}
	if n := sweep(); n != 0 {
		t.Fatalf("a second sweep deleted %d", n)
	}
	s, err := e.Stats(lp, "api")
	if err != nil {
		t.Fatal(err)
	}
	if d := s.Day; d.Windows != 2 || d.Refused != 1 || d.Max != 100 {
		t.Fatalf("api: %d windows, %d refused, max %d; want 2, 1 (b reached 100), 100", d.Windows, d.Refused, d.Max)
	}
	if s, err = e.Stats(lp, "fw"); err != nil {
		t.Fatal(err)
	}
	if d := s.Day; d.Windows != 3 || d.Refused != 1 {
		t.Fatalf("fw: %d windows, %d refused; want 3 (c swept, d ended by a hit and swept), 1 (c reached 10)", d.Windows, d.Refused)
	}
	if n, _ := s.Day.Actors(); n != 2 {
		t.Fatalf("fw: %v actors; want 2", n)
	}
}

// TestStatsConcurrent: rounds ending windows at once, while POLICY STATS
// flushes and reads, lose no window and count none twice (run with
// -race).
func TestStatsConcurrent(t *testing.T) {
	clk := &testClock{now: statsDay0}
	e := New(Config{Store: openStore(t, storage.NewMemDisk()), Clock: clk.Now})
	lp := dialsFile(t, statsRules).Current()
	const workers, windows = 4, 30
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.NewRound()
			user := "user" + strconv.Itoa(w)
			for i := range windows + 1 {
				at := statsDay0.Add(time.Duration(i) * time.Minute)
				if _, err := r.Hit(lp, request("path", "/api", "user", user), int64(i%7+1), at.UnixNano()); err != nil {
					t.Error(err)
					return
				}
				if ok, err := r.Commit(); !ok || err != nil {
					t.Error(ok, err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 20 {
			if _, err := e.Stats(lp, "api"); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	s, err := e.Stats(lp, "api")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Day.Actors(); s.Day.Windows != workers*windows || n != workers {
		t.Fatalf("%d windows of %v actors; want %d of %d", s.Day.Windows, n, workers*windows, workers)
	}
}

// TestStatsFlushedWithoutAsking: each ended window reaches the store
// within the flush interval though nothing else happens, the second as
// the first: a crash loses at most that much.
func TestStatsFlushedWithoutAsking(t *testing.T) {
	clk := &testClock{now: statsDay0}
	st := openStore(t, storage.NewMemDisk())
	e := New(Config{Store: st, Clock: clk.Now, StatsFlush: time.Millisecond})
	lp := dialsFile(t, statsRules).Current()
	r := e.NewRound()
	hitCredits(t, r, lp, "/api", "a", 1, statsDay0)
	for w := 1; w <= 2; w++ {
		hitCredits(t, r, lp, "/api", "a", 1, statsDay0.Add(time.Duration(w)*time.Minute))
		for deadline := time.Now().Add(10 * time.Second); ; {
			v, err := st.Meta(keyspace.StatsMeta + "api.2026-11-01")
			if err != nil {
				t.Fatal(err)
			}
			if v != nil {
				d, err := peakstats.Decode(v)
				if err != nil {
					t.Fatal(err)
				}
				if d.Windows == uint64(w) {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("window %d was not stored within 10 s of a 1 ms flush interval", w)
			}
			runtime.Gosched()
		}
	}
}
