package kubernetes_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
)

// These tests run the shipped defaults end to end: sluice built from
// cmd/sluice, started with the Dockerfile's environment or the
// StatefulSet's arguments, every path the container would see moved into
// a temporary directory (there is no container here), then a real
// CHECKPOINT and a real sluice backup, as the CronJob runs it.

// startLimit bounds how long a process may take to start serving.
const startLimit = time.Minute

// buildSluice builds cmd/sluice and returns the binary.
func buildSluice(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sluice")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/sluice: %v\n%s", err, out)
	}
	return bin
}

// sluiceProc is a running sluice server.
type sluiceProc struct {
	cmd            *exec.Cmd
	addr, httpAddr string
	exited         chan struct{}
	mu             sync.Mutex
	logs           bytes.Buffer
}

func (p *sluiceProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// startSluice runs bin with exactly env and args (--log-format json among
// them) and waits until it logs the addresses it serves on.
func startSluice(t *testing.T, bin string, env, args []string) *sluiceProc {
	t.Helper()
	p := &sluiceProc{cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	p.cmd.Env = env
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.logs.Write(sc.Bytes())
			p.logs.WriteByte('\n')
			p.mu.Unlock()
			var line struct {
				Msg      string `json:"msg"`
				Addr     string `json:"addr"`
				HTTPAddr string `json:"http_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "sluice starting" {
				p.addr, p.httpAddr = line.Addr, line.HTTPAddr
				close(started)
			}
		}
		p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
	})
	select {
	case <-started:
	case <-p.exited:
		t.Fatalf("sluice %q exited before serving:\n%s", args, p.log())
	case <-time.After(startLimit):
		t.Fatalf("sluice %q did not serve within %v:\n%s", args, startLimit, p.log())
	}
	return p
}

// stop ends p with SIGTERM and waits for it.
func (p *sluiceProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(startLimit):
		t.Fatalf("sluice did not stop within %v of SIGTERM:\n%s", startLimit, p.log())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("sluice exited with %d:\n%s", code, p.log())
	}
}

// hostPaths moves the container's paths into temporary directories: each
// mount point maps to a directory of its own.
type hostPaths map[string]string

// add maps the container's directory mnt to a new temporary one.
func (h hostPaths) add(t *testing.T, mnt string) string {
	t.Helper()
	dir := t.TempDir()
	h[mnt] = dir
	return dir
}

// of is the host's path for the container's path p; p unchanged when no
// mount holds it.
func (h hostPaths) of(p string) string {
	for mnt, dir := range h {
		if p == mnt || strings.HasPrefix(p, strings.TrimSuffix(mnt, "/")+"/") {
			return dir + strings.TrimPrefix(p, mnt)
		}
	}
	return p
}

// flagArg maps the paths in one --name=value argument, and listens on
// 127.0.0.1:0 instead of a fixed port.
func (h hostPaths) flagArg(t *testing.T, arg string) string {
	t.Helper()
	name, value, ok := strings.Cut(arg, "=")
	if !ok || !strings.HasPrefix(name, "--") {
		t.Fatalf("argument %q: want --name=value; this test reads no more", arg)
	}
	switch name {
	case "--addr", "--http-addr":
		return name + "=127.0.0.1:0"
	}
	return name + "=" + h.of(value)
}

// serving is what the checks below need of a server started with the
// shipped defaults.
type serving struct {
	bin      string
	proc     *sluiceProc
	password string
	backups  string // --backup-dir, on the host
}

// checkBackups takes a CHECKPOINT over RESP and a backup with sluice backup
// (the CronJob's arguments, when given; else without a password), and
// checks that each holds key.
func checkBackups(t *testing.T, s serving, key string, cronArgs []string) {
	t.Helper()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: s.proc.addr, Password: s.password, MaxRetries: -1})
	defer c.Close()
	path, err := c.Do(ctx, "CHECKPOINT", "nightly").Text()
	if err != nil {
		t.Fatalf("CHECKPOINT: %v\n%s", err, s.proc.log())
	}
	if path != filepath.Join(s.backups, "nightly") {
		t.Errorf("CHECKPOINT wrote %s, want %s", path, filepath.Join(s.backups, "nightly"))
	}
	checkHolds(t, s.bin, path, key)

	out := t.TempDir()
	args := []string{"backup", "--from=" + s.proc.httpAddr, "--dir=" + out + "/"}
	if cronArgs != nil {
		// The CronJob's, its paths moved as the server's are: the same
		// Secret, its own claim for the backups.
		h := hostPaths{"/backups": out}
		h["/etc/sluice/auth"] = filepath.Dir(passwordFile(t, s.password))
		args = []string{cronArgs[0]}
		for _, a := range cronArgs[1:] {
			if strings.HasPrefix(a, "--from=") {
				a = "--from=" + s.proc.httpAddr
			}
			args = append(args, h.flagArg(t, a))
		}
	}
	if b, err := exec.Command(s.bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("sluice %q: %v\n%s", args, err, b)
	}
	names, err := os.ReadDir(out)
	if err != nil || len(names) != 1 || !strings.HasPrefix(names[0].Name(), "sluice-") {
		t.Fatalf("sluice backup left %v in %s (%v), want one sluice-<time> directory", names, out, err)
	}
	checkHolds(t, s.bin, filepath.Join(out, names[0].Name()), key)
}

// passwordFile writes the password into a file of a new directory.
func passwordFile(t *testing.T, password string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(f, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// checkHolds runs sluice inspect on dir and expects key among its records.
func checkHolds(t *testing.T, bin, dir, key string) {
	t.Helper()
	out, err := exec.Command(bin, "inspect", "--data", dir, "--prefix", key, "--format", "json").Output()
	if err != nil || !strings.Contains(string(out), `"key":"`+key+`"`) {
		t.Fatalf("sluice inspect --data %s: %v, want the key %s:\n%s", dir, err, key, out)
	}
}

// reduce takes one token of a 10-token bucket at a fixed time and returns
// the tokens it found (RL.REDUCE's reply).
func reduce(t *testing.T, p *sluiceProc, password, key string) int64 {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: p.addr, Password: password, MaxRetries: -1})
	defer c.Close()
	n, err := c.Do(context.Background(), "RL.REDUCE", key, 10, 3600, "AT", 1_700_000_000).Int64()
	if err != nil {
		t.Fatalf("RL.REDUCE %s: %v\n%s", key, err, p.log())
	}
	return n
}

// cronArgs are the backup CronJob's arguments.
func cronArgs(m *manifests) []string {
	return m.cronJobs[0].Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args
}

// imageRun is the Dockerfile's environment with its volume on the host,
// and the arguments docker run would add to reach it here.
func imageRun(t *testing.T) (h hostPaths, env, args []string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(string(raw))
	final := stages[len(stages)-1]
	h = hostPaths{}
	for _, v := range find(final, "VOLUME") {
		for _, mnt := range strings.Fields(v) {
			h.add(t, mnt)
		}
	}
	for _, e := range find(final, "ENV") {
		for _, kv := range strings.Fields(e) {
			k, v, _ := strings.Cut(kv, "=")
			env = append(env, k+"="+h.of(v))
		}
	}
	return h, env, []string{"--addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--log-format=json"}
}

// statefulSetRun is the StatefulSet container's environment and arguments
// with its mounts on the host, the Secret's password file written.
func statefulSetRun(t *testing.T, m *manifests, password string) (h hostPaths, env, args []string) {
	t.Helper()
	c := m.container(t)
	h = hostPaths{}
	pod := m.sts().Spec.Template.Spec
	for _, vm := range c.VolumeMounts {
		dir := h.add(t, vm.MountPath)
		i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		if i < 0 || pod.Volumes[i].Secret == nil {
			continue
		}
		for _, it := range pod.Volumes[i].Secret.Items {
			if err := os.WriteFile(filepath.Join(dir, it.Path), []byte(password+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Fatalf("env %s: valueFrom; this test reads values only", e.Name)
		}
		env = append(env, e.Name+"="+h.of(e.Value))
	}
	for _, a := range c.Args {
		args = append(args, h.flagArg(t, a))
	}
	return h, env, args
}

// TestShippedDefaultsBackUp starts sluice as the image and the StatefulSet
// configure it and backs it up both ways; then it starts the StatefulSet's
// configuration on a volume laid out the old way (the store's files
// directly on it), which it moves into place, keeping every record.
func TestShippedDefaultsBackUp(t *testing.T) {
	bin := buildSluice(t)
	m := load(t)

	t.Run("image", func(t *testing.T) {
		h, env, args := imageRun(t)
		p := startSluice(t, bin, env, args)
		if n := reduce(t, p, "", "user:1"); n != 10 {
			t.Fatalf("RL.REDUCE on a new store: %d, want 10", n)
		}
		flags := envFlags(t, env)
		checkBackups(t, serving{bin: bin, proc: p, backups: h.of(flags["backup-dir"])}, "user:1", nil)
	})

	const password = "s3cret"
	t.Run("statefulset", func(t *testing.T) {
		h, env, args := statefulSetRun(t, m, password)
		p := startSluice(t, bin, env, args)
		reduce(t, p, password, "user:1")
		checkBackups(t, serving{bin: bin, proc: p, password: password, backups: h.of(m.containerFlags(t)["backup-dir"])}, "user:1", cronArgs(m))
	})

	t.Run("statefulset on an old volume", func(t *testing.T) {
		h, env, args := statefulSetRun(t, m, password)
		flags := m.containerFlags(t)
		dataMount, ok := mountFor(m.container(t), flags["data"])
		if !ok {
			t.Fatalf("--data %s is on no volume", flags["data"])
		}
		vol := h.of(dataMount.MountPath)
		if err := os.Mkdir(filepath.Join(vol, "lost+found"), 0o700); err != nil {
			t.Fatal(err)
		}
		// The old layout: the store's files directly on the volume.
		old := startSluice(t, bin, env, []string{"--data=" + vol, "--addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--log-format=json", "--requirepass=" + password})
		for range 3 {
			reduce(t, old, password, "user:1")
		}
		old.stop(t)

		p := startSluice(t, bin, env, args)
		if !strings.Contains(p.log(), "moved the store into its own directory") {
			t.Errorf("the start on an old volume logged no move:\n%s", p.log())
		}
		if n := reduce(t, p, password, "user:1"); n != 7 {
			t.Fatalf("RL.REDUCE after the move: %d, want 7: the old store's state is lost", n)
		}
		checkBackups(t, serving{bin: bin, proc: p, password: password, backups: h.of(flags["backup-dir"])}, "user:1", cronArgs(m))
		p.stop(t)
		var names []string
		es, err := os.ReadDir(vol)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			names = append(names, e.Name())
		}
		if want := []string{"backups", "lost+found", filepath.Base(h.of(flags["data"]))}; !slices.Equal(names, want) {
			t.Errorf("the volume holds %v, want %v", names, want)
		}
		// Once moved, a restart moves nothing and keeps the state.
		p = startSluice(t, bin, env, args)
		if strings.Contains(p.log(), "moved the store") {
			t.Errorf("a second start moved the store again:\n%s", p.log())
		}
		if n := reduce(t, p, password, "user:1"); n != 6 {
			t.Fatalf("RL.REDUCE after a restart: %d, want 6", n)
		}
	})
}
