package client

import (
	"context"
	"strconv"
	"time"
)

// maxLogMax is the largest SlidingLog.Max sluice accepts (ROLL.*'s range).
const maxLogMax = 100_000

// SlidingLog is at most Max actions per Interval, none closer than MinGap
// to the previous one: a log of action timestamps (sluice's ROLL.*
// commands, the npm rolling-rate-limiter's limiter). Take records one
// action (ROLL.LIMIT), Peek answers what Take would without recording
// (ROLL.WOULDLIMIT); a call counts one action, so n is 1 (0 looks without
// recording, as Peek). A log is identified by its key alone: the
// parameters are per call.
//
// The replies carry whether the call is blocked, why, the time until an
// action is allowed and the actions remaining, not the log's contents; the
// client derives Used and the reset times (see docs/go-client.md):
//   - Used is exact unless the call is blocked by count (more than Max
//     actions in the interval); then it is a lower bound, Max, plus one when
//     the refused action was recorded.
//   - ResetAfter is Interval once the log holds an action: exact when the
//     call recorded one now, an upper bound when it did not (Peek, or a
//     refusal with NoCountBlocked), as if the newest action were now. It is
//     0 for an empty log.
//
// Which check refused an action (count or MinGap) is not in Result.
type SlidingLog struct {
	Interval time.Duration // a whole number of milliseconds, at least 1ms
	Max      int64         // actions per Interval: 1 to 100000
	// MinGap is the least time between two actions (ROLL's MINDIFF): a whole
	// number of milliseconds; 0 (the default) disables the check.
	MinGap time.Duration
	// NoCountBlocked leaves refused actions out of the log (ROLL.LIMIT's
	// NOCOUNTBLOCKED). By default they are recorded, as the npm package
	// does, so that a client that keeps retrying stays refused.
	NoCountBlocked bool
}

// Validate reports whether l's parameters are in ROLL.LIMIT's ranges.
func (l SlidingLog) Validate() error {
	_, _, err := l.check("ROLL.LIMIT", 1)
	return err
}

// Quota is Max and Interval.
func (l SlidingLog) Quota() (int64, time.Duration) { return l.Max, l.Interval }

func (l SlidingLog) check(cmd string, n int64) (intervalMs, gapMs int64, err error) {
	if l.Max < 1 || l.Max > maxLogMax {
		return 0, 0, argError(cmd, "SlidingLog.Max "+strconv.FormatInt(l.Max, 10)+": want 1 to 100000")
	}
	if l.MinGap < 0 || l.MinGap%time.Millisecond != 0 {
		return 0, 0, argError(cmd, "SlidingLog.MinGap "+l.MinGap.String()+": want a whole number of milliseconds, 0 or more")
	}
	if n < 0 || n > 1 {
		return 0, 0, argError(cmd, "cost "+strconv.FormatInt(n, 10)+": want 1 (one action per call), or 0 to look without recording")
	}
	intervalMs, err = millis(cmd, "SlidingLog.Interval", l.Interval)
	return intervalMs, int64(l.MinGap / time.Millisecond), err
}

func (l SlidingLog) call(ctx context.Context, c *Client, key string, n int64, peek bool) (Result, error) {
	peek = peek || n == 0
	cmd := "ROLL.LIMIT"
	if peek {
		cmd = "ROLL.WOULDLIMIT"
	}
	intervalMs, gapMs, err := l.check(cmd, n)
	if err != nil {
		return Result{}, err
	}
	var at int64
	var now time.Time
	sent := c.now != nil
	if sent {
		// ROLL's AT is in µs, the npm package's clock.
		now = c.now()
		at = now.UnixMicro()
	}
	ncb := l.NoCountBlocked && !peek
	args := make([]any, 0, 4+flag(gapMs > 0)*2+flag(sent)*2+flag(ncb))
	args = append(args, boxed(cmd), key, intervalMs, l.Max)
	if gapMs > 0 {
		args = append(args, "MINDIFF", gapMs)
	}
	if sent {
		args = append(args, "AT", at)
	}
	if ncb {
		args = append(args, "NOCOUNTBLOCKED")
	}
	v, err := c.ints(ctx, cmd, 5, args)
	if err != nil {
		return Result{}, err
	}
	return l.result(v, peek, clock(now, sent)), nil
}

// result maps [blocked, blocked_by_count, blocked_by_min_difference,
// ms_until_allowed, actions_remaining] onto a Result as the server's
// bucket.LogResult.Decision does: limit Max, remaining actions_remaining,
// retry after ms_until_allowed when blocked.
func (l SlidingLog) result(v []int64, peek bool, now time.Time) Result {
	blocked, byCount := v[0] != 0, v[1] != 0
	recorded := !peek && (!blocked || !l.NoCountBlocked)
	// actions_remaining is max(Max - n, 0), n being the actions in the
	// interval counting this one: exact unless blocked by count, which
	// means n > Max.
	n := l.Max - v[4]
	if byCount {
		n = l.Max + 1
	}
	res := Result{
		Allowed:    !blocked,
		Limit:      l.Max,
		Remaining:  v[4],
		Used:       n - int64(flag(!recorded)),
		RetryAfter: NoRetry,
	}
	if blocked {
		res.RetryAfter = ms(v[3])
	}
	if res.Used > 0 {
		res.ResetAfter = l.Interval
	}
	res.ResetAt = now.Add(res.ResetAfter)
	return res
}

// ClearLog deletes key's sliding log (ROLL.CLEAR) and reports whether
// there was one. The key's limits of other kinds stay; Del removes them
// all.
func (c *Client) ClearLog(ctx context.Context, key string) (bool, error) {
	const cmd = "ROLL.CLEAR"
	n, err := c.int(ctx, cmd, []any{cmd, key})
	return n == 1, err
}
