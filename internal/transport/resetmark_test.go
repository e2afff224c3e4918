package transport

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// markedSnapshots returns, for every algorithm, a snapshot of a key reset
// with 1 hit (its state and the reset's mark) and one of a key reset with
// none (the mark alone), and a calendar window's state with a mark, taken
// from a KeepStrictest store.
func markedSnapshots(tb testing.TB) []limiter.Snapshot {
	tb.Helper()
	s, err := limiter.NewStore(limiter.StoreConfig{Shards: 1, KeepStrictest: true})
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	check := func(req limiter.Request, at time.Time) {
		if _, err := s.CheckAt(req, at); err != nil {
			tb.Fatal(err)
		}
	}
	for _, a := range limiter.Algorithms {
		for _, hits := range []int64{0, 1} {
			req := limiter.Request{Name: "api", Key: a.String() + string(rune('0'+hits)), Hits: 3, Limit: 10, Period: time.Minute, Algorithm: a}
			check(req, now.Add(-2*time.Second))
			req.Hits, req.Behavior = hits, limiter.Reset
			check(req, now.Add(-time.Second))
		}
	}
	paris, err := limiter.LoadZone("Europe/Paris")
	if err != nil {
		tb.Fatal(err)
	}
	cal := limiter.Request{Name: "api", Key: "cal", Hits: 3, Limit: 10, Algorithm: limiter.FixedWindow, Calendar: limiter.Day, Location: paris}
	check(cal, now.Add(-2*time.Second))
	cal.Hits, cal.Behavior = 1, limiter.Reset
	check(cal, now.Add(-time.Second))
	var out []limiter.Snapshot
	s.Range(now, func(sn limiter.Snapshot) bool {
		if !sn.HasResetMark() {
			tb.Fatalf("%+v: no reset mark", sn)
		}
		out = append(out, sn)
		return true
	})
	if len(out) != 2*len(limiter.Algorithms)+1 {
		tb.Fatalf("%d snapshots, want %d", len(out), 2*len(limiter.Algorithms)+1)
	}
	return out
}

// TestSnapshotProtoResetMark: a reset's mark crosses the wire beside a
// state of format version 1 or 2, which members of the previous release
// read (without the mark), with a state and alone, and within stateSize;
// a member that reads only the earlier form (words) reads it too.
func TestSnapshotProtoResetMark(t *testing.T) {
	for _, sn := range markedSnapshots(t) {
		m, size := overTheWire(t, &sn)
		if m.ResetAtUnixNano != sn.ResetAt || m.ResetUntilUnixNano != sn.ResetUntil {
			t.Fatalf("%s: mark %d..%d beside the state, want %d..%d", sn.Key, m.ResetAtUnixNano, m.ResetUntilUnixNano, sn.ResetAt, sn.ResetUntil)
		}
		if len(m.State) > 0 {
			var old limiter.Snapshot
			if err := old.UnmarshalBinary(m.State); err != nil || m.State[0] > 2 || old.HasResetMark() {
				t.Errorf("%s: state %x (%v) holds the mark, or a version the previous release does not read", sn.Key, m.State, err)
			}
		} else if sn.Algorithm != limiter.GCRA || !sn.MarkOnly() {
			t.Errorf("%s: no state", sn.Key)
		}
		got, err := SnapshotFromProto(m)
		if err != nil || !reflect.DeepEqual(got, sn) {
			t.Errorf("%s: round trip gave %+v, %v, want %+v", sn.Key, got, err, sn)
		}
		m.State = nil
		if got, err := SnapshotFromProto(m); err != nil || !reflect.DeepEqual(got, sn) {
			t.Errorf("%s: earlier form gave %+v, %v, want %+v", sn.Key, got, err, sn)
		}
		if size := 1 + protowire.SizeBytes(size); size > stateSize(&sn) {
			t.Errorf("%s: takes %d bytes, more than its bound %d", sn.Key, size, stateSize(&sn))
		}
	}
}

// TestSnapshotFromProtoResetMarkRejects: a mark no store could have
// written, or one in the state and another beside it, is refused on
// conversion; marks far in the future pass conversion and are refused by
// the store's Merge (limiter's TestForgedResetMarks).
func TestSnapshotFromProtoResetMarkRejects(t *testing.T) {
	var sn limiter.Snapshot
	for _, s := range markedSnapshots(t) {
		if s.RateCalendar == limiter.NoCalendar && !s.MarkOnly() {
			sn = s
		}
	}
	good := SnapshotToProto(&sn)
	inState := sn
	b, err := inState.MarshalBinary()
	if err != nil || b[0] != 3 {
		t.Fatalf("the mark in the state: %x, %v", b, err)
	}
	tests := []struct {
		name string
		mut  func(*pb.KeyState)
		want error
	}{
		{"end before instant", func(m *pb.KeyState) { m.ResetUntilUnixNano = m.ResetAtUnixNano - 1 }, limiter.ErrInvalidSnapshot},
		{"end without instant", func(m *pb.KeyState) { m.ResetAtUnixNano = 0 }, limiter.ErrInvalidSnapshot},
		{"instant without end", func(m *pb.KeyState) { m.ResetUntilUnixNano = 0 }, limiter.ErrInvalidSnapshot},
		{"negative instant", func(m *pb.KeyState) { m.ResetAtUnixNano = -1 << 62 }, limiter.ErrInvalidSnapshot},
		{"mark in the state and beside it", func(m *pb.KeyState) { m.State = b }, ErrInvalidArgument},
	}
	for _, tt := range tests {
		for _, form := range []string{"state", "words"} {
			if form == "words" && tt.name == "mark in the state and beside it" {
				continue
			}
			m := proto.Clone(good).(*pb.KeyState)
			if form == "words" {
				m.State = nil
			}
			tt.mut(m)
			if _, err := SnapshotFromProto(m); !errors.Is(err, tt.want) {
				t.Errorf("%s (%s): %v, want %v", tt.name, form, err, tt.want)
			}
		}
	}
	// The mark in the state alone (a writer of version 3 on the wire)
	// reads as the same snapshot.
	m := proto.Clone(good).(*pb.KeyState)
	m.State, m.ResetAtUnixNano, m.ResetUntilUnixNano = b, 0, 0
	if got, err := SnapshotFromProto(m); err != nil || !reflect.DeepEqual(got, sn) {
		t.Errorf("the mark in the state: %+v, %v, want %+v", got, err, sn)
	}
}

// TestResetKeyFromProtoMark: a reset's Transfer state carries the name
// and key, and the reset's mark alone when the sender holds one; a mark
// no store could have written, or without a known algorithm, is refused.
func TestResetKeyFromProtoMark(t *testing.T) {
	if got, err := resetKeyFromProto(&pb.KeyState{Name: "n", Key: "k", Algorithm: pb.Algorithm_ALGORITHM_GCRA}); err != nil ||
		!reflect.DeepEqual(got, limiter.Snapshot{Name: "n", Key: "k"}) {
		t.Fatalf("a reset without a mark: %+v, %v", got, err)
	}
	for _, a := range limiter.Algorithms {
		alone := limiter.Snapshot{Name: "n", Key: "k", Algorithm: a, ResetAt: 5, ResetUntil: 7}
		m, _ := overTheWire(t, &alone)
		if got, err := resetKeyFromProto(m); err != nil || !reflect.DeepEqual(got, alone) {
			t.Errorf("%s: a reset with its mark: %+v, %v, want %+v", a, got, err, alone)
		}
	}
	for _, tt := range []struct {
		name string
		m    *pb.KeyState
		want error
	}{
		{"end before instant", &pb.KeyState{Name: "n", Key: "k", Algorithm: pb.Algorithm_ALGORITHM_FIXED_WINDOW, ResetAtUnixNano: 7, ResetUntilUnixNano: 5}, limiter.ErrInvalidSnapshot},
		{"negative instant", &pb.KeyState{Name: "n", Key: "k", Algorithm: pb.Algorithm_ALGORITHM_FIXED_WINDOW, ResetAtUnixNano: -1, ResetUntilUnixNano: 5}, limiter.ErrInvalidSnapshot},
		{"no algorithm", &pb.KeyState{Name: "n", Key: "k", ResetAtUnixNano: 5, ResetUntilUnixNano: 7}, ErrInvalidArgument},
		{"a state beside the mark", &pb.KeyState{Name: "n", Key: "k", Algorithm: pb.Algorithm_ALGORITHM_FIXED_WINDOW, ExpireAtUnixNano: 9,
			Words: []int64{1, 1, 0}, ResetAtUnixNano: 5, ResetUntilUnixNano: 7}, nil},
	} {
		got, err := resetKeyFromProto(tt.m)
		if tt.want == nil {
			// Only the name, key and mark of a reset are read.
			if want := (limiter.Snapshot{Name: "n", Key: "k", Algorithm: limiter.FixedWindow, ResetAt: 5, ResetUntil: 7}); err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("%s: %+v, %v, want %+v", tt.name, got, err, want)
			}
		} else if !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
}
