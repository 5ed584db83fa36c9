package main

import (
	"io"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestMemoryLimitInProcess: a real process sets the limit from its flags
// (auto by default), leaves GOMEMLIMIT's alone, and INFO and the log say
// which.
func TestMemoryLimitInProcess(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "") // the runtime reads empty as unset
	defaults, err := parseConfig(nil, func(string) (string, bool) { return "", false }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env    []string
		flags  []string
		limit  int64
		source string
	}{
		{nil, nil, autoMemoryLimit(defaults, pebbleOnGoHeap), "auto"},
		{nil, []string{"--memory-limit", "1GiB"}, 1 << 30, "--memory-limit"},
		{nil, []string{"--memory-limit", "0"}, 0, "off"},
		{[]string{"GOMEMLIMIT=300MiB"}, []string{"--memory-limit", "1GiB"}, 300 << 20, "GOMEMLIMIT"},
		{[]string{"GOMEMLIMIT=off"}, nil, 0, "GOMEMLIMIT"},
	} {
		p := startProcEnv(t, t.TempDir(), tc.env, tc.flags...)
		c := p.client(t)
		limit, source := infoString(t, c, "memory_limit"), infoString(t, c, "memory_limit_source")
		if limit != strconv.FormatInt(tc.limit, 10) || source != tc.source {
			t.Errorf("%v %v: INFO memory_limit:%s memory_limit_source:%s, want %d from %s", tc.env, tc.flags, limit, source, tc.limit, tc.source)
		}
		c.Close()
		p.stop(t, syscall.SIGTERM) // the logs are whole once it exited
		want := `"msg":"memory limit","bytes":` + strconv.FormatInt(tc.limit, 10) + `,"source":"` + tc.source + `"`
		if logs := p.logs.String(); !strings.Contains(logs, want) {
			t.Errorf("%v %v: log lacks %s:\n%s", tc.env, tc.flags, want, logs)
		}
	}
}
