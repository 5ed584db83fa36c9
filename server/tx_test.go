package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/storage"
)

// rawExchange sends in (inline commands, one a line) and returns exactly
// len(want) bytes of replies, so a mismatch shows what came instead.
func rawExchange(t *testing.T, srv *Server, in string, want string) string {
	t.Helper()
	nc, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(nc, in); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	n, err := io.ReadFull(bufio.NewReader(nc), got)
	if err != nil {
		t.Fatalf("reading %d bytes of replies: %v; got %q", len(want), err, got[:n])
	}
	return string(got)
}

// TestTxGoRedisTxPipelined: go-redis' TxPipelined wraps its commands in
// MULTI/EXEC and gets each command's reply; the bucket changes once per
// command, no more.
func TestTxGoRedisTxPipelined(t *testing.T) {
	srv := startServer(t, Config{})
	ctx := context.Background()
	c := newClient(t, srv)
	var first, second, get *redis.Cmd
	cmds, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		first = p.Do(ctx, "RL.REDUCE", "tx", 3, 3600, "AT", 1000)
		second = p.Do(ctx, "RL.REDUCE", "tx", 3, 3600, "AT", 1000)
		get = p.Do(ctx, "RL.GET", "tx", 3, 3600, "AT", 1000)
		return nil
	})
	if err != nil {
		t.Fatalf("TxPipelined: %v", err)
	}
	if len(cmds) != 3 || first.Val() != int64(3) || second.Val() != int64(2) || get.Val() != int64(1) {
		t.Fatalf("TxPipelined replies: %v, %v, %v (%d commands); want 3, 2, 1", first.Val(), second.Val(), get.Val(), len(cmds))
	}
	if n, err := c.Do(ctx, "RL.GET", "tx", 3, 3600, "AT", 1000).Int64(); err != nil || n != 1 {
		t.Fatalf("after the transaction RL.GET = %d, %v; want 1", n, err)
	}

	// A runtime error is an element of the array; the others still run.
	_, err = c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "RL.REDUCE", "tx2", 3, 3600, "AT", 1000)
		p.Do(ctx, "RL.REDUCE", "tx2", "x", 3600)
		p.Do(ctx, "RL.REDUCE", "tx2", 3, 3600, "AT", 1000)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "not an integer") {
		t.Fatalf("TxPipelined with a bad argument: %v; want the command's error", err)
	}
	if n, _ := c.Do(ctx, "RL.GET", "tx2", 3, 3600, "AT", 1000).Int64(); n != 1 {
		t.Fatalf("after a transaction with a runtime error, tx2 holds %d; want 1 (both good reduces ran)", n)
	}
}

// TestTxGoRedisWatch: go-redis' Watch runs its function between WATCH and
// EXEC; a write to the watched key by another client in between makes
// EXEC answer null (redis.TxFailedErr) and nothing runs, and a retry
// without interference succeeds.
func TestTxGoRedisWatch(t *testing.T) {
	srv := startServer(t, Config{})
	ctx := context.Background()
	c := newClient(t, srv)
	other := newClient(t, srv)
	interfere := true
	tx := func(tx *redis.Tx) error {
		n, err := tx.Do(ctx, "RL.GET", "w", 10, 3600, "AT", 1000).Int64()
		if err != nil {
			return err
		}
		if interfere {
			if err := other.Do(ctx, "RL.REDUCE", "w", 10, 3600, "AT", 1000).Err(); err != nil {
				return err
			}
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Do(ctx, "RL.REDUCE", "w", 10, 3600, "TAKE", n/2, "AT", 1000)
			return nil
		})
		return err
	}
	if err := c.Watch(ctx, tx, "w"); !errors.Is(err, redis.TxFailedErr) {
		t.Fatalf("Watch with a write in between: %v; want redis.TxFailedErr", err)
	}
	if n, _ := c.Do(ctx, "RL.GET", "w", 10, 3600, "AT", 1000).Int64(); n != 9 {
		t.Fatalf("after the failed transaction w holds %d; want 9 (only the other client's reduce)", n)
	}
	interfere = false
	if err := c.Watch(ctx, tx, "w"); err != nil {
		t.Fatalf("Watch without interference: %v", err)
	}
	if n, _ := c.Do(ctx, "RL.GET", "w", 10, 3600, "AT", 1000).Int64(); n != 5 {
		t.Fatalf("after the transaction w holds %d; want 5", n)
	}
}

// TestTxProtocol checks the replies of MULTI, EXEC, DISCARD and WATCH
// byte for byte, RESP2 and RESP3, including the errors Redis gives.
func TestTxProtocol(t *testing.T) {
	srv := startServer(t, Config{})
	cases := []struct{ name, in, want string }{
		{"exec", "MULTI\r\nRL.REDUCE p 5 60 AT 1000\r\nPING\r\nRL.REDUCE p 5 60 x\r\nECHO hi\r\nEXEC\r\n",
			"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*4\r\n:5\r\n+PONG\r\n-ERR syntax error\r\n$2\r\nhi\r\n"},
		{"empty", "MULTI\r\nEXEC\r\n", "+OK\r\n*0\r\n"},
		{"without multi", "EXEC\r\nDISCARD\r\n", "-ERR EXEC without MULTI\r\n-ERR DISCARD without MULTI\r\n"},
		{"nested", "MULTI\r\nMULTI\r\nPING\r\nEXEC\r\n", "+OK\r\n-ERR MULTI calls can not be nested\r\n+QUEUED\r\n*1\r\n+PONG\r\n"},
		{"watch inside", "MULTI\r\nWATCH k\r\nPING\r\nEXEC\r\n", "+OK\r\n-ERR WATCH inside MULTI is not allowed\r\n+QUEUED\r\n*1\r\n+PONG\r\n"},
		{"discard", "MULTI\r\nRL.REDUCE d 5 60 AT 1000\r\nDISCARD\r\nRL.GET d 5 60 AT 1000\r\nEXEC\r\n",
			"+OK\r\n+QUEUED\r\n+OK\r\n:5\r\n-ERR EXEC without MULTI\r\n"},
		{"watch own write", "WATCH ow\r\nRL.REDUCE ow 5 60 AT 1000\r\nMULTI\r\nRL.REDUCE ow 5 60 AT 1000\r\nEXEC\r\nRL.GET ow 5 60 AT 1000\r\n",
			"+OK\r\n:5\r\n+OK\r\n+QUEUED\r\n*-1\r\n:4\r\n"},
		{"unwatch", "WATCH uw\r\nRL.REDUCE uw 5 60 AT 1000\r\nUNWATCH\r\nMULTI\r\nRL.REDUCE uw 5 60 AT 1000\r\nEXEC\r\n",
			"+OK\r\n:5\r\n+OK\r\n+OK\r\n+QUEUED\r\n*1\r\n:4\r\n"},
		{"refused", "MULTI\r\nRL.REDUCE rf 5 60 AT 1000\r\nDBSIZE\r\nEXEC\r\nRL.GET rf 5 60 AT 1000\r\n",
			"+OK\r\n+QUEUED\r\n-ERR Command not allowed inside a transaction: dbsize (MULTI queues the limit commands and commands on the connection itself; see docs/protocol.md)\r\n" +
				"-EXECABORT Transaction discarded because of previous errors.\r\n:5\r\n"},
		{"quit", "MULTI\r\nRL.REDUCE q 5 60 AT 1000\r\nQUIT\r\n", "+OK\r\n+QUEUED\r\n+OK\r\n"},
		// Recorded with redis-server 7.0.15: a wrong argument count for
		// MULTI, WATCH or DISCARD inside MULTI aborts the transaction;
		// EXEC's discards it at once.
		{"multi arity", "MULTI\r\nMULTI x\r\nPING\r\nEXEC\r\n",
			"+OK\r\n-ERR wrong number of arguments for 'multi' command\r\n+QUEUED\r\n-EXECABORT Transaction discarded because of previous errors.\r\n"},
		{"watch arity", "MULTI\r\nWATCH\r\nPING\r\nEXEC\r\n",
			"+OK\r\n-ERR wrong number of arguments for 'watch' command\r\n+QUEUED\r\n-EXECABORT Transaction discarded because of previous errors.\r\n"},
		{"discard arity", "MULTI\r\nDISCARD x\r\nEXEC\r\n",
			"+OK\r\n-ERR wrong number of arguments for 'discard' command\r\n-EXECABORT Transaction discarded because of previous errors.\r\n"},
		{"exec arity", "MULTI\r\nPING\r\nEXEC x\r\nPING\r\n",
			"+OK\r\n+QUEUED\r\n-EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command\r\n+PONG\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if got := rawExchange(t, srv, tc.in, want); got != want {
				t.Fatalf("got %q\nwant %q", got, want)
			}
		})
	}
	t.Run("resp3", func(t *testing.T) {
		nc, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(time.Minute))
		in := "HELLO 3\r\nMULTI\r\nRL.REDUCE r3 5 60 AT 1000\r\nRL.SESSIONIZE r3s 5 60 AT 1000\r\nEXEC\r\n" +
			"WATCH r3\r\nRL.REDUCE r3 5 60 AT 1000\r\nMULTI\r\nPING\r\nEXEC\r\n"
		if _, err := io.WriteString(nc, in); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(nc)
		for { // HELLO's map, whose length varies with the client id
			l, err := r.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if l == "modules\r\n" {
				_, _ = r.ReadString('\n')
				break
			}
		}
		want := "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:5\r\n*2\r\n:5\r\n:1000000\r\n" +
			"+OK\r\n:4\r\n+OK\r\n+QUEUED\r\n_\r\n"
		got := make([]byte, len(want))
		if _, err := io.ReadFull(r, got); err != nil || string(got) != want {
			t.Fatalf("got %q, %v\nwant %q", got, err, want)
		}
	})
	// QUIT inside MULTI drops the transaction, as in Redis 7.
	if got := rawExchange(t, srv, "RL.GET q 5 60 AT 1000\r\n", ":5\r\n"); got != ":5\r\n" {
		t.Fatalf("after QUIT inside MULTI, q: %q; want :5 (nothing ran)", got)
	}
}

// TestTxExecAbort: a command refused while queuing (unknown, wrong number
// of arguments, too large a queue) aborts the transaction: EXEC answers
// EXECABORT and no queued command runs, so every bucket stays untouched.
func TestTxExecAbort(t *testing.T) {
	srv := startServer(t, Config{RESP: respserver.Tuning{MaxMultiBytes: 400}})
	ctx := context.Background()
	c := newClient(t, srv)
	for _, bad := range []string{"NOPE x\r\n", "RL.REDUCE a 5\r\n", "ECHO " + strings.Repeat("x", 500) + "\r\n"} {
		in := "MULTI\r\nRL.REDUCE a 5 60 AT 1000\r\nRL.REDUCE b 5 60 AT 1000\r\n" + bad + "RL.REDUCE c 5 60 AT 1000\r\nEXEC\r\n"
		nc, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(time.Minute))
		if _, err := io.WriteString(nc, in); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(nc)
		var lines []string
		for range 6 {
			l, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("%q: %v after %q", bad, err, lines)
			}
			lines = append(lines, l)
		}
		nc.Close()
		if lines[0] != "+OK\r\n" || lines[1] != "+QUEUED\r\n" || lines[2] != "+QUEUED\r\n" || !strings.HasPrefix(lines[3], "-ERR") ||
			lines[4] != "+QUEUED\r\n" || lines[5] != "-EXECABORT Transaction discarded because of previous errors.\r\n" {
			t.Fatalf("transaction with %q answered %q", bad, lines)
		}
		for _, k := range []string{"a", "b", "c"} {
			if n, err := c.Do(ctx, "RL.GET", k, 5, 60, "AT", 1000).Int64(); err != nil || n != 5 {
				t.Fatalf("after EXECABORT (%q) bucket %s holds %d, %v; want 5, untouched", bad, k, n, err)
			}
		}
	}
	if !strings.Contains(rawExchange(t, srv, "MULTI\r\nECHO "+strings.Repeat("x", 500)+"\r\n", "+OK\r\n-ERR transaction exceeds --max-multi-bytes 400"), "--max-multi-bytes 400") {
		t.Fatal("the queue limit's error does not name the flag")
	}
}

// TestTxAtomic races transactions with other clients on the same two
// buckets, whose time is fixed by AT so that no refill blurs the counts.
// Writers' EXECs take alternately from A and B (A first or B first), and
// other clients take from A or B alone. If nothing interleaves with an
// EXEC, the replies of its reduces on one bucket are consecutive (nobody
// took between them), and readers' EXECs of RL.GET A and RL.GET B see
// A - B equal to what the lone reduces alone made of it, never half of a
// writer's EXEC.
func TestTxAtomic(t *testing.T) {
	srv := startServer(t, Config{})
	ctx := context.Background()
	const (
		max     = 1 << 40
		rounds  = 60
		perExec = 8 // reduces per bucket in one writer EXEC
	)
	bucket := func(p redis.Pipeliner, op, k string) *redis.Cmd {
		return p.Do(ctx, op, k, max, 3600, "AT", 1000)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []string
		loneA  int64 // reduces of A alone so far, an upper bound as seen by readers
		loneMu sync.Mutex
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		errs = append(errs, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newClient(t, srv)
			for i := range rounds {
				var a, b []*redis.Cmd
				_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
					for j := range perExec {
						if (w+i+j)%2 == 0 {
							a = append(a, bucket(p, "RL.REDUCE", "A"))
							b = append(b, bucket(p, "RL.REDUCE", "B"))
						} else {
							b = append(b, bucket(p, "RL.REDUCE", "B"))
							a = append(a, bucket(p, "RL.REDUCE", "A"))
						}
					}
					return nil
				})
				if err != nil {
					fail("writer EXEC: %v", err)
					return
				}
				for _, run := range [][]*redis.Cmd{a, b} {
					for j := 1; j < len(run); j++ {
						if run[j].Val() != run[j-1].Val().(int64)-1 {
							fail("writer EXEC saw another client's reduce between its own: %v then %v", run[j-1].Val(), run[j].Val())
							return
						}
					}
				}
			}
		}()
	}
	// Lone reducers of A only, so A - B counts them: a reader must see
	// A - B = -(lone reduces), never a writer's EXEC half done.
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newClient(t, srv)
			for range rounds * 4 {
				loneMu.Lock() // readers see the count only with its reduce done
				if err := c.Do(ctx, "RL.REDUCE", "A", max, 3600, "AT", 1000).Err(); err != nil {
					loneMu.Unlock()
					fail("lone reduce: %v", err)
					return
				}
				loneA++
				loneMu.Unlock()
			}
		}()
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newClient(t, srv)
			for range rounds * 2 {
				var ga, gb *redis.Cmd
				loneMu.Lock()
				lone := loneA
				_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
					ga = bucket(p, "RL.GET", "A")
					gb = bucket(p, "RL.GET", "B")
					return nil
				})
				loneMu.Unlock()
				if err != nil {
					fail("reader EXEC: %v", err)
					return
				}
				if d := gb.Val().(int64) - ga.Val().(int64); d != lone {
					fail("reader EXEC saw B - A = %d with %d lone reduces of A: half of a writer's EXEC", d, lone)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d violations, first: %s", len(errs), errs[0])
	}
	c := newClient(t, srv)
	a, _ := c.Do(ctx, "RL.GET", "A", max, 3600, "AT", 1000).Int64()
	b, _ := c.Do(ctx, "RL.GET", "B", max, 3600, "AT", 1000).Int64()
	if wantB := int64(max - 3*rounds*perExec); b != wantB || a != wantB-loneA {
		t.Fatalf("A = %d, B = %d; want B = %d, A = B - %d", a, b, wantB, loneA)
	}
}

// TestTxRepliesAfterOneCommit: with nothing else running, an EXEC's
// writes reach the store in one committer round, and its reply is sent
// only once they are synced in --fsync always. It does not show that a
// round never splits a transaction while other clients write: storage's
// TestHeldBatchIsOneRound does.
func TestTxRepliesAfterOneCommit(t *testing.T) {
	store, err := storage.Open(t.TempDir(), StoreOptions(storage.Options{Sync: storage.SyncAlways}))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Store: store, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, store)
	before := store.Stats()
	in := "MULTI\r\nRL.REDUCE o1 5 60 AT 1000\r\nFW.INCR o2 5 60 AT 1000\r\nCL.THROTTLE o3 5 10 60 1\r\nRL.REDUCE o1 5 60 AT 1000\r\nEXEC\r\n"
	want := "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*4\r\n:5\r\n"
	if got := rawExchange(t, srv, in, want); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	after := store.Stats()
	if r, k := after.Rounds-before.Rounds, after.KeysWritten-before.KeysWritten; r != 1 || k != 3 {
		t.Fatalf("the EXEC took %d committer rounds writing %d keys; want 1 round of 3 keys", r, k)
	}
}

// TestTxFailedCommit: when the commit of an EXEC's writes fails, the whole
// EXEC reply is the error, not an array with some replies standing; and an
// EXEC sent while the store refuses writes runs nothing.
//
// What "nothing applied" means here: a change is made in the store's
// memory before its commit, as for every command, so a commit that fails
// because the disk refuses writes leaves the changes queued, and they are
// written, all together, once the disk takes writes again (the client saw
// an error, as for a single command). An EXEC that arrives while the store
// already refuses writes runs none of its commands.
func TestTxFailedCommit(t *testing.T) {
	disk := storage.NewMemDisk()
	// The store logs when writes start failing and when they succeed
	// again: the test waits for those lines instead of polling.
	logs := &messageHandler{c: make(chan string, 64)}
	store, err := storage.Open("db", StoreOptions(storage.Options{Sync: storage.SyncAlways, Disk: disk, Logger: slog.New(logs)}))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Store: store, RESP: respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()}})
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, srv, store)
	tx := "MULTI\r\nRL.REDUCE %[1]sa 5 60 AT 1000\r\nPING\r\nRL.REDUCE %[1]sb 5 60 AT 1000\r\nEXEC\r\n"
	queued := "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n"
	unavailable := "-ERR store unavailable"

	disk.FailWrites(fmt.Errorf("injected: %w", syscall.ENOSPC))
	if got := rawExchange(t, srv, fmt.Sprintf(tx, "f"), queued+unavailable); got != queued+unavailable {
		t.Fatalf("EXEC whose commit fails: %q; want the queued replies then one error", got)
	}
	logs.wait(t, "writes to the data directory fail")
	if got := rawExchange(t, srv, fmt.Sprintf(tx, "u"), queued+unavailable); got != queued+unavailable {
		t.Fatalf("EXEC on an unavailable store: %q; want the queued replies then one error", got)
	}
	disk.FailWrites(nil)
	logs.wait(t, "writes to the data directory succeed again")
	for _, k := range []struct {
		key  string
		want int64
	}{{"fa", 4}, {"fb", 4}, {"ua", 5}, {"ub", 5}} {
		got := rawExchange(t, srv, "RL.GET "+k.key+" 5 60 AT 1000\r\n", ":"+strconv.FormatInt(k.want, 10)+"\r\n")
		if got != ":"+strconv.FormatInt(k.want, 10)+"\r\n" {
			t.Fatalf("after recovery %s = %q; want %d", k.key, got, k.want)
		}
	}
}

// messageHandler is a slog.Handler that passes each record's message on.
type messageHandler struct{ c chan string }

func (h *messageHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *messageHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.c <- r.Message:
	default: // nobody waits any more; never block the store
	}
	return nil
}
func (h *messageHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *messageHandler) WithGroup(string) slog.Handler      { return h }

// wait returns once a message starting with prefix was logged.
func (h *messageHandler) wait(t *testing.T, prefix string) {
	t.Helper()
	for m := range h.c {
		if strings.HasPrefix(m, prefix) {
			return
		}
	}
}

// TestTxQueueCountsAgainstClientMemory: a queued transaction is part of a
// client's buffers for --maxmemory-clients.
func TestTxQueueCountsAgainstClientMemory(t *testing.T) {
	srv := startServer(t, Config{RESP: respserver.Tuning{MaxMemoryClients: respserver.LimitOf[int64](256 << 10), MaxMultiBytes: 64 << 20}})
	nc, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(time.Minute))
	r := bufio.NewReader(nc)
	if _, err := io.WriteString(nc, "MULTI\r\n"); err != nil {
		t.Fatal(err)
	}
	if l, _ := r.ReadString('\n'); l != "+OK\r\n" {
		t.Fatalf("MULTI: %q", l)
	}
	arg := strings.Repeat("x", 16<<10)
	for i := range 64 {
		if _, err := io.WriteString(nc, "ECHO "+arg+"\r\n"); err != nil {
			t.Fatal(err)
		}
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d queued commands: %v", i, err)
		}
		if strings.Contains(l, "maxmemory-clients") {
			return
		}
		if l != "+QUEUED\r\n" {
			t.Fatalf("queued command %d: %q", i, l)
		}
	}
	t.Fatal("1 MiB queued in a transaction never hit --maxmemory-clients 256 KiB")
}

// TestTxClientListShowsQueue: CLIENT LIST shows a connection inside MULTI
// with flag x, its queued commands in multi and their bytes in multi-mem.
func TestTxClientListShowsQueue(t *testing.T) {
	srv := startServer(t, Config{})
	nc, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(nc, "CLIENT SETNAME queuer\r\nMULTI\r\nRL.REDUCE q 3 3600\r\nRL.REDUCE q 3 3600\r\n"); err != nil {
		t.Fatal(err)
	}
	want := "+OK\r\n+OK\r\n+QUEUED\r\n+QUEUED\r\n"
	got := make([]byte, len(want))
	if _, err := io.ReadFull(nc, got); err != nil || string(got) != want {
		t.Fatalf("replies %q, %v; want %q", got, err, want)
	}
	list, err := newClient(t, srv).ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(list, "\n") {
		if strings.Contains(l, " name=queuer ") {
			line = l
		}
	}
	fields := map[string]string{}
	for _, f := range strings.Fields(line) {
		k, v, _ := strings.Cut(f, "=")
		fields[k] = v
	}
	if fields["flags"] != "x" || fields["multi"] != "2" {
		t.Fatalf("line of the connection in MULTI: %q; want flags=x multi=2", line)
	}
	if n, err := strconv.Atoi(fields["multi-mem"]); err != nil || n <= 0 {
		t.Fatalf("multi-mem of a connection with 2 queued commands: %q; want > 0", fields["multi-mem"])
	}
}

// TestTxQueuesOnlyAllowedCommands: MULTI refuses (and the transaction
// aborts) every command outside its allowlist, among them those that
// read or flush the whole store, which an EXEC holding its keys' locks and
// the committer would wait for forever (CLUSTER DROP after a write
// deadlocked the store).
func TestTxQueuesOnlyAllowedCommands(t *testing.T) {
	srv := startServer(t, Config{Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: threeNodes, Self: threeNodes[1]}}})
	mine := keyIn(5461, 10921)
	for _, cmd := range []string{"CLUSTER DROP 0-5460", "CLUSTER DUMP 5461 5461 \"\" 10", "CLUSTER MIGRATE PAUSE",
		"CLUSTER MIGRATE DIRTY 10", "DEL " + mine, "INFO", "DBSIZE", "COMPACT", "CHECKPOINT", "CONFIG SET x y", "POLICY reload"} {
		// DISCARD, not EXEC: the code before the allowlist deadlocked
		// on EXEC (TestTxProtocol's "refused" checks EXECABORT).
		in := "MULTI\r\nRL.REDUCE " + mine + " 5 60 AT 1\r\n" + cmd + "\r\nDISCARD\r\n"
		got := rawExchangeAll(t, srv, in)
		if !strings.HasPrefix(got, "+OK\r\n+QUEUED\r\n-ERR Command not allowed inside a transaction: ") ||
			!strings.HasSuffix(got, " (MULTI queues the limit commands and commands on the connection itself; see docs/protocol.md)\r\n+OK\r\n") {
			t.Errorf("MULTI, RL.REDUCE, %s, DISCARD: %q; want the command refused", cmd, got)
		}
	}
	in := "MULTI\r\nPING\r\nCLIENT ID\r\nCONFIG GET maxclients\r\nTIME\r\nUNWATCH\r\nRL.REDUCE " + mine + " 5 60 AT 1\r\nEXEC\r\n"
	if got := rawExchangeAll(t, srv, in); strings.Count(got, "+QUEUED\r\n") != 6 || !strings.Contains(got, "*6\r\n+PONG\r\n") {
		t.Errorf("allowed commands in MULTI: %q", got)
	}
}

// rawExchangeAll sends in, then QUIT, and returns every reply before QUIT's.
func rawExchangeAll(t *testing.T, srv *Server, in string) string {
	t.Helper()
	nc, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(nc, in+"QUIT\r\n"); err != nil {
		t.Fatal(err)
	}
	all, _ := io.ReadAll(nc)
	return strings.TrimSuffix(string(all), "+OK\r\n") // QUIT's
}

// TestTxUnwatchReturnsCharge: UNWATCH gives back WATCH's charge against
// --max-multi-bytes, so a pooled connection that watches and unwatches
// without EXEC (go-redis' Watch whose function writes nothing) is not
// refused WATCH after a while.
func TestTxUnwatchReturnsCharge(t *testing.T) {
	srv := startServer(t, Config{RESP: respserver.Tuning{MaxMultiBytes: respserver.TxEntryCost * 10}})
	in := strings.Repeat("WATCH a b c d e\r\nUNWATCH\r\n", 3)
	want := strings.Repeat("+OK\r\n+OK\r\n", 3)
	if got := rawExchange(t, srv, in, want); got != want {
		t.Fatalf("WATCH 5 keys and UNWATCH, three times, with room for 10 keys: %q", got)
	}
}

// TestTxClientInfoInExec: CLIENT INFO run by EXEC shows the transaction,
// as Redis does: flags=x, multi=<queued commands>, cmd=exec.
func TestTxClientInfoInExec(t *testing.T) {
	srv := startServer(t, Config{})
	got := rawExchangeAll(t, srv, "MULTI\r\nPING\r\nCLIENT INFO\r\nEXEC\r\n")
	for _, f := range []string{" flags=x ", " multi=2 ", " cmd=exec "} {
		if !strings.Contains(got, f) {
			t.Errorf("CLIENT INFO inside EXEC: %q; want %q", got, f)
		}
	}
}

// bigExec is a transaction of 200 COMMAND DOCS, whose replies pass any
// small reply limit, between RL.REDUCEs of first and last when reduce is
// set.
func bigExec(reduce bool) string {
	var b strings.Builder
	b.WriteString("MULTI\r\n")
	if reduce {
		b.WriteString("RL.REDUCE first 5 60 AT 1\r\n")
	}
	for range 200 {
		b.WriteString("COMMAND DOCS\r\n")
	}
	if reduce {
		b.WriteString("RL.REDUCE last 5 60 AT 1\r\n")
	}
	b.WriteString("EXEC\r\n")
	return b.String()
}

// TestTxExecReplyLimits: an EXEC whose replies pass --max-reply-buffer, or
// would take the clients' buffers past --maxmemory-clients, still runs
// every queued command (a transaction is whole), drops their replies
// instead of building the whole reply first, answers the limit's error and
// closes the connection, as a pipeline does.
func TestTxExecReplyLimits(t *testing.T) {
	for _, tc := range []struct {
		flag   string
		limit  int
		maxLen int // the most reply bytes the client may see
		cfg    Config
		want   string
	}{
		{"--max-reply-buffer", 64 << 10, 2 * 64 << 10, Config{RESP: respserver.Tuning{MaxReplyBuffer: 64 << 10}}, "-ERR reply buffer limit reached (--max-reply-buffer); the transaction ran, its replies are dropped; closing the connection\r\n"},
		{"--maxmemory-clients", 512 << 10, 512 << 10, Config{RESP: respserver.Tuning{MaxMemoryClients: respserver.LimitOf[int64](512 << 10)}}, "-ERR client memory limit reached: the buffers of all clients exceed --maxmemory-clients; the transaction ran, its replies are dropped; closing the connection\r\n"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			srv := startServer(t, tc.cfg)
			got := rawExchangeAll(t, srv, bigExec(true))
			if len(got) > tc.maxLen || !strings.HasSuffix(got, tc.want) {
				t.Fatalf("EXEC of 200 COMMAND DOCS with %s %d: %d bytes of replies, ending %q", tc.flag, tc.limit, len(got), got[max(len(got)-200, 0):])
			}
			c := newClient(t, srv)
			for _, k := range []string{"first", "last"} {
				if n, err := c.Do(context.Background(), "RL.GET", k, 5, 60, "AT", 1).Int64(); err != nil || n != 4 {
					t.Fatalf("RL.GET %s after the EXEC: %d, %v; want 4 (the transaction ran whole)", k, n, err)
				}
			}
		})
	}
}

// TestTxExecLimitErrorCounted: the error EXEC answers when its replies
// pass --max-reply-buffer is an error reply like any other, counted once
// in total_error_replies by the dispatcher (it was not counted before the
// accounting moved there, though INFO documents "error replies sent").
func TestTxExecLimitErrorCounted(t *testing.T) {
	const limit = 64 << 10
	srv := startServer(t, Config{RESP: respserver.Tuning{MaxReplyBuffer: limit}})
	got := rawExchangeAll(t, srv, bigExec(false))
	if !strings.HasSuffix(got, "-ERR reply buffer limit reached (--max-reply-buffer); the transaction ran, its replies are dropped; closing the connection\r\n") {
		t.Fatalf("EXEC of 200 COMMAND DOCS with --max-reply-buffer %d: ending %q", limit, got[max(len(got)-200, 0):])
	}
	info := rawExchangeAll(t, srv, "INFO stats\r\nQUIT\r\n")
	if !strings.Contains(info, "\r\ntotal_error_replies:1\r\n") {
		t.Fatalf("INFO stats after the EXEC's limit error: %q; want total_error_replies:1", info)
	}
}
