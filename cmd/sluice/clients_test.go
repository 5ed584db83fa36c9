package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// pythonWithRedis finds a python3 that imports redis-py: the one on PATH,
// else Debian's /usr/bin/python3 (python3-redis installs there, and a
// pyenv python3 on PATH does not see it). It skips when there is none,
// unless CI=true: .ci/run installs python3-redis.
func pythonWithRedis(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import redis").Run() == nil {
			return py
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no python3 with redis-py; .ci/run installs python3-redis")
	}
	t.Skip("no python3 with redis-py (Debian: python3-redis)")
	return ""
}

// runPython runs a Python program and returns its output.
func runPython(t *testing.T, py, program string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang fails, not blocks the suite
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "-c", program).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s\nprogram:\n%s", err, out, program)
	}
	return string(out)
}

// redis-py's client_info(), client_list() and info("memory") parse
// sluice's replies (issue 19: client_info() raised KeyError: 'multi', then
// 'tot-mem', and INFO memory was empty).
func TestRedisPy(t *testing.T) {
	py := pythonWithRedis(t)
	p := startProc(t, t.TempDir())
	host, port, _ := strings.Cut(p.addr, ":")
	got := runPython(t, py, `
import redis
r = redis.Redis(host="`+host+`", port=`+port+`)
r.client_setname("py")
ci = r.client_info()
print(ci["name"], ci["multi"], ci["tot-mem"] > 0, ci["cmd"], ci["user"])
cl = r.client_list()
print(len(cl), cl[0]["name"], int(cl[0]["qbuf-free"]) > 0)
m = r.info("memory")
print(m["used_memory"] > 0, m["used_memory_peak"] >= m["used_memory"], m["used_memory_rss"] > 0, m["maxmemory_policy"])
print("used_memory" in r.info(), "used_memory" in r.info("all"))
`)
	want := "py -1 True client|info default\n1 py True\nTrue True True noeviction\nTrue True\n"
	if got != want {
		t.Errorf("redis-py printed\n%s\nwant\n%s", got, want)
	}
}

// The Python snippet of docs/commands.md runs against a real server and
// prints what its comments say.
func TestDocPythonSnippet(t *testing.T) {
	py := pythonWithRedis(t)
	readme, err := os.ReadFile("../../docs/commands.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "<!-- snippet: python")
	if !ok {
		t.Fatal("docs/commands.md has no <!-- snippet: python --> marker")
	}
	_, rest, _ = strings.Cut(rest, "```python\n")
	snippet, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("docs/commands.md's python snippet has no end")
	}
	const addr = `host="localhost", port=9049`
	if !strings.Contains(snippet, addr) {
		t.Fatalf("docs/commands.md's python snippet does not connect with %s:\n%s", addr, snippet)
	}
	p := startProc(t, t.TempDir())
	host, port, _ := strings.Cut(p.addr, ":")
	got := runPython(t, py, strings.Replace(snippet, addr, `host="`+host+`", port=`+port, 1))
	if want := "10\n[10, 10, 10]\nTrue True\n"; got != want {
		t.Errorf("docs/commands.md's python snippet printed\n%s\nwant\n%s", got, want)
	}
}
