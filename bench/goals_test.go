package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

func TestDecidePin(t *testing.T) {
	for _, c := range []struct {
		name           string
		want, explicit bool
		cpus           int
		taskset        bool
		pin, err       bool
		noteHas        string
	}{
		{name: "default on two cores pins", want: true, cpus: 2, taskset: true, pin: true, noteHas: "pinned"},
		{name: "default on one core runs unpinned and says so", want: true, cpus: 1, taskset: true, noteHas: "unpinned: this process may use 1 CPU"},
		{name: "default without taskset runs unpinned and says so", want: true, cpus: 8, noteHas: "taskset (util-linux) is not installed"},
		{name: "--pin=false", want: false, explicit: true, cpus: 8, taskset: true, noteHas: "unpinned (--pin=false)"},
		{name: "explicit --pin on one core is an error", want: true, explicit: true, cpus: 1, taskset: true, err: true},
		{name: "explicit --pin without taskset is an error", want: true, explicit: true, cpus: 2, err: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := decidePin(c.want, c.explicit, c.cpus, c.taskset)
			if (err != nil) != c.err {
				t.Fatalf("err %v, want error %v", err, c.err)
			}
			if err != nil {
				return
			}
			if p.Pin != c.pin || !strings.Contains(p.Note, c.noteHas) {
				t.Errorf("got %+v, want pin %v and a note with %q", p, c.pin, c.noteHas)
			}
		})
	}
}

func TestParseProcStatAndCoreBusy(t *testing.T) {
	before := parseProcStat([]byte("cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 5 0 5 40 0 0 0 0 0 0\ncpu1 5 0 5 40 0 0 0 0 0 0\nintr 1 2 3\n"))
	after := parseProcStat([]byte("cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 85 0 5 50 0 0 0 0 0 0\ncpu1 10 0 10 120 0 5 5 0 0 0\n"))
	if len(before) != 2 || before[1] != (coreTicks{Busy: 10, Total: 50}) {
		t.Fatalf("before %+v", before)
	}
	got := coreBusy(before, after)
	// cpu0: busy 90-10 of 140-50; cpu1: busy 30-10 (irq and softirq count) of 150-50.
	if len(got) != 2 || got[0] < 0.888 || got[0] > 0.889 || got[1] != 0.2 {
		t.Errorf("coreBusy = %v, want [0.889 0.2]", got)
	}
	if b := coreBusy(before, before); b[0] != -1 {
		t.Errorf("no ticks between readings: %v, want -1", b)
	}
}

// row is a result of ops requests per second with every latency at p99Us.
func row(tg target, ops float64, p99Us int64, gen float64) result {
	h := hdrhistogram.New(1, 60_000_000, 3)
	h.RecordValues(p99Us, 1000)
	return result{Target: tg, Requests: int64(ops), Elapsed: time.Second, Hist: h, CPU: time.Second, Cores: []float64{1, gen}}
}

func goalFixture(before bool) goalReport {
	ptr := func(r result) *result { return &r }
	g := goalReport{Pinned: true, AfterID: "after-bin", BeforeID: "before-bin", Before: before}
	runs := map[string]goalRunResult{
		"pipelined": {Redis: map[target]result{targetRedisLua: row(targetRedisLua, 100_000, 1000, 0.2), targetRedisCell: row(targetRedisCell, 250_000, 1000, 0.3)},
			Sluice: [2]*result{goalAfter: ptr(row(targetSluice, 210_000, 1000, 0.4)), goalBefore: ptr(row(targetSluice, 120_000, 1000, 0.4))}},
		"always": {Sluice: [2]*result{goalAfter: ptr(row(targetSluice, 110_000, 1000, 0.3)), goalBefore: ptr(row(targetSluice, 50_000, 1000, 0.3))}},
		"unpipelined": {Redis: map[target]result{targetRedisLua: row(targetRedisLua, 40_000, 2000, 0.5)},
			Sluice: [2]*result{goalAfter: ptr(row(targetSluice, 41_000, 2500, 0.5)), goalBefore: ptr(row(targetSluice, 39_000, 1500, 0.5))}},
		"hot": {Redis: map[target]result{targetRedisLua: row(targetRedisLua, 150_000, 1000, 0.3)},
			Sluice: [2]*result{goalAfter: ptr(row(targetSluice, 800_000, 1000, 0.95)), goalBefore: ptr(row(targetSluice, 300_000, 1000, 0.5))}},
	}
	for _, gr := range goalRuns {
		r := runs[gr.Name]
		r.Run = gr
		if !before {
			r.Sluice[goalBefore] = nil
		}
		g.Runs = append(g.Runs, r)
	}
	return g
}

func TestGoalsMetAndNotMet(t *testing.T) {
	g := goalFixture(true)
	want := map[int][]struct {
		met   bool
		text  string
		bound bool
	}{
		goalAfter: {
			{true, "2.10×", false},                  // 210k / 100k Lua
			{false, "0.84×", false},                 // 210k / 250k redis-cell
			{true, "0.52×", false},                  // always 110k / everysec 210k
			{true, "1.10×", false},                  // always 110k / Lua 100k
			{true, "1.02×", false},                  // 41k / 40k
			{false, "p99 2.50 ms / 2.00 ms", false}, // worse p99
			{true, "5.33×", true},                   // 800k / 150k, generator core 95% busy
		},
		goalBefore: {
			{false, "1.20×", false},
			{false, "0.48×", false},
			{false, "0.42×", false},
			{false, "0.50×", false},
			{false, "0.97×", false},
			{true, "p99 1.50 ms / 2.00 ms", false},
			{false, "2.00×", false},
		},
	}
	for which, rows := range want {
		for i, w := range rows {
			v := goals[i].eval(g, which)
			if !v.Known || v.Met != w.met || v.Text != w.text || v.Bound != w.bound {
				t.Errorf("%s (binary %d) = %+v, want met %v, %q, bound %v", goals[i].Name, which, v, w.met, w.text, w.bound)
			}
		}
	}
	// Per server CPU second: sluice 210000 requests in 1 s of CPU, Lua
	// 100000 in 0.5 s.
	g.Runs[0].Redis[targetRedisLua] = func(r result) result { r.CPU = 500 * time.Millisecond; return r }(g.Runs[0].Redis[targetRedisLua])
	if v := goals[0].eval(g, goalAfter); v.PerCPU < 1.049 || v.PerCPU > 1.051 || !v.Met {
		t.Errorf("per CPU second: %+v, want 1.05 and met by throughput", v)
	}
	// Without redis-cell's row that goal is unknown, not met.
	delete(g.Runs[0].Redis, targetRedisCell)
	if v := goals[1].eval(g, goalAfter); v.Known || v.cell() != "not measured" {
		t.Errorf("redis-cell goal without its row = %+v, %q", v, v.cell())
	}
}

func TestGoalsMarkdown(t *testing.T) {
	g := goalFixture(true)
	g.PinNote, g.Load = "pinned: ...", [2]string{"0.50 0.40 0.30", "1.10 0.60 0.40"}
	md := goalsMarkdown(g)
	for _, s := range []string{
		"One run, pinned: .... Load average 0.50 0.40 0.30 at the start, 1.10 0.60 0.40 at the end.\n",
		"| goal (issue 13) | wanted | before (before-bin) | after (after-bin) |",
		"| pipelined `RL.PREDUCE`, everysec / Lua bucket | ≥ 2.0× | 1.20×, **not met**; per server CPU second 1.20× | 2.10×, met; per server CPU second 2.10× |",
		"| hot keys (zipf over 1000) / Lua bucket | ≥ 2.5× | 2.00×, **not met**; per server CPU second 2.00× | 5.33×, met (generator-bound); per server CPU second 5.33× |",
		"| pipelined | redis-cell CL.THROTTLE | 250000 |",
		"| pipelined | sluice before | 120000 |",
		"| hot | sluice after | 800000 | 1.00 | 1.00 | 1.25 | - | 100%, CPU 0 100% busy | 0%, CPU 1 95% busy (generator-bound) |",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	md = goalsMarkdown(goalFixture(false))
	if !strings.Contains(md, "| goal (issue 13) | wanted | after-bin |\n|---|---|---|\n") || strings.Contains(md, "sluice before") {
		t.Errorf("without a before binary, one column:\n%s", md)
	}
}

func TestGeneratorBoundOnlyWhenPinned(t *testing.T) {
	r := result{Elapsed: time.Second, GenCPU: 900 * time.Millisecond, Cores: []float64{1, 0.92}}
	if !r.generatorBound(true) || r.generatorBound(false) {
		t.Errorf("generatorBound pinned %v, unpinned %v; want true, false", r.generatorBound(true), r.generatorBound(false))
	}
	if got := r.generatorText(false); got != "90%" {
		t.Errorf("unpinned text %q", got)
	}
	r.Cores[1] = 0.89
	if r.generatorBound(true) {
		t.Error("89% busy flagged as generator-bound")
	}
}

// TestServerSharedFlagsOthersOnTheServersCore: pinned, a row whose
// server used 52% of CPU 0 while CPU 0 was 100% busy had half its core
// taken by other processes, and says so; so does each goal resting on it.
func TestServerSharedFlagsOthersOnTheServersCore(t *testing.T) {
	r := result{Requests: 330_000, Elapsed: time.Second, CPU: 520 * time.Millisecond, Cores: []float64{1, 0.5}}
	if !r.serverShared(true) || r.serverShared(false) {
		t.Errorf("serverShared pinned %v, unpinned %v; want true, false", r.serverShared(true), r.serverShared(false))
	}
	if got := r.serverText(true); got != "52%, CPU 0 100% busy (server core shared)" {
		t.Errorf("serverText %q", got)
	}
	r.CPU = 950 * time.Millisecond
	if r.serverShared(true) {
		t.Error("a server using 95% of a core 100% busy flagged as shared")
	}
	g := goalFixture(false)
	hot := g.Runs[3].Sluice[goalAfter]
	hot.CPU = 500 * time.Millisecond
	if v := goals[6].eval(g, goalAfter); !v.Shared || v.cell() != "5.33×, met (generator-bound, server core shared); per server CPU second 10.67×" {
		t.Errorf("hot goal on a shared core: %+v %q", v, v.cell())
	}
}

func TestWriteGoalsDocsReplacesItsPart(t *testing.T) {
	checkWritesOnlyItsPart(t, goalsPart, func(path string) error {
		return writeGoalsDocs(path, goalFixture(true), []string{"--scenario", "goals"})
	}, "2.10×, met", "`go run ./bench --scenario goals`")
}

// checkWritesOnlyItsPart writes a page holding the main part and an old
// copy of part, calls write on it, and checks that part now holds every
// want and that nothing else changed.
func checkWritesOnlyItsPart(t *testing.T, part docsPart, write func(path string) error, want ...string) {
	t.Helper()
	path := t.TempDir() + "/benchmarks.md"
	doc := "# Benchmarks\n\n" + beginMarker + "\nmain\n" + endMarker + "\n\n" + part.begin + "\nold part\n" + part.end + "\n\n## Profile findings\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := write(path); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	got := string(raw)
	i, j := strings.Index(got, part.begin), strings.Index(got, part.end)
	switch {
	case strings.Contains(got, "old part"):
		t.Errorf("old part kept:\n%s", got)
	case !strings.Contains(got, beginMarker+"\nmain\n"+endMarker):
		t.Errorf("the main part changed:\n%s", got)
	case i < 0 || j < i:
		t.Errorf("no part:\n%s", got)
	case !strings.HasSuffix(got, part.end+"\n\n## Profile findings\n"):
		t.Errorf("what follows the part changed:\n%s", got)
	}
	for _, w := range want {
		if i >= 0 && j > i && !strings.Contains(got[i:j], w) {
			t.Errorf("no %q in the part:\n%s", w, got[i:j])
		}
	}
}

func TestMemoryWorkload(t *testing.T) {
	w := memoryWorkload(options{set: map[string]bool{}, w: workload{ZipfS: 1.2, Take: 1, Max: 100, RefillMs: 60000}})
	if w.Keys != 10_000_000 || w.Requests != w.Keys || w.Dist != "seq" || w.command() != cmdRLPReduce {
		t.Errorf("default memory workload %+v: want 10M keys, each once, in order", w)
	}
	w = memoryWorkload(options{set: map[string]bool{"keys": true}, w: workload{Keys: 1000, ZipfS: 1.2, Take: 1, Max: 100, RefillMs: 60000}})
	if w.Keys != 1000 || w.Requests != 1000 {
		t.Errorf("--keys 1000: %+v, want 1000 requests", w)
	}
}

func TestMemoryMarkdown(t *testing.T) {
	m := memoryReport{W: workload{Keys: 10_000_000, Conns: 50, Pipeline: 16}, PeakRSS: 600 << 20, EndRSS: 500 << 20,
		Res: result{Requests: 10, Elapsed: time.Second, CPU: 50 * time.Microsecond}, Info: infoCacheFields(infoFields{"cache_entries": "7", "fsyncs": "3"})}
	md := memoryMarkdown(m)
	for _, s := range []string{"sluice with default flags", "| 600.0 | 500.0 | **not met** | 10 | 5.00 |", "INFO at the end: cache_entries:7\n"} {
		if !strings.Contains(md, s) {
			t.Errorf("lacks %q:\n%s", s, md)
		}
	}
	m.PeakRSS = 512 << 20
	if md := memoryMarkdown(m); !strings.Contains(md, "| 512.0 | 500.0 | met |") {
		t.Errorf("512 MiB is within the goal:\n%s", md)
	}
}

// TestGoalWorkloadsTakeTheBucketFlags: every goal row sends the bucket of
// the flags (RL.PREDUCE k:<id> 100 60000 TAKE 1 by default, CL.THROTTLE
// ... 100 100 60 1): a row without them sent max 0, which redis-cell
// refuses ("Zero rates are not supported").
func TestGoalWorkloadsTakeTheBucketFlags(t *testing.T) {
	o := options{set: map[string]bool{}, w: workload{Conns: 50, Pipeline: 16, Requests: 1_000_000, Keys: 1_000_000, Dist: "uniform", ZipfS: 1.2, Take: 1, Max: 100, RefillMs: 60000}}
	runs, err := goalWorkloads(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if r.W.Take != 1 || r.W.Max != 100 || r.W.RefillMs != 60000 {
			t.Errorf("%s: take %d, max %d, refill %d ms; want 1, 100, 60000", r.Name, r.W.Take, r.W.Max, r.W.RefillMs)
		}
		if got := string(appendCommand(nil, targetRedisCell, r.W, 7, opReduce, 0, 0, "")); got != "*6\r\n$11\r\nCL.THROTTLE\r\n$3\r\nk:7\r\n$3\r\n100\r\n$3\r\n100\r\n$2\r\n60\r\n$1\r\n1\r\n" {
			t.Errorf("%s: redis-cell sends %q", r.Name, got)
		}
	}
	if got, want := runs[1].about(), "`RL.PREDUCE k:<id> 100 60000 TAKE 1`, 50 connections, pipeline 16, 1000000 requests over 1000000 keys uniform, sluice --fsync always"; got != want {
		t.Errorf("always: about %q, want %q", got, want)
	}
	if got := runs[3].about(); !strings.Contains(got, "2000000 requests over 1000 keys zipf(1.2), sluice --fsync everysec") {
		t.Errorf("hot: about %q", got)
	}
	if runs[0].W.Pipeline != 16 || runs[2].W.Pipeline != 1 || runs[3].W.Keys != 1000 || runs[3].W.Dist != "zipf" {
		t.Errorf("the issue's shapes changed: %+v", runs)
	}
}

// TestSluiceArgsGiveHTTPAFreePort: a sluice the harness starts listens for
// HTTP where the harness says, not on the default 127.0.0.1:9050, which
// another sluice on the machine may hold (a goals run died on "bind:
// address already in use"); a --http-addr among the flags wins.
func TestSluiceArgsGiveHTTPAFreePort(t *testing.T) {
	got := strings.Join(sluiceArgs("127.0.0.1:1", "127.0.0.1:2", "/d", []string{"--fsync", "always"}), " ")
	if want := "--addr 127.0.0.1:1 --data /d --log-level warn --http-addr 127.0.0.1:2 --fsync always"; got != want {
		t.Errorf("args %q, want %q", got, want)
	}
	for _, flags := range [][]string{{"--http-addr", ""}, {"--http-addr=127.0.0.1:3"}} {
		got := sluiceArgs("127.0.0.1:1", "127.0.0.1:2", "/d", flags)
		if strings.Contains(strings.Join(got, " "), "127.0.0.1:2") {
			t.Errorf("flags %q: args %q also give the harness's HTTP address", flags, got)
		}
	}
}
