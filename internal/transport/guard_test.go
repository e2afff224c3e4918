package transport

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Every repeated field of sluice.proto has a limit, with its number, its
// wire type and the limits of its entries; a singular message field holds
// no message that has limits (the guard does not look into it).
func TestCountLimitsCoverEveryRepeatedField(t *testing.T) {
	msgs := pb.File_sluice_v1_sluice_proto.Messages()
	for i := range msgs.Len() {
		md := msgs.Get(i)
		limits := countLimits(md.FullName())
		if len(limits) > maxLimitsPerMessage {
			t.Errorf("%s: %d limits, more than maxLimitsPerMessage", md.Name(), len(limits))
		}
		repeated := 0
		fields := md.Fields()
		for j := range fields.Len() {
			fd := fields.Get(j)
			if !fd.IsList() {
				if fd.Message() != nil && countLimits(fd.Message().FullName()) != nil {
					t.Errorf("%s.%s: a singular field of a message with limits", md.Name(), fd.Name())
				}
				continue
			}
			repeated++
			name := fmt.Sprintf("%s.%s", md.Name(), fd.Name())
			k := limitOf(limits, fd.Number())
			if k < 0 {
				t.Errorf("%s has no limit", name)
				continue
			}
			l := limits[k]
			want := protowire.BytesType
			switch fd.Kind() {
			case protoreflect.MessageKind, protoreflect.StringKind, protoreflect.BytesKind:
			case protoreflect.Int64Kind, protoreflect.Int32Kind, protoreflect.Uint64Kind, protoreflect.Uint32Kind,
				protoreflect.Sint64Kind, protoreflect.Sint32Kind, protoreflect.BoolKind, protoreflect.EnumKind:
				want = protowire.VarintType
			default:
				t.Errorf("%s: the guard does not count fields of kind %v", name, fd.Kind())
			}
			var each []countLimit
			if fd.Message() != nil {
				each = countLimits(fd.Message().FullName())
			}
			if l.name != name || l.typ != want || l.max < 1 || len(l.each) != len(each) || (len(each) > 0 && &l.each[0] != &each[0]) {
				t.Errorf("%s: limit %+v, want name %s, wire type %v and the limits of its entries", name, l, name, want)
			}
		}
		if len(limits) != repeated {
			t.Errorf("%s: %d limits for %d repeated fields", md.Name(), len(limits), repeated)
		}
	}
}

// entries returns n fields num, each an entry of wire type typ: entry as a
// length-delimited field, or a varint 0.
func entries(num protowire.Number, typ protowire.Type, entry []byte, n int) []byte {
	var one []byte
	one = protowire.AppendTag(one, num, typ)
	if typ == protowire.BytesType {
		one = protowire.AppendBytes(one, entry)
	} else {
		one = protowire.AppendVarint(one, 0)
	}
	b := make([]byte, 0, n*len(one))
	for range n {
		b = append(b, one...)
	}
	return b
}

// field returns one length-delimited field num holding v.
func field(num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
}

// overLimits are messages of a million entries in a repeated field, or
// over a limit otherwise, and what the guard says of each.
func overLimits() []struct {
	name   string
	target func() proto.Message
	b      []byte
	refuse string
} {
	// A million entries where the brief asks for them, fewer where the
	// same code runs again (the scan is slow under the race detector).
	const million, many = 1_000_000, 100_000
	emptyState := field(3, nil)
	fullLog := entries(6, protowire.BytesType, nil, limiter.MaxSnapshotLog)
	var manyLogs []byte
	for range MaxTransferLogEntries/limiter.MaxSnapshotLog + 1 {
		manyLogs = append(manyLogs, field(3, fullLog)...)
	}
	return []struct {
		name   string
		target func() proto.Message
		b      []byte
		refuse string
	}{
		{"peer request", func() proto.Message { return new(pb.PeerCheckRequest) },
			entries(peerReqItems, protowire.BytesType, nil, million), "PeerCheckRequest.items has 1000000 entries"},
		{"peer request buffer", func() proto.Message { return new(peerRequestBuffer) },
			entries(peerReqItems, protowire.BytesType, nil, many), "PeerCheckRequest.items has 100000 entries"},
		// Malformed after the items: the protobuf runtime's path.
		{"peer request, then a truncated field", func() proto.Message { return new(pb.PeerCheckRequest) },
			append(entries(peerReqItems, protowire.BytesType, nil, many), 0x0a, 0x05), "PeerCheckRequest.items has 100000 entries"},
		{"peer response", func() proto.Message { return new(pb.PeerCheckResponse) },
			entries(peerRespItems, protowire.BytesType, nil, million), "PeerCheckResponse.items has 1000000 entries"},
		{"peer response buffer", func() proto.Message { return new(PeerResponseBuffer) },
			entries(peerRespItems, protowire.BytesType, nil, many), "PeerCheckResponse.items has 100000 entries"},
		{"peer response, then a truncated field", func() proto.Message { return new(pb.PeerCheckResponse) },
			append(entries(peerRespItems, protowire.BytesType, nil, many), 0x1a, 0x05), "PeerCheckResponse.items has 100000 entries"},
		{"batch request", func() proto.Message { return new(pb.BatchCheckRequest) },
			entries(1, protowire.BytesType, nil, million), "BatchCheckRequest.requests has 1000000 entries"},
		{"batch response", func() proto.Message { return new(pb.BatchCheckResponse) },
			entries(1, protowire.BytesType, nil, million), "BatchCheckResponse.responses has 1000000 entries"},
		{"transfer states", func() proto.Message { return new(pb.TransferRequest) },
			entries(3, protowire.BytesType, nil, million), "TransferRequest.states has 1000000 entries"},
		{"cut-off members", func() proto.Message { return new(pb.TransferRequest) },
			entries(7, protowire.BytesType, nil, million), "TransferRequest.cut_off has 1000000 entries"},
		{"newcomers", func() proto.Message { return new(pb.TransferRequest) },
			entries(8, protowire.BytesType, nil, million), "TransferRequest.newcomers has 1000000 entries"},
		{"packed words", func() proto.Message { return new(pb.TransferRequest) },
			append(emptyState, field(3, field(5, make([]byte, million)))...), "TransferRequest.states[1]: KeyState.words has 1000000 entries"},
		{"unpacked words", func() proto.Message { return new(pb.TransferRequest) },
			field(3, entries(5, protowire.VarintType, nil, many)), "TransferRequest.states[0]: KeyState.words has 100000 entries"},
		{"log", func() proto.Message { return new(pb.TransferRequest) },
			field(3, entries(6, protowire.BytesType, nil, many)), "TransferRequest.states[0]: KeyState.log has 100000 entries"},
		{"logs in all", func() proto.Message { return new(pb.TransferRequest) },
			manyLogs, fmt.Sprintf("KeyState.log has %d entries in all", MaxTransferLogEntries+limiter.MaxSnapshotLog)},
	}
}

// allocated returns the bytes the process allocated in a run of f: the
// fewest over up to three runs while above budget (other goroutines may
// allocate during one).
func allocated(budget uint64, f func()) uint64 {
	least := ^uint64(0)
	for range 3 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		if least = min(least, after.TotalAlloc-before.TotalAlloc); least <= budget {
			break
		}
	}
	return least
}

// A message over its limits is refused by the codec before it is decoded:
// with an error that names the field and the count, or, into a guarded,
// by recording it; it allocates next to nothing beyond its input.
func TestCountGuardRefusesBeforeDecoding(t *testing.T) {
	const budget = 64 << 10
	for _, tt := range overLimits() {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			n := allocated(budget, func() { err = wireUnmarshal(tt.b, tt.target()) })
			if _, ok := err.(*countError); !ok || !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tt.refuse) {
				t.Fatalf("error %v, want a count error saying %q", err, tt.refuse)
			}
			if n > budget {
				t.Errorf("refusing %d bytes allocated %d bytes, more than %d", len(tt.b), n, budget)
			}

			g := &guarded{Message: tt.target()}
			n = allocated(budget, func() { err = wireUnmarshal(tt.b, g) })
			if err != nil {
				t.Fatalf("into a guarded: %v", err)
			}
			if st := status.Convert(g.err()); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tt.refuse) {
				t.Fatalf("guarded refusal %v, want InvalidArgument saying %q", g.err(), tt.refuse)
			}
			if n > budget {
				t.Errorf("refusing %d bytes into a guarded allocated %d bytes, more than %d", len(tt.b), n, budget)
			}
		})
	}
}

// Messages at their limits decode, on either path of the Peer messages.
func TestCountGuardAcceptsTheLimits(t *testing.T) {
	state := append(field(5, make([]byte, 3)), entries(6, protowire.BytesType, nil, limiter.MaxSnapshotLog)...)
	var fullLogs []byte
	for range MaxTransferLogEntries / limiter.MaxSnapshotLog {
		fullLogs = append(fullLogs, field(3, state)...)
	}
	unknown := []byte{0xa0, 0x01, 0x00} // field 20, varint: not for the hand-written decoders
	for _, tt := range []struct {
		name  string
		m     proto.Message
		b     []byte
		count func(proto.Message) int
		want  int
	}{
		{"peer request", new(pb.PeerCheckRequest), entries(peerReqItems, protowire.BytesType, nil, MaxBatchItems),
			func(m proto.Message) int { return len(m.(*pb.PeerCheckRequest).Items) }, MaxBatchItems},
		{"peer request, runtime", new(pb.PeerCheckRequest), append(entries(peerReqItems, protowire.BytesType, nil, MaxBatchItems), unknown...),
			func(m proto.Message) int { return len(m.(*pb.PeerCheckRequest).Items) }, MaxBatchItems},
		{"peer response", new(pb.PeerCheckResponse), entries(peerRespItems, protowire.BytesType, nil, MaxBatchItems),
			func(m proto.Message) int { return len(m.(*pb.PeerCheckResponse).Items) }, MaxBatchItems},
		{"peer response, runtime", new(pb.PeerCheckResponse), append(entries(peerRespItems, protowire.BytesType, nil, MaxBatchItems), unknown...),
			func(m proto.Message) int { return len(m.(*pb.PeerCheckResponse).Items) }, MaxBatchItems},
		{"batch request", new(pb.BatchCheckRequest), entries(1, protowire.BytesType, nil, MaxBatchItems),
			func(m proto.Message) int { return len(m.(*pb.BatchCheckRequest).Requests) }, MaxBatchItems},
		{"batch response", new(pb.BatchCheckResponse), entries(1, protowire.BytesType, nil, MaxBatchItems),
			func(m proto.Message) int { return len(m.(*pb.BatchCheckResponse).Responses) }, MaxBatchItems},
		{"transfer states", new(pb.TransferRequest), entries(3, protowire.BytesType, field(5, make([]byte, 3)), MaxTransferStates),
			func(m proto.Message) int { return len(m.(*pb.TransferRequest).States) }, MaxTransferStates},
		{"transfer logs", new(pb.TransferRequest), fullLogs,
			func(m proto.Message) int {
				n := 0
				for _, s := range m.(*pb.TransferRequest).States {
					n += len(s.Log) + len(s.Words)
				}
				return n
			}, MaxTransferLogEntries + 3*MaxTransferLogEntries/limiter.MaxSnapshotLog},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := wireUnmarshal(tt.b, tt.m); err != nil {
				t.Fatal(err)
			}
			if got := tt.count(tt.m); got != tt.want {
				t.Fatalf("decoded %d entries, want %d", got, tt.want)
			}
		})
	}
}

// transferSink counts the states that reach it.
type transferSink struct{ states atomic.Int64 }

func (s *transferSink) TakeStates(_ context.Context, _ string, _ TransferReason, states []limiter.Snapshot) (int, int, error) {
	s.states.Add(int64(len(states)))
	return len(states), 0, nil
}

// On a real server, a message that fits in MaxMessageSize but holds more
// entries than its limit fails with InvalidArgument, before reaching any
// handler; one of a million entries is refused for its size.
func TestCountGuardOnTheWire(t *testing.T) {
	chk := &echoChecker{owner: "b"}
	sink := new(transferSink)
	conn := startServer(t, func(s *grpc.Server) {
		RegisterPeer(s, chk, WithStateSink(sink))
		RegisterPublic(s, LocalRouter(chk), nil)
	})
	fits := MaxMessageSize / 2 // empty entries of 2 bytes
	for _, tt := range []struct {
		method string
		num    protowire.Number
		field  string
	}{
		{"/sluice.v1.Peer/CheckBatch", peerReqItems, "PeerCheckRequest.items"},
		{"/sluice.v1.Sluice/CheckBatch", 1, "BatchCheckRequest.requests"},
		{"/sluice.v1.Peer/Transfer", 3, "TransferRequest.states"},
		{"/sluice.v1.Peer/CheckStream", peerReqItems, "PeerCheckRequest.items"},
	} {
		for _, n := range []int{fits, 1_000_000} {
			data := entries(tt.num, protowire.BytesType, nil, n)
			var err error
			var reply []byte
			if strings.HasSuffix(tt.method, "Stream") {
				var stream grpc.ClientStream
				stream, err = conn.NewStream(ctxT(t), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, tt.method, grpc.ForceCodec(rawCodec{}))
				if err != nil {
					t.Fatal(err)
				}
				if err := stream.SendMsg(&data); err != nil {
					t.Fatal(err)
				}
				err = stream.RecvMsg(&reply)
			} else {
				err = conn.Invoke(ctxT(t), tt.method, &data, &reply, grpc.ForceCodec(rawCodec{}))
			}
			want, text := codes.InvalidArgument, fmt.Sprintf("%s has %d entries, more than the maximum", tt.field, n)
			if len(data) > MaxMessageSize {
				want, text = codes.ResourceExhausted, "larger than max"
			}
			if st := status.Convert(err); st.Code() != want || !strings.Contains(st.Message(), text) {
				t.Errorf("%s with %d entries (%d bytes): %v, want %v saying %q", tt.method, n, len(data), err, want, text)
			}
		}
	}
	if n := len(chk.requests()); n != 0 || sink.states.Load() != 0 {
		t.Fatalf("%d requests and %d states reached the handlers", n, sink.states.Load())
	}
}

// On a server without ServerOptions' codec, the services decode their
// requests as the plain protobuf codec does, through the same wrapper.
func TestGuardedServicesWithThePlainCodec(t *testing.T) {
	lis, err := DefaultServerLimits().Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	sink := new(transferSink)
	RegisterPeer(s, &echoChecker{owner: "b"}, WithStateSink(sink))
	RegisterPublic(s, LocalRouter(&echoChecker{owner: "b"}), nil)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn := dial(t, lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))

	item := RequestToProto(limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.GCRA})
	peer := pb.NewPeerClient(conn)
	if resp, err := peer.CheckBatch(ctxT(t), &pb.PeerCheckRequest{Items: []*pb.RateLimitRequest{item}}); err != nil || ResultFromProto(resp.Items[0]).Err != nil {
		t.Fatalf("peer batch: %v, %v", resp, err)
	}
	if resp, err := pb.NewSluiceClient(conn).CheckBatch(ctxT(t), &pb.BatchCheckRequest{Requests: []*pb.RateLimitRequest{item}}); err != nil || ResultFromProto(resp.Responses[0]).Err != nil {
		t.Fatalf("public batch: %v, %v", resp, err)
	}
	stream, err := peer.CheckStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.PeerCheckRequest{Seq: 4, Items: []*pb.RateLimitRequest{item}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || resp.Seq != 4 || len(resp.Items) != 1 {
		t.Fatalf("stream: %v, %v", resp, err)
	}
	stream.CloseSend()
	state := liveSnapshots(t)[0]
	if _, err := peer.Transfer(ctxT(t), &pb.TransferRequest{Reason: pb.TransferReason_TRANSFER_REASON_HANDOFF, States: []*pb.KeyState{SnapshotToProto(&state)}}); err != nil || sink.states.Load() != 1 {
		t.Fatalf("transfer: %v, %d states taken", err, sink.states.Load())
	}
}
