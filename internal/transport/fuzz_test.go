package transport

import (
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// FuzzRequestFromProto decodes arbitrary bytes as a request and converts
// it. It must never panic; whatever converts must be valid and must survive
// a second round trip unchanged.
func FuzzRequestFromProto(f *testing.F) {
	for _, r := range validRequests(f) {
		b, err := proto.Marshal(RequestToProto(r))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, m := range []*pb.RateLimitRequest{
		{},
		{Name: "n", Key: "k", Limit: -1, PeriodNanos: -1, Algorithm: 99, Calendar: 99},
		{Name: "n", Key: "k", Limit: 1, Algorithm: pb.Algorithm_ALGORITHM_FIXED_WINDOW, Calendar: pb.Calendar_CALENDAR_WEEK, TimeZone: "../../../../etc/passwd"},
		{Name: "n", Key: "k", Limit: 1, Algorithm: pb.Algorithm_ALGORITHM_FIXED_WINDOW, Calendar: pb.Calendar_CALENDAR_MONTH, TimeZone: "Local"},
		{Name: "n", Key: "k", Limit: 1_000_000_000_000, PeriodNanos: 1000, Burst: 1_000_000_000_000, Algorithm: pb.Algorithm_ALGORITHM_GCRA},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Add([]byte{0x0a, 0x02, 0xc3, 0x28}) // name with invalid UTF-8
	f.Add([]byte{0x18, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})

	var c Codec
	f.Fuzz(func(t *testing.T, data []byte) {
		m := new(pb.RateLimitRequest)
		if err := proto.Unmarshal(data, m); err != nil {
			return
		}
		r, err := c.RequestFromProto(m)
		if err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("converted request is invalid: %v", err)
		}
		b, err := proto.Marshal(RequestToProto(r))
		if err != nil {
			t.Fatalf("valid request does not encode: %v", err)
		}
		m2 := new(pb.RateLimitRequest)
		if err := proto.Unmarshal(b, m2); err != nil {
			t.Fatal(err)
		}
		r2, err := c.RequestFromProto(m2)
		if err != nil {
			t.Fatalf("second round trip: %v", err)
		}
		if r2.Location.String() != r.Location.String() {
			t.Fatalf("second round trip: Location %v, want %v", r2.Location, r.Location)
		}
		r2.Location, r.Location = nil, nil
		if r2 != r {
			t.Fatalf("second round trip: %+v, want %+v", r2, r)
		}
	})
}

// FuzzResultFromProto decodes arbitrary bytes as a response: it must never
// panic, and a decision it accepts must be in range.
func FuzzResultFromProto(f *testing.F) {
	for _, m := range []*pb.RateLimitResponse{
		{},
		{Allowed: true, Limit: 10, Remaining: 3, ResetAtUnixNano: 1, RetryAfterNanos: 5, DelayNanos: 7, Owner: "a", WithoutOwner: true},
		{ErrorCode: pb.ErrorCode_ERROR_CODE_INVALID_LIMIT, ErrorMessage: "limiter: invalid Limit"},
		{ErrorCode: 1000, Remaining: -5},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m := new(pb.RateLimitResponse)
		if err := proto.Unmarshal(data, m); err != nil {
			return
		}
		r := ResultFromProto(m)
		if r.Err != nil {
			_ = r.Err.Error()
			return
		}
		d := r.Decision
		if d.Limit < 0 || d.Remaining < 0 || d.RetryAfter < 0 || d.Delay < 0 {
			t.Fatalf("accepted out-of-range decision %+v", d)
		}
	})
}

// FuzzPeerDecoders decodes arbitrary bytes with the hand-written decoders
// of the Peer messages: fresh, into buffers reused from one input to the
// next, and through the codec into a guarded. Whatever they decode must be
// what proto.Unmarshal decodes; what they refuse for its counts must be
// over the limits.
func FuzzPeerDecoders(f *testing.F) {
	for _, m := range randomPeerMessages(rand.New(rand.NewPCG(7, 8)), 10) {
		f.Add(wireMarshal(f, m))
	}
	f.Add(entries(peerReqItems, protowire.BytesType, nil, MaxBatchItems+1))
	f.Add(entries(peerRespItems, protowire.BytesType, nil, MaxBatchItems+1))
	f.Add([]byte{paddingTag, 0x01, 0x00, 0x12, 0x00, 0x12, 0x02, 0x08, 0x01})
	var reqBuf peerRequestBuffer
	var respBuf PeerResponseBuffer
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, tt := range []struct {
			fresh  proto.Message
			decode func(b []byte, m proto.Message) (bool, error)
			buf    proto.Message // decoded into through the codec
			inBuf  proto.Message // the message of buf
			limits []countLimit
		}{
			{new(pb.PeerCheckRequest), func(b []byte, m proto.Message) (bool, error) {
				return decodePeerRequest(b, m.(*pb.PeerCheckRequest), new(requestSpace))
			}, &reqBuf, &reqBuf.PeerCheckRequest, peerRequestLimits},
			{new(pb.PeerCheckResponse), func(b []byte, m proto.Message) (bool, error) {
				return decodePeerResponse(b, m.(*pb.PeerCheckResponse), new(responseSpace))
			}, &respBuf, &respBuf.PeerCheckResponse, peerResponseLimits},
		} {
			want := tt.fresh.ProtoReflect().New().Interface()
			errPlain := proto.Unmarshal(skipPadding(data), want)
			clearPadding(want)
			over := errPlain == nil && countsOver(want.ProtoReflect(), tt.limits)

			done, err := tt.decode(skipPadding(data), tt.fresh)
			switch {
			case err != nil:
				if _, ok := err.(*countError); !ok || (errPlain == nil && !over) {
					t.Fatalf("%T: refused with %v; plain decoding %v, over the limits %v", tt.fresh, err, errPlain, over)
				}
			case done && (errPlain != nil || !proto.Equal(tt.fresh, want)):
				t.Fatalf("%T: decoded by hand %v, plain %v (%v)", tt.fresh, tt.fresh, want, errPlain)
			}

			err = wireUnmarshal(data, tt.buf)
			checkDecoded(t, tt.inBuf, err, want, errPlain, over)
			g := &guarded{Message: tt.fresh.ProtoReflect().New().Interface()}
			if err = wireUnmarshal(data, g); err == nil {
				err = g.refused
			}
			checkDecoded(t, g.Message, err, want, errPlain, over)
		}
	})
}

// checkDecoded fails the test unless got, decoded with err, agrees with
// want, decoded by proto.Unmarshal with errPlain; the codec refuses just
// what is over the limits.
func checkDecoded(t *testing.T, got proto.Message, err error, want proto.Message, errPlain error, over bool) {
	t.Helper()
	if _, refused := err.(*countError); refused || over {
		if !refused || !over {
			t.Fatalf("%T: codec error %v, over the limits %v", got, err, over)
		}
		return
	}
	if (err == nil) != (errPlain == nil) {
		t.Fatalf("%T: codec error %v, plain error %v", got, err, errPlain)
	}
	clearPadding(got)
	if err == nil && !proto.Equal(got, want) {
		t.Fatalf("%T: codec decoded %v, plain %v", got, got, want)
	}
}

// clearPadding clears the padding field of a Peer message.
func clearPadding(m proto.Message) {
	switch m := m.(type) {
	case *pb.PeerCheckRequest:
		m.Padding = nil
	case *pb.PeerCheckResponse:
		m.Padding = nil
	}
}

// countsOver reports whether the decoded message m has a repeated field
// over limits, itself or in its entries, or more entries of a field than
// its total allows: what checkCounts says of its encoding.
func countsOver(m protoreflect.Message, limits []countLimit) bool {
	totals := map[*countLimit]int{}
	var over func(m protoreflect.Message, limits []countLimit) bool
	over = func(m protoreflect.Message, limits []countLimit) bool {
		for i := range limits {
			l := &limits[i]
			list := m.Get(m.Descriptor().Fields().ByNumber(l.num)).List()
			if list.Len() > l.max {
				return true
			}
			totals[l] += list.Len()
			for j := range list.Len() {
				if l.each != nil && over(list.Get(j).Message(), l.each) {
					return true
				}
			}
		}
		return false
	}
	if over(m, limits) {
		return true
	}
	for l, n := range totals {
		if l.total > 0 && n > l.total {
			return true
		}
	}
	return false
}

// scaledLimits returns a copy of limits with every bound small enough for
// a fuzzer to go over: 2 entries, 3 in all.
func scaledLimits(limits []countLimit) []countLimit {
	out := append([]countLimit(nil), limits...)
	for i := range out {
		out[i].max = 2
		if out[i].total > 0 {
			out[i].total = 3
		}
		out[i].each = scaledLimits(out[i].each)
	}
	return out
}

// FuzzCountGuard runs the count guard on arbitrary bytes as every message
// of sluice.proto that has limits, scaled down: it must never panic, and,
// on what proto.Unmarshal decodes, refuse exactly what is over them.
func FuzzCountGuard(f *testing.F) {
	state := func(words, logs int) []byte {
		b := field(5, make([]byte, words))
		return append(b, entries(6, protowire.BytesType, field(1, []byte{1}), logs)...)
	}
	f.Add(entries(1, protowire.BytesType, nil, 3))
	f.Add(entries(2, protowire.BytesType, field(1, []byte("n")), 2))
	f.Add(append(field(3, state(3, 2)), field(3, state(2, 1))...))
	f.Add(field(3, entries(5, protowire.VarintType, nil, 3)))
	f.Add(append(append(field(3, state(1, 2)), field(3, state(0, 2))...), 0x08, 0x01))
	f.Add([]byte{0x1a, 0x04, 0x2a, 0x02, 0x80, 0x01})
	var types []proto.Message
	msgs := pb.File_sluice_v1_sluice_proto.Messages()
	for i := range msgs.Len() {
		if countLimits(msgs.Get(i).FullName()) != nil {
			mt, err := protoregistry.GlobalTypes.FindMessageByName(msgs.Get(i).FullName())
			if err != nil {
				f.Fatal(err)
			}
			types = append(types, mt.New().Interface())
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, typ := range types {
			limits := scaledLimits(countLimits(typ.ProtoReflect().Descriptor().FullName()))
			err := checkCounts(data, limits)
			if err != nil {
				if _, ok := err.(*countError); !ok {
					t.Fatalf("%T: error %v of type %T", typ, err, err)
				}
			}
			m := typ.ProtoReflect().New().Interface()
			if proto.Unmarshal(data, m) != nil {
				continue
			}
			if over := countsOver(m.ProtoReflect(), limits); over != (err != nil) {
				t.Fatalf("%T: guard says %v, decoded message over the limits: %v (%v)", typ, err, over, m)
			}
		}
	})
}
