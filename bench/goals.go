package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The goals scenario runs issue 13's goal workloads in one invocation,
// one core per server, and prints the goal table: each goal's ratio, met
// or not, for the sluice under test and, with --before-bin, for an older
// binary measured in the same run (each workload's rows back to back, so
// that the machine's drift between them is small).

// goalRun is one workload of the goals scenario.
type goalRun struct {
	Name  string
	W     workload
	Flags []string // the sluice's
	Redis []target // the Redis rows it needs (redis-cell's when --redis-cell is given)
}

// goalRuns are the workloads: 50 connections, keys drawn from 1M
// (as redis-benchmark -r 1000000), 1M requests pipelined 16.
var goalRuns = []goalRun{
	{Name: "pipelined",
		W:     workload{Conns: 50, Pipeline: 16, Requests: 1_000_000, Keys: 1_000_000, Dist: "uniform"},
		Redis: []target{targetRedisINCR, targetRedisLua, targetRedisCell}},
	{Name: "always",
		W:     workload{Conns: 50, Pipeline: 16, Requests: 1_000_000, Keys: 1_000_000, Dist: "uniform"},
		Flags: []string{"--fsync", "always"}},
	{Name: "unpipelined",
		W:     workload{Conns: 50, Pipeline: 1, Requests: 400_000, Keys: 1_000_000, Dist: "uniform"},
		Redis: []target{targetRedisLua}},
	{Name: "hot",
		W:     workload{Conns: 50, Pipeline: 16, Requests: 2_000_000, Keys: 1000, Dist: "zipf", ZipfS: 1.2},
		Redis: []target{targetRedisLua}},
}

// about describes a goal run's workload as it was sent.
func (gr goalRun) about() string {
	w := gr.W
	dist := w.Dist
	if dist == "zipf" {
		dist = fmt.Sprintf("zipf(%g)", w.ZipfS)
	}
	fsync := "everysec"
	for i, f := range gr.Flags {
		if f == "--fsync" && i+1 < len(gr.Flags) {
			fsync = gr.Flags[i+1]
		}
	}
	return fmt.Sprintf("`RL.PREDUCE k:<id> %d %d TAKE %d`, %d connections, pipeline %d, %d requests over %d keys %s, sluice --fsync %s",
		w.Max, w.RefillMs, w.Take, w.Conns, w.Pipeline, w.Requests, w.Keys, dist, fsync)
}

// Which sluice of a goals run: the one under test, or --before-bin's.
const (
	goalAfter = iota
	goalBefore
)

// goalRunResult is one workload's rows.
type goalRunResult struct {
	Run    goalRun
	Redis  map[target]result
	Sluice [2]*result // by goalAfter, goalBefore
}

type goalReport struct {
	Runs     []goalRunResult
	Before   bool   // a before binary was measured
	BeforeID string // how the docs name it
	AfterID  string
	Pinned   bool
	PinNote  string
	RedisVer string
	Notes    []string
	Load     [2]string // /proc/loadavg's three figures at the start and the end
}

func (g goalReport) run(name string) (goalRunResult, bool) {
	for _, r := range g.Runs {
		if r.Run.Name == name {
			return r, true
		}
	}
	return goalRunResult{}, false
}

// goalValue is one goal evaluated for one binary.
type goalValue struct {
	Known  bool    // both sides were measured
	Value  float64 // the ratio
	Met    bool
	Text   string  // "1.91×", or "p99 2.79 ms / 1.44 ms"
	Bound  bool    // a row it rests on was generator-bound
	Shared bool    // a row it rests on had its server's core shared with other processes
	PerCPU float64 // the same ratio of requests per server CPU second, 0 if unknown
}

// goal is one line of the goal table.
type goal struct {
	Name string
	Want string
	eval func(g goalReport, which int) goalValue
}

// ratioGoal is a/b, met when at least want; unknown when a row is missing.
func ratioGoal(a, b *result, want float64, pinned bool) goalValue {
	if a == nil || b == nil || a.opsPerSec() <= 0 || b.opsPerSec() <= 0 {
		return goalValue{}
	}
	v := a.opsPerSec() / b.opsPerSec()
	gv := goalValue{Known: true, Value: v, Met: v >= want, Text: fmt.Sprintf("%.2f×", v),
		Bound: a.generatorBound(pinned) || b.generatorBound(pinned), Shared: a.serverShared(pinned) || b.serverShared(pinned)}
	if a.CPU > 0 && b.CPU > 0 && a.Requests > 0 && b.Requests > 0 {
		// Requests per second of server CPU, a/b: what each would do
		// with its core to itself, if the server alone set the pace.
		gv.PerCPU = (float64(a.Requests) / a.CPU.Seconds()) / (float64(b.Requests) / b.CPU.Seconds())
	}
	return gv
}

// p99Goal is met when a's p99 is no worse than b's.
func p99Goal(a, b *result, pinned bool) goalValue {
	if a == nil || b == nil || a.Hist == nil || b.Hist == nil {
		return goalValue{}
	}
	pa, pb := a.Hist.ValueAtQuantile(99), b.Hist.ValueAtQuantile(99)
	return goalValue{Known: true, Value: float64(pa) / float64(max(pb, 1)), Met: pa <= pb,
		Text:  fmt.Sprintf("p99 %s ms / %s ms", ms(a.Hist, 99), ms(b.Hist, 99)),
		Bound: a.generatorBound(pinned) || b.generatorBound(pinned), Shared: a.serverShared(pinned) || b.serverShared(pinned)}
}

// rows returns the sluice row of binary which and the Redis row t of a run.
func (g goalReport) rows(run string, which int, t target) (*result, *result) {
	r, ok := g.run(run)
	if !ok {
		return nil, nil
	}
	var red *result
	if res, ok := r.Redis[t]; ok {
		red = &res
	}
	return r.Sluice[which], red
}

// goals are issue 13's, in its order.
var goals = []goal{
	{"pipelined `RL.PREDUCE`, everysec / Lua bucket", "≥ 2.0×", func(g goalReport, w int) goalValue {
		s, l := g.rows("pipelined", w, targetRedisLua)
		return ratioGoal(s, l, 2.0, g.Pinned)
	}},
	{"pipelined `RL.PREDUCE`, everysec / redis-cell `CL.THROTTLE`", "≥ 1.0×", func(g goalReport, w int) goalValue {
		s, c := g.rows("pipelined", w, targetRedisCell)
		return ratioGoal(s, c, 1.0, g.Pinned)
	}},
	{"`--fsync always` / everysec (same binary)", "≥ 0.5×", func(g goalReport, w int) goalValue {
		a, _ := g.rows("always", w, targetRedisLua)
		e, _ := g.rows("pipelined", w, targetRedisLua)
		return ratioGoal(a, e, 0.5, g.Pinned)
	}},
	{"`--fsync always` / Lua bucket (pipelined's Lua row)", "≥ 1.0×", func(g goalReport, w int) goalValue {
		a, _ := g.rows("always", w, targetRedisLua)
		_, l := g.rows("pipelined", w, targetRedisLua)
		return ratioGoal(a, l, 1.0, g.Pinned)
	}},
	{"unpipelined / Lua bucket", "≥ 1.0×", func(g goalReport, w int) goalValue {
		s, l := g.rows("unpipelined", w, targetRedisLua)
		return ratioGoal(s, l, 1.0, g.Pinned)
	}},
	{"unpipelined p99 / Lua's p99", "no worse", func(g goalReport, w int) goalValue {
		s, l := g.rows("unpipelined", w, targetRedisLua)
		return p99Goal(s, l, g.Pinned)
	}},
	{"hot keys (zipf over 1000) / Lua bucket", "≥ 2.5×", func(g goalReport, w int) goalValue {
		s, l := g.rows("hot", w, targetRedisLua)
		return ratioGoal(s, l, 2.5, g.Pinned)
	}},
}

// cell is a goal table cell: the value and met or not met.
func (v goalValue) cell() string {
	if !v.Known {
		return "not measured"
	}
	s := v.Text + ", met"
	if !v.Met {
		s = v.Text + ", **not met**"
	}
	var flags []string
	if v.Bound {
		flags = append(flags, "generator-bound")
	}
	if v.Shared {
		flags = append(flags, "server core shared")
	}
	if len(flags) > 0 {
		s += " (" + strings.Join(flags, ", ") + ")"
	}
	if v.PerCPU > 0 {
		s += fmt.Sprintf("; per server CPU second %.2f×", v.PerCPU)
	}
	return s
}

// goalsMarkdown renders the goal table and the rows it rests on.
func goalsMarkdown(g goalReport) string {
	var b strings.Builder
	if g.PinNote != "" {
		fmt.Fprintf(&b, "One run, %s.", g.PinNote)
		if g.Load[0] != "" {
			fmt.Fprintf(&b, " Load average %s at the start, %s at the end.", g.Load[0], g.Load[1])
		}
		b.WriteString("\n\n")
	}
	if g.Before {
		fmt.Fprintf(&b, "| goal (issue 13) | wanted | before (%s) | after (%s) |\n|---|---|---|---|\n", g.BeforeID, g.AfterID)
	} else {
		fmt.Fprintf(&b, "| goal (issue 13) | wanted | %s |\n|---|---|---|\n", g.AfterID)
	}
	for _, gl := range goals {
		fmt.Fprintf(&b, "| %s | %s |", gl.Name, gl.Want)
		if g.Before {
			fmt.Fprintf(&b, " %s |", gl.eval(g, goalBefore).cell())
		}
		fmt.Fprintf(&b, " %s |\n", gl.eval(g, goalAfter).cell())
	}
	b.WriteString("\n| workload | target | ops/s | p50 ms | p99 ms | server CPU µs/op | peak RSS MiB | server CPU | generator CPU |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---|---|\n")
	row := func(run, name string, r result) {
		perOp, rss := "-", "-"
		if r.CPU > 0 {
			perOp = fmt.Sprintf("%.2f", float64(r.CPU.Microseconds())/float64(max(r.Requests, 1)))
		}
		if r.PeakRSS > 0 {
			rss = fmt.Sprintf("%.0f", float64(r.PeakRSS)/(1<<20))
		}
		p50, p99 := "-", "-"
		if r.Hist != nil {
			p50, p99 = ms(r.Hist, 50), ms(r.Hist, 99)
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %s | %s | %s | %s | %s | %s |\n", run, name, r.opsPerSec(), p50, p99, perOp, rss, r.serverText(g.Pinned), r.generatorText(g.Pinned))
	}
	for _, r := range g.Runs {
		for _, t := range r.Run.Redis {
			if res, ok := r.Redis[t]; ok {
				row(r.Run.Name, t.String(), res)
			}
		}
		if s := r.Sluice[goalBefore]; s != nil {
			row(r.Run.Name, "sluice before", *s)
		}
		if s := r.Sluice[goalAfter]; s != nil {
			name := "sluice"
			if g.Before {
				name = "sluice after"
			}
			row(r.Run.Name, name, *s)
		}
	}
	b.WriteString("\nWorkloads:\n\n")
	for _, r := range g.Runs {
		fmt.Fprintf(&b, "- %s: %s\n", r.Run.Name, r.Run.about())
	}
	for _, n := range g.Notes {
		fmt.Fprintf(&b, "\n%s\n", n)
	}
	return b.String()
}

// goalWorkloads is goalRuns with the workload flags applied: the bucket's
// (--max, --refill-ms, --take) hold for every row, as in the other
// scenarios, and the others only when given.
func goalWorkloads(o options) ([]goalRun, error) {
	runs := slices.Clone(goalRuns)
	for i := range runs {
		runs[i].W = o.overrides(runs[i].W)
		if err := validate(runs[i].W); err != nil {
			return nil, fmt.Errorf("goals %s: %w", runs[i].Name, err)
		}
	}
	return runs, nil
}

// runGoals runs every goal workload: its Redis rows, then the before
// binary's sluice, then the one under test, each on a fresh server.
func runGoals(o options, log io.Writer) (g goalReport, err error) {
	g = goalReport{Pinned: o.pin, PinNote: o.pinNote, Before: o.beforeBin != "", AfterID: "this tree", BeforeID: o.beforeBin}
	tmp, bin, err := workDir(o, "bench-goals-")
	if err != nil {
		return g, err
	}
	defer os.RemoveAll(tmp)
	if o.serverBin != "" {
		g.AfterID = o.serverBin
	}
	bins := [2]string{goalAfter: bin}
	if g.Before {
		if bins[goalBefore], err = filepath.Abs(o.beforeBin); err == nil {
			_, err = os.Stat(bins[goalBefore])
		}
		if err != nil {
			return g, fmt.Errorf("--before-bin: %w", err)
		}
	}
	cell := ""
	if o.redisCell != "" {
		if cell, err = filepath.Abs(o.redisCell); err == nil {
			_, err = os.Stat(cell)
		}
		if err != nil {
			return g, fmt.Errorf("--redis-cell: %w", err)
		}
	} else {
		g.Notes = append(g.Notes, "redis-cell not measured: no --redis-cell (or SLUICE_BENCH_REDIS_CELL)")
	}
	runs, err := goalWorkloads(o)
	if err != nil {
		return g, err
	}
	g.Load[0] = loadAverage()
	defer func() { g.Load[1] = loadAverage() }()
	for _, gr := range runs {
		fmt.Fprintf(log, "== goals %s: %s\n", gr.Name, gr.about())
		rr := goalRunResult{Run: gr, Redis: map[target]result{}}
		if err := goalRedis(o, gr, cell, &g, rr.Redis, log); err != nil {
			return g, err
		}
		for _, which := range []int{goalBefore, goalAfter} {
			if bins[which] == "" {
				continue
			}
			res, note, err := sluiceRow(o, bins[which], gr.W, append(append([]string{}, gr.Flags...), strings.Fields(o.serverFlags)...), tmp)
			if err != nil {
				return g, fmt.Errorf("goals %s, %s: %w", gr.Name, bins[which], err)
			}
			fmt.Fprintf(log, "   %s: %s\n", bins[which], note)
			logResult(log, res, gr.W, o.pin)
			rr.Sluice[which] = &res
		}
		g.Runs = append(g.Runs, rr)
	}
	return g, nil
}

// goalRedis measures a goal run's Redis rows into into.
func goalRedis(o options, gr goalRun, cell string, g *goalReport, into map[target]result, log io.Writer) error {
	if len(gr.Redis) == 0 {
		return nil
	}
	dir, err := os.MkdirTemp("", "bench-redis-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var rs *server
	for _, t := range gr.Redis {
		if t == targetRedisCell {
			continue
		}
		if rs == nil {
			if rs, err = startRedis(o.serverWrap(), dir); err != nil {
				return err
			}
			defer rs.stop()
			g.RedisVer, _ = redisVersion(rs)
		}
		res, err := redisRow(rs, t, gr.W, log, o.pin)
		if err != nil {
			return err
		}
		into[t] = res
	}
	if cell == "" || !containsTarget(gr.Redis, targetRedisCell) {
		return nil
	}
	cs, why := startCell(o, cell, dir)
	if cs == nil {
		g.Notes = append(g.Notes, "redis-cell not measured: "+why)
		fmt.Fprintf(log, "   redis-cell not measured: %s\n", why)
		return nil
	}
	defer cs.stop()
	res, err := redisRow(cs, targetRedisCell, gr.W, log, o.pin)
	if err != nil {
		return err
	}
	into[targetRedisCell] = res
	return nil
}

// loadAverage is the three figures of /proc/loadavg, "" if unreadable.
func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func containsTarget(ts []target, t target) bool {
	for _, x := range ts {
		if x == t {
			return true
		}
	}
	return false
}

// sluiceRow starts bin (under the pin wrap) with a fresh data directory in
// dir and flags, runs w against it, and returns the row with its CPU and
// peak RSS, and the store's note.
func sluiceRow(o options, bin string, w workload, flags []string, dir string) (result, string, error) {
	data, err := os.MkdirTemp(dir, "data-")
	if err != nil {
		return result{}, "", err
	}
	defer os.RemoveAll(data)
	ss, err := startSluice(o.serverWrap(), bin, data, flags)
	if err != nil {
		return result{}, "", err
	}
	defer ss.stop()
	p0, _ := ss.info("persistence")
	cpu0 := ss.cpuTime()
	res, err := run(ss.addr, targetSluice, w, "")
	cpu := ss.cpuTime() - cpu0
	if err != nil {
		return res, "", fmt.Errorf("%w\nserver log:\n%s", err, ss.log)
	}
	res.CPU, res.PeakRSS = cpu, ss.peakRSS()
	note := ""
	if p1, err := ss.info("persistence"); err == nil && p0 != nil {
		note = storeNote(p0, p1, res.Requests)
	}
	return res, note, nil
}

// Where the goal table goes in the docs.
var goalsPart = docsPart{
	begin:   "<!-- bench:goals:begin (generated by go run ./bench --scenario goals --write-docs; edits here are overwritten) -->",
	end:     "<!-- bench:goals:end -->",
	heading: "## Goals of issue 13, before and after\n\n",
}

// writeGoalsDocs replaces the goals part of the markdown file.
func writeGoalsDocs(path string, g goalReport, args []string) error {
	return writeMachinePart(path, goalsPart, args, g.RedisVer, goalsMarkdown(g))
}
