package server

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestClientKill: CLIENT KILL's old form (addr:port, OK or an error) and
// its filters (ID, ADDR, LADDR, USER, TYPE, MAXAGE, SKIPME; the number
// killed), with Redis 7.4's replies and errors, as redis-server 7 gives
// them; a killed connection is closed, the others are served on.
func TestClientKill(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix())
	srv := startServer(t, Config{Clock: func() time.Time { return time.Unix(now.Load(), 0) }})
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), MaxRetries: -1, PoolSize: 1, Protocol: 2})
	defer admin.Close()
	do := func(args ...any) (any, error) { return admin.Do(ctx, args...).Result() }
	type victim struct {
		*rawClient
		id   int64
		addr string
	}
	dial := func() victim {
		c := dialRaw(t, srv)
		c.write([]byte("CLIENT ID\r\n"))
		id, err := strconv.ParseInt(strings.TrimPrefix(c.reply(), ":"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return victim{c, id, c.conn.LocalAddr().String()}
	}
	alive := func(v victim) {
		t.Helper()
		v.write([]byte("PING\r\n"))
		v.expect("+PONG")
	}
	a, b, c, d := dial(), dial(), dial(), dial()

	for _, tc := range []struct {
		args []any
		want string // the reply, or the error's text
	}{
		{[]any{"CLIENT", "KILL"}, "ERR wrong number of arguments for 'client|kill' command"},
		{[]any{"CLIENT", "KILL", "1.2.3.4:5"}, "ERR No such client"},
		{[]any{"CLIENT", "KILL", "ID", 0}, "ERR client-id should be greater than 0"},
		{[]any{"CLIENT", "KILL", "ID", "abc"}, "ERR client-id should be greater than 0"},
		{[]any{"CLIENT", "KILL", "ID", 99999}, "0"},
		{[]any{"CLIENT", "KILL", "USER", "nobody"}, "ERR No such user 'nobody'"},
		{[]any{"CLIENT", "KILL", "TYPE", "foo"}, "ERR Unknown client type 'foo'"},
		{[]any{"CLIENT", "KILL", "TYPE", "replica"}, "0"},
		{[]any{"CLIENT", "KILL", "TYPE", "pubsub"}, "0"},
		{[]any{"CLIENT", "KILL", "ADDR", "1.2.3.4:5"}, "0"},
		{[]any{"CLIENT", "KILL", "SKIPME", "maybe"}, "ERR syntax error"},
		{[]any{"CLIENT", "KILL", "a", "b", "c"}, "ERR syntax error"},
		{[]any{"CLIENT", "KILL", "LADDR", "1.1.1.1:1", "ID"}, "ERR syntax error"},
		{[]any{"CLIENT", "KILL", "MAXAGE", 0}, "ERR maxage should be greater than 0"},
		{[]any{"CLIENT", "KILL", "MAXAGE", "x"}, "ERR maxage is not an integer or out of range"},
		{[]any{"CLIENT", "KILL", "USER", "default", "SKIPME", "yes", "TYPE", "master"}, "0"},
		// The old form, by the address CLIENT LIST shows.
		{[]any{"CLIENT", "KILL", a.addr}, "OK"},
		// The filters are ANDed.
		{[]any{"CLIENT", "KILL", "ID", b.id, "ADDR", c.addr}, "0"},
		{[]any{"CLIENT", "KILL", "ID", b.id, "ADDR", b.addr, "USER", "default", "TYPE", "normal"}, "1"},
	} {
		got, err := do(tc.args...)
		if err != nil {
			got = err.Error()
		}
		if fmt.Sprint(got) != tc.want {
			t.Errorf("%v: %v, want %s", tc.args, got, tc.want)
		}
	}
	a.expectClosed()
	b.expectClosed()
	alive(c)
	alive(d)

	// MAXAGE: connections at least that many seconds old; the caller is
	// skipped (SKIPME yes by default).
	now.Add(100)
	e := dial()
	if n, err := admin.Do(ctx, "CLIENT", "KILL", "MAXAGE", 100).Int64(); err != nil || n != 2 {
		t.Errorf("CLIENT KILL MAXAGE 100: %d, %v; want 2 (c and d, not e or the caller)", n, err)
	}
	c.expectClosed()
	d.expectClosed()
	alive(e)

	// SKIPME no, by the server's address: every connection, the caller's
	// own after its reply. The caller is a raw connection, so that the
	// test reads the reply and then the close; a pooled client that sent
	// its next command before the close would see it reset.
	f := dial()
	f.write([]byte("CLIENT KILL LADDR " + srv.Addr().String() + " SKIPME no\r\n"))
	f.expect(":3") // admin, e and the caller
	f.expectClosed()
	e.expectClosed()
	again := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), MaxRetries: -1, PoolSize: 1})
	defer again.Close()
	if id, err := again.ClientID(ctx).Result(); err != nil || id == 0 {
		t.Errorf("a new connection after the kill: %d, %v", id, err)
	}
}

// TestClientListFilters: CLIENT LIST TYPE and ID, as Redis: every sluice
// connection is of type normal; IDs are listed in the order given, unknown
// ones left out.
func TestClientListFilters(t *testing.T) {
	srv := startServer(t, Config{})
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), MaxRetries: -1, PoolSize: 1})
	defer admin.Close()
	self, err := admin.ClientID(ctx).Result() // connects first: the lower ID
	if err != nil {
		t.Fatal(err)
	}
	other := dialRaw(t, srv)
	other.write([]byte("CLIENT ID\r\n"))
	otherID := strings.TrimPrefix(other.reply(), ":")
	ids := func(list string) []string {
		var out []string
		for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
			if id, ok := strings.CutPrefix(line, "id="); ok {
				id, _, _ = strings.Cut(id, " ")
				out = append(out, id)
			}
		}
		return out
	}
	for _, tc := range []struct {
		args []any
		want string // the IDs listed, or the error
	}{
		{[]any{"CLIENT", "LIST", "TYPE", "normal"}, fmt.Sprintf("[%d %s]", self, otherID)},
		{[]any{"CLIENT", "LIST", "TYPE", "NORMAL"}, fmt.Sprintf("[%d %s]", self, otherID)},
		{[]any{"CLIENT", "LIST", "TYPE", "replica"}, "[]"},
		{[]any{"CLIENT", "LIST", "TYPE", "slave"}, "[]"},
		{[]any{"CLIENT", "LIST", "TYPE", "master"}, "[]"},
		{[]any{"CLIENT", "LIST", "TYPE", "pubsub"}, "[]"},
		{[]any{"CLIENT", "LIST", "ID", otherID, 99999, self}, fmt.Sprintf("[%s %d]", otherID, self)},
		{[]any{"CLIENT", "LIST", "ID", 99999}, "[]"},
		{[]any{"CLIENT", "LIST", "TYPE", "foo"}, "ERR Unknown client type 'foo'"},
		{[]any{"CLIENT", "LIST", "ID", "abc"}, "ERR Invalid client ID"},
		{[]any{"CLIENT", "LIST", "TYPE", "normal", "extra"}, "ERR syntax error"},
		{[]any{"CLIENT", "LIST", "foo"}, "ERR syntax error"},
		{[]any{"CLIENT", "LIST", "ID"}, "ERR syntax error"},
	} {
		list, err := admin.Do(ctx, tc.args...).Text()
		got := fmt.Sprint(ids(list))
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("%v: %s, want %s", tc.args, got, tc.want)
		}
	}
}
