package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/sluicehq/sluice/internal/resp"
)

// target is what a workload's requests are sent as.
type target int

const (
	targetSluice       target = iota // the workload's sluice command (workload.Command)
	targetRedisINCR                  // INCR key
	targetRedisLua                   // EVALSHA of the reference token bucket
	targetRedisCell                  // CL.THROTTLE on redis-server with the redis-cell module
	targetRedisFW                    // INCR + EXPIRE NX of ratelimit/{id}/{window}, pipelined: one request, two commands
	targetRedisFWMulti               // the same pair inside MULTI/EXEC: one request, four commands
	targetRedisFWLua                 // EVALSHA of bench/fixedwindow.lua, the script fixed-window stores send
	targetRedisRoll                  // what rolling-rate-limiter's RedisRateLimiter sends per limit(): MULTI, ZREMRANGEBYSCORE, ZADD, ZRANGE WITHSCORES, EXPIRE, EXEC
)

func (t target) String() string {
	switch t {
	case targetSluice:
		return "sluice"
	case targetRedisINCR:
		return "redis INCR"
	case targetRedisLua:
		return "redis EVALSHA bucket"
	case targetRedisCell:
		return "redis-cell CL.THROTTLE"
	case targetRedisFW:
		return "redis INCR+EXPIRE"
	case targetRedisFWMulti:
		return "redis MULTI INCR EXPIRE EXEC"
	case targetRedisFWLua:
		return "redis EVALSHA window"
	case targetRedisRoll:
		return "redis MULTI ZREMRANGEBYSCORE ZADD ZRANGE EXPIRE EXEC"
	}
	return "?"
}

// script is the Lua script t sends by EVALSHA, if any.
func (t target) script() string {
	switch t {
	case targetRedisLua:
		return tokenBucketLua
	case targetRedisFWLua:
		return fixedWindowLua
	}
	return ""
}

// replies is how many RESP replies one request of t reads: its commands.
func (t target) replies() int {
	switch t {
	case targetRedisFW:
		return 2
	case targetRedisFWMulti:
		return 4 // +OK, +QUEUED, +QUEUED, and EXEC's array
	case targetRedisRoll:
		return 6 // +OK, four +QUEUED, and EXEC's array
	}
	return 1
}

// The sluice commands a workload can send (workload.Command). RL.PREDUCE
// is the default and the only one that mixes with RL.PGET and HIT.
const (
	cmdRLPReduce   = "RL.PREDUCE"
	cmdCLThrottle  = "CL.THROTTLE"
	cmdCLPThrottle = "CL.PTHROTTLE"
	cmdFWIncr      = "FW.INCR"
	cmdFWPIncr     = "FW.PINCR"
	cmdRollLimit   = "ROLL.LIMIT"
)

var sluiceCommands = []string{cmdRLPReduce, cmdCLThrottle, cmdCLPThrottle, cmdFWIncr, cmdFWPIncr, cmdRollLimit}

// redisTargets is what --compare redis runs for a workload: the Redis way
// of doing what its sluice command does. GCRA is compared with redis-cell's
// CL.THROTTLE (seconds only: redis-cell has no CL.PTHROTTLE), fixed windows
// with what fixed-window middlewares send to Redis; both with the plain
// INCR+EXPIRE pair as the cheapest limiter Redis can run at all.
func redisTargets(cmd string) []target {
	switch cmd {
	case cmdCLThrottle, cmdCLPThrottle:
		return []target{targetRedisFW, targetRedisCell}
	case cmdFWIncr, cmdFWPIncr:
		return []target{targetRedisFW, targetRedisFWMulti, targetRedisFWLua}
	case cmdRollLimit:
		return []target{targetRedisRoll}
	}
	return []target{targetRedisINCR, targetRedisLua}
}

// workload is one load to apply: the same for every target, so that ratios
// compare like with like.
type workload struct {
	Command  string // the sluice command: one of sluiceCommands; empty means RL.PREDUCE
	Conns    int
	Pipeline int
	Requests int64
	Keys     int64
	Dist     string  // uniform, zipf or seq (every key once, in order, then again)
	ZipfS    float64 // zipf exponent, > 1
	GetPct   int     // share of RL.PGET among sluice commands, percent
	HitPct   int     // share of HIT (policy rules) among sluice commands, percent
	Take     int64   // RL TAKE, CL quantity, FW COST (ROLL.LIMIT has none)
	Max      int64   // RL max, CL max_burst and count, FW limit, ROLL max
	RefillMs int64   // RL refill period, CL period, FW window, ROLL interval_ms (the seconds forms send it in whole seconds)
	// Only, when set, holds the key numbers drawn from, Keys of them (the
	// keys of one shard: replcost); nil: 0 to Keys-1.
	Only []int64
	// Rate paces the load at that many requests/s in all, shared evenly
	// by the connections; 0: as fast as the server answers.
	Rate float64
}

// command is the workload's sluice command, RL.PREDUCE when unset.
func (w workload) command() string {
	if w.Command == "" {
		return cmdRLPReduce
	}
	return w.Command
}

// windowSeconds is RefillMs in whole seconds, for the commands that take
// seconds (CL.THROTTLE, FW.INCR, redis-cell) and for EXPIRE: validate
// refuses a RefillMs they cannot carry.
func (w workload) windowSeconds() int64 { return w.RefillMs / 1000 }

// windowStart is the Unix second at which the fixed window holding now
// starts: the {window} of a middleware's ratelimit/{id}/{window} key.
func (w workload) windowStart(now time.Time) int64 {
	ws := max(w.windowSeconds(), 1)
	return now.Unix() / ws * ws
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
	GenCPU   time.Duration           // the load generator's own CPU during the run
	PeakRSS  int64                   // server peak RSS in bytes, when known
	// Cores is each CPU's busy share over the run, from /proc/stat (by
	// anyone); pinned, CPU 0 is the server's, CPU 1 the generator's.
	Cores []float64
}

// genBoundAt is the busy share of the generator's core from which a
// pinned row is flagged generator-bound: the generator, not the server,
// may have set its pace.
const genBoundAt = 0.90

// genShare is the generator's own CPU over the run as a share of one core.
func (r result) genShare() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return r.GenCPU.Seconds() / r.Elapsed.Seconds()
}

// core is CPU i's busy share over the run, -1 if unknown.
func (r result) core(i int) float64 {
	if i < len(r.Cores) {
		return r.Cores[i]
	}
	return -1
}

// generatorBound reports whether a pinned row's generator core (CPU 1)
// was at least genBoundAt busy.
func (r result) generatorBound(pinned bool) bool {
	return pinned && r.core(1) >= genBoundAt
}

// sharedAt is how much of the server's core (CPU 0), pinned, may be busy
// with others than the server before a row is flagged: other processes on
// the machine took that share of the server's core, so the row
// understates the server.
const sharedAt = 0.10

// serverShare is the server's CPU over the run as a share of one core.
func (r result) serverShare() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return r.CPU.Seconds() / r.Elapsed.Seconds()
}

// serverShared reports whether a pinned row's server core (CPU 0) was busy
// with others than the server for sharedAt of the run or more.
func (r result) serverShared(pinned bool) bool {
	return pinned && r.CPU > 0 && r.core(0) >= 0 && r.core(0)-r.serverShare() >= sharedAt
}

// serverText says how much of a core the server used and, pinned, how
// busy its core was, flagged when others took part of it.
func (r result) serverText(pinned bool) string {
	if r.CPU <= 0 {
		return "-"
	}
	s := fmt.Sprintf("%.0f%%", 100*r.serverShare())
	if pinned && r.core(0) >= 0 {
		s += fmt.Sprintf(", CPU 0 %.0f%% busy", 100*r.core(0))
		if r.serverShared(pinned) {
			s += " (server core shared)"
		}
	}
	return s
}

// generatorText says how busy the generator was: its own CPU as a share
// of one core and, pinned, how busy its core was, flagged when bound.
func (r result) generatorText(pinned bool) string {
	s := fmt.Sprintf("%.0f%%", 100*r.genShare())
	if pinned && r.core(1) >= 0 {
		s += fmt.Sprintf(", CPU 1 %.0f%% busy", 100*r.core(1))
		if r.generatorBound(pinned) {
			s += " (generator-bound)"
		}
	}
	return s
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
	if g.w.Only != nil {
		return g.w.Only[g.draw()]
	}
	return g.draw()
}

func (g *keyGen) draw() int64 {
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

// appendCommand appends one request for t as RESP arrays: for sluice, the
// workload's command, where op picks RL.PREDUCE, RL.PGET or HIT
// path=/bench ip=<key> in an RL.PREDUCE workload. nowUs is the generator's
// clock in Unix µs: the Redis fixed-window keys take the start of its
// window, the Redis sliding log its timestamp. seq numbers the request,
// unique in the run: the sliding log's member. sha is the script of
// targetRedisLua or targetRedisFWLua.
func appendCommand(b []byte, t target, w workload, key int64, op int, nowUs int64, seq uint64, sha string) []byte {
	var kb [24]byte
	k := strconv.AppendInt(append(kb[:0], "k:"...), key, 10)
	win := w.windowStart(time.UnixMicro(nowUs))
	switch t {
	case targetRedisRoll:
		return appendRollRedis(b, k, w, nowUs, seq)
	case targetRedisINCR:
		b = append(b, "*2\r\n$4\r\nINCR\r\n"...)
		return resp.AppendBulk(b, k)
	case targetRedisLua:
		b = append(b, "*8\r\n$7\r\nEVALSHA\r\n"...)
		b = resp.AppendBulkString(b, sha)
		b = append(b, "$1\r\n1\r\n"...)
		b = resp.AppendBulk(b, k)
		b = appendIntBulk(b, w.Max)
		b = appendIntBulk(b, w.RefillMs)
		b = appendIntBulk(b, w.Max) // refill amount: RL's default
		take := w.Take
		if op == opGet {
			take = 0
		}
		return appendIntBulk(b, take)
	case targetRedisCell:
		return appendThrottle(b, "CL.THROTTLE", k, w, w.windowSeconds())
	case targetRedisFW, targetRedisFWMulti, targetRedisFWLua:
		var fb [64]byte
		fk := append(append(fb[:0], "ratelimit/"...), k...)
		fk = strconv.AppendInt(append(fk, '/'), win, 10)
		if t == targetRedisFWLua {
			b = append(b, "*6\r\n$7\r\nEVALSHA\r\n"...)
			b = resp.AppendBulkString(b, sha)
			b = append(b, "$1\r\n1\r\n"...)
			b = resp.AppendBulk(b, fk)
			b = appendIntBulk(b, w.Take)
			return appendIntBulk(b, w.RefillMs)
		}
		if t == targetRedisFWMulti {
			b = append(b, "*1\r\n$5\r\nMULTI\r\n"...)
		}
		if w.Take == 1 {
			b = append(b, "*2\r\n$4\r\nINCR\r\n"...)
			b = resp.AppendBulk(b, fk)
		} else {
			b = append(b, "*3\r\n$6\r\nINCRBY\r\n"...)
			b = resp.AppendBulk(b, fk)
			b = appendIntBulk(b, w.Take)
		}
		// NX: the first request of a window sets its TTL and later ones
		// leave it, so the key goes when its window has passed.
		b = append(b, "*4\r\n$6\r\nEXPIRE\r\n"...)
		b = resp.AppendBulk(b, fk)
		b = appendIntBulk(b, w.windowSeconds())
		b = append(b, "$2\r\nNX\r\n"...)
		if t == targetRedisFWMulti {
			b = append(b, "*1\r\n$4\r\nEXEC\r\n"...)
		}
		return b
	}
	switch w.command() {
	case cmdRollLimit:
		b = append(b, "*4\r\n$10\r\nROLL.LIMIT\r\n"...)
		b = resp.AppendBulk(b, k)
		b = appendIntBulk(b, w.RefillMs)
		return appendIntBulk(b, w.Max)
	case cmdCLThrottle:
		return appendThrottle(b, cmdCLThrottle, k, w, w.windowSeconds())
	case cmdCLPThrottle:
		return appendThrottle(b, cmdCLPThrottle, k, w, w.RefillMs)
	case cmdFWIncr, cmdFWPIncr:
		window, n := w.RefillMs, "*4\r\n"
		if w.command() == cmdFWIncr {
			window = w.windowSeconds()
		}
		if w.Take != 1 {
			n = "*6\r\n"
		}
		b = append(b, n...)
		b = resp.AppendBulkString(b, w.command())
		b = resp.AppendBulk(b, k)
		b = appendIntBulk(b, w.Max)
		b = appendIntBulk(b, window)
		if w.Take != 1 {
			b = append(b, "$4\r\nCOST\r\n"...)
			b = appendIntBulk(b, w.Take)
		}
		return b
	}
	if op == opHit {
		b = append(b, "*3\r\n$3\r\nHIT\r\n$11\r\npath=/bench\r\n"...)
		var ib [32]byte
		return resp.AppendBulk(b, append(append(ib[:0], "ip="...), k...))
	}
	if op == opGet {
		b = append(b, "*4\r\n$7\r\nRL.PGET\r\n"...)
		b = resp.AppendBulk(b, k)
		b = appendIntBulk(b, w.Max)
		return appendIntBulk(b, w.RefillMs)
	}
	b = append(b, "*6\r\n$10\r\nRL.PREDUCE\r\n"...)
	b = resp.AppendBulk(b, k)
	b = appendIntBulk(b, w.Max)
	b = appendIntBulk(b, w.RefillMs)
	b = append(b, "$4\r\nTAKE\r\n"...)
	return appendIntBulk(b, w.Take)
}

// textNowUs is the clock requestText writes requests at: a time whose
// digits appear nowhere else in a request, so that they can be named.
const textNowUs = 1_111_111_111_111_111

// requestText is one request of t as text, with <id> for the key,
// <window> for the window's start, <now> for the clock in µs and <uuid>
// for a sliding log's member, for the docs.
func requestText(t target, w workload) string {
	b := appendCommand(nil, t, w, 0, opReduce, textNowUs, 0, "<sha>")
	var cmds []string
	for len(b) > 0 {
		var words []string
		words, b = splitArray(b)
		if words == nil {
			break
		}
		cmds = append(cmds, strings.Join(words, " "))
	}
	s := strings.Join(cmds, "; ")
	s = strings.ReplaceAll(s, "k:0", "k:<id>")
	s = strings.ReplaceAll(s, "/"+strconv.FormatInt(w.windowStart(time.UnixMicro(textNowUs)), 10), "/<window>")
	s = strings.ReplaceAll(s, string(appendMember(nil, 0)), "<uuid>")
	s = strings.ReplaceAll(s, strconv.FormatInt(textNowUs-w.RefillMs*1000, 10), "<now-interval>")
	return strings.ReplaceAll(s, strconv.FormatInt(textNowUs, 10), "<now>")
}

// appendRollRedis appends what rolling-rate-limiter's RedisRateLimiter
// sends for one limit(id) (getTimestamps with a new timestamp): a MULTI of
// ZREMRANGEBYSCORE key 0 (now - interval), ZADD key now <uuid v4>, ZRANGE
// key 0 -1 WITHSCORES and EXPIRE key <interval in whole seconds, rounded
// up>, and EXEC; its clock and scores are in µs. The client then decides
// from the timestamps it got back.
func appendRollRedis(b, k []byte, w workload, nowUs int64, seq uint64) []byte {
	b = append(b, "*1\r\n$5\r\nMULTI\r\n"...)
	b = append(b, "*4\r\n$16\r\nZREMRANGEBYSCORE\r\n"...)
	b = resp.AppendBulk(b, k)
	b = append(b, "$1\r\n0\r\n"...)
	b = appendIntBulk(b, nowUs-w.RefillMs*1000)
	b = append(b, "*4\r\n$4\r\nZADD\r\n"...)
	b = resp.AppendBulk(b, k)
	b = appendIntBulk(b, nowUs)
	var mb [36]byte
	b = resp.AppendBulk(b, appendMember(mb[:0], seq))
	b = append(b, "*5\r\n$6\r\nZRANGE\r\n"...)
	b = resp.AppendBulk(b, k)
	b = append(b, "$1\r\n0\r\n$2\r\n-1\r\n$10\r\nWITHSCORES\r\n"...)
	b = append(b, "*3\r\n$6\r\nEXPIRE\r\n"...)
	b = resp.AppendBulk(b, k)
	b = appendIntBulk(b, (w.RefillMs+999)/1000)
	return append(b, "*1\r\n$4\r\nEXEC\r\n"...)
}

// appendMember appends a 36-character member in the layout of a v4 UUID,
// as the package's uuid() makes, derived from seq so that members are
// unique in a run (two calls in the same µs must both be recorded) and the
// bytes are reproducible.
func appendMember(b []byte, seq uint64) []byte {
	mix := func(x uint64) uint64 { // splitmix64's finaliser
		x += 0x9e3779b97f4a7c15
		x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
		x = (x ^ x>>27) * 0x94d049bb133111eb
		return x ^ x>>31
	}
	hi, lo := mix(seq), mix(^seq)
	hi = hi&^0xf000 | 0x4000           // version 4
	lo = lo&^(0xc000<<48) | 0x8000<<48 // variant 10
	const hex = "0123456789abcdef"
	var raw [32]byte
	for i := range 16 {
		raw[15-i] = hex[hi>>(4*i)&0xf]
		raw[31-i] = hex[lo>>(4*i)&0xf]
	}
	b = append(b, raw[0:8]...)
	b = append(b, '-')
	b = append(b, raw[8:12]...)
	b = append(b, '-')
	b = append(b, raw[12:16]...)
	b = append(b, '-')
	b = append(b, raw[16:20]...)
	b = append(b, '-')
	return append(b, raw[20:32]...)
}

// splitArray splits the first RESP array of bulk strings off b, as
// appendCommand writes them; nil words if b does not start with one.
func splitArray(b []byte) (words []string, rest []byte) {
	line, rest, ok := bytes.Cut(b, []byte("\r\n"))
	if !ok || len(line) < 2 || line[0] != '*' {
		return nil, b
	}
	n, err := strconv.Atoi(string(line[1:]))
	if err != nil {
		return nil, b
	}
	for range n {
		line, rest, ok = bytes.Cut(rest, []byte("\r\n"))
		size, err := strconv.Atoi(string(line[min(1, len(line)):]))
		if !ok || len(line) < 2 || line[0] != '$' || err != nil || size+2 > len(rest) {
			return nil, b
		}
		words = append(words, string(rest[:size]))
		rest = rest[size+2:]
	}
	return words, rest
}

// appendThrottle appends a GCRA request in redis-cell's grammar, name key
// max_burst count period quantity, with the workload's max as both burst
// and count (compare-redis.sh's "100 100 60").
func appendThrottle(b []byte, name string, k []byte, w workload, period int64) []byte {
	b = append(b, "*6\r\n"...)
	b = resp.AppendBulkString(b, name)
	b = resp.AppendBulk(b, k)
	b = appendIntBulk(b, w.Max)
	b = appendIntBulk(b, w.Max)
	b = appendIntBulk(b, period)
	return appendIntBulk(b, w.Take)
}

func appendIntBulk(b []byte, n int64) []byte {
	var nb [20]byte
	return resp.AppendBulk(b, strconv.AppendInt(nb[:0], n, 10))
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
		// Read every element even after an error (EXEC answers a failed
		// command inside its array), so that the connection stays in step;
		// report the first error.
		isErr, msg := false, ""
		for range max(n, 0) {
			e, m, err := readReply(r)
			if err != nil {
				return false, "", err
			}
			if e && !isErr {
				isErr, msg = true, m
			}
		}
		return isErr, msg, nil
	}
	return false, "", fmt.Errorf("unexpected reply %q", line)
}

// run applies w to addr as t. Each connection sends Pipeline requests,
// reads their replies, and records the round trip as every request's
// latency, as redis-benchmark does. An error reply ends the run with an
// error: a request the server refused measures nothing, and counting it as
// throughput would flatter a server that does not know the command.
func run(addr string, t target, w workload, sha string) (result, error) {
	var (
		remaining atomic.Int64
		seq       atomic.Int64
		reqSeq    atomic.Uint64
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
	replies := t.replies()
	var ioErr atomic.Value
	gen0, cores0 := selfCPU(), readCores()
	start := time.Now()
	for i, c := range conns {
		wg.Go(func() {
			defer c.Close()
			h := hdrhistogram.New(1, 60_000_000, 3)
			g := newKeyGen(w, uint64(i)+1, &seq)
			r := bufio.NewReaderSize(c, 64<<10)
			buf := make([]byte, 0, 64<<10)
			sent := int64(0)
			for errs.Load() == 0 {
				n := int64(w.Pipeline)
				if left := remaining.Add(-n); left < 0 {
					n += left
					if n <= 0 {
						break
					}
				}
				if w.Rate > 0 {
					// Each connection keeps its share of the rate from the start.
					due := start.Add(time.Duration(float64(sent) / (w.Rate / float64(w.Conns)) * float64(time.Second)))
					time.Sleep(time.Until(due))
					sent += n
				}
				buf = buf[:0]
				nowUs := time.Now().UnixMicro()
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
					buf = appendCommand(buf, t, w, g.next(), op, nowUs, reqSeq.Add(1)-1, sha)
				}
				t0 := time.Now()
				if _, err := c.Write(buf); err != nil {
					ioErr.CompareAndSwap(nil, err)
					return
				}
				for range n * int64(replies) {
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
	res := result{Target: t, Requests: total.TotalCount(), Errors: errs.Load(), Elapsed: time.Since(start), Hist: total, GenCPU: selfCPU() - gen0,
		Cores: coreBusy(cores0, readCores())}
	if v, ok := firstErr.Load().(string); ok {
		res.FirstErr = v
	}
	if v, ok := ioErr.Load().(error); ok {
		if errors.Is(v, io.EOF) {
			// The server hung up on a request: what it did not answer
			// was not served, so the run measured nothing sound either.
			v = fmt.Errorf("the server closed a connection before it answered (after %d requests in all): %w", res.Requests, v)
		}
		return res, fmt.Errorf("%s: %w", targetName(t, w), v)
	}
	if res.Errors > 0 {
		return res, fmt.Errorf("%s: the server answered %d commands with an error, the first %q; the run stopped, since refused commands measure nothing (does the server know the command, and are the workload's parameters in its ranges?)",
			targetName(t, w), res.Errors, res.FirstErr)
	}
	return res, nil
}

// selfCPU is this process's user+system CPU time so far: the generator's
// cost, which says whether it, rather than the server, set the pace.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
