package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestScaleProcs(t *testing.T) {
	for _, tc := range []struct {
		cpus int
		want []int
	}{
		{1, []int{1}},
		{2, []int{1, 2}},
		{6, []int{1, 2, 4, 6}},
		{16, []int{1, 2, 4, 8, 16}},
	} {
		if got := scaleProcs(tc.cpus); !slices.Equal(got, tc.want) {
			t.Errorf("scaleProcs(%d) = %v, want %v", tc.cpus, got, tc.want)
		}
	}
}

func TestScaleWorkloads(t *testing.T) {
	o := options{set: map[string]bool{"requests": true}, w: workload{Requests: 300, ZipfS: 1.2, Take: 1, Max: 100, RefillMs: 60000}}
	u, h, err := scaleWorkloads(o)
	if err != nil {
		t.Fatal(err)
	}
	if u.Keys != 1_000_000 || u.Dist != "uniform" || u.Requests != 300 || u.command() != cmdRLPReduce {
		t.Errorf("uniform workload %+v", u)
	}
	if h.Keys != 1000 || h.Dist != "uniform" || h.Requests != 600 || h.Conns != u.Conns || h.Pipeline != u.Pipeline {
		t.Errorf("hot workload %+v", h)
	}
	o.set["command"], o.w.Command = true, cmdCLThrottle
	if _, _, err := scaleWorkloads(o); err == nil {
		t.Error("accepted --command CL.THROTTLE")
	}
}

// go test's own lines, with and without the -N suffix of GOMAXPROCS.
const stageOutput = `goos: linux
BenchmarkCommitterRound/everysec/keys=8192         	      20	  27710152 ns/op	      1568 cpu-ns/key	      3383 ns/key	  111310 B/op	      10 allocs/op
BenchmarkCommitterRound/everysec/keys=8192         	      20	  27710152 ns/op	      1568 cpu-ns/key	      1000 ns/key	  111310 B/op	      10 allocs/op
BenchmarkCommitterRound/everysec/keys=8192         	      20	  27710152 ns/op	      1568 cpu-ns/key	      2000 ns/key	  111310 B/op	      10 allocs/op
BenchmarkPebbleFlush-2      	       5	 174108016 ns/op	       524.3 cpu-ns/key	      1328 ns/key	  946448 B/op	    1641 allocs/op
PASS
`

func TestParseStageOutput(t *testing.T) {
	got := parseStageOutput(stageOutput)
	if v := got["BenchmarkCommitterRound/everysec/keys=8192"]["ns/key"]; !slices.Equal(v, []float64{3383, 1000, 2000}) {
		t.Errorf("committer round: %v", v)
	}
	if v := got["BenchmarkCommitterRound/everysec/keys=8192"]["cpu-ns/key"]; !slices.Equal(v, []float64{1568, 1568, 1568}) {
		t.Errorf("committer round's CPU: %v", v)
	}
	if v := got["BenchmarkPebbleFlush"]["ns/key"]; !slices.Equal(v, []float64{1328}) {
		t.Errorf("flush: %v (the -2 suffix must go)", v)
	}
	if m := median(got["BenchmarkCommitterRound/everysec/keys=8192"]["ns/key"]); m != 2000 {
		t.Errorf("median %v, want 2000", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median of an even count %v, want 2.5", m)
	}
}

// The stages are those of a server of 8 cores, the goal's, on a machine
// of fewer: a 2-core machine sized them for 2 committers and 2
// compactions, which said what caps 2 cores, not 8.
func TestSerialStagesFollowCores(t *testing.T) {
	for cpus, k := range map[int]string{1: "8", 2: "8", 6: "8", 8: "8", 16: "16", 64: "16"} {
		stages := serialStagesFor(cpus)
		byBench := map[string]stageResult{}
		for _, s := range stages {
			byBench[s.Bench] = s
		}
		for bench, unit := range map[string]string{
			"BenchmarkCommittersRound/committers=" + k + "/keys=8192": "serial-ns/key",
			"BenchmarkWALAppend/keys=256":                             "",
			// The flush writes the same tables from 3 compactions on.
			"BenchmarkPebbleFlush/compactions=8": "",
			// As many compactions at once as committers.
			"BenchmarkPebbleCompaction/compactions=" + k: "serial-ns/key",
		} {
			if s, ok := byBench[bench]; !ok || s.CPUUnit != unit {
				t.Errorf("%d cores: no stage %s with unit %q in %+v", cpus, bench, unit, stages)
			}
		}
		if len(stages) != 4 {
			t.Errorf("%d cores: %d stages, want 4: %+v", cpus, len(stages), stages)
		}
	}
}

func TestStageArgsForAnchorsEachLevel(t *testing.T) {
	got := strings.Join(stageArgsFor("BenchmarkCommitterRound/everysec/keys=8192"), " ")
	want := "test -run ^$ -bench ^BenchmarkCommitterRound$/^everysec$/^keys=8192$ -cpu 1 -count 5 ./storage"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if got := strings.Join(stageArgsFor("BenchmarkPebbleFlush"), " "); !strings.Contains(got, "-bench ^BenchmarkPebbleFlush$ ") {
		t.Errorf("got %s", got)
	}
}

func scaleFixture() scaleReport {
	res := func(ops float64, cpu time.Duration) *result {
		return &result{Requests: int64(ops), Elapsed: time.Second, CPU: cpu, GenCPU: time.Second / 2}
	}
	return scaleReport{
		Uniform: workload{Conns: 50, Pipeline: 16, Requests: 1_000_000, Keys: 1_000_000, Dist: "uniform", Max: 100, RefillMs: 60000},
		Hot:     workload{Conns: 50, Pipeline: 16, Requests: 2_000_000, Keys: 1000, Dist: "uniform", Max: 100, RefillMs: 60000},
		Rows: []scaleRow{
			{Target: targetRedisINCR, Uniform: res(500_000, time.Second), Hot: res(900_000, time.Second)},
			{Target: targetSluice, Procs: 2, Uniform: res(300_000, 1800*time.Millisecond)},
		},
		Stages: []stageResult{
			{Name: "a", Bench: "BenchmarkA", NsKey: 1000, CPUNsKey: 900, Runs: 5},
			{Name: "b", Bench: "BenchmarkB", NsKey: 1250, CPUNsKey: 1100, Runs: 5},
			{Name: "c", Bench: "BenchmarkC", NsKey: 1300, CPUNsKey: 390, Runs: 5},
		},
		StageCores: 8,
		Load:       [2]string{"0.5 0.4 0.3", "1.0 0.6 0.4"},
	}
}

// The table has a row per server with the cores it used, and the last line
// is the slowest stage's ceiling.
func TestScaleMarkdown(t *testing.T) {
	md := scaleMarkdown(scaleFixture())
	lines := strings.Split(strings.TrimRight(md, "\n"), "\n")
	if last := lines[len(lines)-1]; last != "serial stage ceiling: 909091 keys/s on one core" {
		t.Errorf("last line %q", last)
	}
	for _, want := range []string{
		"| redis INCR | - | 500000 | 2.00 | 1.00 | 900000 | 1.11 | 1.00 | 0.50, 0.50 |",
		"| sluice RL.PREDUCE | 2 | 300000 | 6.00 | 1.80 | - | - | - | 0.50, - |",
		"| b | BenchmarkB | 1250 | 1100 | 909091 |",
		"write path of a server of 8 cores",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
}

func TestWriteScaleDocsReplacesItsPart(t *testing.T) {
	checkWritesOnlyItsPart(t, scalePart, func(path string) error {
		return writeScaleDocs(path, scaleFixture(), []string{"--scenario", "scale"})
	}, "serial stage ceiling: 909091 keys/s on one core\n", "`go run ./bench --scenario scale`")
}

func TestScaleRefusesPin(t *testing.T) {
	err := mainErr([]string{"--scenario", "scale", "--pin"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "drop --pin") {
		t.Fatalf("got %v, want a refusal of --pin", err)
	}
}
