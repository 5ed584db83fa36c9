package client

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// FixedWindow is Limit requests per Window, in windows aligned to the Unix
// epoch (sluice's FW.* commands): the limiter of the INCR + EXPIRE
// middlewares, in one atomic call. A counter is identified by the key, the
// window's length and Stagger; the limit is per call, so it can change
// without losing the count.
type FixedWindow struct {
	Limit  int64         // requests allowed per window; 0 or more
	Window time.Duration // the window's length: a whole number of milliseconds, at least 1ms
	// Stagger shifts each key's windows by an offset computed from the key,
	// so that keys do not all reset at the same instant (FW's STAGGER). It is
	// part of the counter's identity.
	Stagger bool
	// NoCountBlocked leaves refused requests uncounted (FW's
	// NOCOUNTBLOCKED). By default they count, as INCR-then-compare does, so
	// that a client that keeps retrying stays refused until the window ends.
	NoCountBlocked bool
}

// Validate reports whether w's parameters are in FW.PINCR's ranges.
func (w FixedWindow) Validate() error {
	_, err := w.check("FW.PINCR", 0)
	return err
}

// Quota is the window's limit and length.
func (w FixedWindow) Quota() (int64, time.Duration) { return w.Limit, w.Window }

func (w FixedWindow) check(cmd string, n int64) (windowMs int64, err error) {
	if w.Limit < 0 {
		return 0, argError(cmd, "FixedWindow.Limit "+strconv.FormatInt(w.Limit, 10)+": want 0 or more")
	}
	if n < 0 {
		return 0, argError(cmd, "cost "+strconv.FormatInt(n, 10)+": want 0 or more")
	}
	return millis(cmd, "FixedWindow.Window", w.Window)
}

func (w FixedWindow) call(ctx context.Context, c *Client, key string, n int64, peek bool) (Result, error) {
	cmd := "FW.PINCR"
	if peek {
		cmd = "FW.PGET"
	}
	windowMs, err := w.check(cmd, n)
	if err != nil {
		return Result{}, err
	}
	at, _, sent := c.at(1)
	// The slice is sized exactly: it is the largest allocation of the call.
	size := 6 + flag(sent)*2 + flag(w.NoCountBlocked && !peek) + flag(w.Stagger)
	args := make([]any, 0, size)
	args = append(args, boxed(cmd), key, w.Limit, windowMs, "COST", n)
	if sent {
		args = append(args, "AT", at)
	}
	if w.NoCountBlocked && !peek {
		args = append(args, "NOCOUNTBLOCKED")
	}
	if w.Stagger {
		args = append(args, "STAGGER")
	}
	v, err := c.ints(ctx, cmd, 7, args)
	if err != nil {
		return Result{}, err
	}
	// [limited, limit, remaining, retry_after, reset_after, used, reset_at]
	return Result{
		Allowed:    v[0] == 0,
		Limit:      v[1],
		Remaining:  v[2],
		RetryAfter: ms(v[3]),
		ResetAfter: ms(v[4]),
		Used:       v[5],
		ResetAt:    time.UnixMilli(v[6]),
	}, nil
}

// GCRA is Count requests per Period, in bursts of up to Burst requests: the
// generic cell rate algorithm of redis-cell's CL.THROTTLE, which sluice
// answers as CL.PTHROTTLE. Requests are let through evenly, one per
// Period/Count once a burst is spent. A key has one state whatever the
// parameters: a call with other parameters reinterprets it.
type GCRA struct {
	Count  int64         // requests per Period; at least 1
	Period time.Duration // a whole number of milliseconds, at least 1ms
	// Burst is the most requests allowed at once, CL.THROTTLE's max_burst
	// + 1. 0 means Count.
	Burst int64
}

// Validate reports whether g's parameters are in CL.PTHROTTLE's ranges, as
// far as they can be checked without sluice (the server also refuses rates
// above one request per nanosecond and bursts whose arithmetic overflows).
func (g GCRA) Validate() error {
	_, err := g.check("CL.PTHROTTLE", 0)
	return err
}

func (g GCRA) burst() int64 {
	if g.Burst == 0 {
		return g.Count
	}
	return g.Burst
}

// Quota is the burst and the time to allow a whole burst again from
// nothing: Burst × Period / Count.
func (g GCRA) Quota() (int64, time.Duration) {
	if g.Count < 1 {
		return g.burst(), 0
	}
	ei := g.Period / time.Duration(g.Count)
	b := g.burst()
	if ei > 0 && b > int64(math.MaxInt64/ei) {
		return b, math.MaxInt64
	}
	return b, ei * time.Duration(b)
}

func (g GCRA) check(cmd string, n int64) (periodMs int64, err error) {
	if g.Count < 1 {
		return 0, argError(cmd, "GCRA.Count "+strconv.FormatInt(g.Count, 10)+": want 1 or more")
	}
	if g.Burst < 0 {
		return 0, argError(cmd, "GCRA.Burst "+strconv.FormatInt(g.Burst, 10)+": want 0 (Count) or more")
	}
	if n < 0 {
		return 0, argError(cmd, "cost "+strconv.FormatInt(n, 10)+": want 0 or more")
	}
	return millis(cmd, "GCRA.Period", g.Period)
}

func (g GCRA) call(ctx context.Context, c *Client, key string, n int64, peek bool) (Result, error) {
	const cmd = "CL.PTHROTTLE"
	periodMs, err := g.check(cmd, n)
	if err != nil {
		return Result{}, err
	}
	q := n
	if peek {
		// quantity 0 looks without consuming; whether n would pass is
		// worked out below from the remaining count.
		q = 0
	}
	at, now, sent := c.at(1)
	args := make([]any, 0, 6+flag(sent)*2)
	args = append(args, boxed(cmd), key, g.burst()-1, g.Count, periodMs, q)
	if sent {
		args = append(args, "AT", at)
	}
	v, err := c.ints(ctx, cmd, 5, args)
	if err != nil {
		return Result{}, err
	}
	// [limited, limit, remaining, retry_after, reset_after]
	res := Result{
		Allowed:    v[0] == 0,
		Limit:      v[1],
		Remaining:  v[2],
		Used:       v[1] - v[2],
		RetryAfter: ms(v[3]),
		ResetAfter: ms(v[4]),
	}
	if peek {
		// remaining = floor((dvt - ttl) / ei), so n more would pass now
		// exactly when n <= remaining; else they pass once ttl has fallen
		// to dvt - n×ei.
		res.Allowed = res.Allowed && n <= res.Remaining
		res.RetryAfter = NoRetry
		if !res.Allowed && n <= res.Limit {
			ei := g.Period / time.Duration(g.Count)
			wait := res.ResetAfter - ei*time.Duration(res.Limit-n)
			// In whole milliseconds, rounded up, as CL.PTHROTTLE answers.
			res.RetryAfter = max((wait + time.Millisecond - 1).Truncate(time.Millisecond), time.Millisecond)
		}
	}
	res.ResetAt = clock(now, sent).Add(res.ResetAfter)
	return res, nil
}

// TokenBucket is Max tokens, refilled by RefillAmount every Refill (sluice's
// RL.* commands, the dialect of Smyte's ratelimit server). A request takes
// n tokens; a refused take empties the bucket, as RL.REDUCE does. A bucket
// is identified by the key, Max, RefillAmount and Refill: another parameter
// set is another bucket, which starts full.
//
// RL.* replies carry only the tokens there were before the take, not the
// bucket's refill mark, so the client computes RetryAfter, ResetAfter and
// ResetAt from the parameters as if the last refill had just happened: they
// are upper bounds, longer than the truth by less than one Refill period
// (exact with Strict once the bucket has been emptied, which restarts the
// period).
type TokenBucket struct {
	Max          int64         // tokens in a full bucket; at least 1
	Refill       time.Duration // refill period: a whole number of milliseconds, at least 1ms
	RefillAmount int64         // tokens added per period; 0 means Max
	// Strict restarts the refill period whenever the bucket is emptied
	// (RL's STRICT): no refill until a whole period passes without a take
	// that empties it.
	Strict bool
}

// maxRefillMs is the longest refill period of the P forms, a 32-bit
// integer of milliseconds (about 24.8 days); longer whole-second periods
// go through the seconds forms.
const maxRefillMs = math.MaxInt32

// Validate reports whether b's parameters are in RL.PREDUCE's ranges.
func (b TokenBucket) Validate() error {
	_, _, err := b.check("RL.PREDUCE", 0)
	return err
}

func (b TokenBucket) amount() int64 {
	if b.RefillAmount == 0 {
		return b.Max
	}
	return b.RefillAmount
}

// Quota is Max and the time to refill an empty bucket.
func (b TokenBucket) Quota() (int64, time.Duration) {
	return b.Max, b.refillTime(b.Max)
}

// refillTime is the time whole refills take to add k tokens.
func (b TokenBucket) refillTime(k int64) time.Duration {
	if k <= 0 || b.Refill <= 0 {
		return 0
	}
	ra := b.amount()
	if ra < 1 {
		return 0
	}
	periods := k/ra + min(k%ra, 1)
	if periods > int64(math.MaxInt64/b.Refill) {
		return math.MaxInt64
	}
	return time.Duration(periods) * b.Refill
}

// check validates b and n and chooses the form: unit is 1 for the P forms
// (period in ms) and 1000 for the seconds forms, used for periods longer
// than maxRefillMs.
func (b TokenBucket) check(cmd string, n int64) (period, unit int64, err error) {
	if b.Max < 1 {
		return 0, 0, argError(cmd, "TokenBucket.Max "+strconv.FormatInt(b.Max, 10)+": want 1 or more")
	}
	if b.RefillAmount < 0 {
		return 0, 0, argError(cmd, "TokenBucket.RefillAmount "+strconv.FormatInt(b.RefillAmount, 10)+": want 0 (Max) or more")
	}
	if n < 0 {
		return 0, 0, argError(cmd, "take "+strconv.FormatInt(n, 10)+": want 0 or more")
	}
	p, err := millis(cmd, "TokenBucket.Refill", b.Refill)
	if err != nil {
		return 0, 0, err
	}
	if p <= maxRefillMs {
		return p, 1, nil
	}
	if p%1000 != 0 || p/1000 > maxRefillMs {
		return 0, 0, argError(cmd, "TokenBucket.Refill "+b.Refill.String()+": want at most 2147483647ms, or a whole number of seconds up to 2147483647s")
	}
	return p / 1000, 1000, nil
}

// rlArgs are an RL command's arguments up to its options, in a slice with
// room for more options.
func (b TokenBucket) rlArgs(cmd, key string, period int64, more int) []any {
	args := make([]any, 0, 4+flag(b.RefillAmount != 0)*2+more)
	args = append(args, boxed(cmd), key, b.Max, period)
	if b.RefillAmount != 0 {
		args = append(args, "REFILL", b.RefillAmount)
	}
	return args
}

func (b TokenBucket) call(ctx context.Context, c *Client, key string, n int64, peek bool) (Result, error) {
	period, unit, err := b.check("RL.PREDUCE", n)
	if err != nil {
		return Result{}, err
	}
	cmd := rlName(peek, unit)
	at, now, sent := c.at(unit)
	args := b.rlArgs(cmd, key, period, flag(!peek)*2+flag(sent)*2+flag(b.Strict))
	if !peek {
		args = append(args, "TAKE", n)
	}
	if sent {
		args = append(args, "AT", at)
	}
	if b.Strict {
		args = append(args, "STRICT")
	}
	before, err := c.int(ctx, cmd, args)
	if err != nil {
		return Result{}, err
	}
	return b.result(before, n, peek, clock(now, sent)), nil
}

func rlName(peek bool, unit int64) string {
	switch {
	case peek && unit == 1:
		return "RL.PGET"
	case peek:
		return "RL.GET"
	case unit == 1:
		return "RL.PREDUCE"
	}
	return "RL.REDUCE"
}

// result describes a take (or, with peek, a look) of n from a bucket that
// held before tokens, as bucket.Params.Decision does on the server, with
// the refill mark taken to be now (see TokenBucket).
func (b TokenBucket) result(before, n int64, peek bool, now time.Time) Result {
	left := before
	if !peek && n > 0 {
		left = max(before-n, 0) // a refused take empties the bucket
	}
	res := Result{
		Allowed:    before >= n,
		Limit:      b.Max,
		Remaining:  left,
		Used:       b.Max - left,
		RetryAfter: NoRetry,
		ResetAfter: b.refillTime(b.Max - left),
	}
	if !res.Allowed && n <= b.Max {
		res.RetryAfter = b.refillTime(n - left)
	}
	res.ResetAt = now.Add(res.ResetAfter)
	return res
}

// Sessionize takes n tokens from key's bucket as Take does, with Strict
// always on, and also answers the start of the key's session: the time of
// its last allowed request (RL.PSESSIONIZE).
func (c *Client) Sessionize(ctx context.Context, key string, b TokenBucket, n int64) (Result, time.Time, error) {
	period, unit, err := b.check("RL.PSESSIONIZE", n)
	if err != nil {
		return Result{}, time.Time{}, err
	}
	cmd := "RL.PSESSIONIZE"
	if unit != 1 {
		cmd = "RL.SESSIONIZE"
	}
	at, now, sent := c.at(unit)
	args := b.rlArgs(cmd, key, period, 2+flag(sent)*2)
	args = append(args, "TAKE", n)
	if sent {
		args = append(args, "AT", at)
	}
	v, err := c.ints(ctx, cmd, 2, args)
	if err != nil {
		return Result{}, time.Time{}, err
	}
	// The session start is in Unix milliseconds in both forms.
	return b.result(v[0], n, false, clock(now, sent)), time.UnixMilli(v[1]), nil
}

// Hit asks sluice's rule file (--policy, divvy's model) about a request
// described by fields, each "key=value" (HIT method=GET path=/x ip=1.2.3.4).
// The Result has Allowed, Remaining (the credits left) and ResetAfter and
// ResetAt (when the window resets, in whole seconds); Limit and Used are 0,
// the limits being the server's rules.
func (c *Client) Hit(ctx context.Context, fields ...string) (Result, error) {
	const cmd = "HIT"
	args := make([]any, 0, 1+len(fields))
	args = append(args, cmd)
	for _, f := range fields {
		args = append(args, f)
	}
	v, err := c.ints(ctx, cmd, 3, args)
	if err != nil {
		return Result{}, err
	}
	// [allowed, credits left, seconds until reset (-1: never)]
	res := Result{Allowed: v[0] == 1, Remaining: v[1], RetryAfter: NoRetry}
	if v[2] >= 0 {
		res.ResetAfter = seconds(v[2])
		if !res.Allowed {
			res.RetryAfter = res.ResetAfter
		}
	}
	res.ResetAt = time.Now().Add(res.ResetAfter)
	return res, nil
}

// Del removes every limit stored under each key, of every kind, and
// answers how many of the keys had one (DEL). It is how a key is reset.
func (c *Client) Del(ctx context.Context, keys ...string) (int64, error) {
	args := make([]any, 0, 1+len(keys))
	args = append(args, "DEL")
	for _, k := range keys {
		args = append(args, k)
	}
	return c.int(ctx, "DEL", args)
}

func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// boxed returns a command name as an interface value without allocating:
// converting a string variable to any copies its header to the heap,
// converting a constant does not.
func boxed(cmd string) any {
	switch cmd {
	case "FW.PINCR":
		return "FW.PINCR"
	case "FW.PGET":
		return "FW.PGET"
	case "CL.PTHROTTLE":
		return "CL.PTHROTTLE"
	case "RL.PREDUCE":
		return "RL.PREDUCE"
	case "RL.PGET":
		return "RL.PGET"
	case "RL.REDUCE":
		return "RL.REDUCE"
	case "RL.GET":
		return "RL.GET"
	case "RL.PSESSIONIZE":
		return "RL.PSESSIONIZE"
	case "RL.SESSIONIZE":
		return "RL.SESSIONIZE"
	case "ROLL.LIMIT":
		return "ROLL.LIMIT"
	case "ROLL.WOULDLIMIT":
		return "ROLL.WOULDLIMIT"
	}
	return cmd
}

// ints sends args and reads an array of want integers.
func (c *Client) ints(ctx context.Context, cmd string, want int, args []any) ([]int64, error) {
	r := redis.NewIntSliceCmd(ctx, args...)
	_ = c.rdb.Process(ctx, r) // the error is r's too
	v, err := r.Result()
	if err != nil {
		return nil, classify(cmd, err)
	}
	if len(v) != want {
		return nil, &Error{Kind: ErrUnsupported, Command: cmd, Msg: "the reply has " + strconv.Itoa(len(v)) + " elements, want " + strconv.Itoa(want) + ": not a sluice reply"}
	}
	return v, nil
}

// int sends args and reads an integer.
func (c *Client) int(ctx context.Context, cmd string, args []any) (int64, error) {
	r := redis.NewIntCmd(ctx, args...)
	_ = c.rdb.Process(ctx, r)
	v, err := r.Result()
	if err != nil {
		return 0, classify(cmd, err)
	}
	return v, nil
}

// millis converts a duration argument to whole milliseconds, refusing what
// would have to be rounded: a silently rounded period changes the rate.
func millis(cmd, what string, d time.Duration) (int64, error) {
	if d < time.Millisecond || d%time.Millisecond != 0 {
		return 0, argError(cmd, what+" "+d.String()+": want a whole number of milliseconds, at least 1ms")
	}
	return int64(d / time.Millisecond), nil
}

// ms converts a reply's milliseconds, -1 being NoRetry, saturating at the
// longest Duration (about 292 years).
func ms(v int64) time.Duration {
	switch {
	case v < 0:
		return NoRetry
	case v > math.MaxInt64/int64(time.Millisecond):
		return math.MaxInt64
	}
	return time.Duration(v) * time.Millisecond
}

func seconds(v int64) time.Duration {
	if v > math.MaxInt64/int64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(v) * time.Second
}
