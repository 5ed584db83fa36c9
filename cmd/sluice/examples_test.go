package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The examples in README.md, CONTRIBUTING.md and docs/*.md that show what a
// command prints
// are run by TestDocExamples, and their output compared with the page.
// CONTRIBUTING.md ("Examples in the docs") describes the conventions to
// users of them; this is the definition.
//
// A ```console block is a shell session. "$ cmd" is a command, "> " lines
// right after it continue it (bash's PS2), and the lines up to the next
// command are its output, stdout and stderr together. The block runs in
// one bash, in a new directory holding the files of the page's file blocks
// above it, with this build as sluice, redis-cli printing as it does to a
// terminal (--no-raw), and curl's stand-in (examplecurl_test.go), which
// needs no curl installed. Besides:
//   - "$ sluice ... &" starts a server for the rest of the block; the test
//     starts it, on free ports in place of the ports its flags name (and
//     of 9049 and 9050 for --addr and --http-addr left out), and stops it
//     at the block's end. A block that starts none, but names port 9049 or
//     9050 or types into redis-cli, gets a sluice with no flags.
//   - "127.0.0.1:9049> CMD" is typed into redis-cli, and the lines after it
//     are its reply; the commands of consecutive prompts go through one
//     connection, opened by the "$ redis-cli ..." line just above them if
//     there is one.
//   - The ports of the block's servers are replaced by the ones they got,
//     in every command; in the output, back.
//
// In the expected output, a line "..." stands for any number of lines,
// "..." within a line for any text, and "  # note" at the end of a line
// (two spaces or more before the #) is a note for the reader.
//
// A ```replies block lists RESP commands and their replies, one a line:
// "> CMD args -> reply  note", the reply an integer, a "string", (nil),
// (error) MSG or an array [a, b, ...]. They are sent in order on one
// connection to a sluice with no flags.
//
// "<!-- file: NAME -->" on the line before a fence writes the block's
// text to NAME for the page's later examples. "<!-- not run: REASON -->"
// before a fence marks an example the test cannot run (Kubernetes, other
// machines); the test counts and lists them. Any other block with a line
// that looks like a command example ("$ ", "> ", a redis-cli prompt) fails
// the test, so that no example goes unchecked without saying so.

// docFence is one fenced block of a markdown page.
type docFence struct {
	page   string // path relative to the repository root
	line   int    // of the opening fence, 1-based
	lang   string // the first word of the info string
	body   []string
	notRun string // the reason given by <!-- not run: ... -->
	file   string // the name given by <!-- file: ... -->
}

var (
	notRunComment = regexp.MustCompile(`^<!-- not run: (.+) -->$`)
	fileComment   = regexp.MustCompile(`^<!-- file: (\S+) -->$`)
	// A redis-cli prompt: host:port, "(TX)" inside MULTI, then "> ".
	cliPrompt = regexp.MustCompile(`^([A-Za-z0-9.-]+):(\d+)(?:\(TX\))?> (.*)$`)
	// The ports of a sluice with no flags.
	defaultPorts = regexp.MustCompile(`\b90(49|50)\b`)
	// A note at the end of an expected line.
	outputNote = regexp.MustCompile(`^(.*\S)\s{2,}# .*$`)
)

// docPages lists the pages whose examples run: README.md, CONTRIBUTING.md
// and docs/*.md, relative to the repository root.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md", "CONTRIBUTING.md"}
	for _, p := range pages {
		out = append(out, strings.TrimPrefix(p, "../../"))
	}
	return out
}

// readFences returns the fenced blocks of page, with the markers on the
// line before each.
func readFences(t *testing.T, page string) []docFence {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("../..", page))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	var fences []docFence
	for i := 0; i < len(lines); i++ {
		m := fenceOpen.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		f := docFence{page: page, line: i + 1, lang: m[3]}
		if i > 0 {
			prev := strings.TrimSpace(lines[i-1])
			if c := notRunComment.FindStringSubmatch(prev); c != nil {
				f.notRun = c[1]
			}
			if c := fileComment.FindStringSubmatch(prev); c != nil {
				f.file = c[1]
			}
		}
		indent, marker := m[1], m[2]
		for i++; i < len(lines) && !strings.HasPrefix(strings.TrimLeft(lines[i], " "), marker); i++ {
			f.body = append(f.body, strings.TrimPrefix(lines[i], indent))
		}
		fences = append(fences, f)
	}
	return fences
}

// looksLikeExample reports the first line of body that reads as a command
// with its output.
func looksLikeExample(body []string) (string, bool) {
	for _, l := range body {
		if strings.HasPrefix(l, "$ ") || strings.HasPrefix(l, "> ") || cliPrompt.MatchString(l) {
			return l, true
		}
	}
	return "", false
}

func TestDocExamples(t *testing.T) {
	run, notRun := 0, map[string]string{}
	for _, page := range docPages(t) {
		files := map[string]string{}
		for _, f := range readFences(t, page) {
			name := fmt.Sprintf("%s:%d", page, f.line)
			switch {
			case f.file != "":
				files[f.file] = strings.Join(f.body, "\n") + "\n"
			case f.notRun != "":
				notRun[name] = f.notRun
			case f.lang == "console":
				run++
				snapshot := make(map[string]string, len(files))
				for k, v := range files {
					snapshot[k] = v
				}
				t.Run(name, func(t *testing.T) { runConsole(t, f, snapshot) })
			case f.lang == "replies":
				run++
				t.Run(name, func(t *testing.T) { runReplies(t, f) })
			default:
				if l, ok := looksLikeExample(f.body); ok {
					t.Errorf("%s: %q reads as a command example: make the block ```console or ```replies, or put <!-- not run: why --> before it", name, l)
				}
			}
		}
	}
	keys := make([]string, 0, len(notRun))
	for k := range notRun {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("not run: %s: %s", k, notRun[k])
	}
	t.Logf("%d examples run, %d marked not run", run, len(notRun))
	if run == 0 {
		t.Fatal("found no examples: README.md and docs/ have none, or the test no longer finds them")
	}
}

// needTool finds an outside program an example needs: missing, the
// example is skipped, except under CI=true (.ci/run installs it).
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is missing; .ci/run installs it (Debian package %s)", name, pkg)
	}
	t.Skipf("%s not installed (Debian package %s)", name, pkg)
	return ""
}

// exampleTools are the outside programs examples call, by Debian package.
// curl is not one: examples get the stand-in of examplecurl_test.go.
var exampleTools = map[string]string{"redis-cli": "redis-tools"}

// consoleStep is one command of a console block and the output it shows.
type consoleStep struct {
	line       int    // in the page
	cmd        string // the command, continuation lines joined by \n
	background bool   // "$ sluice ... &"
	// session holds the commands typed at redis-cli prompts, sent to the
	// host and port of the prompt, or through cmd when it opened them.
	session          []string
	host, port       string
	want             []string
	startedByPrompts bool
}

// parseConsole splits a console block into its steps.
func parseConsole(f docFence) ([]*consoleStep, error) {
	var steps []*consoleStep
	var cur *consoleStep
	continuing := false // the last line was a command or its continuation
	for i, l := range f.body {
		line := f.line + 1 + i
		if c, ok := strings.CutPrefix(l, "$ "); ok {
			cur = &consoleStep{line: line, cmd: c}
			if words := strings.Fields(c); len(words) > 0 && words[0] == "sluice" && words[len(words)-1] == "&" {
				cur.background = true
			}
			steps = append(steps, cur)
			continuing = true
			continue
		}
		if c, ok := strings.CutPrefix(l, "> "); ok && continuing {
			cur.cmd += "\n" + c
			continue
		}
		if m := cliPrompt.FindStringSubmatch(l); m != nil {
			switch {
			case cur != nil && cur.session != nil:
			case cur != nil && continuing && !cur.background && strings.HasPrefix(cur.cmd, "redis-cli"):
				cur.session = []string{}
			default:
				cur = &consoleStep{line: line, startedByPrompts: true, session: []string{}}
				steps = append(steps, cur)
			}
			if cur.host == "" {
				cur.host, cur.port = m[1], m[2]
			}
			cur.session = append(cur.session, m[3])
			continuing = false
			continue
		}
		continuing = false
		if cur == nil {
			return nil, fmt.Errorf("line %d: output %q before any command", line, l)
		}
		if cur.background {
			return nil, fmt.Errorf("line %d: output %q after a server started with &", line, l)
		}
		cur.want = append(cur.want, l)
	}
	return steps, nil
}

// docServer is a sluice an example started, and the ports its page
// names for its listeners, by the ports they got.
type docServer struct {
	cmd    *exec.Cmd
	exited chan struct{}
	logs   bytes.Buffer
}

// listenFlags are the flags that name a listener, with the field of the
// "sluice starting" log line that gives its address and the port the page
// assumes when the flag is left out.
var listenFlags = []struct{ flag, field, port string }{
	{"addr", "addr", "9049"},
	{"http-addr", "http_addr", "9050"},
	{"check-addr", "check_addr", ""},
	{"divvy-addr", "divvy_addr", ""},
	{"rls-addr", "rls_addr", ""},
}

// startDocServer starts sluice with args in dir, each listener on a free
// port, and adds the page's port → the one it got to ports.
func startDocServer(ctx context.Context, t *testing.T, dir string, args []string, ports map[string]string) error {
	pagePorts := map[string]string{} // log field → the page's port
	for _, lf := range listenFlags {
		found := false
		for i := 0; i < len(args); i++ {
			var val *string
			switch {
			case args[i] == "--"+lf.flag && i+1 < len(args):
				val = &args[i+1]
			case strings.HasPrefix(args[i], "--"+lf.flag+"="):
				v := strings.TrimPrefix(args[i], "--"+lf.flag+"=")
				args[i] = "--" + lf.flag
				args = append(args[:i+1], append([]string{v}, args[i+1:]...)...)
				val = &args[i+1]
			default:
				continue
			}
			found = true
			host, port, ok := strings.Cut(*val, ":")
			if ok && port != "0" && port != "" {
				pagePorts[lf.field] = port
				*val = host + ":0"
			}
		}
		if !found && lf.port != "" {
			args = append(args, "--"+lf.flag, "127.0.0.1:0")
			pagePorts[lf.field] = lf.port
		}
	}
	args = append(args, "--log-format", "json")
	s := &docServer{exited: make(chan struct{})}
	s.cmd = exec.Command(os.Args[0], args...)
	s.cmd.Dir = dir
	s.cmd.Env = append(exampleEnv(), execMainEnv+"=1")
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	t.Cleanup(func() {
		s.cmd.Process.Kill()
		<-s.exited
	})
	started := make(chan map[string]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			s.logs.Write(sc.Bytes())
			s.logs.WriteByte('\n')
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "sluice starting" {
				addrs := map[string]string{}
				for k, v := range line {
					if s, ok := v.(string); ok {
						addrs[k] = s
					}
				}
				started <- addrs
			}
		}
		s.cmd.Wait()
		close(s.exited)
	}()
	select {
	case addrs := <-started:
		for field, pagePort := range pagePorts {
			_, got, ok := strings.Cut(addrs[field], ":")
			if !ok {
				return fmt.Errorf("sluice logged no %s: %v", field, addrs)
			}
			if _, dup := ports[pagePort]; dup {
				return fmt.Errorf("two servers of the example listen on port %s", pagePort)
			}
			ports[pagePort] = got
		}
		return nil
	case <-s.exited:
		return fmt.Errorf("sluice %s exited before serving:\n%s", strings.Join(args, " "), s.logs.String())
	case <-ctx.Done():
		// Its logs are whole, and no longer written, once it has exited.
		s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("sluice %s did not start: %w\n%s", strings.Join(args, " "), ctx.Err(), s.logs.String())
	}
}

// exampleEnv is the test's environment without the SLUICE_ variables a
// developer may have set, which would change what the examples print.
func exampleEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			env = append(env, kv)
		}
	}
	return env
}

// shellWords splits a command line at blanks, with '...' and "..."
// quoting and no escapes: enough for the flags of a sluice line.
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case '\'', '"':
			end := strings.IndexByte(s[i+1:], c)
			if end < 0 {
				return nil, fmt.Errorf("unbalanced %c in %q", c, s)
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// replacePorts replaces each port of m, as a whole number, in s.
func replacePorts(s string, m map[string]string) string {
	for from, to := range m {
		s = regexp.MustCompile(`\b`+regexp.QuoteMeta(from)+`\b`).ReplaceAllString(s, to)
	}
	return s
}

// exampleBin writes the programs the examples call by name: sluice (this
// test binary running main), curl (this test binary running the stand-in
// of examplecurl_test.go) and redis-cli with --no-raw, as a terminal shows
// its replies.
func exampleBin(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	scripts := map[string]string{
		"sluice": fmt.Sprintf("#!/bin/sh\n%s=1 exec %s \"$@\"\n", execMainEnv, strconv.Quote(os.Args[0])),
		"curl":   fmt.Sprintf("#!/bin/sh\n%s=1 exec %s \"$@\"\n", exampleCurlEnv, strconv.Quote(os.Args[0])),
	}
	if cli, err := exec.LookPath("redis-cli"); err == nil {
		scripts["redis-cli"] = fmt.Sprintf("#!/bin/sh\nexec %s --no-raw \"$@\"\n", strconv.Quote(cli))
	}
	for name, text := range scripts {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// exampleTimeout bounds one example, servers and commands together.
const exampleTimeout = 2 * time.Minute

func runConsole(t *testing.T, f docFence, files map[string]string) {
	steps, err := parseConsole(f)
	if err != nil {
		t.Fatalf("%s:%d: %v", f.page, f.line, err)
	}
	bash := needTool(t, "bash", "bash")
	usesServer, startsOwn := false, false
	for _, s := range steps {
		words := strings.Fields(s.cmd)
		for len(words) > 0 && strings.Contains(words[0], "=") {
			words = words[1:] // VAR=value before the command
		}
		if len(words) > 0 {
			if pkg, ok := exampleTools[words[0]]; ok {
				needTool(t, words[0], pkg)
			}
		}
		if s.session != nil {
			needTool(t, "redis-cli", "redis-tools")
			usesServer = true
		}
		startsOwn = startsOwn || s.background
		if defaultPorts.MatchString(s.cmd) {
			usesServer = true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), exampleTimeout)
	defer cancel()
	dir := t.TempDir()
	for name, text := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ports := map[string]string{} // the page's port → the server's
	if usesServer && !startsOwn {
		if err := startDocServer(ctx, t, dir, nil, ports); err != nil {
			t.Fatalf("%s:%d: %v", f.page, f.line, err)
		}
	}
	sh := startShell(ctx, t, bash, dir, exampleBin(t))
	for _, s := range steps {
		if s.background {
			words, err := shellWords(strings.TrimSuffix(strings.TrimSpace(s.cmd), "&"))
			if err != nil {
				t.Fatalf("%s:%d: %v", f.page, s.line, err)
			}
			if err := startDocServer(ctx, t, dir, words[1:], ports); err != nil {
				t.Fatalf("%s:%d: %v", f.page, s.line, err)
			}
			continue
		}
		cmd := s.cmd
		if s.session != nil {
			if s.startedByPrompts {
				cmd = "redis-cli -h " + s.host + " -p " + s.port
			}
			cmd += " <<'SLUICE_EXAMPLE_EOF'\n" + strings.Join(s.session, "\n") + "\nSLUICE_EXAMPLE_EOF"
		}
		cmd = replacePorts(cmd, ports)
		out, err := sh.run(ctx, cmd)
		if err != nil {
			t.Fatalf("%s:%d: %s: %v\nso far:\n%s", f.page, s.line, s.cmd, err, out)
		}
		back := map[string]string{}
		for from, to := range ports {
			back[to] = from
		}
		got := strings.Split(replacePorts(out, back), "\n")
		if !outputMatches(s.want, got) {
			typed := ""
			if s.session != nil {
				typed = "\n(typed: " + strings.Join(s.session, "; ") + ")"
			}
			t.Errorf("%s:%d: $ %s%s\n--- printed\n%s\n--- the page shows\n%s", f.page, s.line, s.cmd, typed, strings.Join(got, "\n"), strings.Join(s.want, "\n"))
		}
	}
}

// exampleShell is a bash the test types an example's commands into.
type exampleShell struct {
	in    io.Writer
	lines chan string
	n     int
}

func startShell(ctx context.Context, t *testing.T, bash, dir, bin string) *exampleShell {
	t.Helper()
	cmd := exec.Command(bash, "--norc", "--noprofile")
	cmd.Dir = dir
	cmd.Env = append(exampleEnv(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	sh := &exampleShell{in: in, lines: make(chan string, 64)}
	done := make(chan struct{})
	go func() {
		defer close(sh.lines)
		sc := bufio.NewScanner(r)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			select {
			case sh.lines <- sc.Text():
			case <-done:
				return
			}
		}
	}()
	// Kill the whole process group: the commands' children (a redis-cli,
	// a head reading a socket) go with the shell. Never once the shell is
	// reaped, when its group id may be another's.
	var mu sync.Mutex
	reaped := false
	kill := func() {
		mu.Lock()
		defer mu.Unlock()
		if !reaped {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}
	t.Cleanup(func() {
		in.Close()
		close(done)
		kill()
		mu.Lock()
		cmd.Wait()
		reaped = true
		mu.Unlock()
		r.Close()
	})
	go func() {
		select {
		case <-ctx.Done():
			kill()
		case <-done:
		}
	}()
	return sh
}

// run types cmd, with stdin from /dev/null, and returns what it printed.
func (sh *exampleShell) run(ctx context.Context, cmd string) (string, error) {
	sh.n++
	marker := fmt.Sprintf("SLUICE_EXAMPLE_DONE_%d", sh.n)
	// The group keeps a redirection such as exec 3<>... in the shell; the
	// newline before the marker ends output that has none.
	if _, err := fmt.Fprintf(sh.in, "{ %s\n} </dev/null 2>&1\nprintf '\\n%s\\n'\n", cmd, marker); err != nil {
		return "", err
	}
	var out []string
	for {
		select {
		case l, ok := <-sh.lines:
			if !ok {
				return strings.Join(out, "\n"), errors.New("the shell ended")
			}
			if l == marker {
				for len(out) > 0 && strings.TrimSpace(out[len(out)-1]) == "" {
					out = out[:len(out)-1]
				}
				return strings.Join(out, "\n"), nil
			}
			out = append(out, strings.TrimRight(l, "\r"))
		case <-ctx.Done():
			return strings.Join(out, "\n"), fmt.Errorf("no end within %v", exampleTimeout)
		}
	}
}

// outputMatches compares printed lines with a page's: "..." alone matches
// any number of lines, "..." in a line any text, and notes are dropped.
func outputMatches(want, got []string) bool {
	for len(want) > 0 && strings.TrimSpace(want[len(want)-1]) == "" {
		want = want[:len(want)-1]
	}
	if len(want) == 0 {
		return len(got) == 0 || len(got) == 1 && got[0] == ""
	}
	w := want[0]
	if m := outputNote.FindStringSubmatch(w); m != nil {
		w = m[1]
	}
	if w == "..." {
		for i := 0; i <= len(got); i++ {
			if outputMatches(want[1:], got[i:]) {
				return true
			}
		}
		return false
	}
	if len(got) == 0 || !lineMatches(w, got[0]) {
		return false
	}
	return outputMatches(want[1:], got[1:])
}

func lineMatches(want, got string) bool {
	if !strings.Contains(want, "...") {
		return want == got
	}
	parts := strings.Split(want, "...")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(got)
}

// runReplies sends a replies block's commands to a sluice with no flags.
func runReplies(t *testing.T, f docFence) {
	ctx, cancel := context.WithTimeout(context.Background(), exampleTimeout)
	defer cancel()
	ports := map[string]string{}
	if err := startDocServer(ctx, t, t.TempDir(), nil, ports); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + ports["9049"], MaxRetries: -1, PoolSize: 1})
	defer rdb.Close()
	for i, l := range f.body {
		line := f.line + 1 + i
		if strings.TrimSpace(l) == "" {
			continue
		}
		rest, ok := strings.CutPrefix(l, "> ")
		cmdText, replyText, ok2 := strings.Cut(rest, " -> ")
		if !ok || !ok2 {
			t.Fatalf("%s:%d: %q is not \"> command -> reply\"", f.page, line, l)
		}
		want, err := leadingReply(strings.TrimSpace(replyText))
		if err != nil {
			t.Fatalf("%s:%d: %v", f.page, line, err)
		}
		var args []any
		for _, w := range strings.Fields(cmdText) {
			args = append(args, w)
		}
		res, err := rdb.Do(ctx, args...).Result()
		if got := renderReply(res, err); got != want {
			t.Errorf("%s:%d: %s answered %s, the page shows %s", f.page, line, strings.TrimSpace(cmdText), got, want)
		}
	}
}

// leadingReply cuts the reply off the front of s, leaving the note.
func leadingReply(s string) (string, error) {
	switch {
	case strings.HasPrefix(s, "(error) "):
		return s, nil
	case strings.HasPrefix(s, "["):
		depth := 0
		for i, c := range s {
			switch c {
			case '[':
				depth++
			case ']':
				depth--
				if depth == 0 {
					return s[:i+1], nil
				}
			}
		}
		return "", fmt.Errorf("unbalanced [ in %q", s)
	case strings.HasPrefix(s, `"`):
		end := strings.IndexByte(s[1:], '"')
		if end < 0 {
			return "", fmt.Errorf("unbalanced \" in %q", s)
		}
		return s[:end+2], nil
	}
	word, _, _ := strings.Cut(s, " ")
	return word, nil
}

// renderReply writes a reply as a replies block shows it.
func renderReply(v any, err error) string {
	var rerr redis.Error
	switch {
	case errors.Is(err, redis.Nil):
		return "(nil)"
	case errors.As(err, &rerr):
		return "(error) " + rerr.Error()
	case err != nil:
		return "(failed: " + err.Error() + ")"
	}
	switch v := v.(type) {
	case int64:
		return strconv.FormatInt(v, 10)
	case string:
		return strconv.Quote(v)
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = renderReply(e, nil)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case nil:
		return "(nil)"
	}
	return fmt.Sprintf("%v", v)
}
