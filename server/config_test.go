package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/respserver"
)

// TestConfigGet: CONFIG GET answers the settings by their redis.conf names
// (what ops tools and redis_exporter ask for) and by sluice's flag names,
// with Redis' globs and several patterns, and an empty reply for a name it
// does not know.
func TestConfigGet(t *testing.T) {
	srv := startServer(t, Config{Listen: admit.Config{MaxClients: 500, Password: "pw"}, RESP: respserver.Tuning{IdleTimeout: 300 * time.Second, MaxBulk: 2 << 20}})
	ctx := context.Background()
	for _, proto := range []int{2, 3} {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), Password: "pw", Protocol: proto, MaxRetries: -1})
		defer c.Close()
		get := func(patterns ...any) map[string]string {
			t.Helper()
			m, err := c.Do(ctx, append([]any{"CONFIG", "GET"}, patterns...)...).Result()
			if err != nil {
				t.Fatalf("CONFIG GET %v: %v", patterns, err)
			}
			out := map[string]string{}
			switch m := m.(type) {
			case []any: // RESP2: a flat array
				for i := 0; i+1 < len(m); i += 2 {
					out[m[i].(string)] = m[i+1].(string)
				}
			case map[any]any:
				for k, v := range m {
					out[k.(string)] = v.(string)
				}
			default:
				t.Fatalf("CONFIG GET %v: %T", patterns, m)
			}
			return out
		}
		_, port, _ := strings.Cut(srv.Addr().String(), ":")
		want := map[string]string{
			"maxclients": "500", "timeout": "300", "appendfsync": "everysec", "appendonly": "yes", "save": "",
			"databases": "1", "port": port, "bind": "127.0.0.1", "requirepass": "pw", "protected-mode": "yes",
			"proto-max-bulk-len": "2097152", "maxmemory": "0", "maxmemory-policy": "noeviction", "tls-port": "0",
			"maxmemory-clients": "67108864", "cluster-enabled": "no",
		}
		names := make([]any, 0, len(want))
		for k := range want {
			names = append(names, k)
		}
		if got := get(names...); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("RESP%d CONFIG GET %v:\n got %v\nwant %v", proto, names, got, want)
		}
		for _, tc := range []struct {
			patterns []any
			want     string // the names answered
		}{
			{[]any{"nosuch"}, "[]"},
			{[]any{"max*"}, "[max-args max-auth-failures max-bulk max-config-file max-inline max-key-size max-multi-bytes max-query-buffer max-reply-buffer maxclients maxmemory maxmemory-clients maxmemory-policy]"},
			{[]any{"maxmemory*", "maxclients", "MAXMEMORY"}, "[maxclients maxmemory maxmemory-clients maxmemory-policy]"},
			{[]any{"MAXCLIENTS"}, "[MAXCLIENTS]"}, // an exact name is answered as asked, as Redis 7
			{[]any{"TLS-*-FILE"}, "[tls-ca-cert-file tls-cert-file tls-key-file]"},
			{[]any{"?ort", "tls-po?t"}, "[port tls-port]"},
			{[]any{"[ab]*nd", "app[^x]*"}, "[appendfsync appendonly bind]"},
			{[]any{"["}, "[]"},
		} {
			got := get(tc.patterns...)
			keys := make([]string, 0, len(got))
			for k := range got {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if fmt.Sprint(keys) != tc.want {
				t.Errorf("RESP%d CONFIG GET %v: %v, want %s", proto, tc.patterns, keys, tc.want)
			}
		}
		all := get("*")
		for name := range want {
			if _, ok := all[name]; !ok {
				t.Errorf("CONFIG GET * lacks %s", name)
			}
		}
		if all["dir"] == "" || all["data"] != all["dir"] || all["fsync"] != "everysec" || all["max-bulk"] != "2097152" {
			t.Errorf("CONFIG GET *: %v", all)
		}
	}
}

// TestOpsRepliesLikeRedis: the replies and errors of CLIENT KILL, CLIENT
// LIST and CONFIG GET that do not depend on the connections or the
// settings are a real redis-server's, word for word.
func TestOpsRepliesLikeRedis(t *testing.T) {
	rc := redistest.Start(t)
	srv := startServer(t, Config{})
	sc := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), MaxRetries: -1, PoolSize: 1, Protocol: 2})
	defer sc.Close()
	ctx := context.Background()
	reply := func(c *redis.Client, args []any) string {
		v, err := c.Do(ctx, args...).Result()
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("%T %v", v, v)
	}
	for _, args := range [][]any{
		{"CLIENT", "KILL"},
		{"CLIENT", "KILL", "1.2.3.4:5"},
		{"CLIENT", "KILL", "ID", 0},
		{"CLIENT", "KILL", "ID", "abc"},
		{"CLIENT", "KILL", "ID", 99999},
		{"CLIENT", "KILL", "USER", "nobody"},
		{"CLIENT", "KILL", "USER", "default", "SKIPME", "yes", "TYPE", "master"},
		{"CLIENT", "KILL", "TYPE", "foo"},
		{"CLIENT", "KILL", "TYPE", "replica"},
		{"CLIENT", "KILL", "TYPE", "PUBSUB"},
		{"CLIENT", "KILL", "ADDR", "1.2.3.4:5", "LADDR", "1.2.3.4:6"},
		{"CLIENT", "KILL", "SKIPME", "maybe"},
		{"CLIENT", "KILL", "a", "b", "c"},
		{"CLIENT", "KILL", "LADDR", "1.1.1.1:1", "ID"},
		{"CLIENT", "LIST", "TYPE", "foo"},
		{"CLIENT", "LIST", "TYPE", "replica"},
		{"CLIENT", "LIST", "TYPE", "slave"},
		{"CLIENT", "LIST", "ID", "abc"},
		{"CLIENT", "LIST", "ID", 99999},
		{"CLIENT", "LIST", "TYPE", "normal", "extra"},
		{"CLIENT", "LIST", "foo"},
		{"CONFIG", "GET"},
		{"CONFIG", "GET", "nosuch-setting"},
		{"CONFIG", "GET", "["},
		{"CONFIG", "GET", "MAXMEMORY"},
		{"CONFIG", "GET", "maxmemory-policy", "nosuch"},
		{"CONFIG", "GET", "save"},
	} {
		want, got := reply(rc, args), reply(sc, args)
		if got != want {
			t.Errorf("%v:\n sluice %s\n  redis %s", args, got, want)
		}
	}
}
