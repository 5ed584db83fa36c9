package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// The memory scenario: issue 13's "10M buckets: peak RSS ≤ 512 MiB with
// default flags". It starts sluice with its default flags (plus
// --server-flags), creates --keys distinct buckets (10M unless given) with
// one RL.PREDUCE each, in key order, pipelined, and reports the server's
// peak RSS (VmHWM), its RSS at the end, and the cache's INFO fields.

// memoryWorkload is the scenario's load: every key once, in order.
func memoryWorkload(o options) workload {
	w := o.overrides(workload{Conns: 50, Pipeline: 16, Requests: 10_000_000, Keys: 10_000_000, Dist: "seq"})
	if !o.set["requests"] {
		w.Requests = w.Keys
	}
	return w
}

// memoryGoal is the bound on peak RSS.
const memoryGoal = 512 << 20

type memoryReport struct {
	W       workload
	Flags   []string
	Res     result
	PeakRSS int64
	EndRSS  int64
	Samples []int64 // VmRSS once a second during the run
	Info    [][2]string
	PinNote string
	Load    [2]string // load average at the start and the end
}

// memoryMarkdown is the scenario's report.
func memoryMarkdown(m memoryReport) string {
	var b strings.Builder
	flags := "default flags"
	if len(m.Flags) > 0 {
		flags = "flags " + strings.Join(m.Flags, " ")
	}
	fmt.Fprintf(&b, "memory: %d distinct buckets, one RL.PREDUCE each in key order, %d connections, pipeline %d, sluice with %s; %s\n\n",
		m.W.Keys, m.W.Conns, m.W.Pipeline, flags, m.PinNote)
	if m.Load[0] != "" {
		fmt.Fprintf(&b, "Load average %s at the start, %s at the end.\n\n", m.Load[0], m.Load[1])
	}
	verdict := "met"
	if m.PeakRSS > memoryGoal {
		verdict = "**not met**"
	}
	fmt.Fprintf(&b, "| peak RSS (VmHWM) MiB | RSS at the end MiB | goal ≤ 512 MiB | ops/s | server CPU µs/op |\n|---:|---:|---|---:|---:|\n")
	perOp := float64(m.Res.CPU.Microseconds()) / float64(max(m.Res.Requests, 1))
	fmt.Fprintf(&b, "| %s | %s | %s | %.0f | %.2f |\n", mib(m.PeakRSS), mib(m.EndRSS), verdict, m.Res.opsPerSec(), perOp)
	if len(m.Info) > 0 {
		b.WriteString("\nINFO at the end:")
		for _, kv := range m.Info {
			fmt.Fprintf(&b, " %s:%s", kv[0], kv[1])
		}
		b.WriteString("\n")
	}
	if len(m.Samples) > 0 {
		var s []string
		for _, v := range m.Samples {
			s = append(s, fmt.Sprintf("%.0f", float64(v)/(1<<20)))
		}
		fmt.Fprintf(&b, "\nRSS MiB, once a second: %s\n", strings.Join(s, " "))
	}
	return b.String()
}

// infoCacheFields keeps the INFO fields that say what the cache and the
// memory hold: names with "cache" or "memory" in them, sorted.
func infoCacheFields(f infoFields) [][2]string {
	var out [][2]string
	for k, v := range f {
		if strings.Contains(k, "cache") || strings.Contains(k, "memory") || k == "buckets" {
			out = append(out, [2]string{k, v})
		}
	}
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return out
}

// runMemory runs the memory scenario.
func runMemory(o options, log io.Writer) (memoryReport, error) {
	m := memoryReport{W: memoryWorkload(o), Flags: strings.Fields(o.serverFlags), PinNote: o.pinNote}
	if err := validate(m.W); err != nil {
		return m, fmt.Errorf("scenario memory: %w", err)
	}
	tmp, bin, err := workDir(o, "bench-memory-")
	if err != nil {
		return m, err
	}
	defer os.RemoveAll(tmp)
	ss, err := startSluice(o.serverWrap(), bin, tmp+"/data", m.Flags)
	if err != nil {
		return m, err
	}
	defer ss.stop()
	fmt.Fprintf(log, "== memory: %d buckets, sluice %s, data in %s\n", m.W.Keys, bin, tmp)
	stop := make(chan struct{})
	sampled := make(chan []int64)
	go func() {
		var s []int64
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				sampled <- s
				return
			case <-tick.C:
				s = append(s, ss.rss())
			}
		}
	}()
	m.Load[0] = loadAverage()
	cpu0 := ss.cpuTime()
	res, err := run(ss.addr, targetSluice, m.W, "")
	m.Load[1] = loadAverage()
	res.CPU = ss.cpuTime() - cpu0
	close(stop)
	m.Samples = <-sampled
	if err != nil {
		return m, fmt.Errorf("%w\nserver log:\n%s", err, ss.log)
	}
	m.Res = res
	m.PeakRSS, m.EndRSS = ss.peakRSS(), ss.rss()
	logResult(log, res, m.W, o.pin)
	if info, err := ss.info("all"); err == nil {
		m.Info = infoCacheFields(info)
	}
	return m, nil
}
