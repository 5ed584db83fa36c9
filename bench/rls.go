package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The rls scenario: Envoy's ShouldRateLimit over gRPC against a sluice it
// starts with --rls-addr, one descriptor (user=<id>) per call, its keys
// drawn as --dist says from --keys. --conns gRPC connections each carry
// --pipeline calls in flight (HTTP/2 streams), as Envoy multiplexes its
// calls. The limit is high enough that every call is counted and allowed,
// so each one writes its counter.

const rlsBenchConfig = `domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 4000000000
`

// runRLS runs the rls scenario and prints its report.
func runRLS(o options, stdout io.Writer) error {
	w := o.overrides(workload{Conns: 4, Pipeline: 16, Requests: 400_000, Keys: 10_000, Dist: "uniform"})
	if err := validate(w); err != nil {
		return fmt.Errorf("scenario rls: %w", err)
	}
	dir, bin, err := workDir(o, "sluice-bench-rls-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	conf := filepath.Join(dir, "rls")
	if err := os.Mkdir(conf, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(conf, "bench.yaml"), []byte(rlsBenchConfig), 0o644); err != nil {
		return err
	}
	rlsAddr, err := freeAddr()
	if err != nil {
		return err
	}
	srv, err := startSluice(o.serverWrap(), bin, filepath.Join(dir, "data"), []string{"--http-addr", "", "--rls-addr", rlsAddr, "--rls-config", conf})
	if srv != nil {
		defer srv.stop()
	}
	if err != nil {
		return fmt.Errorf("%w\n%s", err, srv.log)
	}
	conns := make([]*grpc.ClientConn, w.Conns)
	for i := range conns {
		if conns[i], err = grpc.NewClient(rlsAddr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return err
		}
		defer conns[i].Close()
	}
	if err := waitServing(conns[0]); err != nil {
		return err
	}
	run := func(requests int64) (time.Duration, *hdrhistogram.Histogram, error) {
		var next atomic.Int64
		var seq atomic.Int64
		var mu sync.Mutex
		var firstErr error
		hist := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
		var wg sync.WaitGroup
		start := time.Now()
		for c := range w.Conns {
			client := rlspb.NewRateLimitServiceClient(conns[c])
			for p := range w.Pipeline {
				wg.Add(1)
				go func(seed uint64) {
					defer wg.Done()
					keys := newKeyGen(w, seed, &seq)
					local := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
					entry := &rlcommon.RateLimitDescriptor_Entry{Key: "user"}
					req := &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{entry}}}}
					for next.Add(1) <= requests {
						entry.Value = strconv.FormatInt(keys.next(), 10)
						t0 := time.Now()
						resp, err := client.ShouldRateLimit(context.Background(), req)
						if err == nil && resp.OverallCode != rlspb.RateLimitResponse_OK {
							err = fmt.Errorf("call over the limit: %v", resp)
						}
						if err != nil {
							mu.Lock()
							if firstErr == nil {
								firstErr = err
							}
							mu.Unlock()
							return
						}
						_ = local.RecordValue(time.Since(t0).Microseconds())
					}
					mu.Lock()
					hist.Merge(local)
					mu.Unlock()
				}(uint64(c*w.Pipeline + p + 1))
			}
		}
		wg.Wait()
		return time.Since(start), hist, firstErr
	}
	// A short warm-up (connections, goroutines, the store's first
	// tables) that is not measured.
	if _, _, err := run(min(w.Requests/10, 20_000)); err != nil {
		return err
	}
	cpu0 := srv.cpuTime()
	elapsed, hist, err := run(w.Requests)
	if err != nil {
		return err
	}
	cpu := srv.cpuTime() - cpu0
	n := w.Requests
	fmt.Fprintf(stdout, "rls: ShouldRateLimit, one descriptor (user=<id>, %d keys %s), %d connections x %d calls in flight, %d calls, --fsync everysec\n", w.Keys, w.Dist, w.Conns, w.Pipeline, n)
	fmt.Fprintf(stdout, "  throughput   %.0f calls/s\n", float64(n)/elapsed.Seconds())
	fmt.Fprintf(stdout, "  server CPU   %.1f µs per call (%.2f s user+system over %.2f s)\n", float64(cpu.Microseconds())/float64(n), cpu.Seconds(), elapsed.Seconds())
	fmt.Fprintf(stdout, "  latency      p50 %d µs, p99 %d µs, p99.9 %d µs, max %d µs\n", hist.ValueAtQuantile(50), hist.ValueAtQuantile(99), hist.ValueAtQuantile(99.9), hist.Max())
	fmt.Fprintf(stdout, "  server peak RSS %.0f MiB\n", float64(srv.peakRSS())/(1<<20))
	return nil
}

// waitServing polls the gRPC health service until it answers SERVING, for
// up to ten seconds.
func waitServing(cc *grpc.ClientConn) error {
	h := healthpb.NewHealthClient(cc)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the rate limit service did not answer SERVING: %v %v", resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
