package server

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
)

// BenchmarkServerLoad drives a real server over loopback with the load of
// bench's pipelined scenario (and issue 28's hot one): 48 connections,
// pipelines of 16 RL.PREDUCE k:<n> 100 60000, n uniform over a million
// keys or over a thousand. The generator runs in the same process, so
// its goroutines share the Ps with the server's; an execution trace of it
// (-trace) shows how much of the wall time the committer runs and what
// the connections wait for, as docs/benchmarks.md ("Issue 28") reports:
//
//	go test -run '^$' -bench 'ServerLoad/keys=1000000$' -benchtime 2000000x -cpu 2 -trace t.out ./server
func BenchmarkServerLoad(b *testing.B) {
	for _, keys := range []int{1_000_000, 1000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			benchLoadOverTCP(b, startServer(b, Config{}), 48, func(rng *rand.Rand) int64 { return int64(rng.IntN(keys)) })
		})
	}
}

// benchLoadOverTCP sends b.N RL.PREDUCE over conns connections, in
// pipelines of 16, on the keys k:<n> that next draws, each connection with
// a random source of its own; the client side allocates nothing per op.
func benchLoadOverTCP(b *testing.B, srv *Server, conns int, next func(*rand.Rand) int64) {
	const depth = 16
	var seed atomic.Uint64
	b.ReportAllocs()
	b.SetParallelism(max(1, conns/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 28))
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		var out, key []byte
		for more := true; more; {
			out = out[:0]
			n := 0
			for ; n < depth; n++ {
				if more = pb.Next(); !more {
					break
				}
				key = strconv.AppendInt(append(key[:0], "k:"...), next(rng), 10)
				out = append(out, "*4\r\n$10\r\nRL.PREDUCE\r\n$"...)
				out = strconv.AppendInt(out, int64(len(key)), 10)
				out = append(out, "\r\n"...)
				out = append(out, key...)
				out = append(out, "\r\n$3\r\n100\r\n$5\r\n60000\r\n"...)
			}
			if n == 0 {
				break
			}
			if _, err := c.Write(out); err != nil {
				b.Error(err)
				return
			}
			for range n {
				line, err := r.ReadSlice('\n')
				if err != nil {
					b.Error(err)
					return
				}
				if line[0] != ':' {
					b.Errorf("reply %q, want an integer", line)
					return
				}
			}
		}
	})
}
