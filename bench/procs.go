package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/resp"
)

// server is a process the harness started and measures.
type server struct {
	name string
	cmd  *exec.Cmd
	addr string
	dir  string
	log  *bytes.Buffer
	done chan struct{} // closed when the process has exited
}

// start starts the server's process and the goroutine that waits for it.
func (s *server) start() error {
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	return nil
}

// exited reports whether the process has ended.
func (s *server) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// serverWrap is the command prefix the servers start under: with --pin,
// taskset -c 0, so that each server has one core (a Go server's
// GOMAXPROCS follows its affinity) and the generator the other.
func (o options) serverWrap() []string {
	if o.pin {
		return []string{"taskset", "-c", "0"}
	}
	return nil
}

// command builds a command run under wrap (taskset execs the server, so
// the process's pid is the server's, for /proc).
func command(wrap []string, bin string, args ...string) *exec.Cmd {
	if len(wrap) == 0 {
		return exec.Command(bin, args...)
	}
	return exec.Command(wrap[0], append(append(append([]string{}, wrap[1:]...), bin), args...)...)
}

// pinPlan is what decidePin chose: whether to pin, and the sentence the
// output says about it.
type pinPlan struct {
	Pin  bool
	Note string
}

// decidePin chooses whether a run gives each server one core: by default
// (explicit false) it pins when the machine has two CPUs or more and
// taskset is installed, and says why not otherwise; --pin=false turns it
// off; an explicit --pin that cannot be honoured is an error rather than
// a silently unpinned run.
func decidePin(want, explicit bool, cpus int, haveTaskset bool) (pinPlan, error) {
	const pinned = "pinned: each server on CPU 0 (taskset -c 0), the load generator on CPU 1"
	switch {
	case !want:
		return pinPlan{Note: "unpinned (--pin=false): the servers and the load generator share every core"}, nil
	case cpus >= 2 && haveTaskset:
		return pinPlan{Pin: true, Note: pinned}, nil
	case explicit && cpus < 2:
		return pinPlan{}, fmt.Errorf("--pin needs 2 CPUs, this process may use %d (--pin=false runs unpinned)", cpus)
	case explicit:
		return pinPlan{}, errors.New("--pin needs taskset (util-linux), which is not installed (--pin=false runs unpinned)")
	case cpus < 2:
		return pinPlan{Note: fmt.Sprintf("unpinned: this process may use %d CPU, pinning needs 2; the server and the load generator share it", cpus)}, nil
	}
	return pinPlan{Note: "unpinned: taskset (util-linux) is not installed; the servers and the load generator share every core"}, nil
}

// pinGenerator moves every thread of this process to CPU 1 (threads made
// later inherit it) and runs Go on one P, so that the load generator has
// one core and the servers, under serverWrap, the other.
func pinGenerator() error {
	out, err := exec.Command("taskset", "-a", "-p", "-c", "1", strconv.Itoa(os.Getpid())).CombinedOutput()
	if err != nil {
		return fmt.Errorf("--pin: taskset -a -p -c 1 %d: %v: %s", os.Getpid(), err, out)
	}
	runtime.GOMAXPROCS(1)
	return nil
}

// coreTicks is one CPU's line of /proc/stat: ticks busy (user, nice,
// system, irq, softirq, steal) and in all (busy plus idle and iowait).
type coreTicks struct{ Busy, Total int64 }

// parseProcStat reads the per-CPU lines (cpu0, cpu1, ...) of /proc/stat,
// indexed by CPU number; the aggregate "cpu" line is skipped.
func parseProcStat(raw []byte) []coreTicks {
	var cores []coreTicks
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		n, err := strconv.Atoi(f[0][3:])
		if err != nil || n < 0 || n > 4096 {
			continue
		}
		var v [8]int64
		for i := range v {
			if i+1 < len(f) {
				v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
			}
		}
		// user nice system idle iowait irq softirq steal
		busy := v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
		for len(cores) <= n {
			cores = append(cores, coreTicks{})
		}
		cores[n] = coreTicks{Busy: busy, Total: busy + v[3] + v[4]}
	}
	return cores
}

// readCores is parseProcStat of this machine's /proc/stat; nil if it
// cannot be read.
func readCores() []coreTicks {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	return parseProcStat(raw)
}

// coreBusy is the share of each CPU's time that was busy between two
// readings (by anyone: the measured processes, and whatever else ran
// there); -1 for a CPU with no ticks between them.
func coreBusy(before, after []coreTicks) []float64 {
	var busy []float64
	for i := range min(len(before), len(after)) {
		dt := after[i].Total - before[i].Total
		if dt <= 0 {
			busy = append(busy, -1)
			continue
		}
		busy = append(busy, float64(after[i].Busy-before[i].Busy)/float64(dt))
	}
	return busy
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// workDir makes a temporary directory for a run and puts the sluice binary
// in it (or finds --server-bin). The caller removes the directory.
func workDir(o options, prefix string) (dir, bin string, err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", "", err
	}
	if bin, err = sluiceBinary(o, dir); err != nil {
		os.RemoveAll(dir)
		return "", "", err
	}
	return dir, bin, nil
}

// sluiceBinary is --server-bin if given, else ./cmd/sluice built into dir.
func sluiceBinary(o options, dir string) (string, error) {
	if o.serverBin == "" {
		return buildSluice(dir)
	}
	bin, err := filepath.Abs(o.serverBin)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("--server-bin: %w", err)
	}
	return bin, nil
}

// buildSluice compiles ./cmd/sluice into dir; the harness runs from the
// repository root.
func buildSluice(dir string) (string, error) {
	bin := filepath.Join(dir, "sluice")
	out, err := exec.Command("go", "build", "-o", bin, "./cmd/sluice").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/sluice (run the harness from the repository root): %v\n%s", err, out)
	}
	return bin, nil
}

// startSluice starts the sluice binary, under wrap, with a fresh data
// directory.
func startSluice(wrap []string, bin, dataDir string, flags []string) (*server, error) {
	return startSluiceEnv(wrap, nil, bin, dataDir, flags)
}

// startSluiceEnv is startSluice with env (NAME=value) added to this
// process's environment, such as GOMAXPROCS.
func startSluiceEnv(wrap, env []string, bin, dataDir string, flags []string) (*server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	httpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := sluiceArgs(addr, httpAddr, dataDir, flags)
	s := &server{name: "sluice", cmd: command(wrap, bin, args...), addr: addr, dir: dataDir, log: &bytes.Buffer{}}
	if len(env) > 0 {
		s.cmd.Env = append(os.Environ(), env...)
	}
	s.cmd.Stderr = s.log
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, s.waitReady()
}

// sluiceArgs is the command line of a sluice the harness starts: its RESP
// address, data directory and quiet logs, and its HTTP endpoint on a free
// port of its own unless flags give one (the default, 127.0.0.1:9050, may
// be taken by any other sluice on the machine, and then sluice refuses to
// start), then flags.
func sluiceArgs(addr, httpAddr, dataDir string, flags []string) []string {
	args := []string{"--addr", addr, "--data", dataDir, "--log-level", "warn"}
	if !slices.ContainsFunc(flags, func(f string) bool { return f == "--http-addr" || strings.HasPrefix(f, "--http-addr=") }) {
		args = append(args, "--http-addr", httpAddr)
	}
	return append(args, flags...)
}

// startRedis starts redis-server, under wrap, with persistence off, as the
// comparison promises ("Redis persisting nothing"), and extra arguments
// such as --loadmodule.
func startRedis(wrap []string, dir string, extra ...string) (*server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server is not installed: apt-get install redis-server (Debian package), or run without --compare")
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	s := &server{name: "redis", addr: addr, dir: dir, log: &bytes.Buffer{}}
	args := append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "no"}, extra...)
	s.cmd = command(wrap, bin, args...)
	s.cmd.Stdout = s.log
	s.cmd.Stderr = s.log
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, s.waitReady()
}

// waitReady polls PING until the server answers, for up to ten seconds.
func (s *server) waitReady() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := s.do("PING"); err == nil {
			return nil
		}
		if s.exited() {
			return fmt.Errorf("%s exited before it answered on %s (%v):\n%s", s.name, s.addr, s.cmd.ProcessState, s.log)
		}
		if time.Now().After(deadline) {
			s.stop()
			return fmt.Errorf("%s did not start on %s:\n%s", s.name, s.addr, s.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// do sends one command and returns the reply's first line (or bulk body).
func (s *server) do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", s.addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Minute))
	b := resp.AppendArray(nil, len(args))
	for _, a := range args {
		b = resp.AppendBulkString(b, a)
	}
	if _, err := c.Write(b); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "-"):
		return "", errors.New(line[1:])
	case strings.HasPrefix(line, "$"):
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		body := make([]byte, n+2)
		if _, err := readFull(r, body); err != nil {
			return "", err
		}
		return string(body[:n]), nil
	}
	return line[1:], nil
}

func readFull(r *bufio.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// stop ends the server gracefully (SIGTERM) and waits.
func (s *server) stop() {
	if s.done == nil || s.exited() {
		return
	}
	s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// cpuTime returns the process's user+system CPU time so far, from
// /proc/PID/stat (in clock ticks of 1/100 s, Linux's USER_HZ).
func (s *server) cpuTime() time.Duration { return procCPU(s.cmd.Process.Pid) }

// procCPU is process pid's user+system CPU time so far (all its threads),
// from /proc/PID/stat; 0 if it cannot be read.
func procCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces; fields resume after its ')'.
	rest := raw[bytes.LastIndexByte(raw, ')')+2:]
	f := strings.Fields(string(rest))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// peakRSS returns the process's peak resident set size (VmHWM) in bytes.
func (s *server) peakRSS() int64 { return procStatusBytes(s.cmd.Process.Pid, "VmHWM") }

// rss returns the process's resident set size now (VmRSS) in bytes.
func (s *server) rss() int64 { return procStatusBytes(s.cmd.Process.Pid, "VmRSS") }

// procStatusBytes is a "kB" field of /proc/PID/status (VmHWM, VmRSS) in
// bytes; 0 if it cannot be read.
func procStatusBytes(pid int, field string) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// dirSize is the bytes of the files under dir, like du --apparent-size.
func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// profiler is a perf record attached to a server for one measured run.
type profiler struct {
	cmd *exec.Cmd
	out string
	log *bytes.Buffer
}

// startPerf attaches perf record (call graphs, 999 Hz) to s, writing to
// out, and returns once perf has created out, so that the run it is to
// profile starts after it.
func startPerf(s *server, out string) (*profiler, error) {
	if _, err := exec.LookPath("perf"); err != nil {
		return nil, errors.New("--perf needs perf (Debian: apt-get install linux-perf)")
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return nil, fmt.Errorf("--perf: %w", err)
	}
	os.Remove(out)
	p := &profiler{out: out, log: &bytes.Buffer{}}
	p.cmd = exec.Command("perf", "record", "-F", "999", "-g", "-p", strconv.Itoa(s.cmd.Process.Pid), "-o", out)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("--perf: start perf record: %w", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(out); err == nil {
			return p, nil
		}
		if time.Now().After(deadline) {
			p.cmd.Process.Kill()
			p.cmd.Wait()
			return nil, fmt.Errorf("--perf: perf record did not start writing %s:\n%s", out, p.log)
		}
	}
}

// stop ends the recording (perf writes its file on SIGINT, then ends by
// that signal) and says where it is and how to turn its shares into CPU µs
// per request.
func (p *profiler) stop(requests int64, cpu time.Duration) string {
	p.cmd.Process.Signal(os.Interrupt)
	err := p.cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGINT {
			err = nil
		}
	}
	if fi, serr := os.Stat(p.out); err != nil || serr != nil || fi.Size() == 0 {
		return fmt.Sprintf("perf record failed (%v): %s", err, strings.TrimSpace(p.log.String()))
	}
	samples := "?"
	if m := perfSamples.FindStringSubmatch(p.log.String()); m != nil {
		samples = m[1]
	}
	perOp := float64(cpu.Microseconds()) / float64(max(requests, 1))
	return fmt.Sprintf("CPU profile of sluice during the run: %s, %s samples; %.2f µs of server CPU per request, so a function's share of the samples × %.2f = its µs per request (inclusive: perf report -i %s --children --sort symbol --stdio)",
		p.out, samples, perOp, perOp, p.out)
}

var perfSamples = regexp.MustCompile(`\((\d+) samples\)`)
