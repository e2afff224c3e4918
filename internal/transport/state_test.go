package transport

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// liveSnapshots returns a snapshot of every algorithm, taken from a store.
func liveSnapshots(tb testing.TB) []limiter.Snapshot {
	tb.Helper()
	s, err := limiter.NewStore(limiter.StoreConfig{Shards: 1, KeepStrictest: true}) // rates too
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	for _, a := range limiter.Algorithms {
		req := limiter.Request{Name: "api", Key: a.String(), Hits: 3, Limit: 10, Period: time.Minute, Algorithm: a}
		for i := range 3 {
			if _, err := s.CheckAt(req, now.Add(time.Duration(i)*time.Second)); err != nil {
				tb.Fatal(err)
			}
		}
	}
	var out []limiter.Snapshot
	s.Range(now, func(sn limiter.Snapshot) bool {
		out = append(out, sn)
		return true
	})
	if len(out) != len(limiter.Algorithms) {
		tb.Fatalf("%d snapshots, want %d", len(out), len(limiter.Algorithms))
	}
	return out
}

// overTheWire is sn's KeyState, encoded and decoded as protobuf, and the
// size of its encoding.
func overTheWire(t *testing.T, sn *limiter.Snapshot) (*pb.KeyState, int) {
	t.Helper()
	b, err := proto.Marshal(SnapshotToProto(sn))
	if err != nil {
		t.Fatal(err)
	}
	m := new(pb.KeyState)
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	return m, len(b)
}

func TestSnapshotProtoRoundTrip(t *testing.T) {
	for _, sn := range liveSnapshots(t) {
		if sn.RateLimit != 10 || sn.RatePeriod != time.Minute {
			t.Fatalf("%s: snapshot rate %d per %v, want the store's 10 per 1m", sn.Algorithm, sn.RateLimit, sn.RatePeriod)
		}
		m, _ := overTheWire(t, &sn)
		got, err := SnapshotFromProto(m)
		if err != nil {
			t.Fatalf("%s: %v", sn.Algorithm, err)
		}
		if !reflect.DeepEqual(got, sn) {
			t.Errorf("%s: round trip gave %+v, want %+v", sn.Algorithm, got, sn)
		}
		// A member that reads only the earlier form (words and log)
		// reads the same state from the same message.
		old, err := snapshotFromWords(m)
		if err != nil || !reflect.DeepEqual(old, sn) {
			t.Errorf("%s: earlier form gave %+v, %v, want %+v", sn.Algorithm, old, err, sn)
		}
		// And a message from such a member, without state, reads too.
		m.State = nil
		if got, err := SnapshotFromProto(m); err != nil || !reflect.DeepEqual(got, sn) {
			t.Errorf("%s: message without state gave %+v, %v, want %+v", sn.Algorithm, got, err, sn)
		}
	}
}

// calendarSnapshots returns snapshots of fixed windows charged under
// calendar rates, in UTC and in zones, taken from a KeepStrictest store.
func calendarSnapshots(tb testing.TB) []limiter.Snapshot {
	tb.Helper()
	s, err := limiter.NewStore(limiter.StoreConfig{Shards: 1, KeepStrictest: true})
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	var out []limiter.Snapshot
	for i, zone := range []string{"", "Europe/Paris", "America/Argentina/Buenos_Aires"} {
		loc, err := limiter.LoadZone(zone)
		if err != nil {
			tb.Fatal(err)
		}
		req := limiter.Request{Name: "api", Key: "cal-" + zone, Hits: 3, Limit: 10, Algorithm: limiter.FixedWindow,
			Calendar: []limiter.Calendar{limiter.Day, limiter.Week, limiter.Month}[i], Location: loc}
		if _, err := s.CheckAt(req, now); err != nil {
			tb.Fatal(err)
		}
		sn, ok := s.Snapshot(req.Name, req.Key, now)
		if !ok || sn.RateCalendar != req.Calendar || sn.RateLocation != loc || sn.RateLimit != 10 {
			tb.Fatalf("snapshot of %+v: %+v, %v", req, sn, ok)
		}
		out = append(out, sn)
	}
	return out
}

// TestSnapshotProtoCalendarRate: a calendar window's rate crosses the
// wire with its unit and zone, beside a state of format version 1, which
// members of the previous release read (without the rate); a message of
// such a member, without the calendar fields, reads as its state alone.
func TestSnapshotProtoCalendarRate(t *testing.T) {
	for _, sn := range calendarSnapshots(t) {
		m, size := overTheWire(t, &sn)
		if len(m.State) == 0 || m.State[0] != 1 {
			t.Fatalf("%s: state %x, want format version 1", sn.Key, m.State)
		}
		got, err := SnapshotFromProto(m)
		if err != nil || !reflect.DeepEqual(got, sn) {
			t.Errorf("%s: round trip gave %+v, %v, want %+v", sn.Key, got, err, sn)
		}
		old, err := snapshotFromWords(m)
		if err != nil || !reflect.DeepEqual(old, sn) {
			t.Errorf("%s: earlier form gave %+v, %v, want %+v", sn.Key, old, err, sn)
		}
		// What a member without the calendar fields reads: the state,
		// without its rate.
		var v1 limiter.Snapshot
		if err := v1.UnmarshalBinary(m.State); err != nil || v1.RateLimit != 0 || v1.Words != sn.Words || v1.ExpireAt != sn.ExpireAt {
			t.Errorf("%s: the state alone reads %+v, %v", sn.Key, v1, err)
		}
		m.RateCalendar, m.RateTimeZone = 0, ""
		if got, err := SnapshotFromProto(m); err != nil || got.RateLimit != 0 || got.Words != sn.Words {
			t.Errorf("%s: without the calendar fields: %+v, %v", sn.Key, got, err)
		}
		if size := 1 + protowire.SizeBytes(size); size > stateSize(&sn) {
			t.Errorf("%s: takes %d bytes, more than its bound %d", sn.Key, size, stateSize(&sn))
		}
	}
}

// TestSnapshotFromProtoCalendarRejects: the calendar rate beside a state
// or the earlier form is checked before a zone is loaded, and validated
// with the state.
func TestSnapshotFromProtoCalendarRejects(t *testing.T) {
	good := SnapshotToProto(&calendarSnapshots(t)[1])
	withRate := SnapshotToProto(&liveSnapshots(t)[0])
	tests := []struct {
		name string
		mut  func(*pb.KeyState)
		want error
	}{
		{"unknown unit", func(m *pb.KeyState) { m.RateCalendar = 99 }, ErrInvalidArgument},
		{"negative unit", func(m *pb.KeyState) { m.RateCalendar = -1 }, ErrInvalidArgument},
		{"zone too long", func(m *pb.KeyState) { m.RateTimeZone = strings.Repeat("a", limiter.MaxZoneNameLen+1) }, limiter.ErrInvalidLocation},
		{"zone path", func(m *pb.KeyState) { m.RateTimeZone = "../../../etc/passwd" }, limiter.ErrInvalidLocation},
		{"zone Local", func(m *pb.KeyState) { m.RateTimeZone = "Local" }, limiter.ErrInvalidLocation},
		{"zone unknown", func(m *pb.KeyState) { m.RateTimeZone = "Mars/Olympus_Mons" }, limiter.ErrInvalidLocation},
		{"zone without unit", func(m *pb.KeyState) { m.RateCalendar = 0 }, ErrInvalidArgument},
		{"with a period", func(m *pb.KeyState) { m.RatePeriodNanos = int64(time.Minute) }, limiter.ErrInvalidSnapshot},
		{"without a limit", func(m *pb.KeyState) { m.RateLimit = 0 }, limiter.ErrInvalidSnapshot},
		{"burst unlike the limit", func(m *pb.KeyState) { m.RateBurst = 11 }, limiter.ErrInvalidSnapshot},
		{"rate in the state too", func(m *pb.KeyState) {
			m.State = withRate.State
			m.Name, m.Key, m.Algorithm = withRate.Name, withRate.Key, withRate.Algorithm
		}, ErrInvalidArgument},
	}
	for _, tt := range tests {
		for _, form := range []string{"state", "words"} {
			if form == "words" && tt.name == "rate in the state too" {
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
	// A calendar rate of an algorithm other than the fixed window.
	m := proto.Clone(withRate).(*pb.KeyState)
	if m.Algorithm == pb.Algorithm_ALGORITHM_FIXED_WINDOW {
		t.Fatal("liveSnapshots' first is a fixed window")
	}
	m.State, m.RatePeriodNanos, m.RateCalendar = nil, 0, pb.Calendar_CALENDAR_DAY
	if _, err := SnapshotFromProto(m); !errors.Is(err, limiter.ErrInvalidCalendar) {
		t.Errorf("calendar rate of %s: %v, want ErrInvalidCalendar", m.Algorithm, err)
	}
}

// TestSnapshotFromProtoStateWins: with state set, the words beside it are
// not read, and a state that disagrees with the message's fields, is
// damaged or is of a format version this node does not know is refused.
func TestSnapshotFromProtoStateWins(t *testing.T) {
	good := SnapshotToProto(&liveSnapshots(t)[0])
	tests := []struct {
		name string
		mut  func(*pb.KeyState)
		want error // nil: accepted
	}{
		{"words damaged", func(m *pb.KeyState) { m.Words = []int64{-1} }, nil},
		{"other key", func(m *pb.KeyState) { m.Key = "other" }, ErrInvalidArgument},
		{"other algorithm", func(m *pb.KeyState) { m.Algorithm = m.Algorithm%6 + 1 }, ErrInvalidArgument},
		{"truncated state", func(m *pb.KeyState) { m.State = m.State[:len(m.State)-1] }, limiter.ErrStateFormat},
		{"format version 4", func(m *pb.KeyState) { m.State[0] = 4 }, limiter.ErrStateFormat},
	}
	for _, tt := range tests {
		m := proto.Clone(good).(*pb.KeyState)
		tt.mut(m)
		_, err := SnapshotFromProto(m)
		if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
}

// TestSnapshotFromProtoRejects: the earlier form, without state, is
// checked field by field.
func TestSnapshotFromProtoRejects(t *testing.T) {
	good := SnapshotToProto(&liveSnapshots(t)[0])
	good.State = nil
	tests := []struct {
		name string
		mut  func(*pb.KeyState)
		want error
	}{
		{"two words", func(m *pb.KeyState) { m.Words = m.Words[:2] }, ErrInvalidArgument},
		{"unknown algorithm", func(m *pb.KeyState) { m.Algorithm = 42 }, ErrInvalidArgument},
		{"unspecified algorithm", func(m *pb.KeyState) { m.Algorithm = 0 }, ErrInvalidArgument},
		{"nil log entry", func(m *pb.KeyState) {
			m.Algorithm, m.Words = pb.Algorithm_ALGORITHM_SLIDING_WINDOW_LOG, []int64{0, 0, 0}
			m.Log = []*pb.LogEntry{nil}
		}, ErrInvalidArgument},
		{"empty key", func(m *pb.KeyState) { m.Key = "" }, limiter.ErrInvalidSnapshot},
		{"negative count", func(m *pb.KeyState) {
			m.Algorithm, m.Words = pb.Algorithm_ALGORITHM_FIXED_WINDOW, []int64{1, -5, 0}
		}, limiter.ErrInvalidSnapshot},
		{"rate without a period", func(m *pb.KeyState) { m.RatePeriodNanos = 0 }, limiter.ErrInvalidSnapshot},
		{"negative rate", func(m *pb.KeyState) { m.RateLimit = -1 }, limiter.ErrInvalidSnapshot},
		{"rate above MaxLimit", func(m *pb.KeyState) { m.RateLimit, m.RateBurst = 2*limiter.MaxLimit, 2*limiter.MaxLimit }, limiter.ErrInvalidSnapshot},
	}
	for _, tt := range tests {
		m := proto.Clone(good).(*pb.KeyState)
		tt.mut(m)
		if _, err := SnapshotFromProto(m); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	if _, err := SnapshotFromProto(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("nil: %v", err)
	}
}

func TestLeaseFromProto(t *testing.T) {
	ok := &pb.LeaseResponse{Granted: 5, ExpiresAtUnixNano: 10, Decision: &pb.RateLimitResponse{Allowed: true, Limit: 10}}
	if l, err := LeaseFromProto(ok, 5); err != nil || l.Granted != 5 || !l.Decision.Allowed {
		t.Errorf("valid lease: %+v, %v", l, err)
	}
	dur := &pb.LeaseResponse{Granted: 5, ValidForNanos: int64(time.Second), Decision: &pb.RateLimitResponse{Allowed: true, Limit: 10}}
	if l, err := LeaseFromProto(dur, 5); err != nil || l.ValidFor != time.Second {
		t.Errorf("lease with a duration only: %+v, %v", l, err)
	}
	for name, m := range map[string]*pb.LeaseResponse{
		"negative duration":   {Granted: 1, ExpiresAtUnixNano: 10, ValidForNanos: -1, Decision: &pb.RateLimitResponse{}},
		"duration over a TTL": {Granted: 1, ValidForNanos: int64(MaxLeaseTTL) + 1, Decision: &pb.RateLimitResponse{}},
		"nil":                 nil,
		"more than want":      {Granted: 6, ExpiresAtUnixNano: 10, Decision: &pb.RateLimitResponse{}},
		"negative":            {Granted: -1, Decision: &pb.RateLimitResponse{}},
		"no expiry":           {Granted: 1, Decision: &pb.RateLimitResponse{}},
		"bad decision":        {Granted: 1, ExpiresAtUnixNano: 10, Decision: &pb.RateLimitResponse{RetryAfterNanos: -1}},
	} {
		if _, err := LeaseFromProto(m, 5); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzSnapshotFromProto decodes arbitrary bytes as a key state. It must
// never panic, and what it accepts must merge into a store at an instant
// none of its times is ahead of.
func FuzzSnapshotFromProto(f *testing.F) {
	for _, sn := range liveSnapshots(f) {
		b, err := proto.Marshal(SnapshotToProto(&sn))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, sn := range calendarSnapshots(f) {
		m := SnapshotToProto(&sn)
		for _, zone := range []string{m.RateTimeZone, "../x", "Local", "Mars/Olympus_Mons"} {
			m.RateTimeZone = zone
			b, err := proto.Marshal(m)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
		m.State = nil
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x2a, 0x03, 0x01, 0x02, 0x03})
	f.Fuzz(func(t *testing.T, data []byte) {
		m := new(pb.KeyState)
		if err := proto.Unmarshal(data, m); err != nil {
			return
		}
		sn, err := SnapshotFromProto(m)
		if err != nil {
			return
		}
		s, err := limiter.NewStore(limiter.StoreConfig{Shards: 1, KeepStrictest: true}) // rates too
		if err != nil {
			t.Fatal(err)
		}
		// Merged at an instant its times are not ahead of, which
		// Merge refuses (limiter.MaxClockSkew).
		now := max(sn.ExpireAt-1, sn.Words[0], sn.Words[1])
		if n := len(sn.Log); n > 0 {
			now = max(now, sn.Log[n-1].At)
		}
		if _, err := s.Merge([]limiter.Snapshot{sn}, time.Unix(0, now)); err != nil {
			t.Fatalf("accepted snapshot %+v does not merge at %d: %v", sn, now, err)
		}
	})
}

// FuzzLeaseFromProto decodes arbitrary bytes as a lease response. It must
// never panic, and what it accepts must hold: granted within the want, a
// lease of hits expiring, no negative duration.
func FuzzLeaseFromProto(f *testing.F) {
	for _, m := range []*pb.LeaseResponse{
		{Granted: 5, ExpiresAtUnixNano: 10, Decision: &pb.RateLimitResponse{Allowed: true, Limit: 10, Remaining: 5}},
		{Decision: &pb.RateLimitResponse{Limit: 10, RetryAfterNanos: 1000}},
		{Granted: -1},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, int64(5))
	}
	f.Fuzz(func(t *testing.T, data []byte, want int64) {
		m := new(pb.LeaseResponse)
		if err := proto.Unmarshal(data, m); err != nil {
			return
		}
		l, err := LeaseFromProto(m, want)
		if err != nil {
			return
		}
		if l.Granted < 0 || l.Granted > want || (l.Granted > 0 && l.ExpiresAt.IsZero()) {
			t.Fatalf("accepted lease %+v for want %d", l, want)
		}
		if l.Decision.RetryAfter < 0 || l.Decision.Delay < 0 || l.Decision.Remaining < 0 {
			t.Fatalf("accepted a negative decision field: %+v", l.Decision)
		}
	})
}
