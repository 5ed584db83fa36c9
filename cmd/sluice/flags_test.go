package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

// flagCommand is sluice or one of its subcommands, for the flag tests:
// its flag set, and how to run it with arguments (args safe to run should
// a value be accepted: a fresh data directory, an address nothing serves).
type flagCommand struct {
	name string
	fs   *flag.FlagSet
	run  func(args []string, stderr io.Writer) error
}

func flagCommands(t *testing.T) []flagCommand {
	none := func(string) (string, bool) { return "", false }
	dir := t.TempDir()
	sub := func(prefix, base []string) func([]string, io.Writer) error {
		return func(args []string, stderr io.Writer) error {
			all := append(append(append([]string{}, prefix...), base...), args...)
			return runReloading(context.Background(), nil, all, none, nil, io.Discard, stderr)
		}
	}
	return []flagCommand{
		{"sluice", newFlagSet(&config{}, io.Discard), func(args []string, stderr io.Writer) error {
			_, err := parseConfig(args, none, stderr)
			return err
		}},
		{"sluice inspect", newInspectFlagSet(&inspectConfig{}, io.Discard), sub([]string{"inspect"}, []string{"--data", filepath.Join(dir, "none")})},
		{"sluice health", newHealthFlagSet(&healthConfig{}, io.Discard), sub([]string{"health"}, []string{"--http-addr", "", "--addr", "127.0.0.1:1", "--health-timeout", "1s"})},
		{"sluice backup", newBackupFlagSet(&backupConfig{}, io.Discard), sub([]string{"backup"}, []string{"--from", "127.0.0.1:1", "--out", filepath.Join(dir, "b.tar")})},
		{"sluice repair", newRepairFlagSet(&repairConfig{}, io.Discard), sub([]string{"repair"}, []string{"--data", filepath.Join(dir, "none"), "--dry-run"})},
		{"sluice cluster", newClusterFlagSet(&clusterToolConfig{}, io.Discard), sub([]string{"cluster", "show"}, []string{"--nodes", "127.0.0.1:1", "--cluster-command-timeout", "1s"})},
	}
}

// flagKind names what a flag takes, from its value's type (the same
// names in the flag package and here) or, for addresses, its name.
func flagKind(f *flag.Flag) string {
	if strings.HasSuffix(f.Name, "addr") {
		return "address"
	}
	typ := fmt.Sprintf("%T", f.Value)
	return typ[strings.LastIndexByte(typ, '.')+1:]
}

// badFlagValues are, for each kind of flag, values it refuses and what the
// error must say about each; every flag of sluice and its subcommands must
// be of a kind listed here or in goodFlagValues.
var badFlagValues = map[string][]struct{ value, want string }{
	"intValue":        {{"abc", "not a number"}, {"1.5", "not a whole number"}, {"99999999999999999999", "out of range"}},
	"int64Value":      {{"abc", "not a number"}, {"1e3", "not a whole number"}, {"99999999999999999999", "out of range"}},
	"durationValue":   {{"10", "a duration needs a unit"}, {"soon", "not a duration"}},
	"boolValue":       {{"maybe", "not a boolean"}},
	"byteSize":        {{"64mq", "not a size"}, {"1.5gb", "not a size"}, {"-5", "cannot be negative"}, {"99999999999gb", "out of range"}},
	"memoryLimit":     {{"lots", "not a memory limit"}},
	"address":         {{"9049", "a port alone is not an address"}, {"localhost", "not host:port"}, {"127.0.0.1:http", "not a number from 0 to 65535"}},
	"prefixList":      {{"10.0.0.0/33", "want networks (CIDR) or addresses"}},
	"fieldHeaderList": {{"quota", "want FIELD=Header"}},
	"stringValue":     nil, // any text; what it must be is checked after parsing
}

// TestFlagValueErrors: every flag of sluice and of its subcommands answers
// a value it refuses with an error that names the flag, says what was
// wrong and gives an example of the flag with a value it takes, and prints
// nothing else: not Go's "parse error", not the usage.
func TestFlagValueErrors(t *testing.T) {
	for _, cmd := range flagCommands(t) {
		cmd.fs.VisitAll(func(f *flag.Flag) {
			kind := flagKind(f)
			rows, ok := badFlagValues[kind]
			if !ok {
				t.Errorf("%s --%s: its kind %s has no row in badFlagValues", cmd.name, f.Name, kind)
				return
			}
			for _, r := range rows {
				var stderr bytes.Buffer
				err := cmd.run([]string{"--" + f.Name + "=" + r.value}, &stderr)
				if err == nil {
					t.Errorf("%s --%s=%s: accepted", cmd.name, f.Name, r.value)
					continue
				}
				msg := err.Error()
				for _, want := range []string{"--" + f.Name + " ", r.want, "e.g. --" + f.Name + " "} {
					if !strings.Contains(msg, want) {
						t.Errorf("%s --%s=%s: %q lacks %q", cmd.name, f.Name, r.value, msg, want)
					}
				}
				if strings.Contains(msg, "parse error") || stderr.Len() > 0 {
					t.Errorf("%s --%s=%s: %q, with %d bytes on stderr:\n%s", cmd.name, f.Name, r.value, msg, stderr.Len(), stderr.String())
				}
			}
		})
	}
}

// TestRedisSpellingsAccepted: sizes as redis.conf writes them (k = 1000,
// kb = 1024, any case), sluice's own binary units, and yes or no for a
// switch; sizes read back in the largest binary unit that divides them,
// as --help shows defaults.
func TestRedisSpellingsAccepted(t *testing.T) {
	fs := newFlagSet(&config{}, io.Discard)
	for _, tc := range []struct{ flag, value, want string }{
		{"max-bulk", "64mb", "64MiB"},
		{"max-bulk", "64MB", "64MiB"},
		{"max-bulk", "1gb", "1GiB"},
		{"max-bulk", "1G", "1000000000"},
		{"max-bulk", "100k", "100000"},
		{"max-bulk", "100kb", "100KiB"},
		{"max-bulk", "3m", "3000000"},
		{"max-bulk", "512", "512"},
		{"max-bulk", "512b", "512"},
		{"max-bulk", "16MiB", "16MiB"},
		{"max-bulk", "16 mib", "16MiB"},
		{"memory-limit", "1gb", "1GiB"},
		{"memory-limit", "auto", "auto"},
		{"sweep-interval", "0", "0s"},
		{"sweep-interval", "90s", "1m30s"},
		{"shutdown-timeout", "1h", "1h"},
		{"rls-response-headers", "yes", "true"},
		{"rls-response-headers", "no", "false"},
		{"addr", ":9049", ":9049"},
		{"addr", "[::1]:0", "[::1]:0"},
		{"http-addr", "", ""},
	} {
		if err := fs.Set(tc.flag, tc.value); err != nil {
			t.Errorf("--%s %s: %v", tc.flag, tc.value, err)
			continue
		}
		if got := fs.Lookup(tc.flag).Value.String(); got != tc.want {
			t.Errorf("--%s %s reads back as %s, want %s", tc.flag, tc.value, got, tc.want)
		}
	}
	var help bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, func(string) (string, bool) { return "", false }, &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"(default 1MiB)", "(default 10m)", "(default 64MiB)"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

// TestFlagMistakes: a mistyped flag gets the closest one (or, for a
// redis.conf name, the flag that does its job), a flag without its value
// says so, and the environment's values get the same messages naming the
// variable; none prints the usage.
func TestFlagMistakes(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{args: []string{"--maxclinets", "5"}, want: []string{"unknown flag --maxclinets: did you mean --maxclients?", "sluice --help"}},
		{args: []string{"-fsnyc=always"}, want: []string{"did you mean --fsync?"}},
		{args: []string{"--port", "9049"}, want: []string{"--port", "--addr :9049"}},
		{args: []string{"--appendfsync", "always"}, want: []string{"--fsync"}},
		{args: []string{"--no-such-thing"}, want: []string{"unknown flag --no-such-thing (sluice --help lists the flags)"}},
		{args: []string{"inspect", "--limt", "5"}, want: []string{"did you mean --limit?", "sluice inspect --help"}},
		{args: []string{"--max-bulk"}, want: []string{"--max-bulk needs a value, e.g. --max-bulk 1MiB"}},
		{args: []string{"--max-bulk", "--maxclients", "5"}, want: []string{"--max-bulk needs a value before --maxclients"}},
		{args: []string{"--rls-response-headers", "yes"}, want: []string{"switch", "--rls-response-headers=yes"}},
		{args: []string{"---fsync", "always"}, want: []string{"bad flag syntax"}},
		{args: []string{"--fsync", "always", "extra"}, want: []string{`unexpected argument "extra"`}},
		{args: []string{"--cluster-nodes", "a:1,b:1,c:1", "--cluster-replicas", "3", "--cluster-shards", "65"}, want: []string{"--cluster-shards 65: want 0 (one per node) up to 64"}},
		{args: []string{"--cluster-nodes", "a:1,b:1", "--cluster-shards", "4"}, want: []string{"--cluster-shards 4 needs --cluster-replicas 3 or 5"}},
		{env: map[string]string{"SLUICE_SWEEP_INTERVAL": "10"}, want: []string{`SLUICE_SWEEP_INTERVAL="10" (--sweep-interval): a duration needs a unit`, "e.g. SLUICE_SWEEP_INTERVAL=10s"}},
		{env: map[string]string{"SLUICE_MAXCLIENTS": "abc"}, want: []string{"SLUICE_MAXCLIENTS", "not a number", "e.g. SLUICE_MAXCLIENTS=10000"}},
		{env: map[string]string{"SLUICE_LIMIT": "lots"}, args: []string{"inspect"}, want: []string{"SLUICE_LIMIT", "e.g. SLUICE_LIMIT=100"}},
	} {
		lookup := none
		if tc.env != nil {
			lookup = func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
		}
		var stderr bytes.Buffer
		err := runReloading(context.Background(), nil, tc.args, lookup, nil, io.Discard, &stderr)
		if err == nil {
			t.Errorf("%v %v: accepted", tc.args, tc.env)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v %v: %q lacks %q", tc.args, tc.env, err, w)
			}
		}
		if stderr.Len() > 0 {
			t.Errorf("%v %v: printed %d bytes besides the error:\n%s", tc.args, tc.env, stderr.Len(), stderr.String())
		}
	}
	var stderr bytes.Buffer
	if err := runReloading(context.Background(), nil, []string{"cluster", "--help"}, none, nil, io.Discard, &stderr); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), "--nodes") {
		t.Errorf("sluice cluster --help: %v\n%s", err, stderr.String())
	}
}

// --cluster-log-keep-bytes and --cluster-log-memory refuse sizes too small
// to bound anything sensibly, naming the least they take.
func TestClusterLogFlagsRefuseTooLittle(t *testing.T) {
	for _, args := range [][]string{{"--cluster-log-keep-bytes", "32KiB"}, {"--cluster-log-memory", "0"}} {
		_, err := parseConfig(args, noEnvAt, io.Discard)
		if err == nil || !strings.Contains(err.Error(), args[0]+" "+args[1]+": want at least 64KiB") {
			t.Errorf("%v: %v, want an error naming the flag and the least it takes", args, err)
		}
	}
	cfg := mustParse(t, "--cluster-log-keep-bytes", "64KiB", "--cluster-log-memory", "64KiB")
	if cfg.clusterLogKeep != 64<<10 || cfg.clusterLogMemory != 64<<10 {
		t.Errorf("64KiB: %v, %v", cfg.clusterLogKeep, cfg.clusterLogMemory)
	}
}
