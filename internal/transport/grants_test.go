package transport

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// A state's lease grants go over the wire as durations from the
// Transfer's sending and are read from the receiver's clock at receipt
// (here 5 s ahead of the sender's): the same durations, whatever the
// offset. A malformed grant is refused with an error naming what is
// wrong, before anything of it is kept; a node that predates the grants
// reads the state alone.
func TestLeaseGrantsProtoRoundTrip(t *testing.T) {
	var sn limiter.Snapshot
	for _, s := range liveSnapshots(t) {
		if s.Algorithm == limiter.TokenBucket {
			sn = s
		}
	}
	sent := time.Unix(1_700_000_010, 0).UnixNano()
	recv := sent + int64(5*time.Second)
	req := limiter.Request{Name: sn.Name, Key: sn.Key, Limit: 10, Period: time.Minute, Algorithm: sn.Algorithm}
	sn.Grants = []limiter.LeaseGrant{
		{Holder: "node-0", Hits: 4, Request: req, Entered: sent - int64(time.Second), Expires: sent + int64(2*time.Second)},
		{Holder: "node-2", Hits: 1, Request: req, Entered: sent + int64(time.Second), Expires: sent + int64(time.Second)},
	}
	wire := func(sn *limiter.Snapshot) []byte {
		in := &pb.TransferRequest{States: []*pb.KeyState{SnapshotToProto(sn)}, SentUnixNano: sent}
		StampLeaseGrants(in, []limiter.Snapshot{*sn}, sent)
		b, err := proto.Marshal(in.States[0])
		if err != nil {
			t.Fatal(err)
		}
		return b
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
		return s, new(Codec).leaseGrantsFromProto(m, &s, recv)
	}
	got, err := read(wire(&sn))
	want := sn
	want.Grants = nil
	for _, g := range sn.Grants {
		g.Entered += recv - sent
		g.Expires += recv - sent
		want.Grants = append(want.Grants, g)
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip gave %+v, %v; want %+v", got.Grants, err, want.Grants)
	}
	// A node that predates the grants reads the state alone.
	m := new(pb.KeyState)
	if err := proto.Unmarshal(wire(&sn), m); err != nil {
		t.Fatal(err)
	}
	plain := sn
	plain.Grants = nil
	if old, err := SnapshotFromProto(m); err != nil || !reflect.DeepEqual(old, plain) {
		t.Fatalf("read without the grants: %+v, %v; want %+v", old, err, plain)
	}

	for _, tc := range []struct {
		name string
		edit func(m *pb.KeyState)
		want string
	}{
		{"too many", func(m *pb.KeyState) {
			for range limiter.MaxLeaseGrants {
				m.LeaseGrants = append(m.LeaseGrants, m.LeaseGrants[0])
			}
		}, "lease_grants"},
		{"no request", func(m *pb.KeyState) { m.LeaseGrants[0].Request = nil }, "no request"},
		{"empty holder", func(m *pb.KeyState) { m.LeaseGrants[0].Holder = "" }, "holder"},
		{"zero hits", func(m *pb.KeyState) { m.LeaseGrants[0].Hits = 0 }, "0 hits"},
		{"more hits than the capacity", func(m *pb.KeyState) { m.LeaseGrants[0].Hits = 11 }, "11 hits"},
		{"another key", func(m *pb.KeyState) { m.LeaseGrants[0].Request.Key = "other" }, "lease grant of"},
		{"a window for a bucket", func(m *pb.KeyState) { m.LeaseGrants[0].WindowEndsInNanos = int64(time.Second) }, "times"},
		{"a lease past the longest TTL", func(m *pb.KeyState) { m.LeaseGrants[0].ExpiresInNanos = int64(MaxLeaseTTL) + 1 }, "times"},
		{"entered too long ago", func(m *pb.KeyState) { m.LeaseGrants[0].EnteredAgoNanos = int64(maxGrantAge) + 1 }, "times"},
	} {
		m := new(pb.KeyState)
		if err := proto.Unmarshal(wire(&sn), m); err != nil {
			t.Fatal(err)
		}
		tc.edit(m)
		b, _ := proto.Marshal(m)
		got, err := read(b)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one naming %q", tc.name, err, tc.want)
		}
		if err != nil && !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, limiter.ErrInvalidSnapshot) {
			t.Errorf("%s: err %v wraps neither ErrInvalidArgument nor limiter.ErrInvalidSnapshot", tc.name, err)
		}
		if got.Grants != nil {
			t.Errorf("%s: kept %d grants", tc.name, len(got.Grants))
		}
	}
}
