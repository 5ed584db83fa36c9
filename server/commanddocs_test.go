package server

import (
	"context"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestCommandDocsSubcommands: COMMAND DOCS gives CLIENT, COMMAND, CONFIG
// and POLICY their subcommands, each a record of its own under its full
// name ("client|setname"), as Redis 7 does: redis-cli builds "CLIENT
// SETNAME" for HELP and Tab completion from them. COMMAND INFO gives them
// as its tenth element, and go-redis still parses COMMAND.
func TestCommandDocsSubcommands(t *testing.T) {
	srv := startServer(t, Config{})
	rdb := newClient(t, srv) // RESP3
	ctx := context.Background()
	want := map[string][]string{
		"client":  {"client|getname", "client|help", "client|id", "client|info", "client|kill", "client|list", "client|setinfo", "client|setname"},
		"command": {"command|count", "command|docs", "command|help", "command|info", "command|list"},
		"config":  {"config|get", "config|resetstat", "config|rewrite", "config|set"},
		"policy":  {"policy|enforce", "policy|limit", "policy|override", "policy|overrides", "policy|reload", "policy|show", "policy|stats"},
	}
	docs, err := rdb.Do(ctx, "COMMAND", "DOCS", "client", "command", "config", "policy").Result()
	if err != nil {
		t.Fatal(err)
	}
	m, _ := docs.(map[any]any)
	subDocs := map[string]map[any]any{}
	for parent, names := range want {
		rec, _ := m[parent].(map[any]any)
		subs, ok := rec["subcommands"].(map[any]any)
		if !ok {
			t.Fatalf("COMMAND DOCS %s has no subcommands: %#v", parent, rec)
		}
		var got []string
		for k, v := range subs {
			name, _ := k.(string)
			got = append(got, name)
			sr, _ := v.(map[any]any)
			for _, f := range []string{"summary", "since", "group"} {
				if s, _ := sr[f].(string); s == "" {
					t.Errorf("COMMAND DOCS %s has no %s: %#v", name, f, sr)
				}
			}
			subDocs[name] = sr
		}
		sort.Strings(got)
		if !slices.Equal(got, names) {
			t.Errorf("COMMAND DOCS %s subcommands %v, want %v", parent, got, names)
		}
	}
	argNames := func(rec map[any]any) []string {
		var names []string
		args, _ := rec["arguments"].([]any)
		for _, a := range args {
			am, _ := a.(map[any]any)
			n, _ := am["name"].(string)
			names = append(names, n)
		}
		return names
	}
	if got := argNames(subDocs["client|setname"]); !slices.Equal(got, []string{"connection-name"}) {
		t.Errorf("client|setname arguments %v", got)
	}
	// CLIENT SETINFO <LIB-NAME libname | LIB-VER libver>: a oneof of two.
	setinfo, _ := subDocs["client|setinfo"]["arguments"].([]any)
	if len(setinfo) != 1 {
		t.Fatalf("client|setinfo arguments %#v", setinfo)
	}
	oneof, _ := setinfo[0].(map[any]any)
	if oneof["type"] != "oneof" || !slices.Equal(argNames(oneof), []string{"libname", "libver"}) {
		t.Errorf("client|setinfo argument %#v, want a oneof of libname and libver", oneof)
	}

	// A subcommand's record by its full name, as Redis.
	one, err := rdb.Do(ctx, "COMMAND", "DOCS", "CLIENT|SETNAME").Result()
	if om, _ := one.(map[any]any); err != nil || len(om) != 1 || om["client|setname"] == nil {
		t.Errorf("COMMAND DOCS client|setname = %#v, %v", one, err)
	}

	// COMMAND INFO: the tenth element lists the subcommands, each with
	// Redis' ten elements.
	info, err := rdb.Do(ctx, "COMMAND", "INFO", "client", "config|get").Slice()
	if err != nil || len(info) != 2 {
		t.Fatalf("COMMAND INFO = %#v, %v", info, err)
	}
	client, _ := info[0].([]any)
	if len(client) != 10 {
		t.Fatalf("COMMAND INFO client = %#v", client)
	}
	subs, _ := client[9].([]any)
	var got []string
	for _, s := range subs {
		e, _ := s.([]any)
		if len(e) != 10 {
			t.Errorf("subcommand entry %#v has %d elements, want 10", e, len(e))
			continue
		}
		name, _ := e[0].(string)
		got = append(got, name)
	}
	if !slices.Equal(got, want["client"]) {
		t.Errorf("COMMAND INFO client subcommands %v, want %v", got, want["client"])
	}
	if get, _ := info[1].([]any); len(get) != 10 || get[0] != "config|get" || get[1] != int64(-3) {
		t.Errorf("COMMAND INFO config|get = %#v", info[1])
	}

	// go-redis parses COMMAND, RESP3 and RESP2.
	for _, proto := range []int{3, 2} {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), Protocol: proto})
		cmds, err := c.Command(ctx).Result()
		c.Close()
		if err != nil || cmds["client"] == nil || cmds["client"].Arity != -2 || cmds["rl.reduce"] == nil {
			t.Errorf("go-redis Command (RESP%d) = %v, %v", proto, cmds["client"], err)
		}
	}

	// CLIENT LIST's cmd names the subcommand.
	c := rdb.Conn()
	defer c.Close()
	id, err := c.ClientID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "CONFIG", "GET", "port").Err(); err != nil {
		t.Fatal(err)
	}
	list, err := rdb.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSuffix(list, "\n"), "\n") {
		if m := parseClientLine(t, line); m["id"] == strconv.FormatInt(id, 10) && m["cmd"] != "config|get" {
			t.Errorf("CLIENT LIST cmd=%s after CONFIG GET, want config|get", m["cmd"])
		}
	}
}
