// Package scripts_test checks what a user installs: go install from a module
// proxy, and the release build of release.sh.
package scripts_test

import (
	"archive/zip"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestGoInstall runs what a user runs, go install
// github.com/sluicehq/sluice/cmd/sluice@v0.1.0, against a module proxy made
// of this checkout: the server module and the client module it requires,
// each zipped in the proxy's layout, the way the Go module proxy serves
// them once tagged (v0.1.0 and client/v0.1.0). Every other module comes
// from the local module cache, else the configured proxy. The go command
// refuses to install a module whose go.mod has a replace directive, and a
// required version the proxy does not have, so this fails if the server
// module stops requiring the client at a real version. The installed binary
// must then run and say its version.
func TestGoInstall(t *testing.T) {
	goCmd := lookTool(t, "go")
	gitCmd := lookTool(t, "git")
	ctx := boundedContext(t)
	root := repoRoot(t)
	// The files a commit of this checkout would have: tracked ones and new
	// ones git does not ignore (node_modules, built binaries and data
	// directories stay out).
	out, err := exec.CommandContext(ctx, gitCmd, "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		if os.Getenv("CI") != "true" {
			t.Skipf("git ls-files in %s: %v (not a git checkout?)", root, err)
		}
		t.Fatalf("git ls-files in %s: %v", root, err)
	}
	files := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")

	const version = "v0.1.0"
	goMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?github\.com/sluicehq/sluice/client\s+(\S+)`).FindSubmatch(goMod)
	if m == nil {
		t.Fatal("go.mod does not require github.com/sluicehq/sluice/client")
	}
	clientVersion := string(m[1])
	// A pseudo-version would resolve here but not on the Go proxy: there is
	// no such commit. A release version is a tag, client/<version>.
	if !regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`).MatchString(clientVersion) {
		t.Fatalf("go.mod requires the client module at %s: want a released version, tagged as client/vX.Y.Z", clientVersion)
	}

	proxy := t.TempDir()
	addModule(t, proxy, root, files, "", "github.com/sluicehq/sluice", version)
	addModule(t, proxy, root, files, "client", "github.com/sluicehq/sluice/client", clientVersion)

	goEnv := func(name string) string {
		out, err := exec.CommandContext(ctx, goCmd, "env", name).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	// The module cache's download directory has the proxy's layout, so it
	// serves the modules earlier builds fetched without the network.
	proxies := []string{fileURL(proxy), fileURL(filepath.Join(goEnv("GOMODCACHE"), "cache", "download"))}
	if p := goEnv("GOPROXY"); p != "" && p != "off" {
		proxies = append(proxies, p)
	}
	gopath := t.TempDir()
	bin := filepath.Join(gopath, "bin")
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains([]string{"GOPATH", "GOMODCACHE", "GOBIN", "GOPROXY", "GONOPROXY", "GOPRIVATE",
			"GONOSUMDB", "GOSUMDB", "GOINSECURE", "GOFLAGS", "GOWORK", "GOTOOLCHAIN", "CGO_ENABLED"}, name)
	})
	env = append(env,
		"GOPATH="+gopath, "GOMODCACHE="+filepath.Join(gopath, "pkg", "mod"), "GOBIN="+bin,
		"GOPROXY="+strings.Join(proxies, ","),
		// The checksum database cannot know modules made here; the others
		// come from this machine's module cache, verified when fetched.
		"GOSUMDB=off",
		// -modcacherw: t.TempDir must be able to remove the module cache.
		"GOFLAGS=-mod=mod -modcacherw",
		"GOTOOLCHAIN=local",
		// As a release build: with -trimpath, the packages compiled from
		// the module cache are cached by module version, not directory, so
		// a second run reuses the first one's.
		"CGO_ENABLED=0",
	)
	install := exec.CommandContext(ctx, goCmd, "install", "-trimpath", "github.com/sluicehq/sluice/cmd/sluice@"+version)
	install.Dir = t.TempDir() // outside every module and workspace, as a user would be
	install.Env = env
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install github.com/sluicehq/sluice/cmd/sluice@%s: %v\n%s", version, err, out)
	}

	sluice := filepath.Join(bin, "sluice")
	got, err := exec.CommandContext(ctx, sluice, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("sluice --version: %v\n%s", err, got)
	}
	if !strings.HasPrefix(string(got), "sluice "+version+" ") && string(got) != "sluice "+version+"\n" {
		t.Errorf("sluice --version printed %q, want the module version %s", got, version)
	}
	// The binary records the client module it was built with: the version
	// go.mod requires, from the proxy, not replaced.
	got, err = exec.CommandContext(ctx, goCmd, "version", "-m", sluice).CombinedOutput()
	if err != nil {
		t.Fatalf("go version -m: %v\n%s", err, got)
	}
	if !regexp.MustCompile(`(?m)^\s*dep\s+github\.com/sluicehq/sluice/client\s+`+regexp.QuoteMeta(clientVersion)+`\s`).Match(got) ||
		strings.Contains(string(got), "=>") {
		t.Errorf("go version -m: want the client module at %s, not replaced:\n%s", clientVersion, got)
	}
}

// boundedContext ends before the test binary's deadline, so that a hung
// go command fails the test with its output rather than the whole binary.
// A first build compiles every dependency, minutes on a busy 2-core
// machine; later ones take them from the build cache.
func boundedContext(t *testing.T) context.Context {
	deadline := time.Now().Add(9 * time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-30*time.Second).Before(deadline) {
		deadline = d.Add(-30 * time.Second)
	}
	ctx, cancel := context.WithDeadline(t.Context(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// repoRoot is the checkout this package is in.
func repoRoot(t *testing.T) string {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// lookTool returns the path of a program the test needs; it skips the
// test when there is none, unless CI=true.
func lookTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no %s on PATH: %v", name, err)
		}
		t.Skipf("no %s on PATH: %v", name, err)
	}
	return p
}

// fileURL is a GOPROXY entry for a directory.
func fileURL(dir string) string {
	return "file://" + filepath.ToSlash(dir)
}

// addModule writes the module in dir (relative to root, "" for the root)
// into a file proxy at version: @v/list, .info, .mod and .zip. The zip holds
// what the go command takes from a repository tag: the module's files, less
// those of modules nested in it, and the repository's LICENSE when the
// module has none of its own.
func addModule(t *testing.T, proxy, root string, files []string, dir, modPath, version string) {
	t.Helper()
	var nested []string // directories of other modules, as prefixes
	for _, f := range files {
		if d := path.Dir(f); path.Base(f) == "go.mod" && d != "." && d != dir {
			nested = append(nested, d+"/")
		}
	}
	prefix := ""
	if dir != "" {
		prefix = dir + "/"
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	add := func(name, src string) {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		w, err := zw.Create(modPath + "@" + version + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	hasLicense := false
	for _, f := range files {
		name, ok := strings.CutPrefix(f, prefix)
		if !ok || slices.ContainsFunc(nested, func(n string) bool { return strings.HasPrefix(f, n) }) {
			continue
		}
		src := filepath.Join(root, filepath.FromSlash(f))
		if fi, err := os.Lstat(src); err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, or a link, which module zips leave out
		}
		hasLicense = hasLicense || name == "LICENSE"
		add(name, src)
	}
	if !hasLicense && dir != "" {
		if _, err := os.Stat(filepath.Join(root, "LICENSE")); err == nil {
			add("LICENSE", filepath.Join(root, "LICENSE"))
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}

	at := filepath.Join(proxy, filepath.FromSlash(modPath), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	goMod, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(prefix), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": fmt.Appendf(nil, `{"Version":%q,"Time":"2026-01-01T00:00:00Z"}`, version),
		version + ".mod":  goMod,
		version + ".zip":  buf.Bytes(),
	} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
