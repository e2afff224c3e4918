package transport

import (
	"testing"

	"google.golang.org/protobuf/proto"

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
