package kubernetes_test

import (
	"encoding/json"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	keyword string // upper case: FROM, RUN, CMD, ...
	args    string
}

// parseDockerfile returns the instructions of each build stage, in order.
func parseDockerfile(src string) [][]instruction {
	var stages [][]instruction
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		kw, args, _ := strings.Cut(line, " ")
		in := instruction{strings.ToUpper(kw), strings.TrimSpace(args)}
		if in.keyword == "FROM" || len(stages) == 0 {
			stages = append(stages, nil)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	for line := range strings.Lines(src) {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue // comments, also between continuation lines
		}
		if body, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	return stages
}

// find returns the arguments of every instruction with the keyword.
func find(stage []instruction, keyword string) []string {
	var out []string
	for _, in := range stage {
		if in.keyword == keyword {
			out = append(out, in.args)
		}
	}
	return out
}

// execForm decodes a JSON-array CMD or ENTRYPOINT; the shell form would run
// sluice under /bin/sh, which the image lacks and which would not pass
// SIGTERM on.
func execForm(t *testing.T, keyword string, args []string) []string {
	t.Helper()
	if len(args) != 1 {
		t.Fatalf("want one %s in the final stage, have %d", keyword, len(args))
	}
	var out []string
	if err := json.Unmarshal([]byte(args[0]), &out); err != nil {
		t.Fatalf("%s %s: want the exec (JSON array) form: %v", keyword, args[0], err)
	}
	return out
}

func TestDockerfile(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(string(raw))
	if len(stages) < 2 {
		t.Fatalf("want a multi-stage build, have %d stages", len(stages))
	}
	final := stages[len(stages)-1]
	m := load(t)
	c := m.container(t)
	src := sluiceSource(t)

	// The build: static, reproducible, version stamped into a variable that
	// exists.
	build := strings.Join(find(slices.Concat(stages[:len(stages)-1]...), "RUN"), "\n")
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main."} {
		if !strings.Contains(build, want) {
			t.Errorf("the build stage's go build lacks %s", want)
		}
	}
	for _, arg := range []string{"VERSION", "REVISION"} {
		if stamp := regexp.MustCompile(`-X main\.(\w+)=\$\{?` + arg + `\}?`).FindStringSubmatch(build); stamp == nil {
			t.Errorf("go build does not stamp $%s with -X main.<var>=${%s}", arg, arg)
		} else if !regexp.MustCompile(`(?m)^var ` + stamp[1] + ` (string )?=`).MatchString(src) {
			t.Errorf("-X main.%s: cmd/sluice has no string variable %s; the %s would silently stay unset", stamp[1], stamp[1], strings.ToLower(arg))
		}
	}

	// The user: numeric, so that the kubelet can verify runAsNonRoot, and
	// the one the StatefulSet runs as.
	users := find(final, "USER")
	if len(users) == 0 {
		t.Fatal("the final stage has no USER: it would run as root")
	}
	uid, _, _ := strings.Cut(users[len(users)-1], ":")
	n, err := strconv.ParseInt(uid, 10, 64)
	if err != nil || n == 0 {
		t.Errorf("USER %s: want a numeric, non-root user", users[len(users)-1])
	}
	if ru := m.sts().Spec.Template.Spec.SecurityContext.RunAsUser; ru == nil || *ru != n {
		t.Errorf("USER %s is not the StatefulSet's pod runAsUser", uid)
	}

	if ep := execForm(t, "ENTRYPOINT", find(final, "ENTRYPOINT")); !slices.Equal(ep, []string{"/sluice"}) {
		t.Errorf("ENTRYPOINT %q, want [\"/sluice\"]", ep)
	}
	// Defaults live in the environment, not in a CMD, which the arguments
	// of docker run replace: docker run sluice --fsync always keeps them.
	if cmds := find(final, "CMD"); len(cmds) != 0 {
		t.Errorf("CMD %s: docker run arguments replace it and lose its defaults; set SLUICE_* in ENV", cmds[0])
	}
	flags := envFlags(t, find(final, "ENV"))
	for name := range flags {
		if !strings.Contains(src, strconv.Quote(name)) {
			t.Errorf("the Dockerfile's ENV sets %s, which is no flag of cmd/sluice", "SLUICE_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
		}
	}
	if v := flags["protected-mode"]; v != "yes" {
		t.Errorf("SLUICE_PROTECTED_MODE %q, want yes", v)
	}
	withArgs := maps.Clone(flags)
	maps.Copy(withArgs, parseFlags(t, []string{"--fsync", "always"}))
	for _, f := range []string{"addr", "http-addr", "data", "backup-dir", "move-store-from"} {
		if flags[f] == "" {
			t.Errorf("the image's ENV does not set --%s; set it explicitly", f)
		} else if withArgs[f] != flags[f] {
			t.Errorf("docker run sluice --fsync always: --%s %q, want the image's %q", f, withArgs[f], flags[f])
		}
	}

	// The health check: the binary itself (no shell), a subcommand of it,
	// and a start period as long as the StatefulSet's startup probe allows
	// for replaying a log.
	hc := find(final, "HEALTHCHECK")
	if len(hc) != 1 {
		t.Fatalf("want one HEALTHCHECK in the final stage, have %d", len(hc))
	}
	opts, exec, ok := strings.Cut(hc[0], "CMD ")
	if !ok {
		t.Fatalf("HEALTHCHECK %s: want CMD", hc[0])
	}
	argv := execForm(t, "HEALTHCHECK CMD", []string{exec})
	if len(argv) < 2 || argv[0] != "/sluice" || !hasSubcommand(src, argv[1]) {
		t.Errorf("HEALTHCHECK CMD %q: want /sluice and a subcommand cmd/sluice dispatches", argv)
	}
	hcFlags := parseFlags(t, strings.Fields(opts))
	start, err := time.ParseDuration(hcFlags["start-period"])
	if err != nil {
		t.Errorf("HEALTHCHECK --start-period %q: %v", hcFlags["start-period"], err)
	}
	if sp := m.container(t).StartupProbe; sp != nil {
		if allowed := time.Duration(sp.PeriodSeconds*sp.FailureThreshold) * time.Second; start < allowed {
			t.Errorf("HEALTHCHECK --start-period %v is shorter than the startup probe's %v: a log replay marks the container unhealthy", start, allowed)
		}
	}

	// Ports: the ones the image listens on, and the StatefulSet's.
	var exposed []string
	for _, e := range find(final, "EXPOSE") {
		exposed = append(exposed, strings.Fields(e)...)
	}
	var want []string
	for _, f := range []string{"addr", "http-addr"} {
		want = append(want, strconv.Itoa(int(port(t, f, requireFlag(t, flags, f)))))
	}
	for _, p := range c.Ports {
		want = append(want, strconv.Itoa(int(p.ContainerPort)))
	}
	want = slices.Compact(slices.Sorted(slices.Values(want)))
	if !slices.Equal(want, slices.Sorted(slices.Values(exposed))) {
		t.Errorf("EXPOSE %v, want %v (the image's listen ports and the StatefulSet's container ports)", exposed, want)
	}

	// Data: a volume holding the store and the backups apart, laid out as
	// in the StatefulSet.
	var volumes []string
	for _, v := range find(final, "VOLUME") {
		volumes = append(volumes, strings.Fields(v)...)
	}
	if len(volumes) != 1 {
		t.Fatalf("VOLUME %v: want one volume, for the store and its backups", volumes)
	}
	checkVolumeLayout(t, "the image's ENV", flags, volumes[0])
	k8s := m.containerFlags(t)
	for _, f := range []string{"data", "backup-dir", "move-store-from"} {
		if k8s[f] != flags[f] {
			t.Errorf("the image's --%s %s, the StatefulSet's %s: keep them equal", f, flags[f], k8s[f])
		}
	}

	// The build: for the platform asked for (docker buildx --platform),
	// cross-compiled on the builder's own.
	buildStage := stages[len(stages)-2]
	if from := buildStage[0].args; !strings.HasPrefix(from, "--platform=$BUILDPLATFORM ") {
		t.Errorf("FROM %s: want --platform=$BUILDPLATFORM, so that the builder runs natively and cross-compiles", from)
	}
	args := strings.Join(find(buildStage, "ARG"), " ")
	for _, want := range []string{"TARGETOS", "TARGETARCH"} {
		if !slices.Contains(strings.Fields(args), want) {
			t.Errorf("the build stage does not declare ARG %s; without it the variable is empty", want)
		}
	}
	if !regexp.MustCompile(`GOOS=\$\{?TARGETOS\}? GOARCH=\$\{?TARGETARCH\}? .*go build`).MatchString(build) {
		t.Errorf("go build does not run with GOOS=$TARGETOS GOARCH=$TARGETARCH: the image would hold a binary for the builder's platform")
	}
}

// checkVolumeLayout checks where flags put the store and its backups on
// the volume mounted at vol: the store in a directory of its own directly
// in it (so that --move-store-from vol moves an older layout's store
// there), the backups on the same filesystem (CHECKPOINT hard-links the
// store's files) but not inside the store (which sluice refuses).
func checkVolumeLayout(t *testing.T, what string, flags map[string]string, vol string) {
	t.Helper()
	data := requireFlag(t, flags, "data")
	if path.Dir(data) != vol {
		t.Errorf("%s: --data %s is not a directory directly on the volume %s", what, data, vol)
	}
	if from := requireFlag(t, flags, "move-store-from"); from != vol {
		t.Errorf("%s: --move-store-from %s, want the volume %s, where older layouts kept the store", what, from, vol)
	}
	b := requireFlag(t, flags, "backup-dir")
	if !strings.HasPrefix(b, vol+"/") {
		t.Errorf("%s: --backup-dir %s is not on the volume %s: CHECKPOINT hard-links the store's files", what, b, vol)
	}
	if b == data || strings.HasPrefix(b, data+"/") {
		t.Errorf("%s: --backup-dir %s is inside --data %s, where sluice refuses checkpoints", what, b, data)
	}
}

// envFlags reads ENV instructions (KEY=value pairs) and returns the flags
// their SLUICE_* variables set, as cmd/sluice maps them.
func envFlags(t *testing.T, envs []string) map[string]string {
	t.Helper()
	flags := map[string]string{}
	for _, e := range envs {
		for _, kv := range strings.Fields(e) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || strings.ContainsAny(v, `"'$`) {
				t.Fatalf("ENV %s: write KEY=value pairs without quotes or variables; this test reads no more", e)
			}
			if name, ok := strings.CutPrefix(k, "SLUICE_"); ok {
				flags[strings.ReplaceAll(strings.ToLower(name), "_", "-")] = v
			}
		}
	}
	return flags
}

func TestParseDockerfile(t *testing.T) {
	got := parseDockerfile("# c\nFROM a AS b\nRUN x \\\n  # note\n  y\n\nFROM c\nUSER 1:1\ncmd [\"z\"]\n")
	want := [][]instruction{
		{{"FROM", "a AS b"}, {"RUN", "x  y"}},
		{{"FROM", "c"}, {"USER", "1:1"}, {"CMD", `["z"]`}},
	}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("parseDockerfile = %q, want %q", got, want)
	}
}
