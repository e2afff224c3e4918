package envoyrls

import (
	"context"
	"net"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The field-by-field decoding of a request reads what the protobuf
// runtime reads (fields it does not know aside), and keeps the bytes of
// strings that are not UTF-8, which the runtime refuses; a request cut
// short is an error either way.
func TestWireRequest(t *testing.T) {
	full := &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 7, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}, {Key: "", Value: "é"}}},
		{Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_HOUR}, HitsAddend: wrapperspb.UInt64(0)},
		{},
	}}
	b, err := proto.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	var lenient wireRequest
	if err := decodeLenient(b, &lenient); err != nil || !proto.Equal(&lenient.RateLimitRequest, full) {
		t.Errorf("field by field: %v, %v; want %v", &lenient.RateLimitRequest, err, full)
	}
	// A value that is not UTF-8, and a field no version defines.
	raw := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "d\xff")
	entry := protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "a\xfeb")
	desc := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), entry)
	raw = protowire.AppendBytes(protowire.AppendTag(raw, 2, protowire.BytesType), desc)
	raw = protowire.AppendVarint(protowire.AppendTag(raw, 99, protowire.VarintType), 1)
	if err := proto.Unmarshal(raw, new(rlsv3.RateLimitRequest)); err == nil {
		t.Fatal("the protobuf runtime took a string that is not UTF-8")
	}
	var w wireRequest
	if err := w.UnmarshalWire(raw); err != nil || w.Domain != "d\xff" || len(w.Descriptors) != 1 || w.Descriptors[0].Entries[0].Value != "a\xfeb" {
		t.Errorf("not UTF-8: %v, %q", err, &w.RateLimitRequest)
	}
	for n := range raw {
		if n == 0 {
			continue
		}
		var cut wireRequest
		if err := cut.UnmarshalWire(raw[:n]); err == nil && proto.Unmarshal(raw[:n], new(rlsv3.RateLimitRequest)) != nil && !strings.Contains(string(raw[:n]), "\xff") {
			t.Errorf("cut at %d: decoded", n)
		}
	}
}

// decodeLenient decodes b field by field, as UnmarshalWire does when the
// runtime refuses b.
func decodeLenient(b []byte, w *wireRequest) error { return decodeRequest(b, &w.RateLimitRequest) }

// Registered on a server with gRPC's own codec, the service answers, and
// interceptors see the RateLimitRequest.
func TestRegisterOnAPlainServer(t *testing.T) {
	e := newEnv(t, []string{hitsConfig})
	var seen []any
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		seen = append(seen, req)
		return h(ctx, req)
	}))
	e.svc.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "hits", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user=a")}})
	if err != nil || summary(resp) != "OK; OK 9/10/minute t=40s" {
		t.Fatalf("%v, %v", resp, err)
	}
	if _, ok := seen[0].(*rlsv3.RateLimitRequest); len(seen) != 1 || !ok {
		t.Errorf("the interceptor saw %T", seen[0])
	}
}
