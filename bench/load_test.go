package main

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// parseArray reads one RESP array of bulk strings, as a server would.
func parseArray(t *testing.T, r *bufio.Reader) []string {
	t.Helper()
	line, err := r.ReadString('\n')
	if err != nil || line[0] != '*' {
		t.Fatalf("array header %q, %v", line, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil {
		t.Fatal(err)
	}
	args := make([]string, n)
	for i := range args {
		h, err := r.ReadString('\n')
		if err != nil || h[0] != '$' {
			t.Fatalf("bulk header %q, %v", h, err)
		}
		size, _ := strconv.Atoi(strings.TrimSpace(h[1:]))
		buf := make([]byte, size+2)
		if _, err := readFull(r, buf); err != nil || string(buf[size:]) != "\r\n" {
			t.Fatalf("bulk body %q, %v", buf, err)
		}
		args[i] = string(buf[:size])
	}
	return args
}

func TestCommandsAreWellFormed(t *testing.T) {
	w := workload{Take: 2, Max: 100, RefillMs: 60000}
	var b []byte
	b = appendCommand(b, targetSluice, w, 42, opReduce, "")
	b = appendCommand(b, targetSluice, w, 7, opGet, "")
	b = appendCommand(b, targetSluice, w, 12345, opHit, "")
	b = appendCommand(b, targetRedisINCR, w, 9, opReduce, "")
	b = appendCommand(b, targetRedisLua, w, 3, opReduce, "abc123")
	b = appendCommand(b, targetRedisLua, w, 3, opGet, "abc123")
	r := bufio.NewReader(bytes.NewReader(b))
	want := []string{
		"RL.PREDUCE k:42 100 60000 TAKE 2",
		"RL.PGET k:7 100 60000",
		"HIT path=/bench ip=k:12345",
		"INCR k:9",
		"EVALSHA abc123 1 k:3 100 60000 100 2",
		"EVALSHA abc123 1 k:3 100 60000 100 0",
	}
	for _, w := range want {
		if got := strings.Join(parseArray(t, r), " "); got != w {
			t.Fatalf("got %q, want %q", got, w)
		}
	}
	if r.Buffered() != 0 {
		t.Fatalf("%d trailing bytes", r.Buffered())
	}
}

func TestKeyDistributions(t *testing.T) {
	var seq atomic.Int64
	for _, dist := range []string{"uniform", "zipf", "seq"} {
		g := newKeyGen(workload{Keys: 1000, Dist: dist, ZipfS: 1.2}, 1, &seq)
		seen := map[int64]int{}
		for range 5000 {
			k := g.next()
			if k < 0 || k >= 1000 {
				t.Fatalf("%s: key %d outside [0, 1000)", dist, k)
			}
			seen[k]++
		}
		switch dist {
		case "seq":
			if len(seen) != 1000 {
				t.Fatalf("seq visited %d keys, want all 1000", len(seen))
			}
		case "zipf":
			if seen[0] < 500 {
				t.Fatalf("zipf: key 0 drawn %d times of 5000; not skewed", seen[0])
			}
		}
	}
}

func TestReadReply(t *testing.T) {
	r := bufio.NewReader(strings.NewReader(":5\r\n-ERR nope\r\n$3\r\nabc\r\n*2\r\n:1\r\n:2\r\n%1\r\n+a\r\n:1\r\n$-1\r\n"))
	for i, wantErr := range []bool{false, true, false, false, false, false} {
		isErr, _, err := readReply(r)
		if err != nil || isErr != wantErr {
			t.Fatalf("reply %d: isErr=%v err=%v", i, isErr, err)
		}
	}
}

func TestScenarioPresetsValid(t *testing.T) {
	o := options{w: workload{Take: 1, Max: 100, RefillMs: 60000, ZipfS: 1.2}, set: map[string]bool{}}
	for _, s := range scenarios {
		if err := validate(o.overrides(s.W)); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
	}
}
