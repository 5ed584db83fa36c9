package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/storage"
)

// TestUpgradeFormat1 opens a store written before hash slots were added
// to record keys (testdata/format1, see its README) and checks that every
// bucket and divvy counter is still there, under its new key with its old
// value, and answers as before.
func TestUpgradeFormat1(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	if err := os.CopyFS(dir, os.DirFS("testdata/format1/store")); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{} // new key -> value
	f, err := os.Open("testdata/format1/records.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		kh, vh, _ := strings.Cut(sc.Text(), " ")
		k, err1 := hex.DecodeString(kh)
		v, err2 := hex.DecodeString(vh)
		if err1 != nil || err2 != nil {
			t.Fatalf("records.txt: %q", sc.Text())
		}
		nk, moved, err := keyspace.UpgradeKey(nil, k)
		if err != nil || !moved {
			t.Fatalf("old key % x: %v, moved %v", k, err, moved)
		}
		want[string(nk)] = string(v)
	}
	if len(want) != 60 {
		t.Fatalf("records.txt lists %d records, want 60", len(want))
	}

	// The first open upgrades the store; storage.Inspect then reads it raw.
	store, err := storage.Open(dir, server.StoreOptions(storage.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	byClass := store.RecordsByClass()
	bucketClass := keyspace.Lookup(keyspace.KindBucket).Class
	divvyClass := keyspace.Lookup(keyspace.KindCounter).Class
	if store.Records() != 60 || byClass[bucketClass] != 57 || byClass[divvyClass] != 3 {
		t.Fatalf("after the upgrade: %d records, by class %v; want 60: 57 buckets, 3 divvy counters", store.Records(), byClass)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	if err := storage.Inspect(dir, func(k, v []byte) bool {
		got[string(k)] = string(v)
		return true
	}, nil); err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("record % x: value % x after the upgrade, want % x", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d records after the upgrade, want %d", len(got), len(want))
	}

	// Served, the buckets and counters answer as they did. The counters'
	// windows opened at unix ms 1795469060587 (README); the clock stands a
	// second later.
	store, err = storage.Open(dir, server.StoreOptions(storage.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c, stop := serveStore(t, server.Config{
		Store:  store,
		Policy: policycmd.Config{File: "testdata/format1/policy.ini"},
		Clock:  func() time.Time { return time.UnixMilli(1795469061587) },
		RESP:   respserver.Tuning{SweepInterval: respserver.NoLimit[time.Duration]()},
	})
	defer stop()
	ctx := context.Background()
	for _, q := range []struct {
		cmd  []any
		want any
	}{
		{[]any{"RL.GET", "user:2", 10, 60, "AT", 1700000000}, int64(4)},  // 10 - 3×2
		{[]any{"RL.GET", "user:1", 10, 60, "AT", 1700000000}, int64(9)},  // its first parameter set
		{[]any{"RL.GET", "user:1", 20, 60, "AT", 1700000000}, int64(16)}, // its second
		{[]any{"RL.PGET", "{tag}a", 100, 1000, "REFILL", 5, "AT", 1700000000000}, int64(93)},
		{[]any{"RL.GET", "bin\xff\x00key", 7, 100, "AT", 1700000000}, int64(4)},
		{[]any{"RL.GET", "", 3, 10, "AT", 1700000000}, int64(2)},
		{[]any{"RL.GET", "many:50", 1000, 3600, "AT", 1700000000}, int64(950)},
		{[]any{"HIT", "method=GET", "path=/login", "ip=1.2.3.4"}, []any{int64(1), int64(2), int64(315359999)}},
		{[]any{"DBSIZE"}, int64(60)},
	} {
		got, err := c.Do(ctx, q.cmd...).Result()
		if err != nil {
			t.Fatalf("%v: %v", q.cmd, err)
		}
		if !equalReply(got, q.want) {
			t.Errorf("%v = %#v, want %#v", q.cmd, got, q.want)
		}
	}
}

func equalReply(got, want any) bool {
	g, ok1 := got.([]any)
	w, ok2 := want.([]any)
	if ok1 != ok2 {
		return false
	}
	if !ok1 {
		return got == want
	}
	if len(g) != len(w) {
		return false
	}
	for i := range g {
		if !equalReply(g[i], w[i]) {
			return false
		}
	}
	return true
}
