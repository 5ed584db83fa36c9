package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// target is what a workload's commands are sent as.
type target int

const (
	targetSluice    target = iota // RL.PREDUCE / RL.PGET
	targetRedisINCR               // INCR key
	targetRedisLua                // EVALSHA of the reference token bucket
)

func (t target) String() string {
	switch t {
	case targetSluice:
		return "sluice RL.PREDUCE"
	case targetRedisINCR:
		return "redis INCR"
	case targetRedisLua:
		return "redis EVALSHA bucket"
	}
	return "?"
}

// workload is one load to apply: the same for every target, so that ratios
// compare like with like.
type workload struct {
	Conns    int
	Pipeline int
	Requests int64
	Keys     int64
	Dist     string  // uniform, zipf or seq (every key once, in order, then again)
	ZipfS    float64 // zipf exponent, > 1
	GetPct   int     // share of RL.PGET among sluice commands, percent
	HitPct   int     // share of HIT (policy rules) among sluice commands, percent
	Take     int64
	Max      int64
	RefillMs int64
}

// result is what one run measured.
type result struct {
	Target   target
	Requests int64
	Errors   int64
	FirstErr string
	Elapsed  time.Duration
	Hist     *hdrhistogram.Histogram // µs per request
	CPU      time.Duration           // server CPU during the run, when known
	PeakRSS  int64                   // server peak RSS in bytes, when known
}

func (r result) opsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// keyGen draws keys for one connection.
type keyGen struct {
	w    workload
	rng  *rand.Rand
	zipf *rand.Zipf
	seq  *atomic.Int64
}

func newKeyGen(w workload, seed uint64, seq *atomic.Int64) *keyGen {
	g := &keyGen{w: w, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seq: seq}
	if w.Dist == "zipf" {
		g.zipf = rand.NewZipf(g.rng, w.ZipfS, 1, uint64(w.Keys-1))
	}
	return g
}

func (g *keyGen) next() int64 {
	switch g.w.Dist {
	case "zipf":
		return int64(g.zipf.Uint64())
	case "seq":
		return (g.seq.Add(1) - 1) % g.w.Keys
	}
	return g.rng.Int64N(g.w.Keys)
}

// Kinds of sluice command in a workload's mix.
const (
	opReduce = iota
	opGet
	opHit
)

// hitPolicy is the rule file a spawned sluice gets for a workload with
// HIT: one counted rule per key, with the workload's limits (whole
// seconds, at least one), and a default that denies.
func hitPolicy(w workload) string {
	return fmt.Sprintf("[path=/bench ip=*]\ncreditLimit = %d\nresetSeconds = %d\nactorField = ip\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n",
		w.Max, max(1, w.RefillMs/1000))
}

// appendCommand appends one request for t as a RESP array: for sluice, op
// picks RL.PREDUCE, RL.PGET or HIT path=/bench ip=<key>.
func appendCommand(b []byte, t target, w workload, key int64, op int, sha string) []byte {
	get := op == opGet
	var kb [24]byte
	k := strconv.AppendInt(append(kb[:0], "k:"...), key, 10)
	switch t {
	case targetRedisINCR:
		b = append(b, "*2\r\n$4\r\nINCR\r\n"...)
		return appendBulk(b, k)
	case targetRedisLua:
		b = append(b, "*8\r\n$7\r\nEVALSHA\r\n"...)
		b = appendBulk(b, []byte(sha))
		b = append(b, "$1\r\n1\r\n"...)
		b = appendBulk(b, k)
		b = appendIntBulk(b, w.Max)
		b = appendIntBulk(b, w.RefillMs)
		b = appendIntBulk(b, w.Max) // refill amount: RL's default
		take := w.Take
		if get {
			take = 0
		}
		return appendIntBulk(b, take)
	}
	if op == opHit {
		b = append(b, "*3\r\n$3\r\nHIT\r\n$11\r\npath=/bench\r\n"...)
		var ib [32]byte
		return appendBulk(b, append(append(ib[:0], "ip="...), k...))
	}
	if get {
		b = append(b, "*4\r\n$7\r\nRL.PGET\r\n"...)
		b = appendBulk(b, k)
		b = appendIntBulk(b, w.Max)
		return appendIntBulk(b, w.RefillMs)
	}
	b = append(b, "*6\r\n$10\r\nRL.PREDUCE\r\n"...)
	b = appendBulk(b, k)
	b = appendIntBulk(b, w.Max)
	b = appendIntBulk(b, w.RefillMs)
	b = append(b, "$4\r\nTAKE\r\n"...)
	return appendIntBulk(b, w.Take)
}

func appendBulk(b, p []byte) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(p)), 10)
	b = append(b, '\r', '\n')
	b = append(b, p...)
	return append(b, '\r', '\n')
}

func appendIntBulk(b []byte, n int64) []byte {
	var nb [20]byte
	return appendBulk(b, strconv.AppendInt(nb[:0], n, 10))
}

// readReply reads one RESP reply and reports whether it was an error.
func readReply(r *bufio.Reader) (isErr bool, msg string, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return false, "", err
	}
	if len(line) < 3 {
		return false, "", fmt.Errorf("short reply line %q", line)
	}
	switch line[0] {
	case '-':
		return true, string(line[1 : len(line)-2]), nil
	case '+', ':', '_', '#', ',':
		return false, "", nil
	case '$':
		n, err := strconv.Atoi(string(line[1 : len(line)-2]))
		if err != nil {
			return false, "", err
		}
		if n >= 0 {
			_, err = r.Discard(n + 2)
		}
		return false, "", err
	case '*', '%':
		n, err := strconv.Atoi(string(line[1 : len(line)-2]))
		if err != nil {
			return false, "", err
		}
		if line[0] == '%' {
			n *= 2
		}
		for range max(n, 0) {
			if e, m, err := readReply(r); err != nil || e {
				return e, m, err
			}
		}
		return false, "", nil
	}
	return false, "", fmt.Errorf("unexpected reply %q", line)
}

// run applies w to addr as t. Each connection sends Pipeline commands, reads
// as many replies, and records the round trip as every request's latency,
// as redis-benchmark does.
func run(addr string, t target, w workload, sha string) (result, error) {
	var (
		remaining atomic.Int64
		seq       atomic.Int64
		errs      atomic.Int64
		firstErr  atomic.Value
		wg        sync.WaitGroup
		mu        sync.Mutex
	)
	remaining.Store(w.Requests)
	total := hdrhistogram.New(1, 60_000_000, 3)
	conns := make([]net.Conn, w.Conns)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			for _, c := range conns[:i] {
				c.Close()
			}
			return result{}, fmt.Errorf("connect to %s: %w", addr, err)
		}
		conns[i] = c
	}
	var ioErr atomic.Value
	start := time.Now()
	for i, c := range conns {
		wg.Go(func() {
			defer c.Close()
			h := hdrhistogram.New(1, 60_000_000, 3)
			g := newKeyGen(w, uint64(i)+1, &seq)
			r := bufio.NewReaderSize(c, 64<<10)
			buf := make([]byte, 0, 64<<10)
			for {
				n := int64(w.Pipeline)
				if left := remaining.Add(-n); left < 0 {
					n += left
					if n <= 0 {
						break
					}
				}
				buf = buf[:0]
				for range n {
					op := opReduce
					if w.GetPct > 0 || w.HitPct > 0 {
						switch r := g.rng.IntN(100); {
						case r < w.GetPct:
							op = opGet
						case r < w.GetPct+w.HitPct:
							op = opHit
						}
					}
					buf = appendCommand(buf, t, w, g.next(), op, sha)
				}
				t0 := time.Now()
				if _, err := c.Write(buf); err != nil {
					ioErr.CompareAndSwap(nil, err)
					return
				}
				for range n {
					isErr, msg, err := readReply(r)
					if err != nil {
						ioErr.CompareAndSwap(nil, err)
						return
					}
					if isErr {
						errs.Add(1)
						firstErr.CompareAndSwap(nil, msg)
					}
				}
				_ = h.RecordValues(max(time.Since(t0).Microseconds(), 1), n)
			}
			mu.Lock()
			total.Merge(h)
			mu.Unlock()
		})
	}
	wg.Wait()
	res := result{Target: t, Requests: total.TotalCount(), Errors: errs.Load(), Elapsed: time.Since(start), Hist: total}
	if v, ok := firstErr.Load().(string); ok {
		res.FirstErr = v
	}
	if v, ok := ioErr.Load().(error); ok && !errors.Is(v, io.EOF) {
		return res, fmt.Errorf("%s: %w", t, v)
	}
	return res, nil
}
