package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/respserver"
)

// TestDebugRefusedByDefault: without Config.RESP.Debug every DEBUG is refused
// with an error that names the flag, and the clock is not shifted.
func TestDebugRefusedByDefault(t *testing.T) {
	clock := newTestClock(1_700_000_000_000)
	srv := startServer(t, Config{Clock: clock.now})
	c := newClient(t, srv)
	ctx := context.Background()
	for _, args := range [][]any{{"DEBUG", "CLOCK-OFFSET", 3_600_000}, {"DEBUG", "HELP"}, {"DEBUG", "CLOCK-OFFSET"}} {
		err := c.Do(ctx, args...).Err()
		if err == nil || !strings.Contains(err.Error(), "--enable-debug-command") {
			t.Errorf("%v: %v; want the refusal naming --enable-debug-command", args, err)
		}
	}
	if got, err := c.Time(ctx).Result(); err != nil || !got.Equal(clock.now().Truncate(time.Microsecond)) {
		t.Errorf("TIME after a refused DEBUG: %v, %v; want %v", got, err, clock.now())
	}
}

// TestDebugClockOffset: DEBUG CLOCK-OFFSET shifts the clock every decision
// on the server clock reads: a bucket emptied, then the clock shifted by
// its refill period, is full again; shifted back, it is not refilled
// again; bad offsets are refused and change nothing.
func TestDebugClockOffset(t *testing.T) {
	for _, access := range []respserver.DebugAccess{respserver.DebugAllowed, respserver.DebugLocal} {
		clock := newTestClock(1_700_000_000_000)
		srv := startServer(t, Config{Clock: clock.now, RESP: respserver.Tuning{Debug: access}})
		c := newClient(t, srv)
		ctx := context.Background()
		reduce := func() int64 {
			t.Helper()
			n, err := c.Do(ctx, "RL.REDUCE", "k", 2, 3600).Int64()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		offset := func(args ...any) {
			t.Helper()
			if err := c.Do(ctx, append([]any{"DEBUG", "CLOCK-OFFSET"}, args...)...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if got := []int64{reduce(), reduce(), reduce()}; got[0] != 2 || got[1] != 1 || got[2] != 0 {
			t.Fatalf("a bucket of 2 answered %v; want [2 1 0]", got)
		}
		offset(3_600_000)
		if n, err := c.Do(ctx, "DEBUG", "CLOCK-OFFSET").Int64(); err != nil || n != 3_600_000 {
			t.Errorf("DEBUG CLOCK-OFFSET: %d, %v; want 3600000", n, err)
		}
		if got, err := c.Time(ctx).Result(); err != nil || !got.Equal(clock.now().Add(time.Hour)) {
			t.Errorf("TIME shifted an hour: %v, %v; want %v", got, err, clock.now().Add(time.Hour))
		}
		if n := reduce(); n != 2 {
			t.Errorf("an hour later the bucket has %d tokens; want 2, refilled", n)
		}
		offset(0)
		if n := reduce(); n != 1 {
			t.Errorf("back on the system clock the bucket has %d tokens; want 1, not refilled again", n)
		}
		for _, bad := range []string{"x", "1.5", "3153600000001", "-3153600000001"} {
			err := c.Do(ctx, "DEBUG", "CLOCK-OFFSET", bad).Err()
			if err == nil || !strings.Contains(err.Error(), "want an integer of milliseconds") {
				t.Errorf("DEBUG CLOCK-OFFSET %s: %v; want a range error", bad, err)
			}
		}
		for _, args := range [][]any{{"DEBUG", "CLOCK-OFFSET", 1, 2}, {"DEBUG", "NOPE"}} {
			if err := c.Do(ctx, args...).Err(); err == nil {
				t.Errorf("%v: accepted", args)
			}
		}
		if n, err := c.Do(ctx, "DEBUG", "CLOCK-OFFSET").Int64(); err != nil || n != 0 {
			t.Errorf("DEBUG CLOCK-OFFSET after refused changes: %d, %v; want 0", n, err)
		}
		if help, err := c.Do(ctx, "DEBUG", "HELP").StringSlice(); err != nil || len(help) == 0 || !strings.HasPrefix(help[0], "DEBUG") {
			t.Errorf("DEBUG HELP: %q, %v", help, err)
		}
	}
}
