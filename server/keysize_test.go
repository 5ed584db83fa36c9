package server

import (
	"context"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/resp"
)

// TestMaxKeySize checks the default --max-key-size on every command that
// names a key: a key of exactly 16 KiB is served, one byte more is refused
// with both lengths named, and the store is not touched.
func TestMaxKeySize(t *testing.T) {
	const limit = engine.DefaultMaxKeySize
	atLimit := strings.Repeat("k", limit)
	over := strings.Repeat("o", limit+1)
	const wantErr = "ERR key is 16385 bytes, longer than --max-key-size 16384"

	srv := startServer(t, Config{}) // zero: the default
	c := newClient(t, srv)
	ctx := context.Background()
	dbsize := func() int64 {
		t.Helper()
		n, err := c.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, cmd := range []string{"RL.REDUCE", "RL.PREDUCE", "RL.GET", "RL.PGET", "RL.SESSIONIZE", "RL.PSESSIONIZE"} {
		before := dbsize()
		if err := c.Do(ctx, cmd, over, 10, 60).Err(); err == nil || err.Error() != wantErr {
			t.Fatalf("%s with a %d-byte key: %v, want %q", cmd, limit+1, err, wantErr)
		}
		if n := dbsize(); n != before {
			t.Fatalf("%s with a refused key changed DBSIZE from %d to %d", cmd, before, n)
		}
		if err := c.Do(ctx, cmd, atLimit, 10, 60).Err(); err != nil {
			t.Fatalf("%s with a key of exactly --max-key-size: %v", cmd, err)
		}
	}
	// Refill 60 s and 60 ms: two buckets.
	if n := dbsize(); n != 2 {
		t.Fatalf("DBSIZE %d after the commands at the limit, want 2 buckets", n)
	}
	// The upstream argument errors still come first.
	if err := c.Do(ctx, "RL.REDUCE", over, "x", 60).Err(); err == nil || err.Error() != resp.ErrorText(errs.NotInteger) {
		t.Fatalf("RL.REDUCE with a long key and a bad max: %v, want %q", err, resp.ErrorText(errs.NotInteger))
	}

	small := startServer(t, Config{Engine: engine.Tuning{MaxKeySize: 8}})
	sc := newClient(t, small)
	if err := sc.Do(ctx, "RL.REDUCE", "123456789", 10, 60).Err(); err == nil || err.Error() != "ERR key is 9 bytes, longer than --max-key-size 8" {
		t.Fatalf("MaxKeySize 8, 9-byte key: %v", err)
	}
	if err := sc.Do(ctx, "RL.REDUCE", "12345678", 10, 60).Err(); err != nil {
		t.Fatalf("MaxKeySize 8, 8-byte key: %v", err)
	}
	info, err := c.Info(ctx, "clients").Result()
	if err != nil || !strings.Contains(info, "max_key_size:16384\r\n") {
		t.Fatalf("INFO clients lacks max_key_size:16384: %v\n%s", err, info)
	}
}

// TestMaxKeySizeHit checks the bound on HIT's counter keys, over RESP and
// the line protocol: the actor field's value is the client's part of the
// key. A refused hit takes no credit, not even from a canary rule matched
// before the deciding one.
func TestMaxKeySizeHit(t *testing.T) {
	path := policyFile(t, "p.ini", "[path=/x]\ncreditLimit = 100\nresetSeconds = 3600\nmatchPolicy = canary\nactorField = user\nlabel = canary\n\n"+
		"[path=/x ip=*]\ncreditLimit = 5\nresetSeconds = 3600\nactorField = ip\nlabel = byip\n\n"+
		"[default]\ncreditLimit = 0\nresetSeconds = 0\n")
	atLimit := strings.Repeat("a", engine.DefaultMaxKeySize)
	over := strings.Repeat("b", engine.DefaultMaxKeySize+1)
	const wantErr = "ERR value of actor field ip is 16385 bytes, longer than --max-key-size 16384"

	t.Run("resp", func(t *testing.T) {
		srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: newTestClock(t0).now})
		if got := hitRESP(t, srv, "HIT path=/x user=u ip="+over); got != "ERR "+wantErr {
			t.Fatalf("HIT with a long actor value: %q, want %q", got, "ERR "+wantErr)
		}
		if n := srv.store.Records(); n != 0 {
			t.Fatalf("a refused HIT stored %d counters", n)
		}
		if got := hitsByLabel(srv); got["canary"] != [4]int64{} || got["byip"] != [4]int64{} {
			t.Fatalf("a refused HIT was counted: %v", got)
		}
		// A long value of a field that is no rule's actor is not a key.
		if got := hitRESP(t, srv, "HIT path=/x user=u ip=1 other="+over); got != "OK true 4 3600" {
			t.Fatalf("HIT with a long non-key value: %q", got)
		}
		if got := hitRESP(t, srv, "HIT path=/x user=u ip="+atLimit); got != "OK true 4 3600" {
			t.Fatalf("HIT with an actor value of exactly --max-key-size: %q", got)
		}
		// The canary's actor value is checked too.
		if got := hitRESP(t, srv, "HIT path=/x ip=1 user="+over); got != "ERR ERR value of actor field user is 16385 bytes, longer than --max-key-size 16384" {
			t.Fatalf("HIT with a long canary actor value: %q", got)
		}
	})
	t.Run("line", func(t *testing.T) {
		srv := startServer(t, Config{Policy: policycmd.Config{File: path}, Clock: newTestClock(t0).now})
		c := dialLine(t, startDivvy(t, srv))
		c.send("HIT path=/x user=u ip=" + atLimit + "\n")
		if got := c.line(); got != "OK true 4 3600" {
			t.Fatalf("HIT with an actor value of exactly --max-key-size: %q", got)
		}
		records := srv.store.Records()
		c.send("HIT path=/x user=u ip=" + over + "\n")
		want := `ERR unknown "` + strings.TrimPrefix(wantErr, "ERR ") + `"`
		if got := c.line(); got != want {
			t.Fatalf("HIT with a long actor value: %q, want %q", got, want)
		}
		c.closed()
		if n := srv.store.Records(); n != records {
			t.Fatalf("a refused HIT changed the records from %d to %d", records, n)
		}
	})
}
