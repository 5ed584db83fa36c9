package main

import (
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
)

func TestVersionOf(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified},
		}}
	}
	for _, tc := range []struct {
		name, stamped string
		bi            *debug.BuildInfo
		want          string
	}{
		{"ldflags win", "v1.2.3", vcs("0123456789abcdef", "true"), "v1.2.3"},
		{"module version", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261123215835-d1a3e868d854+dirty"}}, "v0.0.0-20261123215835-d1a3e868d854+dirty"},
		{"revision", "", vcs("0123456789abcdef0123", "false"), "0123456789ab"},
		{"modified revision", "", vcs("0123456789abcdef0123", "true"), "0123456789ab+dirty"},
		{"no VCS", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev"},
		{"no build info", "", nil, "dev"},
	} {
		if got := versionOf(tc.stamped, tc.bi); got != tc.want {
			t.Errorf("%s: versionOf = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestRevisionOf(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Version: "v0.1.1-0.20261123215835-d1a3e868d854+dirty"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified},
		}}
	}
	module := func(v string) *debug.BuildInfo { return &debug.BuildInfo{Main: debug.Module{Version: v}} }
	const rev = "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		name, stamped string
		bi            *debug.BuildInfo
		want          string
	}{
		{"ldflags win", "fedcba9876543210fedcba9876543210fedcba98", vcs(rev, "true"), "fedcba9876543210fedcba9876543210fedcba98"},
		{"checkout", "", vcs(rev, "false"), rev},
		{"modified checkout", "", vcs(rev, "true"), rev + "-dirty"},
		{"pseudo-version", "", module("v0.0.0-20261123215835-d1a3e868d854"), "d1a3e868d854"},
		{"pseudo-version after a tag", "", module("v0.1.1-0.20261123215835-d1a3e868d854"), "d1a3e868d854"},
		{"pseudo-version after a pre-release", "", module("v0.2.0-rc.1.0.20261123215835-d1a3e868d854"), "d1a3e868d854"},
		{"dirty pseudo-version", "", module("v0.0.0-20261123215835-d1a3e868d854+dirty"), "d1a3e868d854-dirty"},
		{"release", "", module("v0.1.0"), ""},
		{"pre-release", "", module("v0.2.0-rc.1"), ""},
		{"no VCS", "", module("(devel)"), ""},
		{"no build info", "", nil, ""},
	} {
		if got := revisionOf(tc.stamped, tc.bi); got != tc.want {
			t.Errorf("%s: revisionOf = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestVersionLine(t *testing.T) {
	tail := ", " + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")"
	if got, want := versionLine("v0.1.0", "0123abcd"), "sluice v0.1.0 (revision 0123abcd"+tail; got != want {
		t.Errorf("versionLine = %q, want %q", got, want)
	}
	if got, want := versionLine("v0.1.0", ""), "sluice v0.1.0 (revision unknown"+tail; got != want {
		t.Errorf("versionLine without a revision = %q, want %q", got, want)
	}
}

func TestFindUnknownEnv(t *testing.T) {
	got := map[string]unknownEnv{}
	for _, u := range findUnknownEnv([]string{
		"SLUICE_FSNYC=always",                                                                                   // a transposition
		"SLUICE_REQUIREPAS=x",                                                                                   // a letter missing
		"SLUICE_DATA_DIRECTORY=/data",                                                                           // no flag is close
		"SLUICE_FSYNC=always",                                                                                   // a flag
		"SLUICE_PREFIX=a",                                                                                       // sluice inspect's
		"SLUICE_HEALTH_TIMEOUT=1s",                                                                              // sluice health's
		"SLUICE_VERSION=1.2.3",                                                                                  // the deployment's own
		"SLUICE_PORT=tcp://10.0.0.1:9049", "SLUICE_PORT_9049_TCP_ADDR=10.0.0.1", "SLUICE_SERVICE_HOST=10.0.0.1", // service links
		"PATH=/bin", "SLUICEFSYNC=no",
	}) {
		got[u.name] = u
	}
	want := map[string]unknownEnv{
		"SLUICE_FSNYC":          {"SLUICE_FSNYC", "SLUICE_FSYNC", "--fsync"},
		"SLUICE_REQUIREPAS":     {"SLUICE_REQUIREPAS", "SLUICE_REQUIREPASS", "--requirepass"},
		"SLUICE_DATA_DIRECTORY": {name: "SLUICE_DATA_DIRECTORY"},
	}
	if len(got) != len(want) {
		t.Errorf("unknown variables %v, want %v", got, want)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %+v, want %+v", name, got[name], w)
		}
	}
}

// TestUnknownEnvIsLogged starts sluice with a misspelt variable: it starts
// (the variable is not an error) and warns, naming the variable and the
// one meant.
func TestUnknownEnvIsLogged(t *testing.T) {
	p := startProcEnv(t, t.TempDir(), []string{"SLUICE_FSNYC=always", "SLUICE_SERVICE_HOST=10.0.0.1"})
	p.stop(t, syscall.SIGTERM) // the logs are complete
	var found bool
	for _, line := range strings.Split(p.logs.String(), "\n") {
		var l struct{ Level, Msg, Var, Closest, Flag string }
		if json.Unmarshal([]byte(line), &l) != nil || !strings.HasPrefix(l.Msg, "unknown environment variable") {
			continue
		}
		switch l.Var {
		case "SLUICE_FSNYC":
			found = l.Level == "WARN" && l.Closest == "SLUICE_FSYNC" && l.Flag == "--fsync" && strings.Contains(l.Msg, "did you mean SLUICE_FSYNC")
		case "SLUICE_SERVICE_HOST":
			t.Errorf("warned about a service-link variable: %s", line)
		}
	}
	if !found {
		t.Errorf("no warning naming SLUICE_FSNYC and SLUICE_FSYNC:\n%s", p.logs)
	}
}
