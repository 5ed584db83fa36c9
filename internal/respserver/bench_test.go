package respserver

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/counterhit"
	"github.com/sluicehq/sluice/keyspace"
)

func BenchmarkRLReduceCommand(b *testing.B) {
	srv := newTestServer(b, testOptions{})
	runPipelined(b, srv, newBenchClient(srv), [][]byte{[]byte("RL.PREDUCE"), []byte("user:12345"), []byte("1000000000"), []byte("60000")}, nil)
}

func benchCommand(b *testing.B, args [][]byte) {
	srv := newTestServer(b, testOptions{})
	c := newBenchClient(srv)
	srv.exec(c, args)
	if c.Out[0] != '*' {
		b.Fatalf("reply %q", c.Out)
	}
	runPipelined(b, srv, c, args, nil)
}

// BenchmarkCLThrottleCommand and BenchmarkFWIncrCommand are the CL.* and
// FW.* command paths, as BenchmarkRLReduceCommand is for RL.PREDUCE.
func BenchmarkCLThrottleCommand(b *testing.B) {
	benchCommand(b, [][]byte{[]byte("CL.PTHROTTLE"), []byte("user:12345"), []byte("1000000"), []byte("1000000000"), []byte("60000")})
}

func BenchmarkFWIncrCommand(b *testing.B) {
	benchCommand(b, [][]byte{[]byte("FW.PINCR"), []byte("user:12345"), []byte("1000000000"), []byte("60000"), []byte("STAGGER")})
}

func BenchmarkFWGetCommand(b *testing.B) {
	benchCommand(b, [][]byte{[]byte("FW.GET"), []byte("user:12345"), []byte("100"), []byte("60"), []byte("COST"), []byte("2")})
}

// The ROLL.LIMIT command path on a log of max 10 and of max 1000: after the
// first max calls the log is full (max+1 entries on the server clock) and
// every call decodes, filters, appends and encodes it.
func BenchmarkRollLimitCommand10(b *testing.B) {
	benchCommand(b, [][]byte{[]byte("ROLL.LIMIT"), []byte("user:12345"), []byte("60000"), []byte("10"), []byte("MINDIFF"), []byte("0")})
}

func BenchmarkRollLimitCommand1000(b *testing.B) {
	benchCommand(b, [][]byte{[]byte("ROLL.LIMIT"), []byte("user:12345"), []byte("60000"), []byte("1000")})
}

// BenchmarkRollWouldLimitCommand1000 reads a full log of max 1000.
func BenchmarkRollWouldLimitCommand1000(b *testing.B) {
	srv := newTestServer(b, testOptions{})
	c := newBenchClient(srv)
	limit := [][]byte{[]byte("ROLL.LIMIT"), []byte("user:12345"), []byte("60000"), []byte("1000")}
	for range 1001 {
		srv.exec(c, limit)
	}
	if _, err := c.Round.Commit(); err != nil {
		b.Fatal(err)
	}
	args := [][]byte{[]byte("ROLL.WOULDLIMIT"), []byte("user:12345"), []byte("60000"), []byte("1000")}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c.Out = c.Out[:0]
		srv.exec(c, args)
		if i%16 == 15 {
			srv.flushTally(c)
		}
	}
	if !bytes.HasPrefix(c.Out, []byte("*5\r\n:1\r\n")) {
		b.Fatalf("reply %q: the log is not full", c.Out)
	}
}

// BenchmarkHitCommand is HIT over RESP in the command path alone, as
// BenchmarkRLReduceCommand is for RL.PREDUCE: a canary and a deciding rule,
// both counted, per command.
func BenchmarkHitCommand(b *testing.B) {
	rules := "[path=/x]\ncreditLimit = 1000000000\nresetSeconds = 3600\nmatchPolicy = canary\n\n[path=/x ip=*]\ncreditLimit = 1000000000\nresetSeconds = 3600\nactorField = ip\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n"
	srv := newTestServer(b, testOptions{Rules: rules})
	runPipelined(b, srv, newBenchClient(srv), [][]byte{[]byte("HIT"), []byte("method=GET"), []byte("path=/x"), []byte("ip=10.1.2.3")}, nil)
}

// BenchmarkHitAlgorithms is BenchmarkHitCommand for a rule of each
// algorithm, with a quota: HIT allocates nothing, whatever the algorithm.
func BenchmarkHitAlgorithms(b *testing.B) {
	for _, alg := range []string{"divvy", "fixedWindow\nstagger = true", "tokenBucket", "gcra", "slidingLog"} {
		name, _, _ := strings.Cut(alg, "\n")
		b.Run(name, func(b *testing.B) {
			rules := "[path=/x ip=*]\nalgorithm = " + alg + "\ncreditLimit = 100000\nresetSeconds = 1\nactorField = ip\nquotaField = quota\nmaxQuota = 100000\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n"
			var ms atomic.Int64 // the server clock, in unix ms
			ms.Store(t0)
			srv := newTestServer(b, testOptions{Rules: rules, Clock: func() time.Time { return time.UnixMilli(ms.Load()) }})
			args := [][]byte{[]byte("HIT"), []byte("path=/x"), []byte("ip=10.1.2.3"), []byte("quota=50000")}
			runPipelined(b, srv, newBenchClient(srv), args, func() { ms.Add(1) })
		})
	}
}

// BenchmarkSlotCheck is the cost of cluster mode's check on one keyed
// command that this node owns: the slot of its key and the table lookup.
func BenchmarkSlotCheck(b *testing.B) {
	srv := newTestServer(b, testOptions{Cluster: &clusternode.Config{Nodes: []string{"127.0.0.1:7000"}, Self: "127.0.0.1:7000"}})
	c := newBenchClient(srv)
	cmd := srv.cmds["rl.preduce"]
	args := [][]byte{[]byte("RL.PREDUCE"), []byte("user:12345"), []byte("1000000000"), []byte("60000")}
	b.ReportAllocs()
	for b.Loop() {
		if !srv.routeKeys(c, cmd, args) {
			b.Fatal("not routed here")
		}
	}
}

// BenchmarkRLReduceCommandCluster is BenchmarkRLReduceCommand in cluster
// mode, for the check's share of a whole command.
func BenchmarkRLReduceCommandCluster(b *testing.B) {
	srv := newTestServer(b, testOptions{Cluster: &clusternode.Config{Nodes: []string{"127.0.0.1:7000"}, Self: "127.0.0.1:7000"}})
	runPipelined(b, srv, newBenchClient(srv), [][]byte{[]byte("RL.PREDUCE"), []byte("user:12345"), []byte("1000000000"), []byte("60000")}, nil)
}

// FuzzCounterHit gives SLUICE.COUNTERHIT arbitrary arguments on a cluster
// node: it answers an error or six integers, and never panics.
func FuzzCounterHit(f *testing.F) {
	text, err := os.ReadFile(filepath.Join("..", "..", "policy", "testdata", "algorithms.ini"))
	if err != nil {
		f.Fatal(err)
	}
	srv := newTestServer(f, testOptions{Rules: string(text), Cluster: &clusternode.Config{Nodes: []string{"127.0.0.1:7000"}, Self: "127.0.0.1:7000"}})
	rules := srv.pol.Current().Policy.Rules()
	for i, r := range rules {
		for _, lim := range []int64{r.CreditLimit, r.MaxQuota, 1} {
			key := keyspace.AppendRuleKey(nil, r, lim, append(r.AppendCounterID(nil, nil), "a{b}"...))
			f.Add(key, strconv.Itoa(r.Pos), strconv.FormatInt(t0*1e6, 10), strconv.FormatInt(lim, 10), strconv.Itoa(i%3))
		}
	}
	f.Add([]byte{0, 0, 'd'}, "1", "-9223372036854775808", "9223372036854775807", "9223372036854775807")
	f.Add([]byte{0xff, 0xff, 'b', 0xff}, "3", "0", "2", "1")
	f.Fuzz(func(t *testing.T, key []byte, pos, now, limit, hits string) {
		c := newBenchClient(srv)
		srv.exec(c, [][]byte{[]byte("SLUICE.COUNTERHIT"), key, []byte(pos), []byte(now), []byte(limit), []byte(hits)})
		if _, err := c.Round.Commit(); err != nil {
			t.Fatal(err)
		}
		out := string(c.Out)
		if strings.HasPrefix(out, "-") {
			if strings.Count(out, "\r\n") != 1 {
				t.Fatalf("error reply %q", out)
			}
			return
		}
		r := bufio.NewReader(strings.NewReader(out))
		rep, err := counterhit.ReadReply(r)
		if err != nil || rep.Err != nil || r.Buffered() != 0 {
			t.Fatalf("reply %q: %v %v", out, err, rep.Err)
		}
	})
}
