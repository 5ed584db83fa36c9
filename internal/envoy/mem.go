package envoy

import (
	"context"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/encoding/protowire"
)

// What the rate limit service's calls hold is taken from --maxmemory-clients
// (Options.MaxMemoryClients), the budget RESP clients' buffers count
// against, in two steps:
//
//   - when a stream opens (admitStream), before it is served: its
//     header, what the transport and the goroutine serving it hold, and
//     the most request bytes it can make the transport buffer, for as long
//     as it is open;
//   - when its request has arrived (serveShouldRateLimit), before it is
//     decoded: what decoding and evaluating it allocate, counted from its
//     wire bytes, which can be sixty times smaller (an empty descriptor
//     entry is 2 bytes on the wire and a 72-byte struct in memory).
//
// Either refusal is RESOURCE_EXHAUSTED: the call is not served and Envoy's
// failure mode decides, while RESP clients and the other calls go on.

// Costs of an RLS stream and call that their bytes do not show.
const (
	// StreamCost is what an open stream holds besides its header and
	// its request: the transport's stream, its context, and the goroutine
	// serving it. Measured: 10000 streams that sent a header and no body
	// took 116 MiB, about 12 KiB each.
	StreamCost = 12 << 10
	// rlsWindow is each stream's HTTP/2 flow-control window, fixed: it
	// bounds what a stream can make the transport buffer before its
	// handler asks for the request (gRPC's dynamic window would let it
	// grow to 16 MiB).
	rlsWindow = 65535
	// rlsObjectCost is what decoding one message of a request allocates
	// besides its strings: a descriptor, an entry, an override or a
	// hits_addend (72 to 88 bytes, rounded up to the allocator's size
	// class), and its share of the slices that grow to hold it. Measured:
	// 125 to 141 bytes.
	rlsObjectCost = 160
	// rlsDescriptorWork is what evaluating and answering one descriptor
	// allocates: its limit and outcome, and its status in the reply
	// (three messages) with its bytes on the wire.
	rlsDescriptorWork = 512
)

// StreamMemory is what a stream with a header of hdr bytes takes from
// --maxmemory-clients (as HTTP/2 counts them, 32 more per field): StreamCost,
// the header, and the request bytes it can make the transport hold, the
// window or a whole request, whichever is larger.
func StreamMemory(hdr, maxMsg int) int64 {
	return int64(StreamCost + hdr + max(maxMsg+5, rlsWindow))
}

// admitStream is the listener's tap: it takes a new stream's memory
// (StreamMemory) from --maxmemory-clients until the stream ends, or
// refuses the stream. gRPC calls it for every stream, whatever its method,
// before serving it.
func (s *Server) admitStream(ctx context.Context, info *tap.Info) (context.Context, error) {
	hdr := 0
	for k, vs := range info.Header {
		for _, v := range vs {
			hdr += len(k) + len(v) + 32
		}
	}
	n := StreamMemory(hdr, s.cfg.MaxMessage)
	if !s.opt.Host.ReserveClients(n) {
		return nil, s.refuse(n)
	}
	// The stream's context ends with the stream, however it ends.
	context.AfterFunc(ctx, func() { s.opt.Host.ReleaseClients(n) })
	return ctx, nil
}

// refuse counts a call refused at --maxmemory-clients and returns its
// error; n is what it would have held.
func (s *Server) refuse(n int64) error {
	s.refused.Add(1)
	s.log.Debug("rls call refused: client memory limit reached", "bytes", n, "client_memory", s.opt.Host.ClientMemory(), "limit", s.opt.MaxMemoryClients)
	return status.Errorf(codes.ResourceExhausted, "client memory limit reached: this call needs %d bytes and the clients and calls in flight hold %d of --maxmemory-clients %d; retry later", n, s.opt.Host.ClientMemory(), s.opt.MaxMemoryClients)
}

// rlsCodec is gRPC's proto codec, except that it hands a ShouldRateLimit
// request over as its wire bytes (rlsWire), so that the call can count its
// descriptors and take its memory before decoding it.
type rlsCodec struct{ encoding.CodecV2 }

// rlsWire is a request's wire bytes.
type rlsWire struct{ b []byte }

// Unmarshal implements encoding.CodecV2.
func (c rlsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if w, ok := v.(*rlsWire); ok {
		w.b = data.Materialize()
		return nil
	}
	return c.CodecV2.Unmarshal(data, v)
}

// rlsServiceDesc is envoy.service.ratelimit.v3.RateLimitService with its
// method served from the request's wire bytes (rlsCodec). Its handler is
// the *Server.
var rlsServiceDesc = grpc.ServiceDesc{
	ServiceName: rlspb.RateLimitService_ServiceDesc.ServiceName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "ShouldRateLimit",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			return srv.(*Server).serveShouldRateLimit(ctx, dec)
		},
	}},
	Metadata: rlspb.RateLimitService_ServiceDesc.Metadata,
}

// rlsShape is what a RateLimitRequest's wire bytes say of it before it is
// decoded.
type rlsShape struct {
	descriptors int
	// objects is the messages decoding makes: descriptors, entries,
	// overrides and hits_addend wrappers.
	objects int
}

// memory is what decoding and evaluating the request allocate, besides
// its wire bytes: six times those, for its strings and unknown fields
// (protobuf keeps those appended to one slice, whose growth allocates five
// times their size in all), rlsObjectCost per message and
// rlsDescriptorWork per descriptor.
func (sh rlsShape) memory(wire int) int64 {
	return int64(6*wire + rlsObjectCost*sh.objects + rlsDescriptorWork*sh.descriptors)
}

// scanRLSRequest reads a RateLimitRequest's shape from its wire bytes
// without decoding them; it fails on bytes that are not a message.
func scanRLSRequest(b []byte) (rlsShape, error) {
	var sh rlsShape
	err := scanFields(b, func(num protowire.Number, v []byte) error {
		if num != 2 { // descriptors
			return nil
		}
		sh.descriptors++
		sh.objects++
		return scanFields(v, func(num protowire.Number, _ []byte) error {
			if num >= 1 && num <= 3 { // entries, limit, hits_addend
				sh.objects++
			}
			return nil
		})
	})
	return sh, err
}

// scanFields calls f with each length-delimited field of the message b
// and its bytes, and skips the others.
func scanFields(b []byte, f func(num protowire.Number, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if err := f(num, v); err != nil {
				return err
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}
