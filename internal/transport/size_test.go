package transport

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// largest returns a new m with every field at its longest encoding:
// strings at the lengths of maxLen (by field name; a string field not
// there fails the test), every integer, enum and bool at its longest
// varint.
func largest[M proto.Message](t *testing.T, m M, maxLen map[protoreflect.Name]int) M {
	t.Helper()
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		var v protoreflect.Value
		switch fd.Kind() {
		case protoreflect.StringKind:
			n, ok := maxLen[fd.Name()]
			if !ok {
				t.Fatalf("%s: no bound for string field %s", r.Descriptor().Name(), fd.Name())
			}
			v = protoreflect.ValueOfString(strings.Repeat("x", n))
		case protoreflect.Int64Kind:
			v = protoreflect.ValueOfInt64(-1)
		case protoreflect.Uint64Kind:
			v = protoreflect.ValueOfUint64(math.MaxUint64)
		case protoreflect.EnumKind:
			v = protoreflect.ValueOfEnum(-1)
		case protoreflect.BoolKind:
			v = protoreflect.ValueOfBool(true)
		case protoreflect.BytesKind, protoreflect.MessageKind:
			continue // padding; items, set by the caller
		default:
			t.Fatalf("%s.%s: kind %v", r.Descriptor().Name(), fd.Name(), fd.Kind())
		}
		r.Set(fd, v)
	}
	return m
}

// largestBatches returns the largest peer and public batches.
func largestBatches(t *testing.T) (*pb.PeerCheckRequest, *pb.BatchCheckRequest) {
	item := largest(t, new(pb.RateLimitRequest), map[protoreflect.Name]int{
		"name": limiter.MaxNameLen, "key": limiter.MaxKeyLen, "time_zone": MaxTimeZoneLen,
		"traceparent": TraceParentLen,
	})
	peer := largest(t, new(pb.PeerCheckRequest), map[protoreflect.Name]int{"from": limiter.MaxNameLen})
	public := new(pb.BatchCheckRequest)
	for range MaxBatchItems {
		peer.Items = append(peer.Items, item)
		public.Requests = append(public.Requests, item)
	}
	return peer, public
}

// largestRules returns the largest request and response of the Rules
// service.
func largestRules(t *testing.T) (*pb.RulesCheckRequest, *pb.RulesCheckResponse) {
	entry := largest(t, new(pb.RulesEntry), map[protoreflect.Name]int{"name": limiter.MaxNameLen, "value": limiter.MaxKeyLen})
	req := largest(t, new(pb.RulesCheckRequest), map[protoreflect.Name]int{
		"route": limiter.MaxKeyLen, "user": limiter.MaxKeyLen, "method": limiter.MaxNameLen, "ip": limiter.MaxNameLen,
	})
	for range MaxRulesEntries {
		req.Headers = append(req.Headers, entry)
		req.Descriptors = append(req.Descriptors, entry)
	}
	result := largest(t, new(pb.RuleResult), map[protoreflect.Name]int{
		"name": limiter.MaxNameLen, "key": limiter.MaxKeyLen, "owner": limiter.MaxNameLen,
	})
	resp := largest(t, new(pb.RulesCheckResponse), nil)
	for range MaxRulesResults {
		resp.Rules = append(resp.Rules, result)
	}
	return req, resp
}

// The bounds of size.go hold for the largest messages, and MaxMessageSize
// is the largest of them.
func TestMessageSizeBounds(t *testing.T) {
	peer, public := largestBatches(t)
	item := largest(t, new(pb.RateLimitResponse), map[protoreflect.Name]int{
		"owner": limiter.MaxNameLen, "error_message": MaxErrorMessageLen,
	})
	peerResp := largest(t, new(pb.PeerCheckResponse), map[protoreflect.Name]int{"owner": limiter.MaxNameLen})
	publicResp := new(pb.BatchCheckResponse)
	for range MaxBatchItems {
		peerResp.Items = append(peerResp.Items, item)
		publicResp.Responses = append(publicResp.Responses, item)
	}
	rulesReq, rulesResp := largestRules(t)
	for _, tt := range []struct {
		m     proto.Message
		bound int
	}{
		{peer, maxPeerRequest},
		{public, maxBatchRequest},
		{peerResp, maxPeerResponse},
		{publicResp, maxBatchResponse},
		{rulesReq, maxRulesRequest},
		{rulesResp, maxRulesResponse},
	} {
		size := proto.Size(tt.m)
		if size > tt.bound || size > MaxMessageSize {
			t.Errorf("the largest %s takes %d bytes, more than its bound %d or MaxMessageSize %d",
				tt.m.ProtoReflect().Descriptor().Name(), size, tt.bound, MaxMessageSize)
		}
		// Not loose: bools and short lengths take less than the bound.
		if size < tt.bound*97/100 {
			t.Errorf("the largest %s takes %d bytes, far below its bound %d", tt.m.ProtoReflect().Descriptor().Name(), size, tt.bound)
		}
	}
	if MaxMessageSize != maxPeerRequest || padTo > MaxMessageSize {
		t.Errorf("MaxMessageSize %d, want the largest peer request %d (and above padTo %d)", MaxMessageSize, maxPeerRequest, padTo)
	}
	if size := MaxMessageSize; size != 1_419_142 {
		t.Errorf("MaxMessageSize %d, and its doc says 1,419,142", size)
	}
}

// withFiller returns the encoding of m followed by an unknown bytes field
// that brings it to size bytes.
func withFiller(t *testing.T, m proto.Message, size int) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	const num = 100 // no field of any message
	n := size - len(b) - protowire.SizeTag(num)
	for n > 0 && protowire.SizeTag(num)+protowire.SizeBytes(n) > size-len(b) {
		n--
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendBytes(b, make([]byte, n))
	if len(b) != size {
		t.Fatalf("filled to %d bytes, want %d", len(b), size)
	}
	return b
}

// A real server takes the largest batches, on every path, and a message of
// MaxMessageSize bytes; one byte more is refused.
func TestLargestBatchesFit(t *testing.T) {
	chk := &echoChecker{owner: strings.Repeat("o", limiter.MaxNameLen)}
	conn := startServer(t, func(s *grpc.Server) {
		RegisterPeer(s, chk)
		RegisterPublic(s, LocalRouter(chk), nil)
	})
	peer, public := largestBatches(t)
	peerResp, err := pb.NewPeerClient(conn).CheckBatch(ctxT(t), peer, CallOptions()...)
	if err != nil || len(peerResp.Items) != MaxBatchItems {
		t.Fatalf("largest peer batch: %v", err)
	}
	publicResp, err := pb.NewSluiceClient(conn).CheckBatch(ctxT(t), public)
	if err != nil || len(publicResp.Responses) != MaxBatchItems {
		t.Fatalf("largest public batch: %v", err)
	}
	stream, err := pb.NewPeerClient(conn).CheckStream(ctxT(t), CallOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(peer); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || len(resp.Items) != MaxBatchItems {
		t.Fatalf("largest peer batch on a stream: %v", err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}

	for _, size := range []int{MaxMessageSize, MaxMessageSize + 1} {
		want := codes.OK
		if size > MaxMessageSize {
			want = codes.ResourceExhausted
		}
		for method, m := range map[string]proto.Message{"/sluice.v1.Peer/CheckBatch": peer, "/sluice.v1.Sluice/CheckBatch": public} {
			data := withFiller(t, m, size)
			var reply []byte
			err := conn.Invoke(ctxT(t), method, &data, &reply, grpc.ForceCodec(rawCodec{}))
			if status.Code(err) != want {
				t.Errorf("%s of %d bytes: %v, want %v", method, size, err, want)
			}
		}
	}
}

// fullStates returns n states with names and keys at their longest and a
// full log, each number at its longest varint (they share one log).
func fullStates(n int) []limiter.Snapshot {
	log := make([]limiter.LogEntry, limiter.MaxSnapshotLog)
	for i := range log {
		log[i] = limiter.LogEntry{At: -1, Hits: -1}
	}
	states := make([]limiter.Snapshot, n)
	for i := range states {
		states[i] = limiter.Snapshot{
			Name: strings.Repeat("n", limiter.MaxNameLen), Key: strings.Repeat("k", limiter.MaxKeyLen),
			Algorithm: limiter.SlidingWindowLog, ExpireAt: -1, Words: [3]int64{-1, -1, -1}, Log: log,
		}
	}
	return states
}

// TransferSplit cuts states into Transfers that a server takes: within
// MaxTransferStates, MaxTransferLogEntries and MaxMessageSize, and as
// large as its bounds allow.
func TestTransferSplit(t *testing.T) {
	sink := new(transferSink)
	conn := startServer(t, func(s *grpc.Server) { RegisterPeer(s, &echoChecker{}, WithStateSink(sink)) })
	small := make([]limiter.Snapshot, 2*MaxTransferStates+500)
	for i := range small {
		small[i] = limiter.Snapshot{Name: "n", Key: "k", Algorithm: limiter.GCRA}
	}
	huge := fullStates(1)
	huge[0].Log = append(huge[0].Log, huge[0].Log...)
	// States with a settlement of the most parts, with the longest names.
	settled := make([]limiter.Snapshot, 2*MaxTransferStates)
	for i := range settled {
		name, key := strings.Repeat("n", limiter.MaxNameLen), strings.Repeat("k", limiter.MaxKeyLen)
		req := limiter.Request{Name: name, Key: key, Limit: limiter.MaxLimit, Period: limiter.MaxPeriod, Burst: limiter.MaxLimit, Algorithm: limiter.GCRA}
		st := &limiter.Settlement{Request: req}
		for j := range limiter.MaxSettleParts {
			st.Parts = append(st.Parts, limiter.SettlePart{Origin: strings.Repeat("o", limiter.MaxNameLen-1) + string(rune('a'+j)), Gen: math.MaxUint64, Hits: limiter.MaxLimit})
		}
		settled[i] = limiter.Snapshot{Name: name, Key: key, Algorithm: limiter.GCRA, Settle: st}
	}
	for _, tt := range []struct {
		name    string
		states  []limiter.Snapshot
		calls   int
		refused bool // by the receiver, for a log over limiter.MaxSnapshotLog
	}{
		{"none", nil, 0, false},
		{"small states", small, 3, false},
		{"full logs", fullStates(40), 6, false}, // 7 per call: bounded by size (a log goes in both forms)
		{"a state over the limits goes alone", huge, 1, true},
		{"settlements", settled, 8, false}, // 250 per call: bounded by size
	} {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			for states := tt.states; len(states) > 0; calls++ {
				n := TransferSplit(states)
				if n < 1 || n > len(states) {
					t.Fatalf("split %d of %d states", n, len(states))
				}
				in := &pb.TransferRequest{
					From: strings.Repeat("f", limiter.MaxNameLen), Reason: pb.TransferReason_TRANSFER_REASON_HANDOFF, RingFingerprint: math.MaxUint64,
				}
				size, logs := transferOverhead, 0
				for i := range states[:n] {
					in.States = append(in.States, SnapshotToProto(&states[i]))
					size += stateSize(&states[i])
					logs += len(states[i].Log)
					if actual := proto.Size(in.States[i]); 1+protowire.SizeBytes(actual) > stateSize(&states[i]) {
						t.Fatalf("state %d takes %d bytes, more than its bound %d", i, actual, stateSize(&states[i]))
					}
				}
				if got := proto.Size(in); got > size {
					t.Fatalf("a Transfer of %d states takes %d bytes, more than its bound %d", n, got, size)
				}
				if n < len(states) {
					next := stateSize(&states[n])
					if n < MaxTransferStates && size+next <= MaxMessageSize && logs+len(states[n].Log) <= MaxTransferLogEntries {
						t.Fatalf("split after %d states (%d bytes, %d log entries) where the next one fits", n, size, logs)
					}
				}
				_, err := pb.NewPeerClient(conn).Transfer(ctxT(t), in, CallOptions()...)
				if tt.refused && status.Code(err) != codes.InvalidArgument {
					t.Fatalf("a state over the limits: %v, want InvalidArgument", err)
				} else if !tt.refused && err != nil {
					t.Fatalf("Transfer of %d states: %v", n, err)
				}
				states = states[n:]
			}
			if calls != tt.calls {
				t.Fatalf("%d calls, want %d", calls, tt.calls)
			}
		})
	}
}
