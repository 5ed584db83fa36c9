package main

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The sweep scenario: how fast the idle sweep goes, and what a background
// sweep costs the pipelined workload while it runs.
//
// It fills a store with --sweep-buckets buckets of one population, lets it
// settle, keeps a CHECKPOINT of it, and times COMPACT on it (an unpaced
// whole sweep, then a Pebble manual compaction). Then, --rounds times, it
// starts sluice on fresh copies of the checkpoint, once with the background
// sweep off and once with it on at the default pace, and runs the
// pipelined workload against each. Two populations: buckets that stay live
// for the whole run (the sweep reads them and deletes none) and buckets
// idle a second after the fill (the sweep deletes each one it reads).

// population is one kind of background bucket the store is filled with.
type population struct {
	Name     string
	RefillMs int64 // every bucket is max 1, taken once: idle RefillMs later
	Idle     bool  // the harness waits for the buckets to be idle before it measures
	About    string
}

var populations = []population{
	{Name: "live", RefillMs: 3_600_000, About: "idle only an hour after their write: the sweep reads them and deletes none"},
	{Name: "idle", RefillMs: 1000, Idle: true, About: "idle a second after their write: the sweep deletes every one it reads"},
}

// sweepOnFlags and sweepOffFlags are the server flags of the measured runs:
// a pass that starts a second after the server and again a second after
// each pass ends, at the default --sweep-rate; or no background sweep at all.
var (
	sweepOnFlags  = []string{"--sweep-interval", "1s"}
	sweepOffFlags = []string{"--sweep-interval", "0"}
)

// sweepSample is how often the harness reads INFO storage during a measured
// run, to see whether a sweep pass is running.
const sweepSample = 250 * time.Millisecond

// compactResult is one timed COMPACT on a freshly filled store.
type compactResult struct {
	Pop                       population
	Fill                      result        // the fill, for its rate
	Settle                    time.Duration // waiting for Pebble's compaction debt to clear
	DBSizeBefore, DBSizeAfter int64
	TableBefore, TableAfter   int64
	Scanned, Deleted          int64
	SweepTook                 time.Duration // last_sweep_duration_ms of the COMPACT's sweep
	CompactTook               time.Duration // the whole COMPACT, as the client saw it
}

// sweepRun is one measured run of the workload on a copy of a filled store.
type sweepRun struct {
	Pop     population
	Round   int
	Sweep   bool
	Res     result
	Scanned int64 // sweep_scanned_total over the run
	Deleted int64 // sweep_deleted_total over the run
	Samples int   // INFO storage reads during the run
	Running int   // of which saw sweep_in_progress:1
	Passes  int64 // sweep passes that ended during the run
}

type sweepReport struct {
	Scenario scenario
	Buckets  int64
	Rounds   int
	Flags    []string // extra sluice flags of every server
	Compacts []compactResult
	Runs     []sweepRun
}

func sweepScenario(o options) (scenario, error) {
	p, _ := findScenario("pipelined")
	sc := scenario{Name: "sweep", W: o.overrides(p.W),
		About: "the idle sweep's throughput on a filled store, and pipelined with the background sweep off and on"}
	if err := validate(sc.W); err != nil {
		return sc, fmt.Errorf("scenario sweep: %w", err)
	}
	if o.compare != "" {
		return sc, fmt.Errorf("--scenario sweep measures sluice alone: drop --compare %s", o.compare)
	}
	if o.sweepBuckets < 2 || o.rounds < 1 {
		return sc, fmt.Errorf("--sweep-buckets must be at least 2 and --rounds at least 1")
	}
	return sc, nil
}

// fillWorkload writes every one of n buckets of pop once, in key order
// across the connections, as the large scenario does.
func fillWorkload(pop population, n int64) workload {
	return workload{Conns: 50, Pipeline: 16, Requests: n, Keys: n, Dist: "seq", Take: 1, Max: 1, RefillMs: pop.RefillMs}
}

func runSweep(o options, sc scenario, log io.Writer) (sweepReport, error) {
	rep := sweepReport{Scenario: sc, Buckets: o.sweepBuckets, Rounds: o.rounds, Flags: strings.Fields(o.serverFlags)}
	fmt.Fprintf(log, "== sweep: %d buckets per store, %d rounds of the workload with the sweep off and on\n", rep.Buckets, rep.Rounds)
	tmp, bin, err := workDir(o, "bench-sweep-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(tmp)
	backups := filepath.Join(tmp, "backups")
	flags := func(extra []string) []string {
		return append(append([]string{"--backup-dir", backups}, extra...), rep.Flags...)
	}
	snapshots := map[string]string{}
	for _, pop := range populations {
		cr, snap, err := fillAndCompact(o.serverWrap(), bin, filepath.Join(tmp, pop.Name), pop, rep.Buckets, flags(sweepOffFlags), log)
		if err != nil {
			return rep, err
		}
		rep.Compacts = append(rep.Compacts, cr)
		snapshots[pop.Name] = snap
	}
	for round := 1; round <= rep.Rounds; round++ {
		for _, pop := range populations {
			for _, on := range []bool{false, true} {
				extra := sweepOffFlags
				if on {
					extra = sweepOnFlags
				}
				r, err := measureRun(o.serverWrap(), bin, snapshots[pop.Name], filepath.Join(tmp, "run"), flags(extra), on, sc.W)
				if err != nil {
					return rep, fmt.Errorf("%s store, sweep %s: %w", pop.Name, onOff(on), err)
				}
				r.Pop, r.Round = pop, round
				fmt.Fprintf(log, "   round %d, %s store, sweep %-3s %10.0f ops/s, p99 %s ms, swept %d (%d deleted), sweep running in %d of %d samples\n",
					round, pop.Name, onOff(on), r.Res.opsPerSec(), ms(r.Res.Hist, 99), r.Scanned, r.Deleted, r.Running, r.Samples)
				rep.Runs = append(rep.Runs, r)
			}
		}
	}
	return rep, nil
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// fillAndCompact fills a fresh store with n buckets of pop, waits for it to
// settle (and for the buckets to be idle, if they are to be), checkpoints
// it, and times COMPACT. It returns the checkpoint's directory.
func fillAndCompact(wrap []string, bin, dir string, pop population, n int64, flags []string, log io.Writer) (compactResult, string, error) {
	cr := compactResult{Pop: pop}
	ss, err := startSluice(wrap, bin, filepath.Join(dir, "data"), flags)
	if err != nil {
		return cr, "", err
	}
	defer func() {
		ss.stop()
		os.RemoveAll(filepath.Join(dir, "data"))
	}()
	cr.Fill, err = run(ss.addr, targetSluice, fillWorkload(pop, n), "")
	if err != nil {
		return cr, "", fmt.Errorf("fill the %s store: %w\nserver log:\n%s", pop.Name, err, ss.log)
	}
	filled := time.Now()
	// Let Pebble's background compactions finish, so that the runs on
	// copies of this store start from the same settled state.
	t0 := time.Now()
	for time.Since(t0) < time.Minute {
		info, err := ss.info("storage")
		if err != nil {
			return cr, "", err
		}
		if info.int("compaction_debt_bytes") == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	cr.Settle = time.Since(t0)
	fmt.Fprintf(log, "   filled the %s store: %d buckets, %.0f ops/s, %d errors; compactions settled in %.1f s\n",
		pop.Name, n, cr.Fill.opsPerSec(), cr.Fill.Errors, cr.Settle.Seconds())
	if wait := time.Duration(pop.RefillMs)*time.Millisecond + time.Second - time.Since(filled); pop.Idle && wait > 0 {
		time.Sleep(wait) // every bucket idle
	}
	snap, err := ss.do("CHECKPOINT", pop.Name)
	if err != nil {
		return cr, "", fmt.Errorf("CHECKPOINT: %w", err)
	}
	before, err := ss.info("storage")
	if err != nil {
		return cr, "", err
	}
	cr.TableBefore = before.int("table_bytes")
	if cr.DBSizeBefore, err = ss.dbsize(); err != nil {
		return cr, "", err
	}
	t0 = time.Now()
	if _, err := ss.do("COMPACT"); err != nil {
		return cr, "", fmt.Errorf("COMPACT: %w", err)
	}
	cr.CompactTook = time.Since(t0)
	after, err := ss.info("storage")
	if err != nil {
		return cr, "", err
	}
	cr.TableAfter = after.int("table_bytes")
	if cr.DBSizeAfter, err = ss.dbsize(); err != nil {
		return cr, "", err
	}
	cr.Scanned, cr.Deleted = after.int("last_sweep_scanned"), after.int("last_sweep_deleted")
	cr.SweepTook = time.Duration(after.int("last_sweep_duration_ms")) * time.Millisecond
	fmt.Fprintf(log, "   COMPACT of the %s store: %.1f s, of which the sweep %.1f s (%d scanned, %d deleted)\n",
		pop.Name, cr.CompactTook.Seconds(), cr.SweepTook.Seconds(), cr.Scanned, cr.Deleted)
	return cr, snap, nil
}

// measureRun starts sluice on a fresh copy of the store in snap, waits for
// the first sweep pass to start (if the sweep is on), and runs w while it
// reads INFO storage every sweepSample.
func measureRun(wrap []string, bin, snap, dir string, flags []string, on bool, w workload) (sweepRun, error) {
	r := sweepRun{Sweep: on}
	os.RemoveAll(dir)
	defer os.RemoveAll(dir)
	if err := copyDir(snap, dir); err != nil {
		return r, err
	}
	ss, err := startSluice(wrap, bin, dir, flags)
	if err != nil {
		return r, err
	}
	defer ss.stop()
	// The first pass starts --sweep-interval (1s) after the server; the
	// run without the sweep waits as long, so that both start alike.
	t0 := time.Now()
	for time.Since(t0) < 15*time.Second {
		time.Sleep(100 * time.Millisecond)
		info, err := ss.info("storage")
		if err != nil {
			return r, err
		}
		if info.int("sweep_in_progress") == 1 || (!on && time.Since(t0) >= time.Second) {
			break
		}
	}
	before, err := ss.info("storage")
	if err != nil {
		return r, err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(sweepSample)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if info, err := ss.info("storage"); err == nil {
				r.Samples++
				if info.int("sweep_in_progress") == 1 {
					r.Running++
				}
			}
		}
	})
	cpu0 := ss.cpuTime()
	r.Res, err = run(ss.addr, targetSluice, w, "")
	close(stop)
	wg.Wait()
	if err != nil {
		return r, fmt.Errorf("%w\nserver log:\n%s", err, ss.log)
	}
	r.Res.CPU = ss.cpuTime() - cpu0
	r.Res.PeakRSS = ss.peakRSS()
	after, err := ss.info("storage")
	if err != nil {
		return r, err
	}
	r.Scanned = after.int("sweep_scanned_total") - before.int("sweep_scanned_total")
	r.Deleted = after.int("sweep_deleted_total") - before.int("sweep_deleted_total")
	if after.int("last_sweep_time") != before.int("last_sweep_time") {
		r.Passes = 1 // at least one ended
	}
	return r, nil
}

// copyDir copies the regular files under src into a new directory dst.
func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

// infoFields is one INFO reply's fields, name to value.
type infoFields map[string]string

// parseInfo reads the "name:value" lines of an INFO reply; section
// headers ("# Storage"), blank lines and lines without a colon are skipped.
func parseInfo(s string) infoFields {
	f := infoFields{}
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimRight(l, "\r")
		if l == "" || l[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(l, ":"); ok {
			f[k] = v
		}
	}
	return f
}

// int is the field as an integer; 0 if absent or not a number.
func (f infoFields) int(name string) int64 {
	n, _ := strconv.ParseInt(f[name], 10, 64)
	return n
}

func (s *server) info(section string) (infoFields, error) {
	raw, err := s.do("INFO", section)
	if err != nil {
		return nil, err
	}
	return parseInfo(raw), nil
}

func (s *server) dbsize() (int64, error) {
	raw, err := s.do("DBSIZE")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(raw, 10, 64)
}

func mib(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

func perSec(n int64, d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(n)/d.Seconds())
}

// ratio formats a/b with two decimals and a ×.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func quantileMs(h interface{ ValueAtQuantile(float64) int64 }, q float64) float64 {
	return float64(h.ValueAtQuantile(q)) / 1000
}

func sweepMarkdown(rep sweepReport) string {
	var b strings.Builder
	w := rep.Scenario.W
	fmt.Fprintf(&b, "scenario sweep: %s\n", rep.Scenario.About)
	fmt.Fprintf(&b, "(stores of %d buckets, each max 1, refill 1 per period, taken once; workload %d connections, pipeline %d, %d requests, %d keys %s",
		rep.Buckets, w.Conns, w.Pipeline, w.Requests, w.Keys, w.Dist)
	if len(rep.Flags) > 0 {
		fmt.Fprintf(&b, "; sluice %s", strings.Join(rep.Flags, " "))
	}
	b.WriteString(")\n\nStores:\n\n")
	for _, p := range populations {
		fmt.Fprintf(&b, "- `%s`: refill period %d ms, %s.\n", p.Name, p.RefillMs, p.About)
	}
	b.WriteString("\nFill, then COMPACT (a whole sweep without pacing, then a Pebble manual compaction):\n\n")
	b.WriteString("| store | fill ops/s | buckets before | buckets after | tables MiB before | tables MiB after | sweep s | scanned/s | deleted/s | COMPACT s (sweep + compaction) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range rep.Compacts {
		fmt.Fprintf(&b, "| %s | %.0f | %d | %d | %s | %s | %.1f | %s | %s | %.1f |\n", c.Pop.Name, c.Fill.opsPerSec(),
			c.DBSizeBefore, c.DBSizeAfter, mib(c.TableBefore), mib(c.TableAfter), c.SweepTook.Seconds(),
			perSec(c.Scanned, c.SweepTook), perSec(c.Deleted, c.SweepTook), c.CompactTook.Seconds())
	}
	fmt.Fprintf(&b, "\nThe workload on a fresh copy of each store, background sweep off (`%s`) and on (`%s`, default `--sweep-rate`):\n\n",
		strings.Join(sweepOffFlags, " "), strings.Join(sweepOnFlags, " "))
	b.WriteString("| store | round | sweep | ops/s | p50 ms | p90 ms | p99 ms | p99.9 ms | errors | server CPU s | CPU µs/op | peak RSS MiB | sweep running (samples) | swept | swept/s | deleted |\n")
	b.WriteString("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rep.Runs {
		res := r.Res
		running := fmt.Sprintf("%d of %d", r.Running, r.Samples)
		if r.Passes > 0 {
			running += ", a pass ended"
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %.0f | %s | %s | %s | %s | %d | %.1f | %.2f | %.0f | %s | %d | %s | %d |\n",
			r.Pop.Name, r.Round, onOff(r.Sweep), res.opsPerSec(), ms(res.Hist, 50), ms(res.Hist, 90), ms(res.Hist, 99), ms(res.Hist, 99.9),
			res.Errors, res.CPU.Seconds(), float64(res.CPU.Microseconds())/float64(max(res.Requests, 1)), float64(res.PeakRSS)/(1<<20),
			running, r.Scanned, perSec(r.Scanned, res.Elapsed), r.Deleted)
	}
	b.WriteString("\nWith the sweep / without (same store, same round):\n\n")
	b.WriteString("| store | round | ops/s | p50 | p99 | p99.9 | CPU µs/op |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, pr := range sweepPairs(rep.Runs) {
		off, on := pr[0].Res, pr[1].Res
		perOp := func(r result) float64 { return float64(r.CPU.Microseconds()) / float64(max(r.Requests, 1)) }
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s |\n", pr[0].Pop.Name, pr[0].Round,
			ratio(on.opsPerSec(), off.opsPerSec()),
			ratio(quantileMs(on.Hist, 50), quantileMs(off.Hist, 50)),
			ratio(quantileMs(on.Hist, 99), quantileMs(off.Hist, 99)),
			ratio(quantileMs(on.Hist, 99.9), quantileMs(off.Hist, 99.9)),
			ratio(perOp(on), perOp(off)))
	}
	return b.String()
}

// sweepPairs matches each run without the sweep to the run with it of the
// same store and round.
func sweepPairs(runs []sweepRun) [][2]sweepRun {
	var pairs [][2]sweepRun
	for _, off := range runs {
		if off.Sweep {
			continue
		}
		for _, on := range runs {
			if on.Sweep && on.Pop.Name == off.Pop.Name && on.Round == off.Round {
				pairs = append(pairs, [2]sweepRun{off, on})
				break
			}
		}
	}
	return pairs
}
