package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
)

// The rejoin scenario (issue 29, must-show 3) measures how long a node
// that lost its volume takes to rejoin: three local nodes with
// --cluster-replicas 3; --keys buckets put in shard 0, each with its own
// count of tokens taken; shard 0's home node killed with SIGKILL, its
// data directory deleted, and the node started again on an empty one. It
// reports the time from that start to the node leading shard 0 again
// (it rejoined every shard by snapshot, caught up and was promoted,
// and leadership came home), and reads every bucket back from it.

// rejoinAt is the time (AT) of every command: nothing refills.
const rejoinAt = 1700000000

// rejoinLimit is each bucket's capacity; bucket n has n%50+1 tokens taken.
const rejoinLimit = 100

// rejoinBatch is the commands of one pipeline, rejoinConns the pipelines
// sent at once.
const (
	rejoinBatch = 1000
	rejoinConns = 8
)

// rejoinKeys returns n keys whose slots are in shard 0 of the placement.
func rejoinKeys(n int64, first, last uint16) []string {
	keys := make([]string, 0, n)
	for i := 0; int64(len(keys)) < n; i++ {
		k := "rejoin:" + strconv.Itoa(i)
		if sl := keyspace.Slot([]byte(k)); sl >= first && sl <= last {
			keys = append(keys, k)
		}
	}
	return keys
}

func rejoinTake(i int) int { return i%50 + 1 }

// pipelineAll sends cmd(i) for every i < n to rdb, rejoinConns pipelines
// of rejoinBatch at a time, and calls check with each reply; the first
// error ends it.
func pipelineAll(rdb *redis.Client, n int, cmd func(i int) []any, check func(i int, c *redis.Cmd) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, rejoinConns)
	for range rejoinConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := int(next.Add(rejoinBatch)) - rejoinBatch
				if lo >= n {
					return
				}
				hi := min(lo+rejoinBatch, n)
				cmds := make([]*redis.Cmd, 0, hi-lo)
				_, err := rdb.Pipelined(context.Background(), func(p redis.Pipeliner) error {
					for i := lo; i < hi; i++ {
						cmds = append(cmds, p.Do(context.Background(), cmd(i)...))
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
				for j, c := range cmds {
					if err := check(lo+j, c); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// runRejoin runs the rejoin scenario, printing its figures.
func runRejoin(o options, timeout time.Duration, log io.Writer) error {
	tmp, bin, err := workDir(o, "bench-rejoin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	load0 := loadAverage()
	nodes, _, shards, keys, flags, err := startReplicatedNodes(o, tmp, bin)
	defer stopNodes(nodes)
	if err != nil {
		return err
	}
	sh := shards[0]
	fmt.Fprintf(log, "== rejoin: 3 nodes, sluice %s; %d buckets in shard 0 (slots %d-%d), then its home node 0 killed, its data directory deleted, and started again\n",
		strings.Join(flags, " "), o.w.Keys, sh.Slots.First, sh.Slots.Last)
	if _, _, err := waitServed(nodes, keys, shards, time.Now().Add(timeout), time.Now().Add(timeout)); err != nil {
		return fmt.Errorf("the cluster never served every shard: %w%s", err, nodeLogs(nodes))
	}
	bkeys := rejoinKeys(o.w.Keys, sh.Slots.First, sh.Slots.Last)
	home := nodes[0]
	// Pipelines of rejoinBatch commands: the node's own client's
	// timeouts are for probes.
	bulk := func() *redis.Client {
		return redis.NewClient(&redis.Options{Addr: home.addr, MaxRetries: -1, ReadTimeout: time.Minute, WriteTimeout: time.Minute, PoolSize: rejoinConns})
	}
	rdb := bulk()
	defer func() { rdb.Close() }()
	t0 := time.Now()
	err = pipelineAll(rdb, len(bkeys), func(i int) []any {
		return []any{"RL.REDUCE", bkeys[i], rejoinLimit, 3600, "TAKE", rejoinTake(i), "AT", rejoinAt}
	}, func(i int, c *redis.Cmd) error {
		if err := c.Err(); err != nil {
			return fmt.Errorf("bucket %s: %w", bkeys[i], err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("loading the buckets: %w", err)
	}
	loaded := time.Since(t0)
	fmt.Fprintf(log, "   loaded in %.1f s (%.0f buckets/s through node 0); node 0's data directory %.0f MiB\n",
		loaded.Seconds(), float64(len(bkeys))/loaded.Seconds(), float64(dirSize(home.dir))/(1<<20))

	if err := home.srv.cmd.Process.Kill(); err != nil {
		return err
	}
	<-home.srv.done
	if err := os.RemoveAll(home.dir); err != nil {
		return err
	}
	t1 := time.Now()
	if err := home.start(bin); err != nil {
		return fmt.Errorf("restart node 0 on an empty directory: %w", err)
	}
	ready := time.Since(t1)
	_, note, err := waitServed(nodes, keys, shards, t1.Add(timeout), t1.Add(timeout))
	if err != nil || note != "" {
		return fmt.Errorf("node 0 never led shard 0 again within %s: %v %s%s", timeout, err, note, nodeLogs(nodes))
	}
	back := time.Since(t1)
	info, err := home.rdb.Info(context.Background(), "replication").Result()
	if err != nil {
		return err
	}
	inc := "?"
	if _, rest, ok := strings.Cut(info, "cluster_incarnation:"); ok {
		inc, _, _ = strings.Cut(rest, "\r\n")
	}
	fmt.Fprintf(log, "   node 0 answered PING %.2f s after its start on an empty directory, and led shard 0 again %.2f s after it (incarnation %s); its data directory now %.0f MiB\n",
		ready.Seconds(), back.Seconds(), inc, float64(dirSize(home.dir))/(1<<20))

	rdb.Close()
	rdb = bulk()
	var wrong atomic.Int64
	err = pipelineAll(rdb, len(bkeys), func(i int) []any {
		return []any{"RL.GET", bkeys[i], rejoinLimit, 3600, "AT", rejoinAt}
	}, func(i int, c *redis.Cmd) error {
		n, err := c.Int64()
		if err != nil {
			return fmt.Errorf("bucket %s on the rejoined node: %w", bkeys[i], err)
		}
		if n != int64(rejoinLimit-rejoinTake(i)) {
			wrong.Add(1)
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "   every bucket read back from node 0: %d of %d wrong; load average %s before, %s after\n", wrong.Load(), len(bkeys), load0, loadAverage())
	if wrong.Load() > 0 {
		return fmt.Errorf("%d buckets differ after the rejoin", wrong.Load())
	}
	return nil
}
