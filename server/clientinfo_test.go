package server

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/respserver"
)

// redisClientFields are the fields of a CLIENT LIST line in Redis 7.2, in
// its order (networking.c, catClientInfoString).
var redisClientFields = []string{"id", "addr", "laddr", "fd", "name", "age", "idle", "flags", "db", "sub", "psub", "ssub",
	"multi", "qbuf", "qbuf-free", "argv-mem", "multi-mem", "rbs", "rbp", "obl", "oll", "omem", "tot-mem", "events", "cmd",
	"user", "redir", "resp", "lib-name", "lib-ver"}

// parseClientLine splits a CLIENT LIST line into its fields, checking
// they are Redis' in Redis' order.
func parseClientLine(t *testing.T, line string) map[string]string {
	t.Helper()
	m := map[string]string{}
	var keys []string
	for _, kv := range strings.Split(line, " ") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("CLIENT LIST field %q has no '=' in %q", kv, line)
		}
		keys = append(keys, k)
		m[k] = v
	}
	if !slices.Equal(keys, redisClientFields) {
		t.Fatalf("CLIENT LIST fields\n%v\nwant Redis 7.2's\n%v", keys, redisClientFields)
	}
	return m
}

func atoi64(t *testing.T, m map[string]string, k string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(m[k], 10, 64)
	if err != nil {
		t.Fatalf("field %s=%q is not an integer", k, m[k])
	}
	return n
}

// TestClientListFields: CLIENT LIST and CLIENT INFO give every field of
// Redis 7.2 in its order, for every connection: the name, library, last
// command and idle time of another connection too (they used to be left
// out, and redis-py's client_info() raised KeyError: 'multi'). Ages and
// idle times follow the server clock, which the test drives.
func TestClientListFields(t *testing.T) {
	var clock testClock
	clock.ms.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	srv := startServer(t, Config{Clock: clock.now})
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), PoolSize: 1, Protocol: 2})
	t.Cleanup(func() { rdb.Close() })
	a := rdb.Conn()
	t.Cleanup(func() { a.Close() })
	if err := a.Do(ctx, "CLIENT", "SETNAME", "alpha").Err(); err != nil {
		t.Fatal(err)
	}
	b := dialRaw(t, srv)
	b.write([]byte("CLIENT SETNAME beta\r\nCLIENT SETINFO LIB-NAME raw\r\nCLIENT SETINFO LIB-VER 1.2\r\nRL.REDUCE k 10 60\r\n"))
	b.expect("+OK")
	b.expect("+OK")
	b.expect("+OK")
	b.expect(":10")
	clock.ms.Add(7000) // 7 s later on the server clock

	list, err := a.Do(ctx, "CLIENT", "LIST").Text()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(list, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("CLIENT LIST has %d lines, want 2:\n%s", len(lines), list)
	}
	self, other := parseClientLine(t, lines[0]), parseClientLine(t, lines[1])
	for k, want := range map[string]string{
		"name": "beta", "lib-name": "raw", "lib-ver": "1.2", "cmd": "rl.reduce", "age": "7", "idle": "7",
		"flags": "N", "multi": "-1", "db": "0", "sub": "0", "user": "default", "redir": "-1", "resp": "2", "events": "r", "oll": "0",
		"qbuf": "0",
	} {
		if other[k] != want {
			t.Errorf("the other connection's %s=%q, want %q (line %q)", k, other[k], want, lines[1])
		}
	}
	for k, want := range map[string]string{"name": "alpha", "cmd": "client|list", "idle": "0", "age": "7", "multi": "-1"} {
		if self[k] != want {
			t.Errorf("the caller's %s=%q, want %q (line %q)", k, self[k], want, lines[0])
		}
	}
	for _, m := range []map[string]string{self, other} {
		if fd := atoi64(t, m, "fd"); fd < 0 {
			t.Errorf("fd=%d, want the socket's", fd)
		}
		// tot-mem is every buffer --maxmemory-clients counts; the query
		// buffer (a 4 KiB read buffer at least), parsed arguments and
		// replies are parts of it.
		tot, parts := atoi64(t, m, "tot-mem"), atoi64(t, m, "qbuf")+atoi64(t, m, "qbuf-free")+atoi64(t, m, "argv-mem")+atoi64(t, m, "omem")
		if atoi64(t, m, "qbuf-free") < respserver.ConnReadMin || tot < parts {
			t.Errorf("buffers: qbuf-free=%s tot-mem=%d, parts %d: want a read buffer of %d at least, and tot-mem >= its parts", m["qbuf-free"], tot, parts, respserver.ConnReadMin)
		}
		if atoi64(t, m, "rbs") < atoi64(t, m, "obl") || atoi64(t, m, "omem") < atoi64(t, m, "rbs") {
			t.Errorf("reply buffer: rbs=%s obl=%s omem=%s", m["rbs"], m["obl"], m["omem"])
		}
	}
	// The others' lines are a copy their goroutine published: beta's
	// buffers were counted, and its tot-mem is what the server holds for
	// it (the total less the caller's share).
	var clientsMem int64
	if _, err := fmt.Sscanf(infoField(t, newClient(t, srv), "clients", "mem_clients_normal"), "%d", &clientsMem); err != nil || clientsMem < atoi64(t, other, "tot-mem") {
		t.Errorf("mem_clients_normal %d < beta's tot-mem %s", clientsMem, other["tot-mem"])
	}

	info, err := a.Do(ctx, "CLIENT", "INFO").Text()
	if err != nil {
		t.Fatal(err)
	}
	m := parseClientLine(t, strings.TrimSuffix(info, "\n"))
	if m["cmd"] != "client|info" || m["id"] != self["id"] || m["name"] != "alpha" {
		t.Errorf("CLIENT INFO = %q", info)
	}
	// go-redis parses every field of CLIENT INFO.
	ci, err := a.ClientInfo(ctx).Result()
	if err != nil || ci.Name != "alpha" || ci.Multi != -1 || ci.TotalMemory <= 0 || ci.LastCmd != "client|info" {
		t.Errorf("go-redis ClientInfo = %+v, %v", ci, err)
	}
}

// TestClientListWhileOthersRun: CLIENT LIST reads other connections while
// they execute, rename themselves and grow their buffers; under -race this
// fails if a field is read without the publishing lock. Each line names
// its connection (the old lines left other connections' names out).
func TestClientListWhileOthersRun(t *testing.T) {
	srv := startServer(t, Config{})
	ctx := context.Background()
	const workers, rounds = 4, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), PoolSize: 1, Protocol: 2, DisableIdentity: true})
			defer c.Close()
			for i := range rounds {
				_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					p.Do(ctx, "CLIENT", "SETNAME", fmt.Sprintf("w%d-%d", w, i))
					p.Do(ctx, "RL.REDUCE", fmt.Sprintf("k%d", w), 100, 60)
					p.Do(ctx, "ECHO", strings.Repeat("x", 1000*(i%20)))
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	lister := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), PoolSize: 1, Protocol: 2})
	defer lister.Close()
	for range rounds {
		list, err := lister.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSuffix(list, "\n"), "\n") {
			m := parseClientLine(t, line)
			if m["cmd"] != "NULL" && m["cmd"] != "client|list" && m["cmd"] != "hello" && !strings.HasPrefix(m["name"], "w") {
				t.Fatalf("a worker's line has no name: %q", line)
			}
		}
	}
	wg.Wait()
}
