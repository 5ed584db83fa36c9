package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"
)

// imageConfig is what the final stage of the Dockerfile gives a container:
// its environment and its HEALTHCHECK command (exec form).
type imageConfig struct {
	env         map[string]string
	envOrder    []string
	healthcheck []string
	cmd         bool
}

// readImageConfig reads the final stage of ../../Dockerfile: instructions
// with their continuation lines joined, ENV in its key=value form.
func readImageConfig(t *testing.T) imageConfig {
	t.Helper()
	raw, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	var cur strings.Builder
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if body, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	img := imageConfig{env: map[string]string{}}
	for _, l := range lines {
		kw, args, _ := strings.Cut(l, " ")
		switch strings.ToUpper(kw) {
		case "FROM":
			img = imageConfig{env: map[string]string{}}
		case "ENV":
			for _, kv := range strings.Fields(args) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || strings.ContainsAny(v, `"'$`) {
					t.Fatalf("ENV %s: write ENV KEY=value pairs without quotes or variables; this test reads no more", args)
				}
				img.env[k] = v
				img.envOrder = append(img.envOrder, k)
			}
		case "HEALTHCHECK":
			_, exec, ok := strings.Cut(args, "CMD ")
			if !ok || json.Unmarshal([]byte(exec), &img.healthcheck) != nil {
				t.Fatalf("HEALTHCHECK %s: want CMD in the exec (JSON array) form", args)
			}
		case "CMD":
			img.cmd = true
		}
	}
	return img
}

// TestDockerfileDefaults runs the flag parsing of sluice on the image's
// environment: its defaults are SLUICE_* variables, which flags given
// after the image name add to (docker run sluice --fsync always keeps the
// address and the data volume), every variable is one sluice reads, and
// the HEALTHCHECK runs a subcommand sluice has.
func TestDockerfileDefaults(t *testing.T) {
	img := readImageConfig(t)
	if img.cmd {
		t.Errorf("the final stage has a CMD: arguments after the image name replace it, with whatever defaults it holds; put defaults in ENV")
	}
	var sluiceEnv []string
	for _, k := range img.envOrder {
		if strings.HasPrefix(k, "SLUICE_") {
			sluiceEnv = append(sluiceEnv, k+"="+img.env[k])
		}
	}
	for _, u := range findUnknownEnv(sluiceEnv) {
		t.Errorf("ENV %s: sluice reads no such variable (closest: %q)", u.name, u.closest)
	}
	lookup := func(k string) (string, bool) { v, ok := img.env[k]; return v, ok }
	cfg, err := parseConfig([]string{"--fsync", "always"}, lookup, os.Stderr)
	if err != nil {
		t.Fatalf("the image's environment plus --fsync always: %v", err)
	}
	for _, c := range []struct{ flag, got, want string }{
		{"fsync", cfg.fsync, "always"},
		{"addr", cfg.addr, ":9049"},
		{"http-addr", cfg.httpAddr, ":9050"},
		{"data", cfg.data, "/data/store"},
		{"backup-dir", cfg.backupDir, "/data/backups"},
		{"move-store-from", cfg.moveStoreFrom, "/data"},
		{"protected-mode", cfg.protectedMode, "yes"},
	} {
		if c.got != c.want {
			t.Errorf("docker run sluice --fsync always: --%s %q, want %q", c.flag, c.got, c.want)
		}
	}

	if len(img.healthcheck) < 2 || img.healthcheck[0] != "/sluice" {
		t.Fatalf("HEALTHCHECK CMD %q: want /sluice and a subcommand (the image has no shell)", img.healthcheck)
	}
	var out bytes.Buffer
	err = run(t.Context(), append(img.healthcheck[1:], "--help"), lookup, &out, &out)
	if !errors.Is(err, flag.ErrHelp) || !strings.HasPrefix(out.String(), "Usage: sluice "+img.healthcheck[1]) {
		t.Errorf("HEALTHCHECK %q: sluice %s --help: %v\n%s", img.healthcheck, img.healthcheck[1], err, out.String())
	}
	// The check reads the server's variables: it looks where the server
	// listens.
	var hc healthConfig
	fs := newHealthFlagSet(&hc, &out)
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := lookup(envName(f.Name)); ok {
			if err := fs.Set(f.Name, v); err != nil {
				t.Errorf("%s: %v", envName(f.Name), err)
			}
		}
	})
	if hc.addr != cfg.addr || hc.httpAddr != cfg.httpAddr {
		t.Errorf("sluice health in the image checks %s and %s; the server listens on %s and %s", hc.addr, hc.httpAddr, cfg.addr, cfg.httpAddr)
	}
}
