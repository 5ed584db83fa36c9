// Command bench is sluice's load generator and its side-by-side comparison
// with Redis.
//
//	go run ./bench --addr 127.0.0.1:9049                      # load a running server
//	go run ./bench --spawn --scenario durable                 # start sluice itself
//	go run ./bench --compare redis --scenario pipelined       # sluice vs Redis INCR and Lua
//	go run ./bench --compare redis --scenario all --write-docs docs/benchmarks.md
//	go run ./bench --compare redis --pin --scenario limiters --redis-cell path/to/libredis_cell.so
//	go run ./bench --pin --scenario rls                        # Envoy's ShouldRateLimit over gRPC
//	go run ./bench --scenario scale --redis-cell path/to/libredis_cell.so --write-docs docs/benchmarks.md
//	go run ./bench --scenario failover --server-flags "--cluster-election-timeout 300ms"
//	go run ./bench --scenario rejoin --keys 1000000 --kill-timeout 10m
//	go run ./bench --pin --scenario replcost --requests 1000000
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
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

//go:embed tokenbucket.lua
var tokenBucketLua string

//go:embed fixedwindow.lua
var fixedWindowLua string

// scenario is a named preset.
type scenario struct {
	Name        string
	Group       string // groupMain or groupLimiters: which --scenario runs it, and its part of the docs
	About       string
	W           workload
	SluiceFlags []string
	// PrefillLogs: sluice alone, on a store filled before it starts with
	// full sliding logs (prefillLogs), since ROLL.LIMIT cannot fill large
	// ones in reasonable time.
	PrefillLogs bool
}

// Groups of scenarios. --scenario all runs the main group (the token
// bucket against Redis), --scenario limiters the GCRA and fixed-window
// commands against redis-cell and what fixed-window middlewares send.
const (
	groupMain     = ""
	groupLimiters = "limiters"
	groupRoll     = "roll"
	groupRollMem  = "rollmem"
)

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
	{Name: "cell", Group: groupLimiters, About: "GCRA: CL.THROTTLE (max_burst and count --max, period --refill-ms in seconds), 50 connections, pipeline 16, 1M keys uniform, --fsync everysec",
		W: workload{Command: cmdCLThrottle, Conns: 50, Pipeline: 16, Requests: 2_000_000, Keys: 1_000_000, Dist: "uniform"}},
	{Name: "pcell", Group: groupLimiters, About: "GCRA in ms: CL.PTHROTTLE, otherwise as cell (redis-cell has no CL.PTHROTTLE: its row is CL.THROTTLE)",
		W: workload{Command: cmdCLPThrottle, Conns: 50, Pipeline: 16, Requests: 2_000_000, Keys: 1_000_000, Dist: "uniform"}},
	{Name: "window", Group: groupLimiters, About: "aligned fixed windows: FW.PINCR (limit --max, window --refill-ms), 50 connections, pipeline 16, 1M keys uniform, --fsync everysec",
		W: workload{Command: cmdFWPIncr, Conns: 50, Pipeline: 16, Requests: 2_000_000, Keys: 1_000_000, Dist: "uniform"}},
	// The sliding logs: every key is called max+1 times in turn, so that
	// each log ends full, and both servers hold the same entries at every
	// moment (the package's sorted set keeps blocked calls too, as sluice
	// does, and neither has more than max+1 yet). The interval is an hour
	// so that no log goes idle before COMPACT (which would sweep it).
	{Name: "roll10", Group: groupRoll, About: "sliding logs, max 10: ROLL.LIMIT k:<id> 3600000 10, 1M keys called 11 times each in turn (every log ends full, 11 entries), 50 connections, pipeline 16, --fsync everysec",
		W: workload{Command: cmdRollLimit, Conns: 50, Pipeline: 16, Requests: 11_000_000, Keys: 1_000_000, Dist: "seq", Max: 10, RefillMs: 3_600_000}},
	{Name: "roll1000", Group: groupRoll, About: "sliding logs, max 1000: ROLL.LIMIT k:<id> 3600000 1000, 200 keys called 1001 times each in turn (logs grow from 0 to 1001 entries, 500 on average), 50 connections, pipeline 16, --fsync everysec",
		W: workload{Command: cmdRollLimit, Conns: 50, Pipeline: 16, Requests: 200_200, Keys: 200, Dist: "seq", Max: 1000, RefillMs: 3_600_000}},
	{Name: "rollbig", Group: groupRollMem, PrefillLogs: true, About: "the largest logs: 100 keys whose logs hold 100001 entries 9 to 63 ms apart (written into the store before sluice starts), then ROLL.LIMIT k:<id> 7200000 100000 on them in turn, each call on a full log; sluice alone, 50 connections, pipeline 16",
		W: workload{Command: cmdRollLimit, Conns: 50, Pipeline: 16, Requests: 5000, Keys: 100, Dist: "seq", Max: 100_000, RefillMs: 7_200_000}},
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
	beforeBin   string // with --scenario goals: a sluice binary measured as "before"
	redisCell   string // path of the redis-cell module, for its row
	pin         bool
	pinNote     string // what the output says about pinning
	serverPid   int    // of a running server (--addr), for its CPU
	perfDir     string
	// The sweep scenario's own.
	sweepBuckets int64
	rounds       int
	// The failover scenario's own.
	kills       int
	killTimeout time.Duration
	w           workload
	set         map[string]bool
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
	fs.StringVar(&o.compare, "compare", "", "also run the workload against redis-server, the Redis way of doing what its sluice command does (value: redis): for RL.PREDUCE, INCR and the EVALSHA token bucket; for CL.*, redis-cell and INCR+EXPIRE; for FW.*, INCR+EXPIRE, the same in MULTI/EXEC, and the EVALSHA fixed window; for ROLL.LIMIT, rolling-rate-limiter's MULTI of ZREMRANGEBYSCORE, ZADD, ZRANGE WITHSCORES and EXPIRE")
	fs.StringVar(&o.scenario, "scenario", "", "preset: "+strings.Join(scenarioNames(), ", ")+"; or all ("+strings.Join(groupNames(groupMain), ", ")+"); or limiters ("+strings.Join(groupNames(groupLimiters), ", ")+"); or roll ("+strings.Join(groupNames(groupRoll), ", ")+"); or sweep (the idle sweep, sluice alone); or rls (Envoy's ShouldRateLimit over gRPC, sluice alone); or goals (issue 13's goal workloads and their table, Redis rows included); or memory (--keys buckets, 10M by default, created once each: sluice's peak RSS with default flags); or scale (issue 28: Redis INCR, the Lua bucket and, with --redis-cell, redis-cell, then sluice at GOMAXPROCS 1, 2, 4, ... up to the machine's cores, uniform and hot keys, unpinned, with the cores each server used, and the serial stage ceiling of a server of 8 cores, or of the machine's if it has more, from the stage benchmarks of ./storage); or failover (issue 29: three local nodes with --cluster-replicas 3 --fsync always, --server-flags added; --kills SIGKILLs of a shard's leader, each restarted on its volume: the time to the shard's first decision by another node, and to a go-redis ClusterClient's first success; unpinned); or rejoin (issue 29: the same three nodes, --keys buckets in shard 0, then its home node killed and started on an empty data directory: the time until it leads shard 0 again, every bucket read back from it); or replcost (issue 29: pipelined RL.PREDUCE over --keys buckets of one shard against a standalone sluice, the shard's owner of three nodes with --cluster-replicas 1 and its leader with 3, in --fsync always and everysec: throughput and each process's CPU per request, then the standalone sluice again paced at the rate the three replicas took, to compare the followers with it at the same rate; --pin pins the measured node)")
	fs.StringVar(&o.serverBin, "server-bin", "", "a sluice binary to start instead of building ./cmd/sluice")
	fs.StringVar(&o.beforeBin, "before-bin", "", "with --scenario goals: an older sluice binary, measured in the same run on each goal workload, for the table's before column")
	fs.StringVar(&o.redisCell, "redis-cell", os.Getenv("SLUICE_BENCH_REDIS_CELL"), "with --compare redis: the redis-cell module (libredis_cell.so, built for the installed Redis) to load with --loadmodule for the CL.THROTTLE row; without it that row is skipped (env SLUICE_BENCH_REDIS_CELL)")
	fs.BoolVar(&o.pin, "pin", true, "one core per server: start sluice and redis-server under taskset -c 0 and move the load generator to CPU 1; on by default when the machine has 2 CPUs or more and taskset is installed (otherwise the run says it is unpinned); --pin=false shares every core between the servers and the generator")
	fs.IntVar(&o.serverPid, "server-pid", 0, "with --addr: the pid of the running server, for its CPU µs per request and peak RSS (from /proc)")
	fs.StringVar(&o.perfDir, "perf", "", "directory: record a CPU profile of the sluice each scenario starts (not sweep's), during its measured run, with perf record -g, into perf-<scenario>.data there")
	fs.StringVar(&o.w.Command, "command", cmdRLPReduce, "the sluice command of the workload: "+strings.Join(sluiceCommands, ", "))
	fs.Int64Var(&o.sweepBuckets, "sweep-buckets", 10_000_000, "with --scenario sweep: buckets in each store swept")
	fs.IntVar(&o.rounds, "rounds", 2, "with --scenario sweep: runs of the workload with the sweep off then on, on each store")
	fs.IntVar(&o.kills, "kills", 20, "with --scenario failover: leaders killed, one after the other")
	fs.DurationVar(&o.killTimeout, "kill-timeout", 30*time.Second, "with --scenario failover: the most one kill may take to be served again, each of its waits bounded by it; with --scenario rejoin, the most the rejoin may take")
	fs.StringVar(&o.writeDocs, "write-docs", "", "write the results table and a PNG chart into this markdown file (between its bench markers)")
	fs.IntVar(&o.w.Conns, "conns", 50, "connections")
	fs.IntVar(&o.w.Pipeline, "pipeline", 16, "commands per round trip")
	fs.Int64Var(&o.w.Requests, "requests", 1_000_000, "requests in all")
	fs.Int64Var(&o.w.Keys, "keys", 1_000_000, "distinct bucket keys")
	fs.Float64Var(&o.w.Rate, "rate", 0, "requests per second in all, shared by the connections; 0: as fast as the server answers")
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
	if o.perfDir != "" && (o.scenario == "goals" || o.scenario == "memory" || o.scenario == "scale" || o.scenario == "failover" || o.scenario == "rejoin") {
		return fmt.Errorf("--perf is not for --scenario %s (a profiler would slow one of the rows it compares): profile with --spawn --scenario pipelined --perf DIR", o.scenario)
	}
	if o.perfDir != "" && o.scenario != "replcost" && (o.scenario == "sweep" || !o.spawn && o.compare == "") {
		return errors.New("--perf profiles the sluice a scenario starts: add --spawn or --compare redis (the sweep scenario has no --perf)")
	}
	if o.scenario == "scale" || o.scenario == "failover" || o.scenario == "rejoin" {
		// Sluice is to use up to every core, and the generator must keep
		// up with it (scale), or three servers share the machine
		// (failover): nothing is pinned.
		if o.set["pin"] && o.pin {
			return fmt.Errorf("--scenario %s runs every server unpinned: drop --pin", o.scenario)
		}
		o.pin = false
	}
	if o.scenario == "failover" && (o.kills < 1 || o.killTimeout <= 0) {
		return errors.New("--kills must be at least 1 and --kill-timeout positive")
	}
	_, tasksetErr := exec.LookPath("taskset")
	plan, err := decidePin(o.pin, o.set["pin"], runtime.NumCPU(), tasksetErr == nil)
	if err != nil {
		return err
	}
	o.pin, o.pinNote = plan.Pin, plan.Note
	if o.pin {
		if err := pinGenerator(); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "%s\n", o.pinNote)
	if o.beforeBin != "" && o.scenario != "goals" {
		return errors.New("--before-bin is for --scenario goals")
	}
	switch o.scenario {
	case "rls":
		return runRLS(o, stdout)
	case "goals":
		g, err := runGoals(o, stdout)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, goalsMarkdown(g))
		if o.writeDocs != "" {
			return writeGoalsDocs(o.writeDocs, g, args)
		}
		return nil
	case "scale":
		rep, err := runScale(o, stdout)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, scaleMarkdown(rep))
		if o.writeDocs != "" {
			return writeScaleDocs(o.writeDocs, rep, args)
		}
		return nil
	case "rejoin":
		return runRejoin(o, o.killTimeout, stdout)
	case "replcost":
		return runReplCost(o, stdout)
	case "failover":
		rep, err := runFailover(o, o.kills, o.killTimeout, stdout)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, failoverSummary(rep))
		return nil
	case "memory":
		m, err := runMemory(o, stdout)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, memoryMarkdown(m))
		return nil
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
		list = group(groupMain)
	case "limiters":
		list = group(groupLimiters)
	case "roll":
		list = group(groupRoll)
	default:
		s, ok := findScenario(o.scenario)
		if !ok {
			return fmt.Errorf("--scenario %q: want one of %s, all, limiters, roll or sweep", o.scenario, strings.Join(scenarioNames(), ", "))
		}
		list = []scenario{s}
	}
	for i := range list {
		list[i].W = o.overrides(list[i].W)
		if err := validate(list[i].W); err != nil {
			return fmt.Errorf("scenario %s: %w", list[i].Name, err)
		}
		if w := list[i].W; o.compare != "" && w.command() != cmdRLPReduce && w.RefillMs%1000 != 0 {
			return fmt.Errorf("scenario %s: --refill-ms %d: the Redis rows of %s take whole seconds (redis-cell's period, EXPIRE): want a multiple of 1000", list[i].Name, w.RefillMs, w.command())
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
	if o.set["command"] {
		w.Command = o.w.Command
	}
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
	// A preset's own limit and period (the sliding logs') hold unless the
	// flag is given; the others take the flags' values.
	if o.set["take"] || w.Take == 0 {
		w.Take = o.w.Take
	}
	if o.set["max"] || w.Max == 0 {
		w.Max = o.w.Max
	}
	if o.set["refill-ms"] || w.RefillMs == 0 {
		w.RefillMs = o.w.RefillMs
	}
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
	case w.Rate < 0 || math.IsNaN(w.Rate) || math.IsInf(w.Rate, 0):
		return fmt.Errorf("--rate %v: want requests per second, 0 or more (0: unpaced)", w.Rate)
	case w.Take < 0 || w.Max < 1 || w.RefillMs < 1:
		return errors.New("--take >= 0, --max >= 1 and --refill-ms >= 1")
	case w.Command != "" && !slices.Contains(sluiceCommands, w.Command):
		return fmt.Errorf("--command %q: want one of %s", w.Command, strings.Join(sluiceCommands, ", "))
	case w.command() != cmdRLPReduce && (w.GetPct > 0 || w.HitPct > 0):
		return fmt.Errorf("--get-pct and --hit-pct mix RL.PGET and HIT into RL.PREDUCE, not into %s", w.command())
	case (w.command() == cmdCLThrottle || w.command() == cmdFWIncr) && w.RefillMs%1000 != 0:
		return fmt.Errorf("--refill-ms %d: %s takes its period in whole seconds; want a multiple of 1000", w.RefillMs, w.command())
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

// group is the scenarios of one group, in order.
func group(g string) []scenario {
	var list []scenario
	for _, s := range scenarios {
		if s.Group == g {
			list = append(list, s)
		}
	}
	return list
}

func groupNames(g string) []string {
	var n []string
	for _, s := range group(g) {
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
	Pinned     bool
	PinNote    string
	Notes      []string // rows skipped and why; profiles written
}

func runScenario(o options, sc scenario, log io.Writer) (scenarioReport, error) {
	rep := scenarioReport{Scenario: sc, Pinned: o.pin, PinNote: o.pinNote}
	w := sc.W
	fmt.Fprintf(log, "== %s: %s; %d requests\n", sc.Name, sc.About, w.Requests)
	spawn := o.spawn || o.compare != "" || sc.PrefillLogs
	if o.compare == "redis" && !sc.PrefillLogs {
		if err := runRedis(o, &rep, log); err != nil {
			return rep, err
		}
	}
	if !spawn {
		cpu0 := procCPU(o.serverPid)
		res, err := run(o.addr, targetSluice, w, "")
		if err != nil {
			return rep, err
		}
		if o.serverPid > 0 {
			res.CPU, res.PeakRSS = procCPU(o.serverPid)-cpu0, procStatusBytes(o.serverPid, "VmHWM")
		} else {
			rep.Notes = append(rep.Notes, "server CPU unknown: give the running server's pid with --server-pid")
		}
		if o.pin {
			rep.Notes = append(rep.Notes, "the server at --addr was not started by the harness, so it is not pinned: start it under taskset -c 0 for one core per server")
		}
		logResult(log, res, w, o.pin)
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
	if sc.PrefillLogs {
		t0 := time.Now()
		size, err := prefillLogs(dataDir, w)
		if err != nil {
			return rep, err
		}
		rep.Notes = append(rep.Notes, fmt.Sprintf("prefilled %d logs of %d entries (%d bytes each, %.1f MiB in all) in %.1f s, before sluice started",
			w.Keys, w.Max+1, size, float64(size)*float64(w.Keys)/(1<<20), time.Since(t0).Seconds()))
	}
	ss, err := startSluice(o.serverWrap(), bin, dataDir, flags)
	if err != nil {
		return rep, err
	}
	if sc.PrefillLogs {
		rep.Notes = append(rep.Notes, fmt.Sprintf("sluice's peak RSS after it opened the store, before the load: %.0f MiB", float64(ss.peakRSS())/(1<<20)))
	}
	var prof *profiler
	if o.perfDir != "" {
		out := filepath.Join(o.perfDir, "perf-"+sc.Name+".data")
		if prof, err = startPerf(ss, out); err != nil {
			ss.stop()
			return rep, err
		}
	}
	p0, _ := ss.info("persistence")
	cpu0 := ss.cpuTime()
	res, err := run(ss.addr, targetSluice, w, "")
	cpu := ss.cpuTime() - cpu0
	if p1, perr := ss.info("persistence"); err == nil && perr == nil && p0 != nil {
		note := storeNote(p0, p1, res.Requests)
		fmt.Fprintf(log, "   %s\n", note)
		rep.Notes = append(rep.Notes, note)
	}
	if prof != nil {
		note := prof.stop(res.Requests, cpu)
		fmt.Fprintf(log, "   %s\n", note)
		rep.Notes = append(rep.Notes, note)
	}
	if err != nil {
		ss.stop()
		return rep, fmt.Errorf("%w\nserver log:\n%s", err, ss.log)
	}
	res.CPU = cpu
	res.PeakRSS = ss.peakRSS()
	logResult(log, res, w, rep.Pinned)
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

// runRedis runs the scenario's Redis rows (redisTargets): the plain ones on
// one redis-server, redis-cell's on another started with --loadmodule. A
// redis-cell row that cannot run is skipped with a note that says why;
// every other failure ends the run.
func runRedis(o options, rep *scenarioReport, log io.Writer) error {
	w := rep.Scenario.W
	var plain []target
	cell := false
	for _, t := range redisTargets(w.command()) {
		if t == targetRedisCell {
			cell = true
		} else {
			plain = append(plain, t)
		}
	}
	// The token bucket's rows get redis-cell's too when the module is
	// given: a GCRA in a Redis module is the fastest in-memory limiter to
	// measure RL.PREDUCE against (issue 13's goal).
	if w.command() == cmdRLPReduce && o.redisCell != "" {
		cell = true
	}
	tmp, err := os.MkdirTemp("", "bench-redis-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if len(plain) > 0 {
		rs, err := startRedis(o.serverWrap(), tmp)
		if err != nil {
			return err
		}
		rep.RedisVer, _ = redisVersion(rs)
		for _, t := range plain {
			if err := measureRedis(rs, t, rep, log); err != nil {
				rs.stop()
				return err
			}
		}
		rs.stop()
	}
	if !cell {
		return nil
	}
	skip := func(why string) {
		note := targetRedisCell.String() + " row skipped: " + why
		fmt.Fprintf(log, "   %s\n", note)
		rep.Notes = append(rep.Notes, note)
	}
	if o.redisCell == "" {
		skip("no --redis-cell (the path of a libredis_cell.so built for this Redis, e.g. redis-cell v0.3.1 for Redis 7.0)")
		return nil
	}
	mod, err := filepath.Abs(o.redisCell)
	if err == nil {
		_, err = os.Stat(mod)
	}
	if err != nil {
		skip(fmt.Sprintf("--redis-cell: %v", err))
		return nil
	}
	rs, why := startCell(o, mod, tmp)
	if rs == nil {
		skip(why)
		return nil
	}
	defer rs.stop()
	rep.RedisVer, _ = redisVersion(rs)
	return measureRedis(rs, targetRedisCell, rep, log)
}

// startCell starts redis-server with the redis-cell module mod (an
// absolute path) and checks that CL.THROTTLE answers; nil and the reason
// when it cannot.
func startCell(o options, mod, dir string) (*server, string) {
	rs, err := startRedis(o.serverWrap(), dir, "--loadmodule", mod)
	if err != nil {
		return nil, fmt.Sprintf("redis-server --loadmodule %s did not start: %s", mod, moduleLines(err.Error()))
	}
	if _, err := rs.do("CL.THROTTLE", "bench:probe", "1", "1", "1"); err != nil {
		rs.stop()
		return nil, fmt.Sprintf("%s loaded, but CL.THROTTLE answered %q", mod, err)
	}
	return rs, ""
}

// moduleLines keeps the lines of a failed Redis start's log that speak of
// the module ("Module ... failed to load: ..."), else the whole text.
func moduleLines(log string) string {
	var keep []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "odule") {
			keep = append(keep, strings.TrimSpace(l))
		}
	}
	if len(keep) == 0 {
		return log
	}
	return strings.Join(keep, " / ")
}

// measureRedis runs the scenario's workload against rs as t, on an empty
// database, and adds the result with Redis's CPU time and peak RSS.
func measureRedis(rs *server, t target, rep *scenarioReport, log io.Writer) error {
	res, err := redisRow(rs, t, rep.Scenario.W, log, rep.Pinned)
	if err != nil {
		return err
	}
	rep.Results = append(rep.Results, res)
	return nil
}

// redisRow runs w against rs as t, on an empty database, and returns the
// result with Redis's CPU time and peak RSS.
func redisRow(rs *server, t target, w workload, log io.Writer, pinned bool) (result, error) {
	if _, err := rs.do("FLUSHALL"); err != nil {
		return result{}, fmt.Errorf("redis FLUSHALL: %w", err)
	}
	sha := ""
	if script := t.script(); script != "" {
		var err error
		if sha, err = rs.do("SCRIPT", "LOAD", script); err != nil {
			return result{}, fmt.Errorf("load the script of %s into Redis: %w", t, err)
		}
	}
	cpu0 := rs.cpuTime()
	res, err := run(rs.addr, t, w, sha)
	if err != nil {
		return result{}, fmt.Errorf("%w\nredis log:\n%s", err, rs.log)
	}
	res.CPU = rs.cpuTime() - cpu0
	res.PeakRSS = rs.peakRSS()
	logResult(log, res, w, pinned)
	return res, nil
}

// logResult prints a row's main figures as soon as it is measured, so
// that a run that fails later still shows them.
func logResult(log io.Writer, r result, w workload, pinned bool) {
	perReq := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(max(r.Requests, 1)) }
	srv := "server CPU unknown"
	if r.CPU > 0 {
		srv = fmt.Sprintf("%6.2f µs server CPU per request (%s)", perReq(r.CPU), r.serverText(pinned))
	}
	fmt.Fprintf(log, "   %-28s %10.0f ops/s, %s, generator %.2f µs per request (%s), p99 %s ms\n", targetName(r.Target, w), r.opsPerSec(),
		srv, perReq(r.GenCPU), r.generatorText(pinned), ms(r.Hist, 99))
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

// sluiceMix names sluice's row by its command mix, e.g. "sluice RL.PREDUCE",
// "sluice 50% HIT, 50% RL.PREDUCE" or "sluice FW.PINCR".
func sluiceMix(w workload) string {
	if w.GetPct == 0 && w.HitPct == 0 {
		return "sluice " + w.command()
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

// targetName is a row's name: sluice's by its command mix.
func targetName(t target, w workload) string {
	if t == targetSluice {
		return sluiceMix(w)
	}
	return t.String()
}

func tableMarkdown(rep scenarioReport) string {
	var b strings.Builder
	wl := rep.Scenario.W
	fmt.Fprintf(&b, "scenario %s: %s\n", rep.Scenario.Name, rep.Scenario.About)
	fmt.Fprintf(&b, "(%d connections, pipeline %d, %d requests, %d keys %s", wl.Conns, wl.Pipeline, wl.Requests, wl.Keys, wl.Dist)
	if len(rep.SluiceArgs) > 0 {
		fmt.Fprintf(&b, ", sluice %s", strings.Join(rep.SluiceArgs, " "))
	}
	if rep.PinNote != "" {
		b.WriteString("; " + rep.PinNote)
	} else if rep.Pinned {
		b.WriteString("; pinned: each server on CPU 0, the load generator on CPU 1")
	}
	b.WriteString(")\n\n")
	if wl.command() != cmdRLPReduce {
		// Say what each row sends, since a request is not one command for
		// every row.
		b.WriteString("Each request, per row:\n\n")
		for _, r := range rep.Results {
			fmt.Fprintf(&b, "- %s: `%s`\n", targetName(r.Target, wl), requestText(r.Target, wl))
		}
		b.WriteString("\n")
	}
	b.WriteString("| target | ops/s | p50 ms | p90 ms | p99 ms | p99.9 ms | errors | server CPU s | CPU µs/op | peak RSS MiB | server CPU | generator CPU |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	var ours float64
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
		fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", targetName(r.Target, wl), r.opsPerSec(),
			ms(r.Hist, 50), ms(r.Hist, 90), ms(r.Hist, 99), ms(r.Hist, 99.9), errs, cpu, perOp, rss, r.serverText(rep.Pinned), r.generatorText(rep.Pinned))
		if r.Target == targetSluice {
			ours = r.opsPerSec()
		}
	}
	var ratios []string
	for _, r := range rep.Results {
		if r.Target != targetSluice && ours > 0 && r.opsPerSec() > 0 {
			ratios = append(ratios, fmt.Sprintf("sluice / %s = %.2f", r.Target, ours/r.opsPerSec()))
		}
	}
	if len(ratios) > 0 {
		fmt.Fprintf(&b, "\n%s\n", strings.Join(ratios, "; "))
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "\n%s\n", n)
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

// storeNote says how many fsyncs and committer rounds (Pebble commits) the
// measured run cost, per 1000 requests: group commit and write-behind show
// here, where throughput alone would hide them.
func storeNote(before, after infoFields, requests int64) string {
	per := func(name string) (int64, float64) {
		n := after.int(name) - before.int(name)
		return n, float64(n) * 1000 / float64(max(requests, 1))
	}
	f, fk := per("fsyncs")
	r, rk := per("commit_rounds")
	k, kk := per("keys_written")
	return fmt.Sprintf("store during the run: %d fsyncs (%.2f per 1000 requests, %s µs each on average), %d commit rounds (%.2f per 1000), %d keys written to Pebble (%.0f per 1000)",
		f, fk, after["fsync_avg_usec"], r, rk, k, kk)
}
