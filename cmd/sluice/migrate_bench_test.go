package main

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/storage"
)

// BenchmarkMigrate1M is the migration rate of issue 17's fourth must-show:
// one slot holding 1M token buckets (keys sharing a hash tag) moves from
// one in-process node to another with sluice cluster move; it reports
// records/s and the MB/s of RESTORE traffic into the target. Run it once:
// go test ./cmd/sluice -run '^$' -bench BenchmarkMigrate1M -benchtime 1x
func BenchmarkMigrate1M(b *testing.B) {
	const buckets = 1_000_000
	addrs := make([]string, 2)
	lns := make([]net.Listener, 2)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		lns[i], addrs[i] = ln, ln.Addr().String()
	}
	for i := range lns {
		store, err := storage.Open(b.TempDir(), server.StoreOptions(storage.Options{Sync: storage.SyncEverySec}))
		if err != nil {
			b.Fatal(err)
		}
		srv, err := server.New(server.Config{Store: store, Cluster: clusternode.Mode{Node: &clusternode.Config{Nodes: addrs[:1], Self: addrs[i]}}})
		if err != nil {
			b.Fatal(err)
		}
		go srv.Serve(lns[i])
		b.Cleanup(func() { srv.Close(); store.Close() })
	}
	ctx := context.Background()
	src := redis.NewClient(&redis.Options{Addr: addrs[0], ReadTimeout: time.Minute})
	dst := redis.NewClient(&redis.Options{Addr: addrs[1], ReadTimeout: time.Minute})
	defer src.Close()
	defer dst.Close()
	for start := 0; start < buckets; start += 5000 {
		_, err := src.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := start; i < start+5000; i++ {
				p.Do(ctx, "RL.REDUCE", "{tenant42}:user:"+strconv.Itoa(i), 100, 60, "AT", clusterAt)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	slot := strconv.Itoa(int(keyspace.Slot([]byte("{tenant42}"))))
	netIn := func() int64 {
		info, _ := dst.Info(ctx, "stats").Result()
		for _, l := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(l, "total_net_input_bytes:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		return 0
	}
	before := netIn()
	b.ResetTimer()
	t0 := time.Now()
	err := runReloading(ctx, nil, []string{"cluster", "move", "--nodes", addrs[0], "--slots", slot, "--to", addrs[1]}, noEnvLookup, nil, io.Discard, io.Discard)
	elapsed := time.Since(t0)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if n, _ := dst.DBSize(ctx).Result(); n != buckets {
		b.Fatalf("target holds %d records, want %d", n, buckets)
	}
	if n, _ := src.DBSize(ctx).Result(); n != 0 {
		b.Fatalf("source still holds %d records", n)
	}
	bytes := netIn() - before
	b.ReportMetric(float64(buckets)/elapsed.Seconds(), "records/s")
	b.ReportMetric(float64(bytes)/1e6/elapsed.Seconds(), "MB/s")
	b.ReportMetric(elapsed.Seconds(), "s/move")
}
