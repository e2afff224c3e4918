package transport

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// randomPeerMessages returns n PeerCheckRequests and n PeerCheckResponses
// with every field set or not, to values small, large, negative or out of
// the enums' range.
func randomPeerMessages(rng *rand.Rand, n int) []proto.Message {
	ints := []int64{0, 1, -1, 127, 128, 1 << 40, math.MaxInt64, math.MinInt64}
	i64 := func() int64 {
		if rng.IntN(2) == 0 {
			return ints[rng.IntN(len(ints))]
		}
		return rng.Int64() >> rng.IntN(64)
	}
	i32 := func() int32 { return int32(ints[rng.IntN(len(ints))]) }
	strs := []string{"", "a", "bench", "client:1234", "héllo, 世界", strings.Repeat("k", 200), strings.Repeat("z", 3000)}
	str := func() string { return strs[rng.IntN(len(strs))] }
	var out []proto.Message
	for range n {
		req := &pb.PeerCheckRequest{From: str(), Seq: uint64(i64())}
		resp := &pb.PeerCheckResponse{Owner: str(), Seq: uint64(i64())}
		for range rng.IntN(5) {
			it := &pb.RateLimitRequest{
				Name: str(), Key: str(), Limit: i64(), PeriodNanos: i64(), Burst: i64(),
				Algorithm: pb.Algorithm(i32()), Calendar: pb.Calendar(i32()), TimeZone: str(),
				Reset_: rng.IntN(2) == 0, DrainOverLimit: rng.IntN(2) == 0,
				UnreachablePolicy: pb.UnreachablePolicy(i32()), Refund: rng.IntN(2) == 0,
			}
			if rng.IntN(2) == 0 {
				h := i64()
				it.Hits = &h
			}
			req.Items = append(req.Items, it)
			resp.Items = append(resp.Items, &pb.RateLimitResponse{
				Allowed: rng.IntN(2) == 0, Limit: i64(), Remaining: i64(), ResetAtUnixNano: i64(),
				RetryAfterNanos: i64(), DelayNanos: i64(), Owner: str(), WithoutOwner: rng.IntN(2) == 0,
				ErrorCode: pb.ErrorCode(i32()), ErrorMessage: str(),
			})
		}
		out = append(out, req, resp)
	}
	return out
}

// handSize and handAppend encode m by hand, reporting false when m is not
// for the hand-written encoder.
func handSize(m proto.Message) (int, bool) {
	switch m := m.(type) {
	case *pb.PeerCheckRequest:
		return sizePeerRequest(m)
	case *pb.PeerCheckResponse:
		return sizePeerResponse(m)
	}
	return 0, false
}

func handDecode(b []byte, m proto.Message) bool {
	switch m := m.(type) {
	case *pb.PeerCheckRequest:
		ok, err := decodePeerRequest(b, m, new(requestSpace))
		return ok && err == nil
	case *pb.PeerCheckResponse:
		ok, err := decodePeerResponse(b, m, new(responseSpace))
		return ok && err == nil
	}
	return false
}

// The hand-written encoder writes what proto.Marshal writes, byte for
// byte, and the decoder reads it back as proto.Unmarshal does.
func TestPeerWireMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, m := range randomPeerMessages(rng, 500) {
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		size, ok := handSize(m)
		if !ok || size != len(want) {
			t.Fatalf("size %d (%v), proto.Size %d, of %v", size, ok, len(want), m)
		}
		got, _ := appendMessage(nil, m, true)
		if !bytes.Equal(got, want) {
			t.Fatalf("encoded %x\nproto.Marshal %x\nof %v", got, want, m)
		}
		dec := m.ProtoReflect().New().Interface()
		if !handDecode(want, dec) {
			t.Fatalf("did not decode %v", m)
		}
		if !proto.Equal(dec, m) {
			t.Fatalf("decoded %v, want %v", dec, m)
		}
	}
}

// Messages that the hand-written codec leaves to the protobuf runtime,
// and encodings it decodes as the runtime does although the runtime would
// not write them.
func TestPeerWireEdges(t *testing.T) {
	item := &pb.RateLimitRequest{Name: "n", Key: "k", Limit: 5}
	withUnknown := proto.Clone(item).(*pb.RateLimitRequest)
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7))
	for _, tt := range []struct {
		name string
		m    proto.Message
	}{
		{"padding field set", &pb.PeerCheckRequest{Padding: []byte{1}}},
		{"nil item", &pb.PeerCheckRequest{Items: []*pb.RateLimitRequest{item, nil}}},
		{"unknown field in an item", &pb.PeerCheckRequest{Items: []*pb.RateLimitRequest{withUnknown}}},
		{"invalid UTF-8 key", &pb.PeerCheckRequest{Items: []*pb.RateLimitRequest{{Key: "\xc3\x28"}}}},
		{"invalid UTF-8 owner", &pb.PeerCheckResponse{Items: []*pb.RateLimitResponse{{Owner: "\xff"}}}},
		{"response padding set", &pb.PeerCheckResponse{Padding: []byte{1}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, ok := handSize(tt.m); ok {
				t.Fatal("encoded by hand")
			}
			// The codec still encodes it as the runtime does, or fails as
			// it does.
			data, err := wireCodec{}.Marshal(tt.m)
			_, errPlain := proto.Marshal(tt.m)
			if (err == nil) != (errPlain == nil) {
				t.Fatalf("codec error %v, proto.Marshal error %v", err, errPlain)
			}
			if err == nil {
				got := tt.m.ProtoReflect().New().Interface()
				if err := wireUnmarshal(data.Materialize(), got); err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(got, tt.m) {
					t.Fatalf("round trip gave %v", got)
				}
			}
		})
	}

	seq := func(n uint64) []byte { return protowire.AppendVarint([]byte{peerReqSeq<<3 | 0}, n) }
	enc := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tt := range []struct {
		name   string
		b      []byte
		byHand bool
	}{
		{"fields out of order and repeated", append(append(seq(5), enc(&pb.PeerCheckRequest{From: "a", Items: []*pb.RateLimitRequest{item}})...), seq(6)...), true},
		{"non-minimal varint", []byte{peerReqSeq << 3, 0x81, 0x80, 0x00}, true},
		{"hits of 0", enc(&pb.PeerCheckRequest{Items: []*pb.RateLimitRequest{{Hits: new(int64)}}}), true},
		{"empty item", enc(&pb.PeerCheckRequest{Items: []*pb.RateLimitRequest{{}, item}}), true},
		{"a large message", enc(&pb.PeerCheckRequest{From: strings.Repeat("f", smallMessage), Items: []*pb.RateLimitRequest{item}}), true},
		{"unknown field", append(enc(item), protowire.AppendTag(nil, 99, protowire.VarintType)...), false},
		{"wrong wire type", []byte{peerReqSeq<<3 | 2, 0}, false},
		{"padding not first", append(seq(1), paddingTag, 0), false},
		{"truncated", enc(&pb.PeerCheckRequest{From: "abc"})[:3], false},
		{"varint overflow", append([]byte{peerReqSeq << 3}, bytes.Repeat([]byte{0xff}, 10)...), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := new(pb.PeerCheckRequest)
			if byHand, _ := decodePeerRequest(tt.b, got, new(requestSpace)); byHand != tt.byHand {
				t.Fatalf("decoded by hand: %v, want %v", byHand, tt.byHand)
			}
			got = new(pb.PeerCheckRequest)
			errWire := wireUnmarshal(tt.b, got)
			want := new(pb.PeerCheckRequest)
			errPlain := proto.Unmarshal(tt.b, want)
			if (errWire == nil) != (errPlain == nil) || !proto.Equal(got, want) {
				t.Fatalf("codec %v (%v), proto.Unmarshal %v (%v)", got, errWire, want, errPlain)
			}
		})
	}
}

// The strings of a small message share one copy of it; those of a large
// one are copied one by one.
func TestPeerWireStrings(t *testing.T) {
	m := &pb.PeerCheckRequest{From: "node", Items: []*pb.RateLimitRequest{{Name: "n", Key: "k1"}, {Name: "n", Key: "k2"}}}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	got := new(pb.PeerCheckRequest)
	allocs := testing.AllocsPerRun(100, func() {
		if ok, _ := decodePeerRequest(b, got, new(requestSpace)); !ok {
			t.Fatal("not decoded by hand")
		}
	})
	// The items, the pointers to them, and the strings.
	if allocs > 3 {
		t.Errorf("%v allocations to decode a message of 2 items", allocs)
	}
	b[len(b)-1] = 'x' // the received buffer is reused
	if got.Items[1].Key != "k2" {
		t.Fatalf("a decoded string changed with the buffer: %q", got.Items[1].Key)
	}
}

func BenchmarkPeerWire(b *testing.B) {
	req := &pb.PeerCheckRequest{Seq: 12345}
	resp := &pb.PeerCheckResponse{Seq: 12345, Owner: "bench-1"}
	for i := range 5 {
		r := RequestToProto(validRequests(b)[0])
		r.Key = "client:" + strings.Repeat("1", i+1)
		req.Items = append(req.Items, r)
		resp.Items = append(resp.Items, &pb.RateLimitResponse{Allowed: true, Limit: 1_000_000_000, Remaining: 999_999_000, ResetAtUnixNano: 1_790_000_000_000_000_000})
	}
	for _, m := range []proto.Message{req, resp} {
		name := string(m.ProtoReflect().Descriptor().Name())
		b.Run(name+"/marshal", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				data, err := wireCodec{}.Marshal(m)
				if err != nil {
					b.Fatal(err)
				}
				data.Free()
			}
		})
		enc := wireMarshal(b, m)
		b.Run(name+"/unmarshal", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := wireUnmarshal(enc, m.ProtoReflect().New().Interface()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// As a CheckStream handler receives its batches: into the same
	// buffer, message after message.
	enc := skipPadding(wireMarshal(b, req))
	var buf peerRequestBuffer
	b.Run("PeerCheckRequest/unmarshal-buffer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if ok, err := decodePeerRequest(enc, &buf.PeerCheckRequest, &buf.space); !ok || err != nil {
				b.Fatal("not decoded by hand", err)
			}
		}
	})
}

// A small request's strings are copied, before the received buffer is
// reused, into one allocation of their bytes alone: a name that repeats
// the one before it, in the message or in the last message of the same
// buffer, shares that one's bytes.
func TestPeerWireRequestStrings(t *testing.T) {
	var buf peerRequestBuffer
	decode := func(m *pb.PeerCheckRequest) {
		t.Helper()
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := decodePeerRequest(b, &buf.PeerCheckRequest, &buf.space); !ok || err != nil {
			t.Fatalf("not decoded by hand: %v", err)
		}
		clear(b) // the received buffer is reused
		if !proto.Equal(&buf.PeerCheckRequest, m) {
			t.Fatalf("decoded %v, want %v", &buf.PeerCheckRequest, m)
		}
	}
	tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	decode(&pb.PeerCheckRequest{From: "node-1", Items: []*pb.RateLimitRequest{
		{Name: "api", Key: "k1", TimeZone: "Europe/Paris", Traceparent: tp},
		{Name: "api", Key: "k22", TimeZone: "Europe/Paris"},
		{Name: "web", Key: "k333"},
	}})
	items := buf.Items
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	if !same(items[0].Name, items[1].Name) {
		t.Error("a repeated name is copied again")
	}
	// The copies lie end to end, in one allocation of their length.
	addr := func(s string) uintptr { return uintptr(unsafe.Pointer(unsafe.StringData(s))) }
	lo, hi := addr(buf.From), addr(buf.From)+uintptr(len(buf.From))
	for _, s := range []string{items[0].Name, items[0].Key, items[0].TimeZone, items[0].Traceparent, items[1].Key, items[1].TimeZone, items[2].Name, items[2].Key} {
		lo, hi = min(lo, addr(s)), max(hi, addr(s)+uintptr(len(s)))
	}
	want := len("node-1apik1Europe/Paris") + len(tp) + len("k22Europe/Pariswebk333")
	if got := int(hi - lo); got != want {
		t.Errorf("the strings span %d bytes, want %d", got, want)
	}
	web := items[2].Name
	decode(&pb.PeerCheckRequest{Items: []*pb.RateLimitRequest{{Name: "web", Key: "k4"}, {Name: "api", Key: "k5"}}})
	if !same(buf.Items[0].Name, web) {
		t.Error("the name of the last message is copied again")
	}
	if buf.Items[1].Name != "api" || web != "web" {
		t.Fatalf("names %q and %q", buf.Items[1].Name, web)
	}
}

// A buffer decodes message after message as proto.Unmarshal does, reusing
// its memory: no allocation but for a request's strings.
func TestPeerWireBuffers(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var reqBuf peerRequestBuffer
	var respBuf PeerResponseBuffer
	for _, m := range randomPeerMessages(rng, 200) {
		b := wireMarshal(t, m)
		var got proto.Message
		switch m.(type) {
		case *pb.PeerCheckRequest:
			got = &reqBuf.PeerCheckRequest
			if err := wireUnmarshal(b, &reqBuf); err != nil {
				t.Fatal(err)
			}
		case *pb.PeerCheckResponse:
			got = &respBuf.PeerCheckResponse
			if err := wireUnmarshal(b, &respBuf); err != nil {
				t.Fatal(err)
			}
		}
		if !proto.Equal(got, m) {
			t.Fatalf("decoded %v, want %v", got, m)
		}
	}

	req := wireMarshal(t, &pb.PeerCheckRequest{Seq: 1, Items: []*pb.RateLimitRequest{{Name: "n", Key: "k1"}, {Name: "n", Key: "k2"}}})
	resp := wireMarshal(t, &pb.PeerCheckResponse{Seq: 1, Owner: "b", Items: []*pb.RateLimitResponse{{Allowed: true}, {Limit: 3}}})
	// (Through the decoders: wrapping a slice in a BufferSlice allocates.)
	if allocs := testing.AllocsPerRun(100, func() {
		if ok, _ := decodePeerRequest(skipPadding(req), &reqBuf.PeerCheckRequest, &reqBuf.space); !ok {
			t.Fatal("request not decoded by hand")
		}
	}); allocs > 1 {
		t.Errorf("%v allocations per request, want 1", allocs)
	}
	if allocs := testing.AllocsPerRun(100, func() {
		if ok, _ := decodePeerResponse(skipPadding(resp), &respBuf.PeerCheckResponse, &respBuf.space); !ok {
			t.Fatal("response not decoded by hand")
		}
	}); allocs > 0 {
		t.Errorf("%v allocations per response, want none", allocs)
	}

	// The plain protobuf codec decodes into a buffer as into its message.
	plain := encoding.GetCodecV2("proto")
	var fresh PeerResponseBuffer
	if err := plain.Unmarshal(mem.BufferSlice{mem.SliceBuffer(resp)}, &fresh); err != nil {
		t.Fatal(err)
	}
	if fresh.Seq != 1 || fresh.Owner != "b" || len(fresh.Items) != 2 || !fresh.Items[0].Allowed {
		t.Fatalf("plain codec decoded %v", &fresh.PeerCheckResponse)
	}
}
