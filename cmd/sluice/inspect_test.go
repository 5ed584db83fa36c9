package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/storage"
)

// fillStore serves dir in this process, runs cmds, and closes everything.
func fillStore(t *testing.T, dir string, cmds [][]any) {
	t.Helper()
	store, err := storage.Open(dir, server.StoreOptions(storage.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	c, stop := serveStore(t, server.Config{Store: store})
	for _, cmd := range cmds {
		if err := c.Do(context.Background(), cmd...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	stop()
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
}

// serveStore serves cfg.Store in this process on 127.0.0.1:0 and returns a
// client; stop closes the client and the server, not the store.
func serveStore(t *testing.T, cfg server.Config) (c *redis.Client, stop func()) {
	t.Helper()
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	c = redis.NewClient(&redis.Options{Addr: ln.Addr().String()})
	return c, func() {
		c.Close()
		srv.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

func TestInspectListsBuckets(t *testing.T) {
	dir := t.TempDir()
	fillStore(t, dir, [][]any{
		{"RL.REDUCE", "user:1", 10, 60, "TAKE", 3, "AT", 1000},
		{"RL.REDUCE", "user:2", 5, 3600, "AT", 1000},
		{"RL.PREDUCE", "ip:1.2.3.4", 100, 1000, "AT", 1000000},
		{"RL.REDUCE", "caf\xe9", 2, 10, "AT", 1000},
	})
	noEnv := func(string) (string, bool) { return "", false }
	inspect := func(args ...string) ([]inspectRow, string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"inspect", "--data", dir}, args...), noEnv, &out, &errOut)
		var rows []inspectRow
		if strings.Contains(strings.Join(args, " "), "json") {
			sc := bufio.NewScanner(&out)
			for sc.Scan() {
				var r inspectRow
				if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
					t.Fatalf("line %q: %v", sc.Text(), err)
				}
				rows = append(rows, r)
			}
			return rows, errOut.String(), err
		}
		return nil, out.String(), err
	}

	// AT is in seconds for RL.REDUCE: the buckets were written at 1000 s.
	rowsAt := func(at int64) map[string]inspectRow {
		t.Helper()
		rows, summary, err := inspect("--format", "json", "--at", strconv.FormatInt(at, 10))
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 4 || !strings.Contains(summary, "4 records listed") {
			t.Fatalf("got %d rows (%s): %+v", len(rows), summary, rows)
		}
		byKey := map[string]inspectRow{}
		for _, r := range rows {
			byKey[r.Key+r.KeyHex] = r
		}
		return byKey
	}
	rows := rowsAt(1000_000)
	if u1 := rows["user:1"]; u1.Max != 10 || u1.Refill != 10 || u1.RefillMs != 60000 || u1.StoredTokens != 7 || u1.Tokens != 7 || u1.AnchorMs != 1000_000 {
		t.Fatalf("user:1 = %+v", u1)
	}
	if u2 := rows["user:2"]; u2.Tokens != 4 || u2.RefillMs != 3600_000 {
		t.Fatalf("user:2 = %+v", u2)
	}
	if ip := rows["ip:1.2.3.4"]; ip.RefillMs != 1000 || ip.Tokens != 99 {
		t.Fatalf("ip:1.2.3.4 = %+v", ip)
	}
	if _, ok := rows["636166e9"]; !ok {
		t.Fatalf("a key that is not UTF-8 is listed in hex: %+v", rows)
	}
	// A minute later the 60 s bucket is full again, the hourly one is not.
	rows = rowsAt(1060_000)
	if rows["user:1"].Tokens != 10 || rows["user:2"].Tokens != 4 {
		t.Fatalf("a minute later: %+v", rows)
	}
	// Idleness is judged on the server clock of the last write, as the
	// sweep judges it: ten minutes from now the 60 s bucket is idle.
	rows = rowsAt(time.Now().Add(10 * time.Minute).UnixMilli())
	if !rows["user:1"].Idle || rows["user:2"].Idle {
		t.Fatalf("idle ten minutes from now: %+v", rows)
	}

	listed, _, err := inspect("--format", "json", "--prefix", "user:")
	if err != nil || len(listed) != 2 {
		t.Fatalf("--prefix user: gave %d rows, %v", len(listed), err)
	}
	listed, _, err = inspect("--format", "json", "--limit", "1")
	if err != nil || len(listed) != 1 {
		t.Fatalf("--limit 1 gave %d rows, %v", len(listed), err)
	}
	_, text, err := inspect("--prefix", "user:2", "--at", "1000000")
	if err != nil || !strings.HasPrefix(text, "KIND ") || !strings.Contains(text, `"user:2"`) || strings.Contains(text, "user:1") {
		t.Fatalf("text output: %v\n%s", err, text)
	}
}

func TestInspectRefusesWhileServed(t *testing.T) {
	dir := t.TempDir()
	store, err := storage.Open(dir, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	err = run(context.Background(), []string{"inspect", "--data", dir}, func(string) (string, bool) { return "", false }, io.Discard, io.Discard)
	if !errors.Is(err, storage.ErrLocked) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("inspect of a store in use: got %v, want ErrLocked naming %s", err, dir)
	}
	err = run(context.Background(), []string{"inspect", "--data", dir + "/missing"}, func(string) (string, bool) { return "", false }, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("inspect of a missing directory: %v", err)
	}
}

// inspectRow is the part of a line of `sluice inspect --format json` that
// the tests read: the common fields and a token bucket's.
type inspectRow struct {
	Kind           string `json:"kind"`
	Slot           int    `json:"slot"`
	Key            string `json:"key,omitempty"`
	KeyHex         string `json:"key_hex,omitempty"` // keys that are not UTF-8
	Max            int64  `json:"max"`
	Refill         int64  `json:"refill"`
	RefillMs       int64  `json:"refill_ms"`
	Tokens         int64  `json:"tokens"`        // available at --at
	StoredTokens   int64  `json:"stored_tokens"` // as stored, before refill
	AnchorMs       int64  `json:"anchor_ms"`
	LastWriteMs    int64  `json:"last_write_ms"`
	SessionStartMs *int64 `json:"session_start_ms,omitempty"`
	Idle           bool   `json:"idle"` // the sweep deletes it
}

func TestInspectListsEveryKind(t *testing.T) {
	dir := t.TempDir()
	fillStore(t, dir, [][]any{
		{"RL.REDUCE", "user:1", 10, 60, "AT", 1000},
		{"CL.THROTTLE", "user:1", 15, 30, 60, "AT", 4102444800}, // 2100: not idle at --at
		{"FW.PINCR", "user:1", 5, 60000, "STAGGER", "AT", 4102444800000},
		{"ROLL.LIMIT", "user:1", 60000, 5, "AT", 4102444800000000},
		{"ROLL.LIMIT", "user:1", 60000, 5, "AT", 4102444700000000}, // 100 s earlier: out of the minute
	})
	noEnv := func(string) (string, bool) { return "", false }
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"inspect", "--data", dir, "--format", "json", "--at", "4102444800000"}, noEnv, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	kinds := map[string]map[string]any{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		kinds[m["kind"].(string)] = m
	}
	if len(kinds) != 4 || !strings.Contains(errOut.String(), "4 records listed") {
		t.Fatalf("listed %v (%s)", kinds, errOut.String())
	}
	g := kinds["gcra"]
	if g["key"] != "user:1" || g["tat_ns"] != float64(4102444800e9+2e9) || g["idle"] != false || g["slot"] != float64(keyspace.Slot([]byte("user:1"))) {
		t.Errorf("gcra row %v", g)
	}
	w := kinds["window"]
	if w["window_ms"] != float64(60000) || w["stagger"] != true || w["count"] != float64(1) || w["idle"] != false {
		t.Errorf("window row %v", w)
	}
	l := kinds["log"]
	if l["interval_ms"] != float64(60000) || l["entries"] != float64(2) || l["live"] != float64(1) || l["idle"] != false ||
		l["oldest_us"] != float64(4102444800000000) || l["newest_us"] != float64(4102444700000000) {
		t.Errorf("log row %v", l)
	}
	out.Reset()
	errOut.Reset()
	if err := run(context.Background(), []string{"inspect", "--data", dir, "--kind", "log", "--at", "4102444860000"}, noEnv, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "log ") || !strings.Contains(lines[1], "entries=2 live=0") || !strings.HasSuffix(lines[1], "yes") {
		t.Errorf("--kind log a minute later:\n%s", out.String())
	}
	out.Reset()
	errOut.Reset()
	if err := run(context.Background(), []string{"inspect", "--data", dir, "--kind", "window"}, noEnv, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "window ") || !strings.Contains(lines[1], "window_ms=60000 stagger") {
		t.Errorf("--kind window:\n%s", out.String())
	}
	if err := run(context.Background(), []string{"inspect", "--data", dir, "--kind", "nope"}, noEnv, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "bucket, divvy, gcra, window, log") {
		t.Errorf("--kind nope: %v", err)
	}
}
