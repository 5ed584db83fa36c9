package server

import (
	"context"
	"hash/fnv"
	"math"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/metrics"
	"github.com/sluicehq/sluice/storage"
)

// The CL.* and FW.* commands over the wire, through go-redis, against a
// real server with an injected clock.

// ints runs a command that must answer an array of integers.
func ints(t *testing.T, c *redis.Client, args ...any) []int64 {
	t.Helper()
	v, err := c.Do(context.Background(), args...).Result()
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	arr, ok := v.([]any)
	if !ok {
		t.Fatalf("%v: reply %#v, want an array", args, v)
	}
	out := make([]int64, len(arr))
	for i, e := range arr {
		n, ok := e.(int64)
		if !ok {
			t.Fatalf("%v: element %d is %#v, want an integer", args, i, e)
		}
		out[i] = n
	}
	return out
}

func wantInts(t *testing.T, c *redis.Client, want []int64, args ...any) {
	t.Helper()
	if got := ints(t, c, args...); !reflect.DeepEqual(got, want) {
		t.Fatalf("%v = %v, want %v", args, got, want)
	}
}

func dbSize(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	n, err := c.DBSize(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The spec's CL.THROTTLE example, with AT and on the server clock, in both
// forms, with names and keywords in any case.
func TestCLSpecExample(t *testing.T) {
	clock := newTestClock(t0) // 1700000000 s
	srv := startServer(t, Config{Clock: clock.now})
	c := newClient(t, srv)
	wantInts(t, c, []int64{0, 16, 15, -1, 2}, "CL.THROTTLE", "user123", 15, 30, 60, "AT", 1700000000)
	wantInts(t, c, []int64{0, 16, 15, -1, 2}, "CL.THROTTLE", "user124", 15, 30, 60) // the call of docs/protocol.md, no AT
	wantInts(t, c, []int64{0, 16, 15, -1, 2}, "cl.throttle", "user125", 15, 30, 60, 1, "at", 1700000000)
	wantInts(t, c, []int64{0, 16, 15, -1, 2000}, "CL.PTHROTTLE", "user126", 15, 30, 60000)
	wantInts(t, c, []int64{0, 16, 15, -1, 2000}, "Cl.PThrottle", "user127", 15, 30, 60000, "At", 1700000000000)

	// The second call on the server clock sees the first: 14 left, full
	// again in 4 s. Then 2 s later one emission interval has passed.
	wantInts(t, c, []int64{0, 16, 14, -1, 4}, "CL.THROTTLE", "user124", 15, 30, 60)
	clock.ms.Store(t0 + 2000)
	wantInts(t, c, []int64{0, 16, 14, -1, 4}, "CL.THROTTLE", "user124", 15, 30, 60)

	// A burst of 16 empties it; the 17th waits one emission interval.
	for i := range 16 {
		wantInts(t, c, []int64{0, 16, int64(15 - i), -1, int64(2 * (i + 1))}, "CL.THROTTLE", "burst", 15, 30, 60, "AT", 1700000000)
	}
	wantInts(t, c, []int64{1, 16, 0, 2, 32}, "CL.THROTTLE", "burst", 15, 30, 60, "AT", 1700000000)
	// Last AT wins.
	wantInts(t, c, []int64{0, 16, 0, -1, 32}, "CL.THROTTLE", "burst", 15, 30, 60, "AT", 1, "AT", 1700000002)
}

// The spec's FW.INCR example and its sixth call, with AT and on the server
// clock.
func TestFWSpecExample(t *testing.T) {
	clock := newTestClock(t0)
	srv := startServer(t, Config{Clock: clock.now})
	c := newClient(t, srv)
	wantInts(t, c, []int64{0, 5, 4, -1, 100, 1, 1700000100}, "FW.INCR", "user:42", 5, 300, "AT", 1700000000)
	for i := int64(2); i <= 5; i++ {
		wantInts(t, c, []int64{0, 5, 5 - i, -1, 100 - i + 1, i, 1700000100}, "FW.INCR", "user:42", 5, 300, "AT", 1700000000+i-1)
	}
	wantInts(t, c, []int64{1, 5, 0, 95, 95, 6, 1700000100}, "FW.INCR", "user:42", 5, 300, "AT", 1700000005)
	// GET answers the same count and writes nothing.
	wantInts(t, c, []int64{1, 5, 0, 95, 95, 6, 1700000100}, "fw.get", "user:42", 5, 300, "at", 1700000005)
	wantInts(t, c, []int64{1, 5, 0, 95, 95, 6, 1700000100}, "FW.GET", "user:42", 5, 300, "AT", 1700000005)

	// The same on the server clock, and in the P forms.
	wantInts(t, c, []int64{0, 5, 4, -1, 100, 1, 1700000100}, "FW.INCR", "user:43", 5, 300)
	wantInts(t, c, []int64{0, 5, 3, -1, 100000, 2, 1700000100000}, "FW.PINCR", "user:43", 5, 300000)
	wantInts(t, c, []int64{0, 5, 3, -1, 100000, 2, 1700000100000}, "FW.PGET", "user:43", 5, 300000)
}

// FW.GET and FW.PGET write nothing, so DBSIZE does not move; FW.INCR adds
// one record per counter.
func TestFWGetWritesNothing(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now})
	c := newClient(t, srv)
	wantInts(t, c, []int64{0, 5, 5, -1, 100, 0, 1700000100}, "FW.GET", "new", 5, 300)
	wantInts(t, c, []int64{0, 5, 5, -1, 100000, 0, 1700000100000}, "FW.PGET", "new", 5, 300000, "COST", 0)
	if n := dbSize(t, c); n != 0 {
		t.Fatalf("DBSIZE after FW.GET = %d, want 0", n)
	}
	ints(t, c, "FW.INCR", "new", 5, 300)
	if n := dbSize(t, c); n != 1 {
		t.Fatalf("DBSIZE after FW.INCR = %d, want 1", n)
	}
}

// The edges the spec names, over the wire.
func TestCLEdges(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now})
	c := newClient(t, srv)
	const at = 1700000000

	// quantity 0 peeks: nothing consumed, however often. Under stricter
	// parameters the same TAT answers limited, as in redis-cell.
	wantInts(t, c, []int64{0, 16, 6, -1, 20}, "CL.THROTTLE", "peek", 15, 30, 60, 10, "AT", at)
	for range 3 {
		wantInts(t, c, []int64{0, 16, 6, -1, 20}, "CL.THROTTLE", "peek", 15, 30, 60, 0, "AT", at)
	}
	wantInts(t, c, []int64{1, 1, 0, 18, 20}, "CL.THROTTLE", "peek", 0, 30, 60, 0, "AT", at)
	wantInts(t, c, []int64{0, 16, 6, -1, 20}, "CL.THROTTLE", "peek", 15, 30, 60, 0, "AT", at)

	// A quantity above the limit can never pass: retry_after is -1 and
	// nothing is consumed.
	wantInts(t, c, []int64{1, 16, 16, -1, 0}, "CL.THROTTLE", "big", 15, 30, 60, 17, "AT", at)
	wantInts(t, c, []int64{0, 16, 0, -1, 32}, "CL.THROTTLE", "big", 15, 30, 60, 16, "AT", at)

	// AT going backwards: the stored TAT is later than now, so the reply
	// counts from it: 14 s to full, 9 left.
	wantInts(t, c, []int64{0, 16, 15, -1, 2}, "CL.THROTTLE", "back", 15, 30, 60, "AT", at)
	wantInts(t, c, []int64{0, 16, 9, -1, 14}, "CL.THROTTLE", "back", 15, 30, 60, "AT", at-10)
	wantInts(t, c, []int64{0, 16, 13, -1, 6}, "CL.THROTTLE", "back", 15, 30, 60, "AT", at)

	// The rounding: 2.0004 s is 2 s (redis-cell 0.4+), and the P form
	// rounds ms up.
	wantInts(t, c, []int64{0, 1, 0, -1, 2}, "CL.THROTTLE", "round", 0, 5000, 10002, "AT", at)
	wantInts(t, c, []int64{0, 1, 0, -1, 334}, "CL.PTHROTTLE", "round2", 0, 3, 1001, "AT", int64(at)*1000)

	// AT before 1970 is a time like any other.
	wantInts(t, c, []int64{0, 16, 15, -1, 2}, "CL.THROTTLE", "old", 15, 30, 60, "AT", -1000)
}

func TestFWEdges(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now})
	c := newClient(t, srv)
	const at = 1700000000 // a multiple of 100 s, 1700000100 of 300 s

	// Counters shared between the plain and the P form of one window.
	wantInts(t, c, []int64{0, 5, 4, -1, 100, 1, 1700000100}, "FW.INCR", "k", 5, 300, "AT", at)
	wantInts(t, c, []int64{0, 5, 3, -1, 99500, 2, 1700000100000}, "FW.PINCR", "k", 5, 300000, "AT", int64(at)*1000+500)
	wantInts(t, c, []int64{0, 5, 3, -1, 100, 2, 1700000100}, "FW.GET", "k", 5, 300, "AT", at)
	// Another window length or STAGGER is another counter.
	wantInts(t, c, []int64{0, 5, 4, -1, 141, 1, 1700000141}, "FW.INCR", "k", 5, 301, "AT", at)
	wantInts(t, c, []int64{0, 5, 4, -1, 1000, 1, 1700000001000}, "FW.PINCR", "k", 5, 1000, "AT", int64(at)*1000)
	if r := ints(t, c, "FW.INCR", "k", 5, 300, "STAGGER", "AT", at); r[5] != 1 {
		t.Fatalf("STAGGER shares the unstaggered counter: %v", r)
	}

	// The limit changed between calls keeps the count.
	wantInts(t, c, []int64{0, 5, 2, -1, 100, 3, 1700000100}, "FW.INCR", "k", 5, 300, "AT", at)
	wantInts(t, c, []int64{1, 2, 0, 100, 100, 4, 1700000100}, "FW.INCR", "k", 2, 300, "AT", at)
	wantInts(t, c, []int64{0, 10, 5, -1, 100, 5, 1700000100}, "FW.INCR", "k", 10, 300, "AT", at)

	// COST above the limit: never allowed, retry -1; counted by default,
	// not with NOCOUNTBLOCKED.
	wantInts(t, c, []int64{1, 5, 5, -1, 100, 0, 1700000100}, "FW.INCR", "big", 5, 300, "COST", 6, "NOCOUNTBLOCKED", "AT", at)
	wantInts(t, c, []int64{1, 5, 0, -1, 100, 6, 1700000100}, "FW.INCR", "big", 5, 300, "AT", at, "COST", 6)
	// NOCOUNTBLOCKED keeps used at the limit.
	for range 3 {
		ints(t, c, "FW.INCR", "ncb", 2, 300, "NOCOUNTBLOCKED", "AT", at)
	}
	wantInts(t, c, []int64{1, 2, 0, 100, 100, 2, 1700000100}, "FW.INCR", "ncb", 2, 300, "nocountblocked", "AT", at)

	// Exactly at the boundary: the last second of a window, then the
	// first of the next, which starts from 0.
	wantInts(t, c, []int64{0, 1, 0, -1, 1, 1, 1700000100}, "FW.INCR", "edge", 1, 300, "AT", 1700000099)
	wantInts(t, c, []int64{1, 1, 0, 1, 1, 2, 1700000100}, "FW.INCR", "edge", 1, 300, "AT", 1700000099)
	wantInts(t, c, []int64{0, 1, 0, -1, 300, 1, 1700000400}, "FW.INCR", "edge", 1, 300, "AT", 1700000100)
	wantInts(t, c, []int64{0, 1, 0, -1, 1, 1, 1700000400000}, "FW.PINCR", "edgems", 1, 300000, "AT", 1700000399999)
	wantInts(t, c, []int64{0, 1, 0, -1, 300000, 1, 1700000700000}, "FW.PINCR", "edgems", 1, 300000, "AT", 1700000400000)

	// AT going backwards lands in an earlier window, counted from 0: the
	// record holds one window.
	wantInts(t, c, []int64{0, 5, 4, -1, 100, 1, 1700000100}, "FW.INCR", "back", 5, 300, "AT", at)
	wantInts(t, c, []int64{0, 5, 4, -1, 100, 1, 1699999800}, "FW.INCR", "back", 5, 300, "AT", at-300)
	wantInts(t, c, []int64{0, 5, 4, -1, 100, 1, 1700000100}, "FW.INCR", "back", 5, 300, "AT", at)

	// The plain forms round a staggered window's reset up to whole seconds.
	got := ints(t, c, "FW.PINCR", "user:42", 5, 300000, "STAGGER", "AT", int64(at)*1000)
	sec := ints(t, c, "FW.INCR", "user:42", 5, 300, "STAGGER", "AT", at)
	if sec[5] != 2 || sec[6] != (got[6]+999)/1000 || sec[4] != (got[4]+999)/1000 {
		t.Fatalf("staggered: ms reply %v, s reply %v", got, sec)
	}
}

// STAGGER moves each key's reset to the FNV-1a hash of the key mod the
// window: different keys reset at different instants; without it they
// share one.
func TestFWStaggerSpreads(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now})
	c := newClient(t, srv)
	const window = 60_000
	resets := map[int64]bool{}
	for i := range 50 {
		key := "user:" + strconv.Itoa(i)
		plain := ints(t, c, "FW.PINCR", key, 10, window)
		if plain[6] != (t0/window+1)*window {
			t.Fatalf("%s unstaggered reset_at %d", key, plain[6])
		}
		r := ints(t, c, "FW.PINCR", key, 10, window, "STAGGER")
		h := fnv.New64a()
		h.Write([]byte(key))
		offset := int64(h.Sum64() % window)
		if r[5] != 1 || (r[6]-offset)%window != 0 || r[4] < 1 || r[4] > window || r[6]-r[4] != t0 {
			t.Fatalf("%s staggered reply %v, offset %d", key, r, offset)
		}
		resets[r[6]] = true
	}
	if len(resets) < 45 {
		t.Fatalf("50 staggered keys reset at only %d instants", len(resets))
	}
}

// Every malformed or out-of-range call is an error naming the argument,
// and changes nothing.
func TestLimiterErrors(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now})
	c := newClient(t, srv)
	ctx := context.Background()
	for _, tc := range []struct {
		args []any
		want string
	}{
		{[]any{"CL.THROTTLE", "k", 1, 2}, "ERR wrong number of arguments for 'cl.throttle' command"},
		{[]any{"cl.pthrottle", "k"}, "ERR wrong number of arguments for 'cl.pthrottle' command"},
		{[]any{"FW.INCR", "k", 1}, "ERR wrong number of arguments for 'fw.incr' command"},
		{[]any{"FW.PGET"}, "ERR wrong number of arguments for 'fw.pget' command"},
		{[]any{"CL.THROTTLE", "k", "x", 30, 60}, `ERR max_burst: "x" is not an integer: want a decimal int64`},
		{[]any{"CL.THROTTLE", "k", 15, "3.5", 60}, `ERR count: "3.5" is not an integer: want a decimal int64`},
		{[]any{"CL.THROTTLE", "k", 15, 30, "9223372036854775808"}, `ERR period: "9223372036854775808" is not an integer: want a decimal int64`},
		{[]any{"CL.PTHROTTLE", "k", 15, 30, ""}, `ERR period_ms: "" is not an integer: want a decimal int64`},
		{[]any{"CL.THROTTLE", "k", 15, 30, 60, "one"}, `ERR quantity: "one" is not an integer: want a decimal int64`},
		{[]any{"CL.THROTTLE", "k", 15, 30, 60, 1, 2}, `ERR syntax error at "2": want AT`},
		{[]any{"CL.THROTTLE", "k", 15, 30, 60, "AT", 5, 2}, `ERR syntax error at "2": want AT`},
		{[]any{"CL.THROTTLE", "k", 15, 30, 60, "AT"}, `ERR syntax error: AT needs a value: want AT unix_s`},
		{[]any{"CL.PTHROTTLE", "k", 15, 30, 60, 1, "AT"}, `ERR syntax error: AT needs a value: want AT unix_ms`},
		{[]any{"CL.THROTTLE", "k", 15, 30, 60, "AT", "now"}, `ERR AT: "now" is not an integer: want a decimal int64`},
		{[]any{"CL.THROTTLE", "k", -1, 30, 60}, "ERR max_burst: -1: want 0 or more"},
		{[]any{"CL.THROTTLE", "k", 15, 0, 60}, "ERR count: 0: want 1 or more"},
		{[]any{"CL.THROTTLE", "k", 15, 30, -60}, "ERR period: -60: want 1 or more"},
		{[]any{"CL.PTHROTTLE", "k", 15, 30, 0}, "ERR period_ms: 0: want 1 or more"},
		{[]any{"FW.PINCR", "k", 5, -1}, "ERR window_ms: -1: want 1 or more"},
		{[]any{"FW.PGET", "k", 5, 0}, "ERR window_ms: 0: want 1 or more"},
		{[]any{"CL.THROTTLE", "k", 15, 30, 60, -1}, "ERR quantity: -1: want 0 or more"},
		{[]any{"CL.THROTTLE", "k", 15, 30, 9223372036854775807}, "ERR period: 9223372036854775807: too long, its nanoseconds overflow int64: want at most 9223372036"},
		{[]any{"CL.PTHROTTLE", "k", 15, 2000000, 1}, "ERR count: 2000000: rate too high, more than one request per nanosecond: want at most 1000000 for this period"},
		{[]any{"CL.THROTTLE", "k", 15, 30, 60, "AT", 9223372036854775807}, "ERR AT: 9223372036854775807 is out of range: want -9223372036 to 9223372036"},
		{[]any{"FW.INCR", "k", "five", 300}, `ERR limit: "five" is not an integer: want a decimal int64`},
		{[]any{"FW.PINCR", "k", 5, "x"}, `ERR window_ms: "x" is not an integer: want a decimal int64`},
		{[]any{"FW.INCR", "k", -5, 300}, "ERR limit: -5: want 0 or more"},
		{[]any{"FW.INCR", "k", 5, 0}, "ERR window: 0: want 1 or more"},
		{[]any{"FW.INCR", "k", 5, 300, "COST", -1}, "ERR COST: -1: want 0 or more"},
		{[]any{"FW.INCR", "k", 5, 300, "COST"}, "ERR syntax error: COST needs a value: want COST n"},
		{[]any{"FW.INCR", "k", 5, 300, "COST", "a"}, `ERR COST: "a" is not an integer: want a decimal int64`},
		{[]any{"FW.PINCR", "k", 5, 300, "AT"}, "ERR syntax error: AT needs a value: want AT unix_ms"},
		{[]any{"FW.INCR", "k", 5, 300, "STRICT"}, `ERR syntax error at "STRICT": want COST, AT, NOCOUNTBLOCKED or STAGGER`},
		{[]any{"FW.GET", "k", 5, 300, "NOCOUNTBLOCKED"}, `ERR syntax error at "NOCOUNTBLOCKED": want COST, AT or STAGGER`},
		{[]any{"FW.INCR", "k", 5, 9223372036854775807}, "ERR window: 9223372036854775807: too long, its milliseconds overflow int64: want at most 9223372036854775"},
		{[]any{"FW.INCR", "k", 5, 300, "AT", -9223372036854775808}, "ERR AT: -9223372036854775808 is out of range: want -9223372036854775 to 9223372036854775"},
		{[]any{"FW.INCR", "\xff\xfe", 5, 300, "COST", "\xff"}, `ERR COST: "\xff" is not an integer: want a decimal int64`},
	} {
		err := c.Do(ctx, tc.args...).Err()
		if err == nil || err.Error() != tc.want {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	if n := dbSize(t, c); n != 0 {
		t.Fatalf("refused calls stored %d records", n)
	}
	// The connection is still in step: the next call answers.
	wantInts(t, c, []int64{0, 16, 15, -1, 2}, "CL.THROTTLE", "k", 15, 30, 60)
}

// Non-UTF-8 keys and values at the int64 edges are answered, with a reply
// or an error, and the server stays up.
func TestLimiterOddInputs(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now})
	c := newClient(t, srv)
	ctx := context.Background()
	wantInts(t, c, []int64{0, 16, 15, -1, 2}, "CL.THROTTLE", "\xff\xfe\x00\r\n", 15, 30, 60)
	wantInts(t, c, []int64{0, 16, 14, -1, 4}, "CL.THROTTLE", "\xff\xfe\x00\r\n", 15, 30, 60)
	wantInts(t, c, []int64{0, 5, 4, -1, 100, 1, 1700000100}, "FW.INCR", "\xc3\x28{\xff}", 5, 300)
	wantInts(t, c, []int64{0, 5, 4, -1, 100, 1, 1700000100}, "FW.INCR", "", 5, 300)
	edges := []string{"9223372036854775807", "-9223372036854775808", "9223372036854775806", "-9223372036854775807", "0", "1", "-1", "9223372036854", "9223372036854775"}
	cmds := [][]string{
		{"CL.THROTTLE", "e", "A", "B", "C", "D", "AT", "E"},
		{"CL.PTHROTTLE", "e", "A", "B", "C", "D", "AT", "E"},
		{"FW.INCR", "e", "A", "B", "COST", "D", "AT", "E"},
		{"FW.PINCR", "e", "A", "B", "COST", "D", "AT", "E", "STAGGER"},
		{"FW.PGET", "e", "A", "B", "COST", "D", "AT", "E", "STAGGER"},
	}
	calls := 0
	for _, cmd := range cmds {
		for i, v := range edges {
			// Each slot gets the edges in turn, the others 1 or the
			// next edge, so every slot meets every edge.
			for slot := range 5 {
				args := make([]any, len(cmd))
				for j, a := range cmd {
					args[j] = a
				}
				vals := []string{"1", "1", "1", "1", "1"}
				if slot > 0 {
					vals = []string{edges[(i+1)%len(edges)], edges[(i+2)%len(edges)], edges[(i+3)%len(edges)], edges[(i+4)%len(edges)], edges[(i+5)%len(edges)]}
				}
				vals[slot] = v
				for j, a := range cmd {
					if len(a) == 1 && a[0] >= 'A' && a[0] <= 'E' {
						args[j] = vals[a[0]-'A']
					}
				}
				calls++
				r, err := c.Do(ctx, args...).Result()
				if err != nil {
					if !strings.HasPrefix(err.Error(), "ERR ") {
						t.Fatalf("%q: %v", args, err)
					}
					continue
				}
				arr, ok := r.([]any)
				if !ok || (len(arr) != 5 && len(arr) != 7) {
					t.Fatalf("%q: reply %#v", args, r)
				}
				// Remaining within [0, limit], reset_after >= 0.
				lim, rem, reset := arr[1].(int64), arr[2].(int64), arr[4].(int64)
				if rem < 0 || rem > lim || reset < 0 {
					t.Fatalf("%q: reply %v", args, arr)
				}
			}
		}
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("after %d odd calls: %v", calls, err)
	}
}

// GCRA and window state are written through the store like buckets: with
// --fsync always, what was answered is there after a restart.
func TestLimitersSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	clock := newTestClock(t0)
	run := func(check func(c *redis.Client)) {
		t.Helper()
		store, err := storage.Open(dir, storage.Options{Sync: storage.SyncAlways})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := New(Config{Store: store, Clock: clock.now})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ln) }()
		c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1})
		check(c)
		c.Close()
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}
	}
	run(func(c *redis.Client) {
		wantInts(t, c, []int64{0, 16, 15, -1, 2}, "CL.THROTTLE", "user123", 15, 30, 60)
		wantInts(t, c, []int64{0, 5, 4, -1, 100, 1, 1700000100}, "FW.INCR", "user:42", 5, 300)
		wantInts(t, c, []int64{0, 0, 0, 2, 2}, "ROLL.LIMIT", "ex", 10, 3, "MINDIFF", 2, "AT", 0)
		wantInts(t, c, []int64{0, 0, 0, 2, 1}, "ROLL.LIMIT", "ex", 10, 3, "MINDIFF", 2, "AT", 4000)
	})
	run(func(c *redis.Client) {
		wantInts(t, c, []int64{0, 16, 14, -1, 4}, "CL.THROTTLE", "user123", 15, 30, 60)
		wantInts(t, c, []int64{0, 5, 3, -1, 100, 2, 1700000100}, "FW.INCR", "user:42", 5, 300)
		// The spec example's third call sees both actions of the first run.
		wantInts(t, c, []int64{1, 0, 1, 5, 0}, "ROLL.LIMIT", "ex", 10, 3, "MINDIFF", 2, "AT", 5000)
	})
}

// COMMAND, COMMAND INFO and COMMAND DOCS describe the new commands.
func TestLimiterCommandInfo(t *testing.T) {
	srv := startServer(t, Config{})
	c := newClient(t, srv)
	ctx := context.Background()
	info, err := c.Command(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]struct {
		arity int8
		flag  string
	}{
		"cl.throttle": {-5, "write"}, "cl.pthrottle": {-5, "write"},
		"fw.incr": {-4, "write"}, "fw.pincr": {-4, "write"},
		"fw.get": {-4, "readonly"}, "fw.pget": {-4, "readonly"},
	} {
		ci := info[name]
		if ci == nil || ci.Arity != want.arity || !slices.Contains(ci.Flags, want.flag) || ci.FirstKeyPos != 1 || ci.LastKeyPos != 1 || ci.StepCount != 1 {
			t.Errorf("COMMAND's %s = %+v, want arity %d, flag %s, key at 1", name, ci, want.arity, want.flag)
		}
	}
	for _, name := range []string{"cl.throttle", "CL.PTHROTTLE", "fw.incr", "fw.pincr", "fw.get", "fw.pget"} {
		v, err := c.Do(ctx, "COMMAND", "INFO", name).Slice()
		if err != nil || len(v) != 1 || v[0] == nil {
			t.Errorf("COMMAND INFO %s = %v, %v", name, v, err)
		}
	}

	// COMMAND DOCS: a record per command, with its arguments (RESP3).
	docs, err := c.Do(ctx, "COMMAND", "DOCS", "fw.incr", "CL.PTHROTTLE", "ping", "nosuch").Result()
	if err != nil {
		t.Fatal(err)
	}
	m, ok := docs.(map[any]any)
	if !ok || len(m) != 3 {
		t.Fatalf("COMMAND DOCS = %#v, want the records of fw.incr, cl.pthrottle and ping", docs)
	}
	for name, want := range map[string][]string{
		"fw.incr":      {"key", "limit", "window", "n", "unix_s", "nocountblocked", "stagger"},
		"cl.pthrottle": {"key", "max_burst", "count", "period_ms", "quantity", "unix_ms"},
		"ping":         {"message"},
	} {
		rec, _ := m[name].(map[any]any)
		if s, _ := rec["summary"].(string); s == "" {
			t.Errorf("COMMAND DOCS %s has no summary: %#v", name, rec)
		}
		if s, _ := rec["since"].(string); s == "" {
			t.Errorf("COMMAND DOCS %s has no since (redis-cli's HELP prints it): %#v", name, rec)
		}
		args, _ := rec["arguments"].([]any)
		var got []string
		for _, a := range args {
			am, _ := a.(map[any]any)
			n, _ := am["name"].(string)
			got = append(got, n)
		}
		if !slices.Equal(got, want) {
			t.Errorf("COMMAND DOCS %s arguments %v, want %v", name, got, want)
		}
	}
	// RESP2: a flat array of name, record; a record for every command of
	// the table, since redis-cli's HELP and Tab completion know only those.
	c2 := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), Protocol: 2})
	defer c2.Close()
	flat, err := c2.Do(ctx, "COMMAND", "DOCS").Slice()
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for i := 0; i+1 < len(flat); i += 2 {
		name, _ := flat[i].(string)
		rec, _ := flat[i+1].([]any)
		// Containers (CLIENT, ...) add their subcommands.
		if len(rec) != 8 && (len(rec) != 10 || rec[8] != "subcommands") {
			t.Errorf("COMMAND DOCS %s = %v, want summary, since, group, arguments", name, rec)
		}
		documented[name] = true
	}
	// Each command's record is its Doc (respserver's TestCommandsHaveDocs).
	table := 0
	srv.resp.EachCommand(func(name string, _, _, _, _ int64) {
		table++
		if !documented[name] {
			t.Errorf("command %s has no COMMAND DOCS record", name)
		}
	})
	if len(documented) != table {
		t.Errorf("COMMAND DOCS has %d records, the table %d commands", len(documented), table)
	}
}

// The deciding commands count allowed and denied for the metrics; FW.GET
// decides nothing.
func TestLimiterMetrics(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now})
	c := newClient(t, srv)
	for range 3 {
		ints(t, c, "CL.THROTTLE", "m1", 0, 1, 60)
		ints(t, c, "CL.PTHROTTLE", "m2", 0, 1, 60000)
		ints(t, c, "FW.INCR", "m3", 1, 60)
		ints(t, c, "FW.PINCR", "m4", 1, 60000)
		ints(t, c, "FW.GET", "m3", 1, 60)
	}
	for name, want := range map[string][2]int64{
		"cl.throttle": {1, 2}, "cl.pthrottle": {1, 2}, "fw.incr": {1, 2}, "fw.pincr": {1, 2}, "fw.get": {0, 0},
	} {
		if got := allowedDenied(srv, name); got != want {
			t.Errorf("%s allowed, denied = %v, want %v", name, got, want)
		}
		if !metrics.TakesTokens(name) != (name == "fw.get") {
			t.Errorf("metrics.TakesTokens(%s) = %v", name, metrics.TakesTokens(name))
		}
	}
	if a, d := infoField(t, c, "stats", "rl_allowed"), infoField(t, c, "stats", "rl_denied"); a != "4" || d != "8" {
		t.Errorf("INFO rl_allowed %s, rl_denied %s; want 4 and 8", a, d)
	}
}

// allowedDenied is the allowed and denied counts of the RESP command name.
func allowedDenied(srv *Server, name string) (ad [2]int64) {
	srv.resp.EachCommand(func(n string, _, _, allowed, denied int64) {
		if n == name {
			ad = [2]int64{allowed, denied}
		}
	})
	return ad
}

// A refused FW.INCR whose COST would take the count past 2^63 - 1 leaves it
// there: every later call of the window is answered limited, not with an
// error (which clients that let requests through on errors would take for
// a pass).
func TestFWHugeCostSaturates(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now})
	c := newClient(t, srv)
	wantInts(t, c, []int64{1, 5, 0, -1, 100, math.MaxInt64, 1700000100}, "FW.INCR", "poison", 5, 300, "COST", int64(math.MaxInt64), "AT", 1700000000)
	wantInts(t, c, []int64{1, 5, 0, 100, 100, math.MaxInt64, 1700000100}, "FW.INCR", "poison", 5, 300, "AT", 1700000000)
	wantInts(t, c, []int64{1, 5, 0, 100, 100, math.MaxInt64, 1700000100}, "FW.INCR", "poison", 5, 300, "COST", 5, "AT", 1700000000)
}
