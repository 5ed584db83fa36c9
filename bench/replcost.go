package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/keyspace"
)

// The replcost scenario (issue 29, must-show 4) measures what replicating
// a shard costs: pipelined RL.PREDUCE over --keys buckets, all in shard 0
// (slots 0-5460 of three nodes), against a standalone sluice, the node
// owning shard 0 of a three-node cluster with one copy per slot
// (--cluster-replicas 1), and shard 0's leader of a three-node cluster
// with --cluster-replicas 3, in --fsync always and everysec. It reports
// the throughput, and each process's CPU per request from /proc: the
// leader's, and the followers', which only apply shard 0's rounds. With
// --pin the measured node (standalone, owner, leader) runs on core 0 and
// the generator on core 1; the followers and the other nodes are not
// pinned. --server-flags go to every sluice it starts.

// replcostRow is one configuration's figures.
type replcostRow struct {
	Name   string
	Res    result
	CPU    []time.Duration // by node: the measured node first
	Labels []string
	Notes  []string // where the profiles are (--perf)
	// PacedFor is the replicated row whose rate a paced standalone row
	// took, nil for others.
	PacedFor *replcostRow
}

// shardKeyNumbers returns n key numbers whose keys (k:<n>, as the generator
// writes them) have slots in [first, last].
func shardKeyNumbers(n int64, first, last uint16) []int64 {
	out := make([]int64, 0, n)
	var kb [24]byte
	for i := int64(0); int64(len(out)) < n; i++ {
		k := strconv.AppendInt(append(kb[:0], "k:"...), i, 10)
		if sl := keyspace.Slot(k); sl >= first && sl <= last {
			out = append(out, i)
		}
	}
	return out
}

func runReplCost(o options, log io.Writer) error {
	tmp, bin, err := workDir(o, "bench-replcost-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	w := o.w
	w.Only = shardKeyNumbers(w.Keys, 0, 5460)
	fmt.Fprintf(log, "== replcost: %d connections, pipeline %d, %d RL.PREDUCE over %d buckets of shard 0 (slots 0-5460); %s; load average %s\n",
		w.Conns, w.Pipeline, w.Requests, w.Keys, o.pinNote, loadAverage())
	var rows []replcostRow
	for _, mode := range []string{"always", "everysec"} {
		row, err := replcostStandalone(o, filepath.Join(tmp, "standalone-"+mode), bin, "standalone, "+mode, mode, w)
		if err != nil {
			return err
		}
		rows = append(rows, row)
		fmt.Fprintln(log, "   "+row.line())
		// A cluster with one copy per slot, then with three.
		var r3 replcostRow
		for _, r := range []int{1, 3} {
			if r3, err = replcostCluster(o, tmp, bin, r, mode, w); err != nil {
				return err
			}
			rows = append(rows, r3)
			fmt.Fprintln(log, "   "+r3.line())
		}
		// Standalone again, paced at the rate the three replicas took: a
		// follower's cost per request follows the size of its leader's
		// rounds, which follows the rate, and so does a standalone
		// node's; this row compares them at the same rate.
		paced := w
		paced.Rate = r3.Res.opsPerSec()
		if row, err = replcostStandalone(o, filepath.Join(tmp, "paced-"+mode), bin, fmt.Sprintf("standalone at %.0f requests/s, %s", paced.Rate, mode), mode, paced); err != nil {
			return err
		}
		row.PacedFor = &r3
		rows = append(rows, row)
		fmt.Fprintln(log, "   "+row.line())
	}
	fmt.Fprintln(log)
	fmt.Fprint(log, replcostMarkdown(rows))
	return nil
}

// replcostStandalone measures a standalone node on dir, named name.
func replcostStandalone(o options, dir, bin, name, mode string, w workload) (replcostRow, error) {
	s, err := startSluice(o.serverWrap(), bin, dir, append([]string{"--fsync", mode}, strings.Fields(o.serverFlags)...))
	if err != nil {
		return replcostRow{}, err
	}
	cpu0 := s.cpuTime()
	res, err := run(s.addr, targetSluice, w, "")
	cpu := s.cpuTime() - cpu0
	s.stop()
	if err != nil {
		return replcostRow{}, err
	}
	return replcostRow{Name: name, Res: res, CPU: []time.Duration{cpu}, Labels: []string{"node"}}, nil
}

// replcostCluster measures shard 0's node (its owner, or its leader at
// home) of three local nodes with r replicas per shard.
func replcostCluster(o options, tmp, bin string, r int, mode string, w workload) (replcostRow, error) {
	name := fmt.Sprintf("--cluster-replicas %d, %s", r, mode)
	dir := filepath.Join(tmp, fmt.Sprintf("r%d-%s", r, mode))
	flags := append([]string{"--cluster-replicas", strconv.Itoa(r), "--fsync", mode}, strings.Fields(o.serverFlags)...)
	nodes, _, shards, keys, err := startClusterNodes(dir, bin, r, flags, func(i int) []string {
		if i == 0 {
			return o.serverWrap()
		}
		return nil
	})
	defer stopNodes(nodes)
	if err != nil {
		return replcostRow{}, err
	}
	// Shard 0 served by node 0 (its owner, or its home leader).
	if _, note, err := waitServed(nodes, keys, shards, time.Now().Add(time.Minute), time.Now().Add(time.Minute)); err != nil || note != "" {
		return replcostRow{}, fmt.Errorf("%s: shard 0 not served from node 0: %v %s%s", name, err, note, nodeLogs(nodes))
	}
	// With --perf, the leader and a follower of the replicated runs.
	var profs []*profiler
	if o.perfDir != "" && r > 1 {
		for _, i := range []int{0, 1} {
			p, err := startPerf(nodes[i].srv, filepath.Join(o.perfDir, fmt.Sprintf("replcost-r%d-%s-node%d.data", r, mode, i)))
			if err != nil {
				return replcostRow{}, err
			}
			profs = append(profs, p)
		}
	}
	cpu0 := make([]time.Duration, len(nodes))
	for i, nd := range nodes {
		cpu0[i] = nd.srv.cpuTime()
	}
	res, err := run(nodes[0].addr, targetSluice, w, "")
	if err != nil {
		return replcostRow{}, fmt.Errorf("%s: %w", name, err)
	}
	row := replcostRow{Name: name, Res: res}
	for i, p := range profs {
		row.Notes = append(row.Notes, p.stop(res.Requests, nodes[i].srv.cpuTime()-cpu0[i]))
	}
	for i, nd := range nodes {
		row.CPU = append(row.CPU, nd.srv.cpuTime()-cpu0[i])
		label := "node " + strconv.Itoa(i)
		switch {
		case i == 0 && r > 1:
			label = "leader"
		case i == 0:
			label = "owner"
		case r > 1:
			label = "follower " + strconv.Itoa(i)
		}
		row.Labels = append(row.Labels, label)
	}
	return row, nil
}

// perReq is a CPU time per request of the row, in µs.
func (r replcostRow) perReq(i int) float64 {
	if r.Res.Requests == 0 {
		return 0
	}
	return float64(r.CPU[i].Microseconds()) / float64(r.Res.Requests)
}

func (r replcostRow) line() string {
	var cpu []string
	for i := range r.CPU {
		cpu = append(cpu, fmt.Sprintf("%s %.2f µs", r.Labels[i], r.perReq(i)))
	}
	s := fmt.Sprintf("%s: %.0f requests/s; CPU per request: %s", r.Name, r.Res.opsPerSec(), strings.Join(cpu, ", "))
	for _, n := range r.Notes {
		s += "\n     " + n
	}
	return s
}

// replcostMarkdown is the rows as a table, with the ratios to the
// standalone row of the same mode.
func replcostMarkdown(rows []replcostRow) string {
	var b strings.Builder
	b.WriteString("| configuration | requests/s | × standalone | measured node µs CPU/request | × standalone | other nodes µs CPU/request |\n|---|---:|---:|---:|---:|---|\n")
	var base replcostRow
	for _, r := range rows {
		if strings.HasPrefix(r.Name, "standalone") && r.PacedFor == nil {
			base = r
		}
		var others []string
		for i := 1; i < len(r.CPU); i++ {
			others = append(others, fmt.Sprintf("%s %.2f", r.Labels[i], r.perReq(i)))
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.2f | %.2f | %.2f | %s |\n", r.Name, r.Res.opsPerSec(), r.Res.opsPerSec()/base.Res.opsPerSec(),
			r.perReq(0), r.perReq(0)/base.perReq(0), strings.Join(others, ", "))
	}
	for _, r := range rows {
		if f := r.PacedFor; f != nil && r.perReq(0) > 0 {
			var ratios []string
			for i := 1; i < len(f.CPU); i++ {
				ratios = append(ratios, fmt.Sprintf("%s %.2f×", f.Labels[i], f.perReq(i)/r.perReq(0)))
			}
			fmt.Fprintf(&b, "\n%s: at the same rate as a standalone node (%.2f µs CPU/request at %.0f requests/s): leader %.2f×, %s\n",
				f.Name, r.perReq(0), r.Res.opsPerSec(), f.perReq(0)/r.perReq(0), strings.Join(ratios, ", "))
		}
	}
	return b.String()
}
