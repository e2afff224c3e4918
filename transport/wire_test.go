package transport

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

func wireMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	data, err := wireCodec{}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	return data.Materialize()
}

func wireUnmarshal(b []byte, m proto.Message) error {
	return wireCodec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m)
}

func TestWireCodec(t *testing.T) {
	r := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.GCRA}
	small := &pb.PeerCheckRequest{From: "a", Seq: 7, Items: []*pb.RateLimitRequest{RequestToProto(r)}}
	bigKey := r
	bigKey.Key = strings.Repeat("k", limiter.MaxKeyLen)
	big := &pb.PeerCheckRequest{Seq: 8, Items: []*pb.RateLimitRequest{RequestToProto(bigKey)}}
	resp := &pb.PeerCheckResponse{Seq: 7, Owner: "b", Items: []*pb.RateLimitResponse{DecisionToProto(limiter.Decision{Allowed: true, Limit: 3})}}
	public := &pb.CheckRequest{Request: RequestToProto(r)}

	for _, tt := range []struct {
		name   string
		m      proto.Message
		padded bool
	}{
		{"small request", small, true},
		{"small response", resp, true},
		{"empty response", &pb.PeerCheckResponse{}, true},
		{"request over the threshold", big, false},
		{"public message", public, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := wireMarshal(t, tt.m)
			plain, err := proto.Marshal(tt.m)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.padded {
				if string(b) != string(plain) {
					t.Fatal("unpadded message differs from the plain encoding")
				}
			} else if n := len(b) + frameHeader; n < padTo-2 || n > padTo {
				t.Fatalf("padded to %d bytes on the wire, want about %d", n, padTo)
			}
			// The codec decodes its own encoding and the plain one alike.
			for _, enc := range [][]byte{b, plain} {
				got := tt.m.ProtoReflect().New().Interface()
				if err := wireUnmarshal(enc, got); err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(got, tt.m) {
					t.Fatalf("decoded %v, want %v", got, tt.m)
				}
			}
			// A plain decoder reads the padding as an ordinary field.
			if tt.padded {
				got := tt.m.ProtoReflect().New().Interface()
				if err := proto.Unmarshal(b, got); err != nil {
					t.Fatal(err)
				}
				var pad []byte
				switch g := got.(type) {
				case *pb.PeerCheckRequest:
					pad, g.Padding = g.Padding, nil
				case *pb.PeerCheckResponse:
					pad, g.Padding = g.Padding, nil
				}
				if len(pad) < 900 || strings.Trim(string(pad), "\x00") != "" || !proto.Equal(got, tt.m) {
					t.Fatalf("plain decoding: %d bytes of padding, message %v", len(pad), got)
				}
			}
		})
	}

	if _, err := (wireCodec{}).Marshal("not a message"); err == nil {
		t.Error("Marshal of a string")
	}
	if err := (wireCodec{}).Unmarshal(nil, new(int)); err == nil {
		t.Error("Unmarshal into an int")
	}
	// A padding field whose length runs past the end is not skipped, and
	// fails to decode.
	if err := wireUnmarshal([]byte{paddingTag, 0x05, 0, 0}, new(pb.PeerCheckRequest)); err == nil {
		t.Error("truncated padding decoded")
	}
}

// FuzzWireUnmarshal decodes arbitrary bytes with the codec: it must never
// panic, and must agree with the plain protobuf decoder on everything but
// the padding.
func FuzzWireUnmarshal(f *testing.F) {
	r := limiter.Request{Name: "n", Key: "k", Hits: 2, Limit: 10, Period: time.Second, Algorithm: limiter.TokenBucket}
	f.Add(wireMarshal(f, &pb.PeerCheckRequest{From: "a", Seq: 1, Items: []*pb.RateLimitRequest{RequestToProto(r)}}))
	f.Add(wireMarshal(f, &pb.PeerCheckResponse{Seq: 1, Owner: "b", Items: []*pb.RateLimitResponse{{Allowed: true}}}))
	// Every field of both messages, for the hand-written decoder.
	hits := int64(-3)
	f.Add(wireMarshal(f, &pb.PeerCheckRequest{From: "é", Seq: 1 << 40, Items: []*pb.RateLimitRequest{{
		Name: "n", Key: "k", Hits: &hits, Limit: 1, PeriodNanos: 2, Burst: 3, Algorithm: 4, Calendar: 5,
		TimeZone: "UTC", Reset_: true, DrainOverLimit: true, UnreachablePolicy: 2, Refund: true,
	}, {}}}))
	f.Add(wireMarshal(f, &pb.PeerCheckResponse{Seq: 9, Owner: "b", Items: []*pb.RateLimitResponse{{
		Allowed: true, Limit: 1, Remaining: -2, ResetAtUnixNano: 3, RetryAfterNanos: 4, DelayNanos: 5,
		Owner: "c", WithoutOwner: true, ErrorCode: 6, ErrorMessage: "m",
	}, {}}}))
	f.Add([]byte{paddingTag, 0x01, 0x00, 0x18, 0x05})
	f.Add([]byte{paddingTag, 0xff})
	f.Add([]byte{paddingTag})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range []proto.Message{new(pb.PeerCheckRequest), new(pb.PeerCheckResponse)} {
			got := m.ProtoReflect().New().Interface()
			errWire := wireUnmarshal(data, got)
			want := m.ProtoReflect().New().Interface()
			errPlain := proto.Unmarshal(data, want)
			if _, refused := errWire.(*countError); refused {
				// Only a message over its limits (guard.go) is refused.
				if errPlain != nil || !countsOver(want.ProtoReflect(), countLimits(want.ProtoReflect().Descriptor().FullName())) {
					t.Fatalf("%T: refused with %v, plain error %v", m, errWire, errPlain)
				}
				continue
			}
			if (errWire == nil) != (errPlain == nil) {
				t.Fatalf("%T: codec error %v, plain error %v", m, errWire, errPlain)
			}
			if errWire != nil {
				continue
			}
			for _, x := range []proto.Message{got, want} {
				switch x := x.(type) {
				case *pb.PeerCheckRequest:
					x.Padding = nil
				case *pb.PeerCheckResponse:
					x.Padding = nil
				}
			}
			if !proto.Equal(got, want) {
				t.Fatalf("%T: codec decoded %v, plain %v", m, got, want)
			}
		}
	})
}
