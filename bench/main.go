// Command bench is sluice's load generator and its side-by-side comparison
// with Redis.
//
//	go run ./bench --addr 127.0.0.1:9049                      # load a running server
//	go run ./bench --spawn --scenario durable                 # start sluice itself
//	go run ./bench --compare redis --scenario pipelined       # sluice vs Redis INCR and Lua
//	go run ./bench --compare redis --scenario all --write-docs docs/benchmarks.md
//
// It reports throughput and latency percentiles from an HDR histogram, and,
// for servers it started, their CPU time and peak RSS from /proc. Run it
// from the repository root (it builds ./cmd/sluice) on an otherwise idle
// machine; compare ratios from one run, not absolute numbers across runs.
package main

import (
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

//go:embed tokenbucket.lua
var tokenBucketLua string

// scenario is a named preset.
type scenario struct {
	Name        string
	About       string
	W           workload
	SluiceFlags []string
}

var scenarios = []scenario{
	{Name: "pipelined", About: "50 connections, pipeline 16, 1M keys uniform, --fsync everysec",
		W: workload{Conns: 50, Pipeline: 16, Requests: 2_000_000, Keys: 1_000_000, Dist: "uniform"}},
	{Name: "unpipelined", About: "50 connections, pipeline 1, 1M keys uniform, --fsync everysec",
		W: workload{Conns: 50, Pipeline: 1, Requests: 400_000, Keys: 1_000_000, Dist: "uniform"}},
	{Name: "large", About: "10M distinct buckets, each written once in turn (working set far beyond the cache), pipeline 16",
		W: workload{Conns: 50, Pipeline: 16, Requests: 10_000_000, Keys: 10_000_000, Dist: "seq"}},
	{Name: "durable", About: "as pipelined, with --fsync always (Redis persists nothing)",
		W:           workload{Conns: 50, Pipeline: 16, Requests: 1_000_000, Keys: 1_000_000, Dist: "uniform"},
		SluiceFlags: []string{"--fsync", "always"}},
	{Name: "hot", About: "zipf(1.2) over 1000 keys: a few hot buckets, lock contention, pipeline 16",
		W: workload{Conns: 50, Pipeline: 16, Requests: 2_000_000, Keys: 1000, Dist: "zipf", ZipfS: 1.2}},
}

func findScenario(name string) (scenario, bool) {
	for _, s := range scenarios {
		if s.Name == name {
			return s, true
		}
	}
	return scenario{}, false
}

type options struct {
	addr        string
	spawn       bool
	serverFlags string
	compare     string
	scenario    string
	writeDocs   string
	serverBin   string
	// The sweep scenario's own.
	sweepBuckets int64
	rounds       int
	w            workload
	set          map[string]bool
}

func main() {
	if err := mainErr(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func mainErr(args []string, stdout, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:9049", "address of a running sluice (ignored with --spawn or --compare)")
	fs.BoolVar(&o.spawn, "spawn", false, "build and start sluice with a fresh data directory, and report its CPU and peak RSS")
	fs.StringVar(&o.serverFlags, "server-flags", "", "extra flags for the sluice the harness starts, e.g. \"--fsync always\"")
	fs.StringVar(&o.compare, "compare", "", "also run the workload against redis-server: INCR and the EVALSHA token bucket (value: redis)")
	fs.StringVar(&o.scenario, "scenario", "", "preset: "+strings.Join(scenarioNames(), ", ")+", or all (these five); or sweep (the idle sweep, sluice alone)")
	fs.StringVar(&o.serverBin, "server-bin", "", "a sluice binary to start instead of building ./cmd/sluice")
	fs.Int64Var(&o.sweepBuckets, "sweep-buckets", 10_000_000, "with --scenario sweep: buckets in each store swept")
	fs.IntVar(&o.rounds, "rounds", 2, "with --scenario sweep: runs of the workload with the sweep off then on, on each store")
	fs.StringVar(&o.writeDocs, "write-docs", "", "write the results table and a PNG chart into this markdown file (between its bench markers)")
	fs.IntVar(&o.w.Conns, "conns", 50, "connections")
	fs.IntVar(&o.w.Pipeline, "pipeline", 16, "commands per round trip")
	fs.Int64Var(&o.w.Requests, "requests", 1_000_000, "requests in all")
	fs.Int64Var(&o.w.Keys, "keys", 1_000_000, "distinct bucket keys")
	fs.StringVar(&o.w.Dist, "dist", "uniform", "key distribution: uniform, zipf or seq")
	fs.Float64Var(&o.w.ZipfS, "zipf-s", 1.2, "zipf exponent (> 1)")
	fs.IntVar(&o.w.GetPct, "get-pct", 0, "percent of RL.PGET among sluice commands (the rest RL.PREDUCE)")
	fs.IntVar(&o.w.HitPct, "hit-pct", 0, "percent of HIT path=/bench ip=<key> among sluice commands; a spawned sluice gets a --policy with a rule for it (see hitPolicy), a running one needs its own")
	fs.Int64Var(&o.w.Take, "take", 1, "TAKE of each RL.PREDUCE")
	fs.Int64Var(&o.w.Max, "max", 100, "bucket max")
	fs.Int64Var(&o.w.RefillMs, "refill-ms", 60_000, "bucket refill period in ms")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if o.compare != "" && o.compare != "redis" {
		return fmt.Errorf("--compare %q: the only comparison is redis", o.compare)
	}
	if o.compare != "" && o.w.HitPct > 0 {
		return errors.New("--hit-pct measures sluice alone (Redis has no HIT): drop --compare, or use --spawn")
	}
	if o.scenario == "sweep" {
		sc, err := sweepScenario(o)
		if err != nil {
			return err
		}
		rep, err := runSweep(o, sc, stdout)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, sweepMarkdown(rep))
		if o.writeDocs != "" {
			return writeSweepDocs(o.writeDocs, rep, args)
		}
		return nil
	}
	var list []scenario
	switch o.scenario {
	case "":
		list = []scenario{{Name: "custom", About: "flags as given", W: o.w}}
	case "all":
		list = scenarios
	default:
		s, ok := findScenario(o.scenario)
		if !ok {
			return fmt.Errorf("--scenario %q: want one of %s, all or sweep", o.scenario, strings.Join(scenarioNames(), ", "))
		}
		list = []scenario{s}
	}
	for i := range list {
		list[i].W = o.overrides(list[i].W)
		if err := validate(list[i].W); err != nil {
			return fmt.Errorf("scenario %s: %w", list[i].Name, err)
		}
	}
	var reports []scenarioReport
	for _, sc := range list {
		rep, err := runScenario(o, sc, stdout)
		if err != nil {
			return err
		}
		printReport(stdout, rep)
		reports = append(reports, rep)
	}
	if o.writeDocs != "" {
		return writeDocs(o.writeDocs, reports, args)
	}
	return nil
}

// overrides applies the workload flags given on the command line to a
// preset.
func (o options) overrides(w workload) workload {
	if o.set["conns"] {
		w.Conns = o.w.Conns
	}
	if o.set["pipeline"] {
		w.Pipeline = o.w.Pipeline
	}
	if o.set["requests"] {
		w.Requests = o.w.Requests
	}
	if o.set["keys"] {
		w.Keys = o.w.Keys
	}
	if o.set["dist"] {
		w.Dist = o.w.Dist
	}
	if o.set["zipf-s"] || w.ZipfS == 0 {
		w.ZipfS = o.w.ZipfS
	}
	if o.set["get-pct"] {
		w.GetPct = o.w.GetPct
	}
	if o.set["hit-pct"] {
		w.HitPct = o.w.HitPct
	}
	w.Take, w.Max, w.RefillMs = o.w.Take, o.w.Max, o.w.RefillMs
	return w
}

func validate(w workload) error {
	switch {
	case w.Conns < 1 || w.Pipeline < 1 || w.Requests < 1 || w.Keys < 2:
		return errors.New("conns, pipeline and requests must be at least 1, keys at least 2")
	case !slices.Contains([]string{"uniform", "zipf", "seq"}, w.Dist):
		return fmt.Errorf("--dist %q: want uniform, zipf or seq", w.Dist)
	case w.Dist == "zipf" && w.ZipfS <= 1:
		return errors.New("--zipf-s must be greater than 1")
	case w.GetPct < 0 || w.HitPct < 0 || w.GetPct+w.HitPct > 100:
		return errors.New("--get-pct and --hit-pct must be 0..100 together")
	case w.Take < 0 || w.Max < 1 || w.RefillMs < 1:
		return errors.New("--take >= 0, --max >= 1 and --refill-ms >= 1")
	}
	return nil
}

func scenarioNames() []string {
	var n []string
	for _, s := range scenarios {
		n = append(n, s.Name)
	}
	return n
}

// scenarioReport is one scenario's results.
type scenarioReport struct {
	Scenario   scenario
	Results    []result
	DataBytes  int64 // sluice data directory after the run and a graceful stop
	TableBytes int64 // sluice's sorted tables after COMPACT
	Buckets    int64 // distinct buckets written, for bytes per bucket
	RedisVer   string
	SluiceArgs []string
}

func runScenario(o options, sc scenario, log io.Writer) (scenarioReport, error) {
	rep := scenarioReport{Scenario: sc}
	w := sc.W
	fmt.Fprintf(log, "== %s: %s; %d requests\n", sc.Name, sc.About, w.Requests)
	spawn := o.spawn || o.compare != ""
	if o.compare == "redis" {
		tmp, err := os.MkdirTemp("", "bench-redis-")
		if err != nil {
			return rep, err
		}
		defer os.RemoveAll(tmp)
		rs, err := startRedis(tmp)
		if err != nil {
			return rep, err
		}
		rep.RedisVer, _ = redisVersion(rs)
		sha, err := rs.do("SCRIPT", "LOAD", tokenBucketLua)
		if err != nil {
			rs.stop()
			return rep, fmt.Errorf("load the Lua bucket into Redis: %w", err)
		}
		for _, t := range []target{targetRedisINCR, targetRedisLua} {
			rs.do("FLUSHALL")
			cpu0 := rs.cpuTime()
			res, err := run(rs.addr, t, w, sha)
			if err != nil {
				rs.stop()
				return rep, err
			}
			res.CPU = rs.cpuTime() - cpu0
			res.PeakRSS = rs.peakRSS()
			fmt.Fprintf(log, "   %-22s %10.0f ops/s\n", t, res.opsPerSec())
			rep.Results = append(rep.Results, res)
		}
		rs.stop()
	}
	if !spawn {
		res, err := run(o.addr, targetSluice, w, "")
		if err != nil {
			return rep, err
		}
		rep.Results = append(rep.Results, res)
		return rep, nil
	}
	tmp, bin, err := workDir(o, "bench-sluice-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(tmp)
	flags := append(append([]string{}, sc.SluiceFlags...), strings.Fields(o.serverFlags)...)
	if w.HitPct > 0 {
		pol := filepath.Join(tmp, "bench-policy.ini")
		if err := os.WriteFile(pol, []byte(hitPolicy(w)), 0o644); err != nil {
			return rep, err
		}
		flags = append(flags, "--policy", pol)
	}
	rep.SluiceArgs = flags
	dataDir := tmp + "/data"
	ss, err := startSluice(bin, dataDir, flags)
	if err != nil {
		return rep, err
	}
	cpu0 := ss.cpuTime()
	res, err := run(ss.addr, targetSluice, w, "")
	if err != nil {
		ss.stop()
		return rep, fmt.Errorf("%w\nserver log:\n%s", err, ss.log)
	}
	res.CPU = ss.cpuTime() - cpu0
	res.PeakRSS = ss.peakRSS()
	fmt.Fprintf(log, "   %-22s %10.0f ops/s\n", targetSluice, res.opsPerSec())
	rep.Results = append(rep.Results, res)
	if _, err := ss.do("COMPACT"); err != nil {
		fmt.Fprintf(log, "   COMPACT: %v\n", err)
	} else if info, err := ss.info("storage"); err == nil {
		rep.TableBytes, rep.Buckets = info.int("table_bytes"), info.int("buckets")
	}
	ss.stop()
	rep.DataBytes = dirSize(dataDir)
	if rep.Buckets == 0 { // an older server without INFO storage
		rep.Buckets = min(w.Keys, w.Requests)
	}
	return rep, nil
}

func redisVersion(s *server) (string, error) {
	info, err := s.info("server")
	if err != nil {
		return "", err
	}
	return info["redis_version"], nil
}

func ms(h interface{ ValueAtQuantile(float64) int64 }, q float64) string {
	return fmt.Sprintf("%.2f", float64(h.ValueAtQuantile(q))/1000)
}

// printReport prints one scenario's table and ratios.
func printReport(w io.Writer, rep scenarioReport) {
	fmt.Fprint(w, tableMarkdown(rep))
	fmt.Fprintln(w)
}

// sluiceMix names sluice's row by its command mix, e.g. "sluice RL.PREDUCE"
// or "sluice 50% HIT, 50% RL.PREDUCE".
func sluiceMix(w workload) string {
	if w.GetPct == 0 && w.HitPct == 0 {
		return targetSluice.String()
	}
	var parts []string
	for _, p := range []struct {
		pct  int
		name string
	}{{w.HitPct, "HIT"}, {w.GetPct, "RL.PGET"}, {100 - w.GetPct - w.HitPct, "RL.PREDUCE"}} {
		if p.pct > 0 {
			parts = append(parts, fmt.Sprintf("%d%% %s", p.pct, p.name))
		}
	}
	return "sluice " + strings.Join(parts, ", ")
}

func tableMarkdown(rep scenarioReport) string {
	var b strings.Builder
	wl := rep.Scenario.W
	fmt.Fprintf(&b, "scenario %s: %s\n", rep.Scenario.Name, rep.Scenario.About)
	fmt.Fprintf(&b, "(%d connections, pipeline %d, %d requests, %d keys %s", wl.Conns, wl.Pipeline, wl.Requests, wl.Keys, wl.Dist)
	if len(rep.SluiceArgs) > 0 {
		fmt.Fprintf(&b, ", sluice %s", strings.Join(rep.SluiceArgs, " "))
	}
	b.WriteString(")\n\n")
	b.WriteString("| target | ops/s | p50 ms | p90 ms | p99 ms | p99.9 ms | errors | server CPU s | CPU µs/op | peak RSS MiB |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var incr, lua, ours float64
	for _, r := range rep.Results {
		cpu, perOp, rss := "-", "-", "-"
		if r.CPU > 0 {
			cpu = fmt.Sprintf("%.1f", r.CPU.Seconds())
			perOp = fmt.Sprintf("%.2f", float64(r.CPU.Microseconds())/float64(max(r.Requests, 1)))
		}
		if r.PeakRSS > 0 {
			rss = fmt.Sprintf("%.0f", float64(r.PeakRSS)/(1<<20))
		}
		errs := fmt.Sprint(r.Errors)
		if r.FirstErr != "" {
			errs += " (" + r.FirstErr + ")"
		}
		name := r.Target.String()
		if r.Target == targetSluice {
			name = sluiceMix(wl)
		}
		fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s |\n", name, r.opsPerSec(),
			ms(r.Hist, 50), ms(r.Hist, 90), ms(r.Hist, 99), ms(r.Hist, 99.9), errs, cpu, perOp, rss)
		switch r.Target {
		case targetRedisINCR:
			incr = r.opsPerSec()
		case targetRedisLua:
			lua = r.opsPerSec()
		case targetSluice:
			ours = r.opsPerSec()
		}
	}
	if incr > 0 && lua > 0 && ours > 0 {
		fmt.Fprintf(&b, "\nsluice / Redis INCR = %.2f; sluice / Redis EVALSHA bucket = %.2f\n", ours/incr, ours/lua)
	}
	if rep.TableBytes > 0 && rep.Buckets > 0 {
		fmt.Fprintf(&b, "\nafter COMPACT: sorted tables %.1f MiB for %d buckets = %.1f bytes per bucket\n",
			float64(rep.TableBytes)/(1<<20), rep.Buckets, float64(rep.TableBytes)/float64(rep.Buckets))
	}
	if rep.DataBytes > 0 && rep.Buckets > 0 {
		fmt.Fprintf(&b, "\nwhole data directory after a graceful stop (write-ahead log included): %.1f MiB = %.1f bytes per bucket\n",
			float64(rep.DataBytes)/(1<<20), float64(rep.DataBytes)/float64(rep.Buckets))
	}
	return b.String()
}
