package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
)

// buildVersion is the version --version, INFO and sluice_build_info report.
func buildVersion() string {
	bi, _ := debug.ReadBuildInfo()
	return versionOf(version, bi)
}

// buildRevision is the VCS revision --version, INFO and sluice_build_info
// report, "" when unknown.
func buildRevision() string {
	bi, _ := debug.ReadBuildInfo()
	return revisionOf(revision, bi)
}

// versionLine is what sluice --version prints.
func versionLine(version, revision string) string {
	if revision == "" {
		revision = "unknown"
	}
	return fmt.Sprintf("sluice %s (revision %s, %s, %s/%s)", version, revision, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// pseudoVersion matches the versions the go command makes for a commit
// (v0.0.0-20261123215835-d1a3e868d854, v1.2.4-0.2026..., v1.2.3-pre.0.2026...),
// capturing the commit's first 12 hex digits and the +dirty of a build
// with uncommitted changes.
var pseudoVersion = regexp.MustCompile(`^v[0-9]+\.(?:0\.0-|[0-9]+\.[0-9]+-(?:[^+]*\.)?0\.)[0-9]{14}-([0-9a-f]{12})(\+dirty)?$`)

// revisionOf picks the revision: the one stamped with -ldflags, else the
// commit Go records from the checkout it built (vcs.revision, with -dirty
// when vcs.modified), else the commit in a pseudo-version (go install
// ...@main), else "" (go install of a release, whose version says what it
// is; go run; a build without VCS information).
func revisionOf(stamped string, bi *debug.BuildInfo) string {
	if stamped != "" {
		return stamped
	}
	if bi == nil {
		return ""
	}
	if rev, modified := vcsOf(bi); rev != "" {
		if modified {
			rev += "-dirty"
		}
		return rev
	}
	if m := pseudoVersion.FindStringSubmatch(bi.Main.Version); m != nil {
		if m[2] != "" {
			return m[1] + "-dirty"
		}
		return m[1]
	}
	return ""
}

// versionOf picks the version: the one stamped with -ldflags, else the
// module version Go records (a release tag, or a pseudo-version when
// building from a repository), else the VCS revision Go records, with
// +dirty for uncommitted changes, else "dev" (go run, go test, or a build
// without VCS information such as -buildvcs=false or a Docker context
// without .git).
func versionOf(stamped string, bi *debug.BuildInfo) string {
	if stamped != "" {
		return stamped
	}
	if bi == nil {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, modified := vcsOf(bi)
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12] // as in Go's pseudo-versions
	}
	if modified {
		rev += "+dirty"
	}
	return rev
}

// vcsOf is the commit Go recorded from the checkout it built, and whether
// the checkout had uncommitted changes; "" without VCS information.
func vcsOf(bi *debug.BuildInfo) (rev string, modified bool) {
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	return rev, modified
}

// knownEnv is every SLUICE_* variable some part of sluice reads, with the
// flag it sets: the server's and those of sluice inspect, health, backup and
// repair (the same name sets the same-named flag of each).
func knownEnv() map[string]string {
	known := map[string]string{}
	add := func(fs *flag.FlagSet) {
		fs.VisitAll(func(f *flag.Flag) {
			if !noEnv[f.Name] {
				known[envName(f.Name)] = "--" + f.Name
			}
		})
	}
	add(newFlagSet(&config{}, io.Discard))
	add(newInspectFlagSet(&inspectConfig{}, io.Discard))
	add(newHealthFlagSet(&healthConfig{}, io.Discard))
	add(newBackupFlagSet(&backupConfig{}, io.Discard))
	add(newRepairFlagSet(&repairConfig{}, io.Discard))
	return known
}

// unknownEnv is a SLUICE_* variable no flag reads, and the closest known
// one when a typo could explain it.
type unknownEnv struct {
	name, closest, flag string
}

// findUnknownEnv returns the SLUICE_* variables of environ (NAME=value
// entries, as os.Environ gives) that sluice does not read. SLUICE_VERSION
// is left to deployments; SLUICE_PORT and SLUICE_SERVICE_* are what
// Kubernetes service links and Docker links set for a service or container
// named sluice, not settings.
func findUnknownEnv(environ []string) []unknownEnv {
	known := knownEnv()
	var out []unknownEnv
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "SLUICE_") || known[name] != "" || name == "SLUICE_VERSION" ||
			name == "SLUICE_PORT" || strings.HasPrefix(name, "SLUICE_PORT_") || strings.HasPrefix(name, "SLUICE_SERVICE_") {
			continue
		}
		u := unknownEnv{name: name}
		best := -1
		for _, k := range slices.Sorted(maps.Keys(known)) {
			d := editDistance(name, k)
			// Up to two edits (a transposition is one), more for long
			// names: enough for typos, too few to pair unrelated names.
			if d <= max(2, (len(k)-len("SLUICE_"))/4) && (best < 0 || d < best) {
				best, u.closest, u.flag = d, k, known[k]
			}
		}
		out = append(out, u)
	}
	return out
}

// warnUnknownEnv logs one warning per SLUICE_* variable sluice ignores:
// a misspelt SLUICE_FSNYC would otherwise leave --fsync at its default
// without a word.
func warnUnknownEnv(environ []string, log *slog.Logger) {
	for _, u := range findUnknownEnv(environ) {
		if u.closest != "" {
			log.Warn("unknown environment variable ignored; did you mean "+u.closest+"?", "var", u.name, "closest", u.closest, "flag", u.flag)
		} else {
			log.Warn("unknown environment variable ignored: no flag reads it (sluice --help lists the variables)", "var", u.name)
		}
	}
}

// editDistance is the optimal string alignment distance: insertions,
// deletions, substitutions and transpositions of adjacent bytes each count
// one.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
