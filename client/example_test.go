package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/client"
)

// A go-redis client connected to sluice, shared by the examples.
var rdb = redis.NewClient(&redis.Options{Addr: "localhost:9049"})

// Count a request against "100 per minute" for a user, and fail open when
// sluice cannot answer.
func Example() {
	c := client.New(rdb, client.Config{})
	res, err := c.Take(context.Background(), "user:42", client.FixedWindow{Limit: 100, Window: time.Minute}, 1)
	switch {
	case errors.Is(err, client.ErrUnavailable):
		log.Printf("sluice unavailable, letting the request through: %v", err)
	case err != nil:
		log.Fatal(err) // auth, argument or unsupported: a configuration error
	case !res.Allowed:
		fmt.Printf("refused; retry in %v\n", res.RetryAfter)
	default:
		fmt.Printf("allowed; %d of %d left until %v\n", res.Remaining, res.Limit, res.ResetAt)
	}
}

// A fixed window counts requests in windows aligned to the clock, as
// INCR + EXPIRE middlewares do, in one atomic call (FW.PINCR).
func ExampleFixedWindow() {
	c := client.New(rdb, client.Config{})
	lim := client.FixedWindow{Limit: 5000, Window: time.Hour, Stagger: true}
	res, err := c.Take(context.Background(), "api-key:abc", lim, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Allowed, res.Used, res.ResetAt)
}

// GCRA (redis-cell's CL.THROTTLE) spreads requests evenly: 30 per minute,
// one every 2 s once a burst of 10 is spent.
func ExampleGCRA() {
	c := client.New(rdb, client.Config{})
	lim := client.GCRA{Count: 30, Period: time.Minute, Burst: 10}
	res, err := c.Take(context.Background(), "user:42", lim, 1)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Println("retry in", res.RetryAfter)
	}
}

// A token bucket (RL.PREDUCE) of 10 tokens, one added every 6 s; a bulk
// request takes 5.
func ExampleTokenBucket() {
	c := client.New(rdb, client.Config{})
	lim := client.TokenBucket{Max: 10, Refill: 6 * time.Second, RefillAmount: 1}
	res, err := c.Take(context.Background(), "import:user:42", lim, 5)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Allowed, res.Remaining)
}

// A sliding log (ROLL.LIMIT, the npm rolling-rate-limiter): at most 10
// notifications a minute, 2 s apart. Take records one action per call.
func ExampleSlidingLog() {
	c := client.New(rdb, client.Config{})
	lim := client.SlidingLog{Interval: time.Minute, Max: 10, MinGap: 2 * time.Second}
	res, err := c.Take(context.Background(), "notify:user:42", lim, 1)
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Println("too soon; retry in", res.RetryAfter)
	}
}

// ClearLog forgets a key's sliding log (ROLL.CLEAR); its other limits stay.
func ExampleClient_ClearLog() {
	c := client.New(rdb, client.Config{})
	if _, err := c.ClearLog(context.Background(), "notify:user:42"); err != nil {
		log.Fatal(err)
	}
}

// Peek answers what Take would, without counting: to show a quota, or to
// check before expensive work.
func ExampleClient_Peek() {
	c := client.New(rdb, client.Config{})
	res, err := c.Peek(context.Background(), "user:42", client.FixedWindow{Limit: 100, Window: time.Minute}, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d of %d used\n", res.Used, res.Limit)
}

// A Config clock sends each call's time as AT: replays and tests get
// replies that do not depend on when they run.
func ExampleConfig() {
	c := client.New(rdb, client.Config{Now: func() time.Time { return time.Unix(1700000000, 0) }})
	res, err := c.Take(context.Background(), "user:42", client.FixedWindow{Limit: 5, Window: 300 * time.Second}, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.ResetAt.Unix()) // 1700000100, the end of the window
}

// Del resets a key: every limit stored under it, of every kind.
func ExampleClient_Del() {
	c := client.New(rdb, client.Config{})
	if _, err := c.Del(context.Background(), "user:42"); err != nil {
		log.Fatal(err)
	}
}
