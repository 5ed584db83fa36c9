package client_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/client/internal/sluicetest"
)

// fwReply is an FW.PINCR reply: allowed, 5, 4 left, no retry, 100 s to
// the window's end, 1 used, ending at 1700000100000 ms.
const fwReply = "*7\r\n:0\r\n:5\r\n:4\r\n:-1\r\n:100000\r\n:1\r\n:1700000100000\r\n"

// benchKey is a variable, as the key of a real call is: the compiler boxes
// a constant string into an interface without allocating.
var benchKey = "httplimit:ip:203.0.113.7"

// fakeRedis is a go-redis client whose connections answer every command
// with reply, in memory: the benchmarks measure the client and go-redis,
// not the network or sluice.
func fakeRedis(b *testing.B, reply string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr:            "fake",
		Protocol:        2,
		DisableIdentity: true,
		PoolSize:        1,
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			return sluicetest.NewConn(reply), nil
		},
	})
	b.Cleanup(func() { rdb.Close() })
	return rdb
}

// BenchmarkTake: one Take through go-redis on an in-memory connection.
// Compare with BenchmarkGoRedisCommand: the difference is the client's
// own cost.
func BenchmarkTake(b *testing.B) {
	c := client.New(fakeRedis(b, fwReply), client.Config{})
	ctx := context.Background()
	lim := client.FixedWindow{Limit: 5, Window: 300 * time.Second}
	b.ReportAllocs()
	for b.Loop() {
		res, err := c.Take(ctx, benchKey, lim, 1)
		if err != nil || res.Remaining != 4 {
			b.Fatal(res, err)
		}
	}
}

// BenchmarkGoRedisCommand sends the same FW.PINCR with go-redis alone, as
// a caller without this package would, the key and the window in
// variables: go-redis' own allocations (the command, its argument slice,
// the key and window boxed into it, the reply's slice).
func BenchmarkGoRedisCommand(b *testing.B) {
	rdb := fakeRedis(b, fwReply)
	ctx := context.Background()
	key, window := benchKey, 300*time.Second
	b.ReportAllocs()
	for b.Loop() {
		cmd := redis.NewIntSliceCmd(ctx, "FW.PINCR", key, int64(5), window.Milliseconds(), "COST", int64(1))
		rdb.Process(ctx, cmd)
		if v, err := cmd.Result(); err != nil || v[2] != 4 {
			b.Fatal(v, err)
		}
	}
}

// BenchmarkTakeSlidingLog: one ROLL.LIMIT Take, as BenchmarkTake; the
// reply is allowed, 4 actions remaining.
func BenchmarkTakeSlidingLog(b *testing.B) {
	c := client.New(fakeRedis(b, "*5\r\n:0\r\n:0\r\n:0\r\n:0\r\n:4\r\n"), client.Config{})
	ctx := context.Background()
	lim := client.SlidingLog{Interval: 300 * time.Second, Max: 5}
	b.ReportAllocs()
	for b.Loop() {
		res, err := c.Take(ctx, benchKey, lim, 1)
		if err != nil || res.Remaining != 4 {
			b.Fatal(res, err)
		}
	}
}
