package server

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/storage"
)

// rlsMethod is ShouldRateLimit's full name.
const rlsMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// waitClientMem waits until the clients' memory satisfies ok, for at most
// 10 s, and returns it.
func waitClientMem(t *testing.T, srv *Server, what string, ok func(int64) bool) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := srv.stats.ClientMem.Load()
		if ok(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: client memory %d", what, m)
		}
		time.Sleep(time.Millisecond)
	}
}

func descriptors(n int) []*rlcommon.RateLimitDescriptor {
	ds := make([]*rlcommon.RateLimitDescriptor, n)
	for i := range ds {
		ds[i] = desc("k", "a")
	}
	return ds
}

// TestRLSMaxDescriptors: a call with more descriptors than
// --rls-max-descriptors is refused before it is decoded, and counts
// nothing; one with as many is served.
func TestRLSMaxDescriptors(t *testing.T) {
	f := newRLS(t, Config{RLS: envoy.Config{MaxDescriptors: 3}})
	_, err := f.client.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "test", Descriptors: descriptors(4)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "request has 4 descriptors; at most 3 are accepted (--rls-max-descriptors)") {
		t.Fatalf("4 descriptors with --rls-max-descriptors 3: %v; want InvalidArgument naming the flag", err)
	}
	resp := f.call(t, &rlspb.RateLimitRequest{Descriptors: descriptors(3)})
	checkStatus(t, "3 descriptors, nothing counted before", resp.Statuses[2], rlspb.RateLimitResponse_OK, 0, 26)

	// The default bounds too: 25000 descriptors of a MiB were evaluated
	// one by one.
	g := newRLS(t, Config{})
	_, err = g.client.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "test", Descriptors: descriptors(envoy.DefaultMaxDescriptors + 1)})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("%d descriptors by default: %v; want InvalidArgument", envoy.DefaultMaxDescriptors+1, err)
	}
}

// TestRLSCallMemoryCountsAgainstClients: a call whose request would take
// more memory decoded than --maxmemory-clients leaves is refused with
// RESOURCE_EXHAUSTED before it is decoded; what calls take is given back
// when they end.
func TestRLSCallMemoryCountsAgainstClients(t *testing.T) {
	f := newRLS(t, Config{RESP: respserver.Tuning{MaxMemoryClients: respserver.LimitOf[int64](2 << 20)}})
	// 60 KiB on the wire: 30000 empty entries, 4 MB decoded, which the
	// wire bytes do not show.
	var ds []*rlcommon.RateLimitDescriptor
	for range 60 {
		d := &rlcommon.RateLimitDescriptor{}
		for range 500 {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{})
		}
		ds = append(ds, d)
	}
	req := &rlspb.RateLimitRequest{Domain: "test", Descriptors: ds}
	if n := proto.Size(req); n > envoy.DefaultMaxMessage {
		t.Fatalf("request of %d bytes, over --rls-max-message", n)
	}
	_, err := f.client.ShouldRateLimit(context.Background(), req)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "client memory limit reached") {
		t.Fatalf("a request that decodes to 4 MB under --maxmemory-clients 2MiB: %v; want ResourceExhausted", err)
	}
	checkStatus(t, "a small call", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 2, 26)
	waitClientMem(t, f.srv, "after the calls", func(m int64) bool { return m == 0 })
	if n := f.srv.rls.Info().Refused; n != 1 {
		t.Fatalf("refused calls counted: %d, want 1", n)
	}
}

// TestRLSStreamsCountAgainstClients: open streams, which hold their header
// and may hold a whole request, count against --maxmemory-clients from
// their header on: past it a new one is refused with RESOURCE_EXHAUSTED,
// and what they held is given back when they end.
func TestRLSStreamsCountAgainstClients(t *testing.T) {
	per := envoy.StreamMemory(0, envoy.DefaultMaxMessage)
	f := newRLS(t, Config{RESP: respserver.Tuning{MaxMemoryClients: respserver.LimitOf[int64](4*per + per/2)}})
	cc := dialRLS(t, f.addr, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Streams that send their header and no request: each stays open.
	var streams []grpc.ClientStream
	for range 4 {
		st, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, rlsMethod)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	waitClientMem(t, f.srv, "4 open streams", func(m int64) bool { return m >= 4*per })
	// The fifth no longer fits; gRPC takes the streams of a connection in
	// order. Bounded: before, it waited for its request.
	ctx5, cancel5 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel5()
	_, err := rlspb.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx5, &rlspb.RateLimitRequest{Domain: "test", Descriptors: descriptors(1)})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--maxmemory-clients") {
		t.Fatalf("a call past --maxmemory-clients: %v; want ResourceExhausted", err)
	}
	cancel()
	for _, st := range streams {
		_ = st.RecvMsg(new(rlspb.RateLimitResponse)) // ends with the context
	}
	waitClientMem(t, f.srv, "after the streams ended", func(m int64) bool { return m == 0 })
	checkStatus(t, "a call after", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 2, 26)
}

// TestRLSMaxHeaderBytes: a call whose header list is longer than
// --rls-max-header-bytes is not served (gRPC's default allowed 16 MiB).
func TestRLSMaxHeaderBytes(t *testing.T) {
	f := newRLS(t, Config{})
	req := &rlspb.RateLimitRequest{Domain: "test", Descriptors: descriptors(1)}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-big", strings.Repeat("x", envoy.DefaultMaxHeaderBytes))
	if _, err := f.client.ShouldRateLimit(ctx, req); err == nil {
		t.Fatal("a call with a 16 KiB header value was served")
	}
	ctx = metadata.AppendToOutgoingContext(context.Background(), "x-small", strings.Repeat("x", envoy.DefaultMaxHeaderBytes/2))
	resp, err := f.client.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("a call with an 8 KiB header value: %v", err)
	}
	checkStatus(t, "a call with an 8 KiB header value", resp.Statuses[0], rlspb.RateLimitResponse_OK, 2, 26)
}

// TestRLSCancelledCallStops: a call whose client goes away while it runs
// stops before its next descriptor, and counts none of those left.
func TestRLSCancelledCallStops(t *testing.T) {
	// The call reads the clock once, before evaluating: there its client
	// cancels it, and the clock waits until the server has seen that (the
	// stream's memory is given back), for at most 10 s.
	clock := newTestClock(rlsT0)
	var armed atomic.Bool
	var srv atomic.Pointer[Server]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := &rlsFixture{clock: clock}
	f.srv = startServer(t, Config{RLS: envoy.Config{Dir: rlsConfigDir(t, rlsYAML)}, Clock: func() time.Time {
		if armed.CompareAndSwap(true, false) {
			cancel()
			deadline := time.Now().Add(10 * time.Second)
			for srv.Load().stats.ClientMem.Load() >= envoy.StreamCost && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
		}
		return clock.now()
	}})
	srv.Store(f.srv)
	f.addr = startRLS(t, f.srv)
	f.client = rlspb.NewRateLimitServiceClient(dialRLS(t, f.addr, nil))
	armed.Store(true)
	_, err := f.client.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "test", Descriptors: descriptors(3)})
	if status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v", err)
	}
	// Its reply never reaches the client: the counters say whether the
	// server went on.
	checkStatus(t, "nothing counted", f.one(t, desc("k", "a")), rlspb.RateLimitResponse_OK, 2, 26)
}

// TestRLSCallLargerThanClientMemoryIsRefusedAtStart: with a
// --rls-max-message under which no call fits in --maxmemory-clients, New
// fails naming both, rather than serve a listener that refuses every call.
func TestRLSCallLargerThanClientMemoryIsRefusedAtStart(t *testing.T) {
	store, err := storage.Open(t.TempDir(), StoreOptions(storage.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	_, err = New(Config{Store: store, RLS: envoy.Config{Dir: rlsConfigDir(t, rlsYAML), MaxMessage: 64 << 20}})
	if err == nil || !strings.Contains(err.Error(), "--rls-max-message 67108864") || !strings.Contains(err.Error(), "--maxmemory-clients 67108864") {
		t.Fatalf("New with --rls-max-message 64MiB and --maxmemory-clients 64MiB: %v", err)
	}
}
