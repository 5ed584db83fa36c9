package server

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/metrics"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// The ROLL.* commands over the wire, through go-redis, against a real
// server with an injected clock.

// rollingUpstream is testdata/rolling-upstream.json: the six scenarios of
// the npm rolling-rate-limiter 0.4.2 test suite, recorded from the real
// package with a controlled clock.
type rollingUpstream struct {
	Scenarios []struct {
		Name    string `json:"name"`
		Options struct {
			Interval      int64  `json:"interval"`
			MaxInInterval int64  `json:"maxInInterval"`
			MinDifference *int64 `json:"minDifference"`
		} `json:"options"`
		Steps []struct {
			TUs    int64           `json:"t_us"`
			Op     string          `json:"op"`
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Stored []int64         `json:"stored_after_us"`
		} `json:"steps"`
	} `json:"scenarios"`
}

type rollingInfo struct {
	Blocked                   bool  `json:"blocked"`
	BlockedDueToCount         bool  `json:"blockedDueToCount"`
	BlockedDueToMinDifference bool  `json:"blockedDueToMinDifference"`
	MillisecondsUntilAllowed  int64 `json:"millisecondsUntilAllowed"`
	ActionsRemaining          int64 `json:"actionsRemaining"`
}

// storedLog is the log the store holds for key, once every change is in
// Pebble; nil if there is none.
func storedLog(t *testing.T, srv *Server, key string) *bucket.LogState {
	t.Helper()
	if err := srv.store.Flush(); err != nil {
		t.Fatal(err)
	}
	want := keyspace.AppendLogKey(nil, []byte(key))
	lo, hi := keyspace.SlotRange(keyspace.Slot([]byte(key)))
	var found *bucket.LogState
	err := srv.store.Scan(lo[:], hi[:], func(k, v []byte) bool {
		if bytes.Equal(k, want) {
			s, err := bucket.DecodeLogState(nil, v)
			if err != nil {
				t.Fatalf("stored log of %q: %v", key, err)
			}
			found = &s
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestRollUpstream runs the package's six scenarios: each step's reply, and
// the log it leaves. Both trim old entries at every call, wouldLimit
// included; the package keeps every entry of the interval and sluice the
// last max+1, so what is compared is the stored entries with the last
// max+1 of the package's.
func TestRollUpstream(t *testing.T) {
	raw, err := os.ReadFile("testdata/rolling-upstream.json")
	if err != nil {
		t.Fatal(err)
	}
	var f rollingUpstream
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Scenarios) != 6 {
		t.Fatalf("%d scenarios in testdata/rolling-upstream.json, want 6", len(f.Scenarios))
	}
	steps := 0
	for _, sc := range f.Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			srv := startServer(t, Config{Clock: newTestClock(t0).now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
			c := newClient(t, srv)
			o := sc.Options
			for i, st := range sc.Steps {
				key := "rl:" + strconv.Itoa(st.ID) // the package's namespace and id
				var cmd string
				switch st.Op {
				case "limit", "limitWithInfo":
					cmd = "ROLL.LIMIT"
				case "wouldLimit", "wouldLimitWithInfo":
					cmd = "ROLL.WOULDLIMIT"
				default:
					t.Fatalf("step %d: unknown op %q", i, st.Op)
				}
				args := []any{cmd, key, o.Interval, o.MaxInInterval, "AT", st.TUs}
				if o.MinDifference != nil {
					args = append(args, "MINDIFF", *o.MinDifference)
				}
				got := ints(t, c, args...)
				if strings.HasSuffix(st.Op, "WithInfo") {
					var want rollingInfo
					if err := json.Unmarshal(st.Result, &want); err != nil {
						t.Fatal(err)
					}
					w := []int64{int64(b2i(want.Blocked)), int64(b2i(want.BlockedDueToCount)), int64(b2i(want.BlockedDueToMinDifference)), want.MillisecondsUntilAllowed, want.ActionsRemaining}
					if !slices.Equal(got, w) {
						t.Fatalf("step %d %v = %v, the package answered %v (%s)", i, args, got, w, st.Result)
					}
				} else {
					var blocked bool
					if err := json.Unmarshal(st.Result, &blocked); err != nil {
						t.Fatal(err)
					}
					if got[0] != int64(b2i(blocked)) {
						t.Fatalf("step %d %v = %v, the package answered blocked %v", i, args, got, blocked)
					}
				}
				if st.Stored != nil {
					var stored []int64
					if s := storedLog(t, srv, key); s != nil {
						stored = s.Entries
					}
					want := st.Stored[max(0, len(st.Stored)-int(o.MaxInInterval)-1):]
					if !slices.Equal(stored, want) {
						t.Fatalf("step %d: stored %v, the package holds %v", i, stored, st.Stored)
					}
				}
				steps++
			}
		})
	}
	if steps != 38 {
		t.Fatalf("ran %d upstream steps, want 38", steps)
	}
}

// The spec's example, with AT, with names and keywords in any case and
// the last keyword winning; then on the server clock.
func TestRollSpecExample(t *testing.T) {
	clock := newTestClock(t0)
	srv := startServer(t, Config{Clock: clock.now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	c := newClient(t, srv)
	const at = t0 * 1000 // unix µs
	wantInts(t, c, []int64{0, 0, 0, 2, 2}, "ROLL.LIMIT", "ex", 10, 3, "MINDIFF", 2, "AT", at)
	wantInts(t, c, []int64{0, 0, 0, 2, 1}, "roll.limit", "ex", 10, 3, "at", 1, "mindiff", 2, "At", at+4000)
	wantInts(t, c, []int64{1, 0, 1, 5, 0}, "Roll.Limit", "ex", 10, 3, "MINDIFF", 9, "MINDIFF", 2, "AT", at+5000)
	wantInts(t, c, []int64{1, 1, 0, 6, 0}, "ROLL.LIMIT", "ex", 10, 3, "MINDIFF", 2, "AT", at+8000)
	wantInts(t, c, []int64{1, 1, 0, 4, 0}, "ROLL.WOULDLIMIT", "ex", 10, 3, "MINDIFF", 2, "AT", at+11000)
	wantInts(t, c, []int64{0, 0, 0, 2, 1}, "roll.wouldlimit", "ex", 10, 3, "AT", at+17000, "MINDIFF", 2)

	// On the server clock: the same steps, moving the clock.
	steps := []struct {
		ms    int64
		would bool
		want  []int64
	}{
		{0, false, []int64{0, 0, 0, 2, 2}}, {4, false, []int64{0, 0, 0, 2, 1}}, {5, false, []int64{1, 0, 1, 5, 0}},
		{8, false, []int64{1, 1, 0, 6, 0}}, {11, true, []int64{1, 1, 0, 4, 0}}, {17, true, []int64{0, 0, 0, 2, 1}},
	}
	for _, st := range steps {
		clock.ms.Store(t0 + st.ms)
		cmd := "ROLL.LIMIT"
		if st.would {
			cmd = "ROLL.WOULDLIMIT"
		}
		wantInts(t, c, st.want, cmd, "clock", 10, 3, "MINDIFF", 2)
		if st.ms == 8 {
			if s := storedLog(t, srv, "clock"); s == nil || s.Interval != 10 || len(s.Entries) != 4 {
				t.Fatalf("stored %+v, want interval 10 and max+1 = 4 entries", s)
			}
		}
	}
	// The looks dropped the entries an interval old, as the package's
	// wouldLimit: the one at 8 ms is left.
	if s := storedLog(t, srv, "clock"); s == nil || s.Interval != 10 || !slices.Equal(s.Entries, []int64{(t0 + 8) * 1000}) {
		t.Fatalf("stored %+v, want interval 10 and the entry at 8 ms", s)
	}
	// WOULDLIMIT on a new key writes nothing: it stays absent.
	wantInts(t, c, []int64{0, 0, 0, 0, 2}, "ROLL.WOULDLIMIT", "new", 10, 3)
	if s := storedLog(t, srv, "new"); s != nil {
		t.Fatalf("WOULDLIMIT stored %+v", s)
	}
}

// "a client that retries once per second against "2 per 4 s" gets through
// every 2 s instead of never", by AT.
func TestRollNoCountBlocked(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	c := newClient(t, srv)
	for _, ncb := range []bool{false, true} {
		key := "retry:" + strconv.FormatBool(ncb)
		var allowed []int64
		for sec := range int64(40) {
			args := []any{"ROLL.LIMIT", key, 4000, 2, "AT", t0*1000 + sec*1_000_000}
			if ncb {
				args = append(args, "NOCOUNTBLOCKED")
			}
			if r := ints(t, c, args...); r[0] == 0 {
				allowed = append(allowed, sec)
			}
		}
		if !ncb {
			if !slices.Equal(allowed, []int64{0, 1}) {
				t.Fatalf("without NOCOUNTBLOCKED allowed at %v, want only seconds 0 and 1: every blocked retry is recorded", allowed)
			}
			continue
		}
		if want := []int64{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29, 32, 33, 36, 37}; !slices.Equal(allowed, want) {
			t.Fatalf("with NOCOUNTBLOCKED allowed at %v, want %v: 2 every 4 s", allowed, want)
		}
	}
}

// Many connections hammering one key on a fixed server clock: exactly max
// of them get through, with or without NOCOUNTBLOCKED, and the log holds
// what was recorded.
func TestRollAtomic(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	const conns, calls, maxN = 8, 40, 7
	for _, ncb := range []bool{false, true} {
		key := "hammer:" + strconv.FormatBool(ncb)
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for range conns {
			c := newClient(t, srv)
			wg.Go(func() {
				p := c.Pipeline()
				cmds := make([]*redis.Cmd, calls)
				for i := range cmds {
					args := []any{"ROLL.LIMIT", key, 60_000, maxN, "MINDIFF", 0}
					if ncb {
						args = append(args, "NOCOUNTBLOCKED")
					}
					cmds[i] = p.Do(context.Background(), args...)
				}
				if _, err := p.Exec(context.Background()); err != nil {
					t.Error(err)
					return
				}
				for _, cmd := range cmds {
					if r, err := cmd.Int64Slice(); err != nil || len(r) != 5 {
						t.Errorf("reply %v, %v", r, err)
					} else if r[0] == 0 {
						allowed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if got := allowed.Load(); got != maxN {
			t.Fatalf("NOCOUNTBLOCKED %v: %d of %d calls allowed in one instant, want max = %d", ncb, got, conns*calls, maxN)
		}
		s := storedLog(t, srv, key)
		wantLen := maxN + 1 // every blocked attempt recorded, the last max+1 kept
		if ncb {
			wantLen = maxN
		}
		if s == nil || len(s.Entries) != wantLen {
			t.Fatalf("NOCOUNTBLOCKED %v: stored %+v, want %d entries", ncb, s, wantLen)
		}
	}
}

// putMutator stores val.
type putMutator struct{ val []byte }

func (m putMutator) Mutate([]byte, bool) ([]byte, storage.Op, error) {
	return m.val, storage.Put, nil
}

// A log of max 100000 and one of max 1 live side by side. The large log is
// filled through the store: filling it call by call costs O(max²) (each
// call decodes and rewrites the whole log), seconds for a test.
func TestRollLargeAndSmall(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	c := newClient(t, srv)
	const big = bucket.MaxLogMax
	base := t0 * 1000
	fill := bucket.LogState{Interval: 3_600_000}
	for i := range big - 1 {
		fill.Entries = append(fill.Entries, base+int64(i)*10)
	}
	b := srv.store.NewBatch()
	if err := b.Modify(keyspace.AppendLogKey(nil, []byte("big")), putMutator{bucket.AppendLogState(nil, fill)}); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	small := func(i int64) {
		t.Helper()
		k := "small:" + strconv.FormatInt(i, 10)
		wantInts(t, c, []int64{0, 0, 0, 1000, 0}, "ROLL.LIMIT", k, 1000, 1, "AT", base+i)
		wantInts(t, c, []int64{1, 1, 0, 1000, 0}, "ROLL.LIMIT", k, 1000, 1, "AT", base+i+1)
	}
	small(0)
	// The 100000th action is allowed; the first leaves the hour 999.99 ms
	// after it.
	wantInts(t, c, []int64{0, 0, 0, 3_599_001, 0}, "ROLL.LIMIT", "big", 3_600_000, big, "AT", base+(big-1)*10)
	small(1)
	// The 100001st is blocked; every next one waits the same while actions
	// come 10 µs apart.
	wantInts(t, c, []int64{1, 1, 0, 3_599_001, 0}, "ROLL.LIMIT", "big", 3_600_000, big, "AT", base+big*10)
	small(2)
	// 10 µs before the hour is over, the 100000th newest action counting
	// this one (the third stored) leaves it 30 µs later: 1 ms, rounded up.
	wantInts(t, c, []int64{1, 1, 0, 1, 0}, "ROLL.WOULDLIMIT", "big", 3_600_000, big, "AT", base+3_600_000_000-10)
	s := storedLog(t, srv, "big")
	if s == nil || len(s.Entries) != big+1 || s.Entries[0] != base || s.Entries[big] != base+big*10 {
		t.Fatalf("stored log of %d entries", len(s.Entries))
	}
	// One more: still max+1 entries, the oldest gone.
	wantInts(t, c, []int64{1, 1, 0, 3_599_001, 0}, "ROLL.LIMIT", "big", 3_600_000, big, "AT", base+(big+1)*10)
	if s := storedLog(t, srv, "big"); len(s.Entries) != big+1 || s.Entries[0] != base+10 {
		t.Fatalf("stored log of %d entries from %d", len(s.Entries), s.Entries[0])
	}
	if n := len(bucket.AppendLogState(nil, *s)); n > 2*(big+1) {
		t.Errorf("a log of %d entries 10 µs apart takes %d bytes", big+1, n)
	}
	for i := range int64(3) {
		if s := storedLog(t, srv, "small:"+strconv.FormatInt(i, 10)); s == nil || len(s.Entries) != 2 {
			t.Fatalf("small log %d: %+v", i, s)
		}
	}
}

// ROLL.CLEAR deletes the log and only the log; DEL deletes it too.
func TestRollClear(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	c := newClient(t, srv)
	ctx := context.Background()
	ints(t, c, "ROLL.LIMIT", "k", 1000, 1)
	ints(t, c, "CL.THROTTLE", "k", 0, 1, 60)
	wantInts(t, c, []int64{1, 1, 0, 1000, 0}, "ROLL.WOULDLIMIT", "k", 1000, 1)
	for _, want := range []int64{1, 0} {
		if n, err := c.Do(ctx, "ROLL.CLEAR", "k").Int64(); err != nil || n != want {
			t.Fatalf("ROLL.CLEAR = %d, %v; want %d", n, err, want)
		}
	}
	wantInts(t, c, []int64{0, 0, 0, 1000, 0}, "ROLL.LIMIT", "k", 1000, 1)
	wantInts(t, c, []int64{1, 1, 0, 60, 60}, "CL.THROTTLE", "k", 0, 1, 60) // the GCRA key is untouched
	if n, err := c.Do(ctx, "DEL", "k").Int64(); err != nil || n != 1 {
		t.Fatalf("DEL = %d, %v", n, err)
	}
	if dbSize(t, c) != 0 {
		t.Fatal("DEL left records")
	}
	if n, err := c.Do(ctx, "roll.clear", "k").Int64(); err != nil || n != 0 {
		t.Fatalf("ROLL.CLEAR after DEL = %d, %v", n, err)
	}
}

func TestRollErrors(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	c := newClient(t, srv)
	ctx := context.Background()
	for _, tc := range []struct {
		args []any
		want string
	}{
		{[]any{"ROLL.LIMIT", "k", 10}, "ERR wrong number of arguments for 'roll.limit' command"},
		{[]any{"ROLL.WOULDLIMIT", "k"}, "ERR wrong number of arguments for 'roll.wouldlimit' command"},
		{[]any{"ROLL.CLEAR"}, "ERR wrong number of arguments for 'roll.clear' command"},
		{[]any{"ROLL.CLEAR", "a", "b"}, "ERR wrong number of arguments for 'roll.clear' command"},
		{[]any{"ROLL.LIMIT", "k", "ten", 3}, `ERR interval_ms: "ten" is not an integer: want a decimal int64`},
		{[]any{"ROLL.LIMIT", "k", 10, "3.0"}, `ERR max: "3.0" is not an integer: want a decimal int64`},
		{[]any{"ROLL.LIMIT", "k", 0, 3}, "ERR interval_ms: 0: want 1 or more"},
		{[]any{"ROLL.LIMIT", "k", 10, 0}, "ERR max: 0: want 1 to 100000"},
		{[]any{"ROLL.WOULDLIMIT", "k", 10, 100001}, "ERR max: 100001: want 1 to 100000"},
		{[]any{"ROLL.LIMIT", "k", 10, 3, "MINDIFF", -1}, "ERR MINDIFF: -1: want 0 or more"},
		{[]any{"ROLL.LIMIT", "k", 10, 3, "MINDIFF"}, "ERR syntax error: MINDIFF needs a value: want MINDIFF ms"},
		{[]any{"ROLL.LIMIT", "k", 10, 3, "MINDIFF", "x"}, `ERR MINDIFF: "x" is not an integer: want a decimal int64`},
		{[]any{"ROLL.LIMIT", "k", 10, 3, "AT"}, "ERR syntax error: AT needs a value: want AT unix_us"},
		{[]any{"ROLL.LIMIT", "k", 10, 3, "AT", "9223372036854775808"}, `ERR AT: "9223372036854775808" is not an integer: want a decimal int64`},
		{[]any{"ROLL.LIMIT", "k", 10, 3, "STRICT"}, `ERR syntax error at "STRICT": want MINDIFF, AT or NOCOUNTBLOCKED`},
		{[]any{"ROLL.WOULDLIMIT", "k", 10, 3, "NOCOUNTBLOCKED"}, `ERR syntax error at "NOCOUNTBLOCKED": want MINDIFF or AT`},
		{[]any{"ROLL.LIMIT", "k", 9223372036854775807, 3}, "ERR interval_ms: 9223372036854775807: too long, its microseconds overflow int64: want at most 9223372036854775"},
		{[]any{"ROLL.LIMIT", strings.Repeat("k", 16<<10+1), 10, 3}, ""},
		{[]any{"ROLL.CLEAR", strings.Repeat("k", 16<<10+1)}, ""},
	} {
		err := c.Do(ctx, tc.args...).Err()
		if err == nil || (tc.want != "" && err.Error() != tc.want) || !strings.HasPrefix(err.Error(), "ERR ") {
			t.Errorf("%.60v: %v, want %q", tc.args, err, tc.want)
		}
	}
	if n := dbSize(t, c); n != 0 {
		t.Fatalf("refused calls stored %d records", n)
	}
	// The widest values are answered, and the server stays up.
	for _, args := range [][]any{
		{"ROLL.LIMIT", "e", 9223372036854775, 100000, "MINDIFF", 9223372036854775, "AT", -9223372036854775808},
		{"ROLL.LIMIT", "e", 1, 1, "AT", 9223372036854775807},
		{"ROLL.LIMIT", "e", 9223372036854775, 1, "AT", -9223372036854775808},
		{"ROLL.WOULDLIMIT", "e", 1, 100000, "MINDIFF", 9223372036854775, "AT", 0},
		{"ROLL.LIMIT", "\xff\x00{\xfe}", 1, 1},
	} {
		r := ints(t, c, args...)
		if r[3] < 0 || r[4] < 0 {
			t.Errorf("%v = %v", args, r)
		}
	}
	wantInts(t, c, []int64{0, 0, 0, 0, 2}, "ROLL.LIMIT", "k", 10, 3)
}

// The sweep deletes logs whose every entry is an interval old, on the
// server clock, and keeps live ones; INFO and /metrics count them.
func TestSweepIdleLogs(t *testing.T) {
	ctx := context.Background()
	clock := newTestClock(t0)
	srv := startServer(t, Config{Clock: clock.now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	c := newClient(t, srv)
	for i := range 10 {
		// Intervals of 1 to 10 s; the newest entry is the one on the
		// server clock, an older one came by AT.
		k := "log" + strconv.Itoa(i)
		ints(t, c, "ROLL.LIMIT", k, 1000*(i+1), 5, "AT", t0*1000-500_000)
		ints(t, c, "ROLL.LIMIT", k, 1000*(i+1), 5)
	}
	ints(t, c, "ROLL.WOULDLIMIT", "never", 1000, 5) // stores nothing
	keys := func() string { return infoField(t, c, "keyspace", "keys_log") }
	if got := keys(); got != "10" {
		t.Fatalf("keys_log:%s before the sweep, want 10", got)
	}
	if err := c.Do(ctx, "COMPACT").Err(); err != nil {
		t.Fatal(err)
	}
	if got := keys(); got != "10" {
		t.Fatalf("keys_log:%s after a sweep with nothing idle, want 10", got)
	}
	// 5 s later the logs of intervals up to 5 s are idle: their newest
	// entry is exactly an interval old for the 5 s one.
	clock.ms.Store(t0 + 5000)
	if err := c.Do(ctx, "COMPACT").Err(); err != nil {
		t.Fatal(err)
	}
	if got := keys(); got != "5" {
		t.Fatalf("keys_log:%s after the sweep at +5 s, want 5", got)
	}
	if got := infoField(t, c, "storage", "records_log"); got != "5" {
		t.Fatalf("INFO storage records_log:%s, want 5", got)
	}
	// A live one kept both entries: with max 2 the third is blocked.
	wantInts(t, c, []int64{1, 1, 0, 1000, 0}, "ROLL.WOULDLIMIT", "log5", 6000, 2)
	wantInts(t, c, []int64{0, 0, 0, 0, 2}, "ROLL.WOULDLIMIT", "log4", 5000, 3) // swept: empty
	_, metrics := get(t, serveHTTPOn(t, srv)+"/metrics")
	if !strings.Contains(metrics, `sluice_records{kind="log"} 5`+"\n") {
		t.Errorf("/metrics lacks sluice_records{kind=\"log\"} 5")
	}
}

// ROLL.LIMIT counts allowed and denied for the metrics; WOULDLIMIT and
// CLEAR decide nothing. COMMAND describes the three.
func TestRollMetricsAndCommandInfo(t *testing.T) {
	srv := startServer(t, Config{Clock: newTestClock(t0).now, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	c := newClient(t, srv)
	ctx := context.Background()
	for range 3 {
		ints(t, c, "ROLL.LIMIT", "m", 60000, 1)
		ints(t, c, "ROLL.WOULDLIMIT", "m", 60000, 1)
	}
	c.Do(ctx, "ROLL.CLEAR", "m")
	for name, want := range map[string][2]int64{"roll.limit": {1, 2}, "roll.wouldlimit": {0, 0}, "roll.clear": {0, 0}} {
		if got := allowedDenied(srv, name); got != want {
			t.Errorf("%s allowed, denied = %v, want %v", name, got, want)
		}
		if metrics.TakesTokens(name) != (name == "roll.limit") {
			t.Errorf("metrics.TakesTokens(%s) = %v", name, metrics.TakesTokens(name))
		}
	}
	info, err := c.Command(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]struct {
		arity int8
		flag  string
	}{"roll.limit": {-4, "write"}, "roll.wouldlimit": {-4, "write"}, "roll.clear": {2, "write"}} {
		ci := info[name]
		if ci == nil || ci.Arity != want.arity || !slices.Contains(ci.Flags, want.flag) || ci.FirstKeyPos != 1 || ci.LastKeyPos != 1 {
			t.Errorf("COMMAND's %s = %+v", name, ci)
		}
	}
	docs, err := c.Do(ctx, "COMMAND", "DOCS", "roll.limit", "roll.wouldlimit", "roll.clear").Result()
	if err != nil {
		t.Fatal(err)
	}
	m, _ := docs.(map[any]any)
	for name, want := range map[string][]string{
		"roll.limit":      {"key", "interval_ms", "max", "ms", "unix_us", "nocountblocked"},
		"roll.wouldlimit": {"key", "interval_ms", "max", "ms", "unix_us"},
		"roll.clear":      {"key"},
	} {
		rec, _ := m[name].(map[any]any)
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
}

// A long pipeline of writes is committed in pieces of at most a quarter of
// the commit queue's byte bound (--commit-queue-memory), not held whole in
// memory until it ends, however large its values (sliding logs can be
// hundreds of KB). In --fsync always each commit is a round of its own: 200
// writes of about 60 bytes each (record charge included) against a 2 KiB
// bound, pieces of 512 bytes, take dozens of rounds; arriving in one or two
// reads, the pipeline used to be committed in one or two.
func TestPipelineCommitsLargeWritesInPieces(t *testing.T) {
	ctx := context.Background()
	store, err := storage.Open(t.TempDir(), StoreOptions(storage.Options{Sync: storage.SyncAlways, MaxQueuedBytes: 2 << 10}))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Store: store, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, store)
	c := newClient(t, srv)
	before := store.Stats().Rounds
	p := c.Pipeline()
	cmds := make([]*redis.Cmd, 200)
	for i := range cmds {
		cmds[i] = p.Do(ctx, "ROLL.LIMIT", "k"+strconv.Itoa(i), 60000, 10, "AT", 1_700_000_000_000_000)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, cmd := range cmds {
		if v, err := cmd.Int64Slice(); err != nil || v[0] != 0 {
			t.Fatalf("command %d: %v, %v", i, v, err)
		}
	}
	if rounds := store.Stats().Rounds - before; rounds < 20 {
		t.Errorf("200 writes were committed in %d rounds, want at least 20: pieces of a quarter of the queue's bytes", rounds)
	}
	if got := dbSize(t, c); got != 200 {
		t.Errorf("DBSIZE = %d, want 200", got)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
