package client_test

import (
	"context"
	"errors"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/client/internal/sluicetest"
)

func TestMain(m *testing.M) { os.Exit(sluicetest.Main(m)) }

// start runs a real sluice and returns a go-redis client for it. The sweep
// is off: the tests replay times in the past, whose records the sweep would
// find idle and delete between two calls.
func start(t *testing.T, flags ...string) (*sluicetest.Proc, *redis.Client) {
	t.Helper()
	p := sluicetest.Start(t, t.TempDir(), append([]string{"--sweep-interval", "0"}, flags...)...)
	return p, dial(t, p.Addr, "")
}

func dial(t *testing.T, addr, password string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, Password: password, MaxRetries: -1, DialTimeout: time.Minute, ReadTimeout: time.Minute})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// at is a clock standing at t (Unix ms), for replies that do not depend on
// when the test runs.
func at(ms int64) func() time.Time {
	return func() time.Time { return time.UnixMilli(ms) }
}

func sec(n int64) time.Duration { return time.Duration(n) * time.Second }

// TestKindsOverRESP replays the examples of docs/protocol.md through the
// client against a real sluice: every reply field lands in the Result.
func TestKindsOverRESP(t *testing.T) {
	_, rdb := start(t)
	ctx := context.Background()
	const t0 = 1700000000000 // ms

	t.Run("FixedWindow", func(t *testing.T) {
		w := client.FixedWindow{Limit: 5, Window: 300 * time.Second}
		c := client.New(rdb, client.Config{Now: at(t0)})
		res, err := c.Take(ctx, "user:42", w, 1)
		want := client.Result{Allowed: true, Limit: 5, Remaining: 4, Used: 1, RetryAfter: client.NoRetry, ResetAfter: sec(100), ResetAt: time.Unix(1700000100, 0)}
		check(t, "FW.PINCR user:42 5 300000 COST 1 AT t0", res, err, want)
		c = client.New(rdb, client.Config{Now: at(t0 + 1000)})
		res, err = c.Take(ctx, "user:42", w, 4)
		want = client.Result{Allowed: true, Limit: 5, Remaining: 0, Used: 5, RetryAfter: client.NoRetry, ResetAfter: sec(99), ResetAt: time.Unix(1700000100, 0)}
		check(t, "COST 4 at t0+1s", res, err, want)
		c = client.New(rdb, client.Config{Now: at(t0 + 5000)})
		res, err = c.Peek(ctx, "user:42", w, 1)
		want = client.Result{Allowed: false, Limit: 5, Remaining: 0, Used: 5, RetryAfter: sec(95), ResetAfter: sec(95), ResetAt: time.Unix(1700000100, 0)}
		check(t, "Peek at t0+5s", res, err, want)
		res, err = c.Take(ctx, "user:42", w, 1)
		want.Used = 6
		check(t, "Take at t0+5s (refused, counted)", res, err, want)
		nc := w
		nc.NoCountBlocked = true
		res, err = c.Take(ctx, "user:42", nc, 1)
		check(t, "Take at t0+5s, NoCountBlocked", res, err, want)
		res, err = c.Take(ctx, "user:42", w, 6)
		want = client.Result{Allowed: false, Limit: 5, Remaining: 0, Used: 12, RetryAfter: client.NoRetry, ResetAfter: sec(95), ResetAt: time.Unix(1700000100, 0)}
		check(t, "cost above the limit: waiting cannot help", res, err, want)
		c = client.New(rdb, client.Config{Now: at(t0)})
		res, err = c.Take(ctx, "ip:10.0.0.7", client.FixedWindow{Limit: 100, Window: time.Minute, Stagger: true}, 1)
		// The spec's offset: FNV-1a of the key mod the window; the window
		// ends at the next instant t with t mod 60 s = offset.
		h := fnv.New64a()
		h.Write([]byte("ip:10.0.0.7"))
		offset := int64(h.Sum64() % 60000)
		end := t0 - t0%60000 + offset
		if end <= t0 {
			end += 60000
		}
		want = client.Result{Allowed: true, Limit: 100, Remaining: 99, Used: 1, RetryAfter: client.NoRetry, ResetAfter: time.Duration(end-t0) * time.Millisecond, ResetAt: time.UnixMilli(end)}
		check(t, "STAGGER", res, err, want)
		if got := (res.ResetAfter + time.Second - 1) / time.Second; got != 29 {
			t.Errorf("STAGGER: reset after %v, protocol.md's example says 29 s rounded up", res.ResetAfter)
		}
	})

	t.Run("GCRA", func(t *testing.T) {
		g := client.GCRA{Count: 30, Period: time.Minute, Burst: 16}
		c := client.New(rdb, client.Config{Now: at(t0)})
		res, err := c.Take(ctx, "user123", g, 1)
		want := client.Result{Allowed: true, Limit: 16, Remaining: 15, Used: 1, RetryAfter: client.NoRetry, ResetAfter: sec(2), ResetAt: time.UnixMilli(t0 + 2000)}
		check(t, "CL.PTHROTTLE user123 15 30 60000 1 AT t0", res, err, want)
		res, err = c.Take(ctx, "user123", g, 30)
		want = client.Result{Allowed: false, Limit: 16, Remaining: 15, Used: 1, RetryAfter: client.NoRetry, ResetAfter: sec(2), ResetAt: time.UnixMilli(t0 + 2000)}
		check(t, "quantity 30 > 16: never", res, err, want)
		res, err = c.Take(ctx, "user123", g, 15)
		want = client.Result{Allowed: true, Limit: 16, Remaining: 0, Used: 16, RetryAfter: client.NoRetry, ResetAfter: sec(32), ResetAt: time.UnixMilli(t0 + 32000)}
		check(t, "the rest of the burst", res, err, want)
		res, err = c.Peek(ctx, "user123", g, 1)
		want = client.Result{Allowed: false, Limit: 16, Remaining: 0, Used: 16, RetryAfter: sec(2), ResetAfter: sec(32), ResetAt: time.UnixMilli(t0 + 32000)}
		check(t, "Peek 1 on an empty burst: one emission interval", res, err, want)
		res, err = c.Peek(ctx, "user123", g, 3)
		want.RetryAfter = sec(6)
		check(t, "Peek 3: three intervals", res, err, want)
		res, err = c.Take(ctx, "user123", g, 1)
		want.RetryAfter = sec(2)
		check(t, "Take on an empty burst", res, err, want)
		// The zero Burst is Count: "5 per 300 s" lets 5 through at once.
		res, err = c.Take(ctx, "five", client.GCRA{Count: 5, Period: 300 * time.Second}, 1)
		want = client.Result{Allowed: true, Limit: 5, Remaining: 4, Used: 1, RetryAfter: client.NoRetry, ResetAfter: sec(60), ResetAt: time.UnixMilli(t0 + 60000)}
		check(t, "Burst 0", res, err, want)
	})

	t.Run("TokenBucket", func(t *testing.T) {
		b := client.TokenBucket{Max: 10, Refill: time.Minute}
		c := client.New(rdb, client.Config{Now: at(1000_000)})
		res, err := c.Take(ctx, "rl:user:42", b, 1)
		want := client.Result{Allowed: true, Limit: 10, Remaining: 9, Used: 1, RetryAfter: client.NoRetry, ResetAfter: time.Minute, ResetAt: time.UnixMilli(1000_000 + 60_000)}
		check(t, "RL.PREDUCE rl:user:42 10 60000 TAKE 1 AT 1000000", res, err, want)
		res, err = c.Peek(ctx, "rl:user:42", b, 9)
		want = client.Result{Allowed: true, Limit: 10, Remaining: 9, Used: 1, RetryAfter: client.NoRetry, ResetAfter: time.Minute, ResetAt: time.UnixMilli(1000_000 + 60_000)}
		check(t, "RL.PGET, 9 fit", res, err, want)
		res, err = c.Take(ctx, "rl:user:42", b, 20)
		want = client.Result{Allowed: false, Limit: 10, Remaining: 0, Used: 10, RetryAfter: client.NoRetry, ResetAfter: time.Minute, ResetAt: time.UnixMilli(1000_000 + 60_000)}
		check(t, "TAKE 20 > Max: refused, the bucket drained", res, err, want)
		c = client.New(rdb, client.Config{Now: at(1060_000)})
		res, err = c.Peek(ctx, "rl:user:42", b, 1)
		want = client.Result{Allowed: true, Limit: 10, Remaining: 10, Used: 0, RetryAfter: client.NoRetry, ResetAfter: 0, ResetAt: time.UnixMilli(1060_000)}
		check(t, "one period later: full", res, err, want)

		// 2 tokens per 10 s, one refilled at a time: retry and reset count
		// whole refills.
		slow := client.TokenBucket{Max: 4, Refill: 10 * time.Second, RefillAmount: 1}
		res, err = c.Take(ctx, "slow", slow, 4)
		want = client.Result{Allowed: true, Limit: 4, Remaining: 0, Used: 4, RetryAfter: client.NoRetry, ResetAfter: sec(40), ResetAt: time.UnixMilli(1060_000 + 40_000)}
		check(t, "emptied", res, err, want)
		res, err = c.Take(ctx, "slow", slow, 2)
		want.Allowed, want.RetryAfter = false, sec(20)
		check(t, "2 more: two refills away", res, err, want)

		sc := client.New(rdb, client.Config{Now: at(1003_000)})
		res, start, err := sc.Sessionize(ctx, "sess", client.TokenBucket{Max: 2, Refill: 10 * time.Second}, 1)
		want = client.Result{Allowed: true, Limit: 2, Remaining: 1, Used: 1, RetryAfter: client.NoRetry, ResetAfter: sec(10), ResetAt: time.UnixMilli(1013_000)}
		check(t, "RL.PSESSIONIZE", res, err, want)
		if !start.Equal(time.UnixMilli(1003_000)) {
			t.Errorf("session start %v, want the allowed request's time", start)
		}

		// Periods past 2^31 ms go through the seconds forms.
		long := client.TokenBucket{Max: 3, Refill: 30 * 24 * time.Hour}
		res, err = c.Take(ctx, "long", long, 1)
		want = client.Result{Allowed: true, Limit: 3, Remaining: 2, Used: 1, RetryAfter: client.NoRetry, ResetAfter: 30 * 24 * time.Hour, ResetAt: time.UnixMilli(1060_000).Add(30 * 24 * time.Hour)}
		check(t, "RL.REDUCE with a 30-day period", res, err, want)
	})

	t.Run("SlidingLog", func(t *testing.T) {
		// The spec's example: 3 per 10 ms, 2 ms apart; AT in µs.
		l := client.SlidingLog{Interval: 10 * time.Millisecond, Max: 3, MinGap: 2 * time.Millisecond}
		us := func(v int64) *client.Client {
			return client.New(rdb, client.Config{Now: func() time.Time { return time.UnixMicro(v) }})
		}
		ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
		res, err := us(0).Take(ctx, "ex", l, 1)
		want := client.Result{Allowed: true, Limit: 3, Remaining: 2, Used: 1, RetryAfter: client.NoRetry, ResetAfter: ms(10), ResetAt: time.UnixMicro(10000)}
		check(t, "ROLL.LIMIT ex 10 3 MINDIFF 2 AT 0 -> [0,0,0,2,2]", res, err, want)
		res, err = us(4000).Take(ctx, "ex", l, 1)
		want = client.Result{Allowed: true, Limit: 3, Remaining: 1, Used: 2, RetryAfter: client.NoRetry, ResetAfter: ms(10), ResetAt: time.UnixMicro(14000)}
		check(t, "AT 4000 -> [0,0,0,2,1]", res, err, want)
		res, err = us(5000).Take(ctx, "ex", l, 1)
		want = client.Result{Allowed: false, Limit: 3, Remaining: 0, Used: 3, RetryAfter: ms(5), ResetAfter: ms(10), ResetAt: time.UnixMicro(15000)}
		check(t, "AT 5000 -> [1,0,1,5,0]: too close, recorded", res, err, want)
		res, err = us(8000).Take(ctx, "ex", l, 1)
		want = client.Result{Allowed: false, Limit: 3, Remaining: 0, Used: 4, RetryAfter: ms(6), ResetAfter: ms(10), ResetAt: time.UnixMicro(18000)}
		check(t, "AT 8000 -> [1,1,0,6,0]: 4 in 10 ms", res, err, want)
		// Peek records nothing: Used is the log's live actions (4000, 5000,
		// 8000), ResetAfter the Interval, an upper bound.
		res, err = us(11000).Peek(ctx, "ex", l, 1)
		want = client.Result{Allowed: false, Limit: 3, Remaining: 0, Used: 3, RetryAfter: ms(4), ResetAfter: ms(10), ResetAt: time.UnixMicro(21000)}
		check(t, "ROLL.WOULDLIMIT AT 11000 -> [1,1,0,4,0]", res, err, want)
		res, err = us(17000).Peek(ctx, "ex", l, 1)
		want = client.Result{Allowed: true, Limit: 3, Remaining: 1, Used: 1, RetryAfter: client.NoRetry, ResetAfter: ms(10), ResetAt: time.UnixMicro(27000)}
		check(t, "ROLL.WOULDLIMIT AT 17000 -> [0,0,0,2,1]", res, err, want)
		res, err = us(17000).Take(ctx, "ex", l, 0)
		check(t, "Take of 0 looks as Peek", res, err, want)

		// ROLL.CLEAR deletes the log only.
		fw := client.FixedWindow{Limit: 5, Window: time.Second}
		if _, err := us(17000).Take(ctx, "ex", fw, 1); err != nil {
			t.Fatal(err)
		}
		if ok, err := us(17000).ClearLog(ctx, "ex"); !ok || err != nil {
			t.Fatalf("ClearLog: %v, %v; want true", ok, err)
		}
		if ok, err := us(17000).ClearLog(ctx, "ex"); ok || err != nil {
			t.Fatalf("ClearLog again: %v, %v; want false", ok, err)
		}
		res, err = us(17000).Peek(ctx, "ex", l, 1)
		want = client.Result{Allowed: true, Limit: 3, Remaining: 2, Used: 0, RetryAfter: client.NoRetry, ResetAt: time.UnixMicro(17000)}
		check(t, "Peek after ClearLog: an empty log", res, err, want)
		if res, err := us(17000).Peek(ctx, "ex", fw, 1); err != nil || res.Used != 1 {
			t.Errorf("the fixed window after ClearLog: %+v, %v; want it kept, Used 1", res, err)
		}

		// NoCountBlocked: the refusal at 5000 is not recorded, so 6000 is
		// 2 ms after 4000 and allowed.
		l.NoCountBlocked = true
		for _, at := range []int64{0, 4000} {
			if _, err := us(at).Take(ctx, "ncb", l, 1); err != nil {
				t.Fatal(err)
			}
		}
		res, err = us(5000).Take(ctx, "ncb", l, 1)
		want = client.Result{Allowed: false, Limit: 3, Remaining: 0, Used: 2, RetryAfter: ms(5), ResetAfter: ms(10), ResetAt: time.UnixMicro(15000)}
		check(t, "NoCountBlocked at 5000: refused, not recorded", res, err, want)
		res, err = us(6000).Take(ctx, "ncb", l, 1)
		want = client.Result{Allowed: true, Limit: 3, Remaining: 0, Used: 3, RetryAfter: client.NoRetry, ResetAfter: ms(10), ResetAt: time.UnixMicro(16000)}
		check(t, "NoCountBlocked at 6000: allowed", res, err, want)
		res, err = us(7000).Take(ctx, "ncb", l, 1)
		want = client.Result{Allowed: false, Limit: 3, Remaining: 0, Used: 3, RetryAfter: ms(7), ResetAfter: ms(10), ResetAt: time.UnixMicro(17000)}
		check(t, "NoCountBlocked at 7000: full and too close", res, err, want)
	})

	t.Run("Del", func(t *testing.T) {
		c := client.New(rdb, client.Config{Now: at(t0)})
		n, err := c.Del(ctx, "user:42", "user123", "never-seen")
		if err != nil || n != 2 {
			t.Fatalf("Del: %d, %v; want 2", n, err)
		}
		res, err := c.Take(ctx, "user:42", client.FixedWindow{Limit: 5, Window: 300 * time.Second}, 1)
		if err != nil || res.Remaining != 4 {
			t.Fatalf("after Del: %+v, %v; want a fresh window", res, err)
		}
	})
}

// TestHit: HIT's three integers in a Result, against a real rule file.
func TestHit(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "rules.ini")
	if err := os.WriteFile(rules, []byte("[method=GET path=/cookies ip=*]\ncreditLimit = 2\nresetSeconds = 3600\nactorField = ip\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, rdb := start(t, "--policy", rules)
	c := client.New(rdb, client.Config{})
	ctx := context.Background()
	for i, want := range []client.Result{
		{Allowed: true, Remaining: 1, RetryAfter: client.NoRetry, ResetAfter: time.Hour},
		{Allowed: true, Remaining: 0, RetryAfter: client.NoRetry, ResetAfter: time.Hour},
		{Allowed: false, Remaining: 0, RetryAfter: time.Hour, ResetAfter: time.Hour},
	} {
		res, err := c.Hit(ctx, "method=GET", "path=/cookies", "ip=1.2.3.4")
		if err != nil {
			t.Fatal(err)
		}
		// The window started at the first hit, by the server's clock: its
		// reset is within the hour, in whole seconds.
		if res.ResetAfter <= 0 || res.ResetAfter > time.Hour || res.ResetAfter%time.Second != 0 {
			t.Errorf("hit %d: reset after %v, want whole seconds up to an hour", i+1, res.ResetAfter)
		}
		if !want.Allowed && res.RetryAfter != res.ResetAfter {
			t.Errorf("hit %d refused: retry after %v, want the reset, %v", i+1, res.RetryAfter, res.ResetAfter)
		}
		if want.RetryAfter > 0 {
			want.RetryAfter = res.RetryAfter
		}
		res.ResetAt, res.ResetAfter = time.Time{}, want.ResetAfter
		if res != want {
			t.Errorf("hit %d: %+v, want %+v", i+1, res, want)
		}
	}
	res, err := c.Hit(ctx, "method=POST")
	if err != nil || res.Allowed || res.RetryAfter != client.NoRetry {
		t.Errorf("the always-deny default: %+v, %v; want refused for good", res, err)
	}
	_, err = c.Hit(ctx, "method")
	wantKind(t, "a field without =", err, client.ErrArgument, "ERR HIT argument")
}

// TestServerClock: without a Config clock no AT is sent, and the reset
// instants are reckoned from the local clock.
func TestServerClock(t *testing.T) {
	_, rdb := start(t)
	c := client.New(rdb, client.Config{})
	ctx := context.Background()
	before := time.Now()
	res, err := c.Take(ctx, "k", client.GCRA{Count: 1, Period: time.Hour}, 1)
	after := time.Now()
	if err != nil || !res.Allowed || res.ResetAfter != time.Hour {
		t.Fatalf("GCRA on the server clock: %+v, %v", res, err)
	}
	if res.ResetAt.Before(before.Add(time.Hour)) || res.ResetAt.After(after.Add(time.Hour)) {
		t.Errorf("ResetAt %v: want an hour after the call", res.ResetAt)
	}
	res, err = c.Take(ctx, "w", client.FixedWindow{Limit: 1, Window: time.Hour}, 1)
	if err != nil || !res.Allowed || res.ResetAt.UnixMilli()%3600_000 != 0 {
		t.Fatalf("FW on the server clock: %+v, %v; want a window aligned to the hour", res, err)
	}
}

func check(t *testing.T, what string, res client.Result, err error, want client.Result) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if res.ResetAt.Equal(want.ResetAt) {
		res.ResetAt = want.ResetAt
	}
	if res != want {
		t.Errorf("%s:\n got %+v\nwant %+v", what, res, want)
	}
}

// TestErrorKinds: every way a call can fail lands in one of the four
// kinds, with the server's text and the underlying error kept.
func TestErrorKinds(t *testing.T) {
	ctx := context.Background()
	w := client.FixedWindow{Limit: 5, Window: time.Minute}

	t.Run("client-side arguments", func(t *testing.T) {
		c := client.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), client.Config{})
		for _, tc := range []struct {
			lim  client.Limit
			n    int64
			want string
		}{
			{client.FixedWindow{Limit: -1, Window: time.Second}, 1, "FixedWindow.Limit -1: want 0 or more"},
			{client.FixedWindow{Limit: 1, Window: 1500 * time.Microsecond}, 1, "FixedWindow.Window 1.5ms: want a whole number of milliseconds"},
			{client.FixedWindow{Limit: 1, Window: time.Second}, -1, "cost -1: want 0 or more"},
			{client.GCRA{Count: 0, Period: time.Second}, 1, "GCRA.Count 0: want 1 or more"},
			{client.GCRA{Count: 1, Period: 0}, 1, "GCRA.Period 0s"},
			{client.TokenBucket{Max: 0, Refill: time.Second}, 1, "TokenBucket.Max 0"},
			{client.TokenBucket{Max: 1, Refill: 30*24*time.Hour + time.Millisecond}, 1, "want at most 2147483647ms, or a whole number of seconds"},
			{client.SlidingLog{Interval: 0, Max: 1}, 1, "SlidingLog.Interval 0s: want a whole number of milliseconds, at least 1ms"},
			{client.SlidingLog{Interval: 1500 * time.Microsecond, Max: 1}, 1, "SlidingLog.Interval 1.5ms"},
			{client.SlidingLog{Interval: time.Second, Max: 0}, 1, "SlidingLog.Max 0: want 1 to 100000"},
			{client.SlidingLog{Interval: time.Second, Max: 100001}, 1, "SlidingLog.Max 100001: want 1 to 100000"},
			{client.SlidingLog{Interval: time.Second, Max: 1, MinGap: -time.Millisecond}, 1, "SlidingLog.MinGap -1ms: want a whole number of milliseconds, 0 or more"},
			{client.SlidingLog{Interval: time.Second, Max: 1, MinGap: 1500 * time.Microsecond}, 1, "SlidingLog.MinGap 1.5ms"},
			{client.SlidingLog{Interval: time.Second, Max: 1}, 2, "cost 2: want 1 (one action per call), or 0"},
			{client.SlidingLog{Interval: time.Second, Max: 1}, -1, "cost -1: want 1"},
		} {
			_, err := c.Take(ctx, "k", tc.lim, tc.n)
			if !errors.Is(err, client.ErrArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%+v take %d: %v; want ErrArgument saying %q", tc.lim, tc.n, err, tc.want)
			}
			if tc.n == 1 && tc.lim.Validate() == nil {
				t.Errorf("%+v: Validate accepts it", tc.lim)
			}
		}
	})

	t.Run("real sluice", func(t *testing.T) {
		p, rdb := start(t, "--max-key-size", "64")
		c := client.New(rdb, client.Config{})
		_, err := c.Take(ctx, strings.Repeat("k", 65), w, 1)
		wantKind(t, "a key over --max-key-size", err, client.ErrArgument, "ERR key is 65 bytes, longer than --max-key-size 64")
		_, err = c.Take(ctx, "k", client.GCRA{Count: 2_000_000, Period: time.Millisecond}, 1)
		wantKind(t, "a rate above one per ns", err, client.ErrArgument, "ERR count: 2000000: rate too high")
		_, err = c.Hit(ctx, "method=GET")
		wantKind(t, "HIT without --policy", err, client.ErrUnsupported, "ERR no policy loaded")

		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err = c.Take(cctx, "k", w, 1)
		wantKind(t, "a cancelled context", err, client.ErrUnavailable, "context canceled")
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%v: does not wrap context.Canceled", err)
		}

		p.Kill()
		_, err = c.Take(ctx, "k", w, 1)
		wantKind(t, "sluice killed", err, client.ErrUnavailable, "")
		_, err = client.New(dial(t, p.Addr, ""), client.Config{}).Take(ctx, "k", w, 1)
		wantKind(t, "sluice down, a new connection", err, client.ErrUnavailable, "connection refused")
	})

	t.Run("auth", func(t *testing.T) {
		p, _ := start(t, "--requirepass", "s3cret")
		_, err := client.New(dial(t, p.Addr, ""), client.Config{}).Take(ctx, "k", w, 1)
		wantKind(t, "no password", err, client.ErrAuth, "NOAUTH")
		_, err = client.New(dial(t, p.Addr, "wrong"), client.Config{}).Take(ctx, "k", w, 1)
		wantKind(t, "wrong password", err, client.ErrAuth, "WRONGPASS")
		res, err := client.New(dial(t, p.Addr, "s3cret"), client.Config{}).Take(ctx, "k", w, 1)
		if err != nil || !res.Allowed {
			t.Fatalf("right password: %+v, %v", res, err)
		}
	})

	// The replies a real sluice gives only in rare states (a failing
	// disk, a shutdown, a corrupt record), word for word, from a stand-in
	// server; the disk-full case also runs against a real sluice in
	// client/httplimit.
	t.Run("server texts", func(t *testing.T) {
		for _, tc := range []struct {
			reply string
			want  error
		}{
			{"ERR store unavailable: writes to the data directory are failing (disk full or I/O error); the server retries and takes changes again by itself", client.ErrUnavailable},
			{"ERR store unavailable: a write to the data directory failed; see the server log", client.ErrUnavailable},
			{"ERR store read failed; see the server log", client.ErrUnavailable},
			{"ERR stored state is corrupt; see the server log", client.ErrUnavailable},
			{"ERR stored bucket state is corrupt; see the server log", client.ErrUnavailable},
			{"ERR server is shutting down", client.ErrUnavailable},
			{"ERR internal error", client.ErrUnavailable},
			{"ERR max number of clients reached", client.ErrUnavailable},
			{"ERR client memory limit reached: the buffers of all clients exceed --maxmemory-clients; closing the connection", client.ErrUnavailable},
			{"LOADING Redis is loading the dataset in memory", client.ErrUnavailable},
			{"NOAUTH Authentication required.", client.ErrAuth},
			{"WRONGPASS invalid username-password pair or user is disabled.", client.ErrAuth},
			{"DENIED sluice is running in protected mode because protected mode is enabled and no password is set.", client.ErrAuth},
			{"ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?", client.ErrAuth},
			{"ERR unknown command 'fw.pincr', with args beginning with: 'k' '5' '60000' ", client.ErrUnsupported},
			{"ERR no policy loaded: start sluice with --policy FILE (a divvy .ini or .json rule file)", client.ErrUnsupported},
			{"ERR wrong number of arguments for 'fw.pincr' command", client.ErrArgument},
			{"ERR limit: -5: want 0 or more", client.ErrArgument},
			{"ERR syntax error at \"STRICT\": want COST, AT, NOCOUNTBLOCKED or STAGGER", client.ErrArgument},
			{"ERR value is not an integer or out of range", client.ErrArgument},
			{"ERR key is 16385 bytes, longer than --max-key-size 16384", client.ErrArgument},
		} {
			addr := sluicetest.Serve(t, func([]string) string { return "-" + tc.reply + "\r\n" })
			rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1})
			_, err := client.New(rdb, client.Config{}).Take(ctx, "k", w, 1)
			rdb.Close()
			wantKind(t, tc.reply, err, tc.want, tc.reply)
			var re redis.Error
			if !errors.As(err, &re) {
				t.Errorf("%q: %v does not wrap the redis.Error", tc.reply, err)
			}
		}
	})

	// A server that takes the command and never answers: the call ends
	// at its context's deadline, with go-redis' ContextTimeoutEnabled.
	t.Run("deadline", func(t *testing.T) {
		hang := make(chan struct{})
		defer close(hang)
		addr := sluicetest.Serve(t, func(args []string) string {
			if strings.EqualFold(args[0], "HELLO") {
				return "-ERR unknown command 'HELLO'\r\n"
			}
			<-hang
			return ""
		})
		rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1, ContextTimeoutEnabled: true})
		defer rdb.Close()
		dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := client.New(rdb, client.Config{}).Take(dctx, "k", w, 1)
		wantKind(t, "no answer before the deadline", err, client.ErrUnavailable, "timeout")
	})

	t.Run("not a sluice reply", func(t *testing.T) {
		addr := sluicetest.Serve(t, func([]string) string { return "*2\r\n:1\r\n:2\r\n" })
		rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true})
		defer rdb.Close()
		_, err := client.New(rdb, client.Config{}).Take(ctx, "k", w, 1)
		wantKind(t, "a two-element reply to FW.PINCR", err, client.ErrUnsupported, "the reply has 2 elements, want 7")
	})
}

func wantKind(t *testing.T, what string, err, kind error, text string) {
	t.Helper()
	if !errors.Is(err, kind) || !strings.Contains(err.Error(), text) {
		t.Errorf("%s: %v; want %v containing %q", what, err, kind, text)
	}
	for _, other := range []error{client.ErrUnavailable, client.ErrAuth, client.ErrArgument, client.ErrUnsupported} {
		if other != kind && errors.Is(err, other) {
			t.Errorf("%s: %v is also %v", what, err, other)
		}
	}
}

// TestQuota: the quota a RateLimit-Policy header announces, per kind.
func TestQuota(t *testing.T) {
	for _, tc := range []struct {
		lim    client.Limit
		n      int64
		window time.Duration
	}{
		{client.FixedWindow{Limit: 5, Window: 300 * time.Second}, 5, 300 * time.Second},
		{client.GCRA{Count: 5, Period: 300 * time.Second}, 5, 300 * time.Second},
		{client.GCRA{Count: 30, Period: time.Minute, Burst: 16}, 16, 32 * time.Second},
		{client.TokenBucket{Max: 5, Refill: 300 * time.Second}, 5, 300 * time.Second},
		{client.TokenBucket{Max: 10, Refill: time.Second, RefillAmount: 3}, 10, 4 * time.Second},
	} {
		n, w := tc.lim.Quota()
		if n != tc.n || w != tc.window {
			t.Errorf("%+v: Quota %d, %v; want %d, %v", tc.lim, n, w, tc.n, tc.window)
		}
	}
}
