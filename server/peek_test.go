package server

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/respserver"
)

// TestPeekTranscript runs testdata/peeks.txt: the looks of every kind, and
// what they store, each as its reference answers.
func TestPeekTranscript(t *testing.T) {
	f, err := os.Open("testdata/peeks.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type step struct {
		line      int
		cmd, want string
	}
	type section struct {
		title string
		steps []step
	}
	var (
		sections []section
		pending  *step // a command waiting for its reply line
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case line == "" || line == "#" || strings.HasPrefix(line, "# "):
		case strings.HasPrefix(line, "## "):
			sections = append(sections, section{title: line[3:]})
		case pending != nil:
			pending.want = line
			pending = nil
		case strings.HasPrefix(line, "> ") && len(sections) > 0:
			s := &sections[len(sections)-1]
			s.steps = append(s.steps, step{line: n, cmd: line[2:]})
			pending = &s.steps[len(s.steps)-1]
		default:
			t.Fatalf("testdata/peeks.txt:%d: want \"## title\", \"> command\" or a comment, got %q", n, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if pending != nil || len(sections) == 0 {
		t.Fatal("testdata/peeks.txt: no sections, or a command without its reply")
	}
	ctx := context.Background()
	for _, s := range sections {
		t.Run(s.title, func(t *testing.T) {
			srv := startServer(t, Config{Clock: newTestClock(t0).now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
			c := newClient(t, srv)
			for _, st := range s.steps {
				words := strings.Fields(st.cmd)
				args := make([]any, len(words))
				for i, w := range words {
					args[i] = w
				}
				v, err := c.Do(ctx, args...).Result()
				got := renderReply(v, err)
				if got != st.want {
					t.Errorf("testdata/peeks.txt:%d: %s = %s, want %s", st.line, st.cmd, got, st.want)
				}
			}
		})
	}
}

// renderReply writes a reply as the transcript does: an integer, [a b ...]
// for an array, or the error's text.
func renderReply(v any, err error) string {
	if err != nil {
		return err.Error()
	}
	if arr, ok := v.([]any); ok {
		parts := make([]string, len(arr))
		for i, e := range arr {
			parts[i] = renderReply(e, nil)
		}
		return "[" + strings.Join(parts, " ") + "]"
	}
	return fmt.Sprint(v)
}
