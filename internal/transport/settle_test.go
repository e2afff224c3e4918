package transport

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// A state's settlement goes over the wire and back whole, and one that is
// malformed is refused with an error naming what is wrong; a state
// without one reads without one.
func TestSettlementProtoRoundTrip(t *testing.T) {
	sn := liveSnapshots(t)[0]
	req := limiter.Request{Name: sn.Name, Key: sn.Key, Limit: 10, Period: sn.RatePeriod, Algorithm: sn.Algorithm}
	sn.Settle = &limiter.Settlement{Request: req, Parts: []limiter.SettlePart{{Origin: "node-0", Gen: 7, Hits: 3}, {Origin: "node-1", Gen: 1, Hits: 2}}}
	b, err := proto.Marshal(SnapshotToProto(&sn))
	if err != nil {
		t.Fatal(err)
	}
	read := func(b []byte) (limiter.Snapshot, error) {
		m := new(pb.KeyState)
		if err := proto.Unmarshal(b, m); err != nil {
			t.Fatal(err)
		}
		s, err := SnapshotFromProto(m)
		if err != nil {
			t.Fatal(err)
		}
		return s, new(Codec).settlementFromProto(m, &s)
	}
	got, err := read(b)
	if err != nil || !reflect.DeepEqual(got, sn) {
		t.Fatalf("round trip gave %+v (%+v), %v; want %+v", got, got.Settle, err, sn)
	}
	plain := sn
	plain.Settle = nil
	// A node that predates the settlement reads the state alone, as
	// SnapshotFromProto does: the same state, merged by the larger.
	m := new(pb.KeyState)
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	if old, err := SnapshotFromProto(m); err != nil || !reflect.DeepEqual(old, plain) {
		t.Fatalf("read without the settlement: %+v, %v; want %+v", old, err, plain)
	}
	b, _ = proto.Marshal(SnapshotToProto(&plain))
	if got, err := read(b); err != nil || got.Settle != nil {
		t.Fatalf("a state without settlement read with %+v, %v", got.Settle, err)
	}

	for _, tc := range []struct {
		name string
		edit func(m *pb.KeyState)
		want string
	}{
		{"parts without request", func(m *pb.KeyState) { m.SettleRequest = nil }, "without the other"},
		{"request without parts", func(m *pb.KeyState) { m.SettleParts = nil }, "without the other"},
		{"too many parts", func(m *pb.KeyState) {
			for range limiter.MaxSettleParts {
				m.SettleParts = append(m.SettleParts, &pb.SettlePart{Origin: "x", Hits: 1})
			}
		}, "settle_parts"},
		{"request of another key", func(m *pb.KeyState) { m.SettleRequest.Key = "other" }, "settlement request"},
		{"invalid request", func(m *pb.KeyState) { m.SettleRequest.Limit = 0 }, "settle_request"},
		{"empty origin", func(m *pb.KeyState) { m.SettleParts[0].Origin = "" }, "origin"},
		{"zero hits", func(m *pb.KeyState) { m.SettleParts[0].Hits = 0 }, "hits 0"},
		{"repeated part", func(m *pb.KeyState) { m.SettleParts[1].Origin, m.SettleParts[1].Gen = "node-0", 7 }, "repeats"},
	} {
		m := SnapshotToProto(&sn)
		tc.edit(m)
		b, _ := proto.Marshal(m)
		_, err := read(b)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one naming %q", tc.name, err, tc.want)
		}
		if err != nil && !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, limiter.ErrInvalidSnapshot) {
			t.Errorf("%s: err %v wraps neither ErrInvalidArgument nor limiter.ErrInvalidSnapshot", tc.name, err)
		}
	}
}
