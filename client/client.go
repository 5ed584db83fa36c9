// Package client is a typed Go client for sluice, the rate-limit server that
// speaks the Redis protocol. It sends sluice's commands through the caller's
// own go-redis client (redis.UniversalClient), so connection pools, TLS,
// AUTH, Sentinel configurations and cluster clients work unchanged, and it
// answers every kind of limit with one Result.
//
// A limit is a value of one of the Limit types: FixedWindow (FW.*),
// GCRA (redis-cell's CL.THROTTLE), TokenBucket (RL.*), SlidingLog (ROLL.*).
// Client.Take counts a request against a key's limit, Client.Peek answers
// what Take would without counting. Client.Sessionize, Client.Hit,
// Client.ClearLog and Client.Del cover the rest of the command families.
//
// Every error is an *Error whose kind is one of ErrUnavailable, ErrAuth,
// ErrArgument or ErrUnsupported, so that a caller can decide to fail open
// (let the request through) or closed when sluice cannot answer:
//
//	res, err := c.Take(ctx, "user:42", client.FixedWindow{Limit: 100, Window: time.Minute}, 1)
//	if errors.Is(err, client.ErrUnavailable) {
//		// sluice is down or its store cannot serve: fail open or closed
//	}
//
// A Client is safe for concurrent use. Take and Peek allocate nothing beyond
// the go-redis command they send and its reply.
package client

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client sends sluice commands through a go-redis client. Create it with New.
type Client struct {
	rdb redis.UniversalClient
	now func() time.Time
}

// Config holds a Client's settings. The zero Config is ready to use.
type Config struct {
	// Now, when set, is the clock of every call: its time is sent as the
	// command's AT, so that sluice computes with it instead of its own clock,
	// and the reset instants of the kinds whose replies carry none are
	// computed from it. It is meant for tests and replays, or for callers
	// that must decide on their own timestamps. Nil (the default) uses
	// sluice's clock, and the local clock after the reply for those reset
	// instants.
	Now func() time.Time
}

// New returns a Client that sends its commands through rdb. rdb is used as
// it is: its pool, timeouts, retries, TLS and credentials apply.
func New(rdb redis.UniversalClient, cfg Config) *Client {
	return &Client{rdb: rdb, now: cfg.Now}
}

// Result is sluice's answer to one call, of any kind of limit.
type Result struct {
	// Allowed reports whether the request is within the limit. For Take, an
	// allowed request has been counted.
	Allowed bool
	// Limit is the requests the limit allows at once: the window's limit,
	// GCRA's burst, the token bucket's and the sliding log's Max. It is 0
	// for Hit, whose limits are in the server's rule file.
	Limit int64
	// Remaining is the requests that would still be allowed now, after this
	// call; 0 <= Remaining <= Limit (except for Hit).
	Remaining int64
	// Used is what the window has counted after this call (for GCRA and
	// token buckets, Limit - Remaining; for sliding logs, the actions in the
	// interval, a lower bound when refused by count: see SlidingLog).
	Used int64
	// RetryAfter is, for a refused request, how long until it would be
	// allowed. It is NoRetry when the request was allowed, or when waiting
	// cannot help because it asks for more than the limit.
	RetryAfter time.Duration
	// ResetAfter is how long until the limit is whole again (Remaining ==
	// Limit); 0 when it is whole now.
	ResetAfter time.Duration
	// ResetAt is the instant the limit is whole again.
	ResetAt time.Time
}

// NoRetry is Result.RetryAfter when no wait makes the request allowed, or
// when it was allowed.
const NoRetry time.Duration = -1

// Limit is a limit of one of sluice's kinds: FixedWindow, GCRA,
// TokenBucket or SlidingLog. The set is closed: only this package's types
// implement it.
type Limit interface {
	// Validate reports, without asking sluice, whether the limit's
	// parameters are in the ranges sluice accepts.
	Validate() error
	// Quota is the requests the limit allows at once and the time it takes
	// to allow as many again from nothing (the fixed window's length, the
	// sliding log's interval; for GCRA and token buckets, the time to
	// refill from empty). It is what a RateLimit-Policy header announces.
	Quota() (limit int64, window time.Duration)
	// call runs one Take (peek false) or Peek of n against key.
	call(ctx context.Context, c *Client, key string, n int64, peek bool) (Result, error)
}

// Take counts a request of n units (a cost; 1 for one request) against
// key's limit and answers whether it is allowed. Refused requests of a
// fixed window or a sliding log are counted too unless NoCountBlocked is
// set, as sluice documents for each kind.
func (c *Client) Take(ctx context.Context, key string, lim Limit, n int64) (Result, error) {
	return lim.call(ctx, c, key, n, false)
}

// Peek answers what Take would for a request of n units, without counting
// it. It writes only what the command's look stores, as its reference
// does: a GCRA key's TAT moved to now, a sliding log's entries that have
// left the interval dropped.
func (c *Client) Peek(ctx context.Context, key string, lim Limit, n int64) (Result, error) {
	return lim.call(ctx, c, key, n, true)
}

// at is the AT argument for a call, in unit (1 for milliseconds, 1000 for
// seconds), and the time to compute reset instants from; ok is false when
// the Client uses sluice's clock.
func (c *Client) at(unitMs int64) (at int64, now time.Time, ok bool) {
	if c.now == nil {
		return 0, time.Time{}, false
	}
	now = c.now()
	ms := now.UnixMilli()
	// Floor, so that a clock before 1970 lands in the right second.
	at = ms / unitMs
	if ms%unitMs != 0 && ms < 0 {
		at--
	}
	return at, now, true
}

// clock is the instant a reply's durations count from: the Config's clock
// when it sent AT, else the local clock now that the reply is in.
func clock(now time.Time, sent bool) time.Time {
	if sent {
		return now
	}
	return time.Now()
}
