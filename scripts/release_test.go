package scripts_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestReleaseBuild runs release.sh for this machine's platform and checks
// what it made: SHA256SUMS matches the archive, the archive holds the
// binary and the files a redistribution must carry (LICENSE), and the
// binary runs and says the version and the commit it was stamped with.
// The other platforms differ only in GOOS and GOARCH.
func TestReleaseBuild(t *testing.T) {
	bash := lookTool(t, "bash")
	gitCmd := lookTool(t, "git")
	lookTool(t, "go")
	lookTool(t, "sha256sum")
	ctx := boundedContext(t)
	root := repoRoot(t)
	head, err := exec.CommandContext(ctx, gitCmd, "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		if os.Getenv("CI") != "true" {
			t.Skipf("git rev-parse HEAD in %s: %v (not a git checkout?)", root, err)
		}
		t.Fatalf("git rev-parse HEAD in %s: %v", root, err)
	}
	const version = "v0.1.0-test.1" // not a release: no clean tree or CHANGELOG section needed
	platform := runtime.GOOS + "/" + runtime.GOARCH
	out := t.TempDir()
	cmd := exec.CommandContext(ctx, bash, filepath.Join(root, "scripts", "release.sh"), "-o", out, "-p", platform, version)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh: %v\n%s", err, msg)
	}

	name := "sluice-" + version + "-" + runtime.GOOS + "-" + runtime.GOARCH
	archive, err := os.ReadFile(filepath.Join(out, name+".tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	sums, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(archive)
	if want := hex.EncodeToString(sum[:]) + "  " + name + ".tar.gz\n"; string(sums) != want {
		t.Errorf("SHA256SUMS is\n%s\nwant\n%s", sums, want)
	}

	bin := filepath.Join(t.TempDir(), "sluice")
	var names []string
	zr, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == name+"/sluice" {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(bin, data, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range []string{"sluice", "LICENSE", "README.md", "CHANGELOG.md"} {
		if !slices.Contains(names, name+"/"+f) {
			t.Errorf("the archive lacks %s/%s; it has %q", name, f, names)
		}
	}

	got, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("sluice --version: %v\n%s", err, got)
	}
	rev := strings.TrimSpace(string(head))
	if want := "sluice " + version + " (revision " + rev; !strings.HasPrefix(string(got), want) {
		t.Errorf("sluice --version printed %q, want it to start with %q", got, want)
	}
}

// TestReleaseNeedsChangelog: a release version without its CHANGELOG.md
// section is refused before anything is built.
func TestReleaseNeedsChangelog(t *testing.T) {
	bash := lookTool(t, "bash")
	lookTool(t, "git")
	ctx := boundedContext(t)
	root := repoRoot(t)
	out := t.TempDir()
	cmd := exec.CommandContext(ctx, bash, filepath.Join(root, "scripts", "release.sh"), "-o", out, "v999.0.0")
	msg, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("release.sh v999.0.0 succeeded:\n%s", msg)
	}
	if !strings.Contains(string(msg), "CHANGELOG.md has no section") {
		t.Errorf("release.sh v999.0.0: %v, want it refused for the missing CHANGELOG.md section:\n%s", err, msg)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("release.sh v999.0.0 left %d files in %s", len(entries), out)
	}
}
