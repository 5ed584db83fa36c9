package internal

import (
	"path/filepath"
	"strings"
	"testing"
)

const mod = "github.com/sluicehq/sluice/"

// TestImports keeps each package under internal/ where the server split
// put it (issue 13): below server, each importing only the standard
// library, without the packages banned for it (locks, I/O, the clock:
// those are the engine's and the server's, reached through dispatch.Ctx
// and its engine.Round), and
// the packages of this module listed for it. Pebble stays behind storage.
func TestImports(t *testing.T) {
	noIO := []string{"os", "io", "net"}
	pure := append([]string{"sync", "sync/atomic", "time"}, noIO...)
	for _, p := range []struct {
		dir    string
		banned []string
		allow  []string
	}{
		// Typed errors, made where a request goes wrong and rendered by
		// each front end: below everything.
		{"errs", pure, nil},
		// The framer, reply encoders and argument parsing: the protocol.
		{"resp", pure, []string{"internal/errs"}},
		// COMMAND DOCS records and encoders.
		{"cmddoc", pure, []string{"internal/resp"}},
		// The replies of CLUSTER INFO, SLOTS, SHARDS and NODES; net only
		// for net.ParseIP, which does no I/O.
		{"clustercmd", []string{"sync", "sync/atomic", "time", "os", "io"}, []string{"cluster", "internal/resp"}},
		// SLUICE.COUNTERHIT's wire format; it reads a bufio.Reader.
		{"counterhit", []string{"sync", "sync/atomic", "time", "os", "net"}, []string{"internal/resp", "policy"}},
		// The command entry and per-command context: a seam between the
		// RESP front end and the families.
		{"dispatch", pure, []string{"internal/engine", "internal/cmddoc"}},
		// RL.*, CL.*, FW.*, ROLL.* and HIT: requests, mutations, commands.
		{"limitcmd", pure, []string{"bucket", "keyspace", "policy", "storage", "internal/errs", "internal/resp", "internal/dispatch", "internal/cmddoc", "internal/rules"}},
		// Reads the files an operator gives: I/O, and nothing else.
		{"conffile", []string{"net", "sync", "sync/atomic", "time"}, nil},
		// The rule sets in use and the rule file's reloads (it holds a
		// lock).
		{"rules", noIO, []string{"policy", "internal/errs"}},
		// The engine under every front end: the store, the rules, typed
		// errors, a cluster node's filter of its overrides; no protocol
		// (internal/resp), no I/O but the store's.
		{"engine", noIO, []string{"bucket", "keyspace", "policy", "storage", "internal/errs", "internal/rules", "internal/peakstats", "internal/bloom"}},
		// The Bloom filter under the store and the engine: atomic words,
		// no lock, no clock, no I/O.
		{"bloom", append([]string{"sync", "time"}, noIO...), nil},
		// POLICY STATS's summaries: pure, the standard library alone.
		{"peakstats", pure, nil},
	} {
		t.Run(p.dir, func(t *testing.T) {
			files, err := filepath.Glob(filepath.Join(p.dir, "*.go"))
			if err != nil || len(files) == 0 {
				t.Fatalf("no Go files in internal/%s (%v)", p.dir, err)
			}
			for _, f := range files {
				if strings.HasSuffix(f, "_test.go") {
					continue
				}
				for _, path := range fileImports(t, f) {
					first, _, _ := strings.Cut(path, "/")
					switch {
					case contains(p.banned, path):
						t.Errorf("%s imports %s, banned there (%v)", f, path, p.banned)
					case strings.Contains(first, ".") && !contains(p.allow, strings.TrimPrefix(path, mod)):
						t.Errorf("%s imports %s: internal/%s may import only the standard library and %v", f, path, p.dir, p.allow)
					}
				}
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
