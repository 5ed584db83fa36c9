package envoy

import (
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// desc is a descriptor of the entries kv, keys and values in turn.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// TestRequestMemoryCoversDecoding: what a call takes for its request
// (the wire bytes, in the stream's share, and rlsShape.memory) is at
// least what decoding it allocates, for requests of every shape,
// including those that decode to sixty times their size.
func TestRequestMemoryCoversDecoding(t *testing.T) {
	many := func(n int, d func(i int) *rlcommon.RateLimitDescriptor) *rlspb.RateLimitRequest {
		r := &rlspb.RateLimitRequest{Domain: "test"}
		for i := range n {
			r.Descriptors = append(r.Descriptors, d(i))
		}
		return r
	}
	emptyEntries := &rlcommon.RateLimitDescriptor{}
	for range 30000 {
		emptyEntries.Entries = append(emptyEntries.Entries, &rlcommon.RateLimitDescriptor_Entry{})
	}
	cases := map[string]*rlspb.RateLimitRequest{
		"one descriptor": many(1, func(int) *rlcommon.RateLimitDescriptor { return desc("k", "a") }),
		"64 descriptors": many(64, func(int) *rlcommon.RateLimitDescriptor { return desc("k", strings.Repeat("v", 32), "user", "u") }),
		"25000 descriptors": many(25000, func(int) *rlcommon.RateLimitDescriptor {
			return desc("k", strings.Repeat("v", 32))
		}),
		"empty descriptors": many(30000, func(int) *rlcommon.RateLimitDescriptor { return &rlcommon.RateLimitDescriptor{} }),
		"empty entries":     {Domain: "test", Descriptors: []*rlcommon.RateLimitDescriptor{emptyEntries}},
		"overrides and hits": many(10000, func(int) *rlcommon.RateLimitDescriptor {
			return &rlcommon.RateLimitDescriptor{Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 1}, HitsAddend: wrapperspb.UInt64(1)}
		}),
		"long values, unknown fields": many(4, func(int) *rlcommon.RateLimitDescriptor { return desc("k", strings.Repeat("v", 16000)) }),
	}
	for name, req := range cases {
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		// Unknown fields are kept, appended as they come.
		if name == "long values, unknown fields" {
			for i := range 10000 {
				b = protowire.AppendTag(b, protowire.Number(100+i%50), protowire.BytesType)
				b = protowire.AppendBytes(b, []byte("unknown"))
			}
		}
		sh, err := scanRLSRequest(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if sh.descriptors != len(req.Descriptors) {
			t.Fatalf("%s: %d descriptors scanned, want %d", name, sh.descriptors, len(req.Descriptors))
		}
		taken := int64(len(b)) + sh.memory(len(b))
		// What decoding allocates is the same at every try; what the
		// runtime or another goroutine allocates meanwhile only adds to
		// it: the least of three tries is the decoding's.
		alloc := int64(math.MaxInt64)
		for range 3 {
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			var got rlspb.RateLimitRequest
			if err := proto.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&m1)
			alloc = min(alloc, int64(m1.TotalAlloc-m0.TotalAlloc)+int64(len(b)))
		}
		if alloc > taken {
			t.Errorf("%s: %d wire bytes, %d taken, %d allocated with its copy", name, len(b), taken, alloc)
		}
	}
	if _, err := scanRLSRequest([]byte{0x12, 0x05, 0x0a}); err == nil {
		t.Fatal("a truncated request scanned")
	}
}

// TestNewRefusesCallsOverClientMemory: a service whose every call may
// hold more than --maxmemory-clients is refused at start, with the text
// the server gave it before the check moved here; at the bound, or with
// no bound (0), it starts.
func TestNewRefusesCallsOverClientMemory(t *testing.T) {
	cfg := Config{Dir: t.TempDir(), MaxMessage: 1 << 20}
	n := StreamMemory(DefaultMaxHeaderBytes, cfg.MaxMessage)
	_, err := New(cfg, Options{MaxMemoryClients: n - 1})
	want := "server: a rate limit service call may hold " + strconv.FormatInt(n, 10) + " bytes with --rls-max-message 1048576 and --rls-max-header-bytes 16384, more than --maxmemory-clients " + strconv.FormatInt(n-1, 10) + ": every call would be refused; raise --maxmemory-clients or lower the others"
	if err == nil || err.Error() != want {
		t.Fatalf("New at %d bytes of --maxmemory-clients: %v, want %q", n-1, err, want)
	}
	for _, limit := range []int64{n, 0} {
		if _, err := New(cfg, Options{MaxMemoryClients: limit}); err != nil && strings.Contains(err.Error(), "maxmemory-clients") {
			t.Errorf("New at %d bytes of --maxmemory-clients: %v", limit, err)
		}
	}
}
