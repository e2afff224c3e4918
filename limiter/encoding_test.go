package limiter

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestStateFormatRoundTrip: every state a store exports, of every
// algorithm, decodes from its encoding to the same snapshot, and encodes
// again to the same bytes.
func TestStateFormatRoundTrip(t *testing.T) {
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(a)))
			for trace := range 200 {
				_, s, now := randomTrace(t, rng, a)
				s.Range(nsTime(now), func(sn Snapshot) bool {
					b, err := sn.MarshalBinary()
					if err != nil {
						t.Fatalf("trace %d: encode %+v: %v", trace, sn, err)
					}
					var got Snapshot
					if err := got.UnmarshalBinary(b); err != nil {
						t.Fatalf("trace %d: decode %+v: %v", trace, sn, err)
					}
					if !sameSnapshot(got, sn) {
						t.Fatalf("trace %d: decoded %+v, want %+v", trace, got, sn)
					}
					again, _ := got.MarshalBinary()
					if !bytes.Equal(again, b) {
						t.Fatalf("trace %d: encodings differ: %x, %x", trace, again, b)
					}
					return true
				})
			}
		})
	}
}

// reencoded is sn encoded in the state format and decoded again.
func reencoded(t testing.TB, sn Snapshot) Snapshot {
	t.Helper()
	b, err := sn.MarshalBinary()
	if err != nil {
		t.Fatalf("encode %+v: %v", sn, err)
	}
	var got Snapshot
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatalf("decode %x: %v", b, err)
	}
	return got
}

func sameSnapshot(a, b Snapshot) bool {
	if len(a.Log) != len(b.Log) {
		return false
	}
	for i := range a.Log {
		if a.Log[i] != b.Log[i] {
			return false
		}
	}
	return a.Name == b.Name && a.Key == b.Key && a.Algorithm == b.Algorithm && a.ExpireAt == b.ExpireAt && a.Words == b.Words &&
		a.RateLimit == b.RateLimit && a.RateBurst == b.RateBurst && a.RatePeriod == b.RatePeriod &&
		a.RateCalendar == b.RateCalendar && zoneName(a.RateLocation) == zoneName(b.RateLocation) &&
		a.ResetAt == b.ResetAt && a.ResetUntil == b.ResetUntil
}

// The state format's bytes of one fixed window's state with a rate, in
// version 1 (a 1m Period) and in version 2 (a calendar day in
// Europe/Paris): files and messages written in either are read as they
// are, and a state that version 1 holds is still written as version 1.
var (
	goldenV1 = "0103016e016b8080c0ece9d9b6c1370a0a80e0ba84bf0380d8e9b2e2d9b6c13707"
	goldenV2 = "0203016e016b8080c0ece9d9b6c1370a0a00030c4575726f70652f506172697380d8e9b2e2d9b6c13707"
)

func goldenSnapshot() Snapshot {
	return Snapshot{Name: "n", Key: "k", Algorithm: FixedWindow, ExpireAt: 2e18, Words: [3]int64{1_999_999_999e9, 7, 0},
		RateLimit: 10, RateBurst: 10, RatePeriod: time.Minute}
}

// TestStateFormatVersions: a version 1 encoding (the previous release's)
// decodes to its state and is what a state without a calendar rate still
// encodes to; a calendar window's rate is written as version 2; a version
// 2 state without one is read too.
func TestStateFormatVersions(t *testing.T) {
	v1 := goldenSnapshot()
	v2 := goldenSnapshot()
	v2.RatePeriod, v2.RateCalendar, v2.RateLocation = 0, Day, mustZone("Europe/Paris")
	for _, g := range []struct {
		hex  string
		want Snapshot
	}{{goldenV1, v1}, {goldenV2, v2}} {
		data, _ := hex.DecodeString(g.hex)
		var got Snapshot
		if err := got.UnmarshalBinary(data); err != nil {
			t.Fatalf("%s: %v", g.hex, err)
		}
		if !sameSnapshot(got, g.want) {
			t.Fatalf("%s decoded to %+v, want %+v", g.hex, got, g.want)
		}
		b, err := g.want.MarshalBinary()
		if err != nil || hex.EncodeToString(b) != g.hex {
			t.Fatalf("%+v encoded to %x (%v), want %s", g.want, b, err, g.hex)
		}
	}
	// Version 2 with no calendar: the calendar byte 0 and an empty zone.
	data, _ := hex.DecodeString(goldenV1)
	noCal := append([]byte{2}, data[1:len(data)-10]...)
	noCal = append(noCal, 0, 0)
	noCal = append(noCal, data[len(data)-10:]...)
	var got Snapshot
	if err := got.UnmarshalBinary(noCal); err != nil || !sameSnapshot(got, v1) {
		t.Fatalf("version 2 without a calendar: %+v, %v", got, err)
	}
}

// TestStateFormatKeepsRate: the rate a KeepStrictest store charged a key
// under travels with its state, so that a node restoring it from disk
// decides the key at no laxer rate.
func TestStateFormatKeepsRate(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)
	for _, a := range Algorithms {
		s := newStrictStore(t)
		req := Request{Name: "n", Key: "k", Hits: 3, Limit: 10, Period: time.Minute, Algorithm: a}
		if _, err := s.CheckAt(req, t0); err != nil {
			t.Fatal(err)
		}
		seen := 0
		s.Range(t0, func(sn Snapshot) bool {
			seen++
			if sn.RateLimit != 10 || sn.RatePeriod != time.Minute {
				t.Fatalf("%s: snapshot rate %d/%s, want 10/1m", a, sn.RateLimit, sn.RatePeriod)
			}
			if got := reencoded(t, sn); !sameSnapshot(got, sn) {
				t.Fatalf("%s: decoded %+v, want %+v", a, got, sn)
			}
			return true
		})
		if seen != 1 {
			t.Fatalf("%s: %d snapshots, want 1", a, seen)
		}
	}
}

// TestStateFormatKeepsCalendarRate: a calendar window's rate, its unit and
// zone, travels with its state, in version 2.
func TestStateFormatKeepsCalendarRate(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)
	for _, loc := range []*time.Location{nil, time.UTC, mustZone("Asia/Kathmandu"), mustZone("America/Argentina/Buenos_Aires")} {
		for c := Minute; c < numCalendars; c++ {
			s := newStrictStore(t)
			req := Request{Name: "n", Key: "k", Hits: 3, Limit: 10, Algorithm: FixedWindow, Calendar: c, Location: loc}
			if _, err := s.CheckAt(req, t0); err != nil {
				t.Fatal(err)
			}
			sn := snapOf(t, s, req, t0)
			if sn.RateLimit != 10 || sn.RateBurst != 10 || sn.RatePeriod != 0 || sn.RateCalendar != c || zoneName(sn.RateLocation) != zoneName(loc) {
				t.Fatalf("%s in %v: snapshot rate %+v", c, loc, sn)
			}
			if b, err := sn.MarshalBinary(); err != nil || b[0] != 2 {
				t.Fatalf("%s in %v: written as %x, %v, want version 2", c, loc, b, err)
			}
			if got := reencoded(t, sn); !sameSnapshot(got, sn) {
				t.Fatalf("%s in %v: decoded %+v, want %+v", c, loc, got, sn)
			}
		}
	}
}

// TestStateFormatRefuses: each damaged or foreign encoding is refused with
// an error that names what is wrong.
func TestStateFormatRefuses(t *testing.T) {
	good := func(a Algorithm) []byte {
		sn := Snapshot{Name: "n", Key: "k", Algorithm: a, ExpireAt: 1e18}
		switch a {
		case GCRA:
			sn.Words = [3]int64{1e18, 1000, 0}
		case SlidingWindowLog:
			sn.Log = []LogEntry{{At: 10, Hits: 2}, {At: 20, Hits: 3}}
		case FixedWindow, SlidingWindowCounter:
			sn.Words = [3]int64{5, 3, 0}
		}
		b, err := sn.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	bucket, logState := good(TokenBucket), good(SlidingWindowLog)
	// v2 is goldenV2 up to its zone (a day in Europe/Paris); withZone
	// follows it with a zone and the window.
	v2, _ := hex.DecodeString(goldenV2)
	calAt := len(v2) - 10 - 1 - len("Europe/Paris") - 1 // the calendar byte
	withCal := func(code byte, zone string) []byte {
		b := append(bytes.Clone(v2[:calAt]), code)
		b = binary.AppendUvarint(b, uint64(len(zone)))
		b = append(b, zone...)
		return append(b, v2[len(v2)-10:]...)
	}
	withPeriod := func(b []byte) []byte { // rate period 1m instead of 0
		b = bytes.Clone(b)
		return slices.Concat(b[:calAt-1], []byte{0x80, 0xe0, 0xba, 0x84, 0xbf, 0x03}, b[calAt:])
	}
	asBucket := bytes.Clone(v2[:len(v2)-10]) // the window replaced by a bucket's level and time
	asBucket[1] = 1
	asBucket = binary.AppendVarint(binary.LittleEndian.AppendUint64(asBucket, 0), 5)
	steps := []struct {
		name    string
		data    []byte
		wantErr error
		wantMsg string
	}{
		{"empty", nil, ErrStateFormat, "format version"},
		{"version 4", append([]byte{4}, bucket[1:]...), ErrStateFormat, "format version 4, this node reads versions 1 to 3"},
		{"version 0", append([]byte{0}, bucket[1:]...), ErrStateFormat, "format version 0"},
		{"algorithm 0", append([]byte{1, 0}, bucket[2:]...), ErrStateFormat, "algorithm code 0"},
		{"algorithm 9", append([]byte{1, 9}, bucket[2:]...), ErrStateFormat, "algorithm code 9"},
		{"name too long", binary.AppendUvarint([]byte{1, 1}, MaxNameLen+1), ErrStateFormat, "name: 129 bytes"},
		{"name truncated", []byte{1, 1, 5, 'a'}, ErrStateFormat, "name: truncated"},
		{"key too long", binary.AppendUvarint([]byte{1, 1, 1, 'n'}, 1<<40), ErrStateFormat, "key: 1099511627776 bytes"},
		{"bucket truncated", bucket[:len(bucket)-3], ErrStateFormat, "truncated"},
		{"trailing byte", append(append([]byte(nil), bucket...), 0), ErrStateFormat, "1 bytes after"},
		{"overlong varint", append([]byte{1, 1, 1, 'n', 1, 'k'}, bytes.Repeat([]byte{0xff}, 11)...), ErrStateFormat, "expiry: truncated or overlong"},
		{"log too long", binary.AppendUvarint(bytes.Clone(logState[:len(logState)-5]), MaxSnapshotLog+1), ErrStateFormat, "log of 4097 entries"},
		{"log gap zero", append(bytes.Clone(logState[:len(logState)-2]), 0, 3), ErrInvalidSnapshot, "not after"},
		{"huge input", make([]byte, MaxEncodedState+1), ErrStateFormat, "more than the maximum"},
		{"calendar code 7", withCal(7, ""), ErrStateFormat, "unknown calendar unit code 7"},
		{"calendar code 255", withCal(255, "UTC"), ErrStateFormat, "unknown calendar unit code 255"},
		{"zone too long", withCal(3, strings.Repeat("a", MaxZoneNameLen+1)), ErrStateFormat, "rate zone: 65 bytes"},
		{"zone length huge", binary.AppendUvarint(bytes.Clone(v2[:calAt+1]), 1<<40), ErrStateFormat, "rate zone: 1099511627776 bytes"},
		{"zone truncated", v2[:calAt+4], ErrStateFormat, "rate zone: truncated"},
		{"zone path", withCal(3, "../../etc/passwd"), ErrInvalidLocation, "not an IANA zone name"},
		{"zone absolute", withCal(3, "/etc/localtime"), ErrInvalidLocation, "not an IANA zone name"},
		{"zone Local", withCal(3, "Local"), ErrInvalidLocation, "differs from node to node"},
		{"zone unknown", withCal(3, "Mars/Olympus_Mons"), ErrInvalidLocation, "does not load"},
		{"zone without calendar", withCal(0, "Europe/Paris"), ErrInvalidSnapshot, "without a calendar unit"},
		{"calendar with period", withPeriod(v2), ErrInvalidSnapshot, "with calendar unit day"},
		{"calendar on a bucket", asBucket, ErrInvalidCalendar, "needs Algorithm fixed_window"},
		{"fixed window over limit", binary.AppendUvarint(good(FixedWindow)[:len(good(FixedWindow))-1], MaxLimit+1), ErrInvalidSnapshot, "window count"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			var sn Snapshot
			err := sn.UnmarshalBinary(s.data)
			if !errors.Is(err, s.wantErr) || !strings.Contains(err.Error(), s.wantMsg) {
				t.Fatalf("error %v, want %v containing %q", err, s.wantErr, s.wantMsg)
			}
			if sn.Name != "" {
				t.Fatalf("a refused decode set %+v", sn)
			}
		})
	}
}

// FuzzStateFormat: any bytes decode to a valid snapshot or to an error,
// never a panic; what decodes encodes back to the same state and merges
// into a store.
func FuzzStateFormat(f *testing.F) {
	for _, a := range Algorithms {
		sn := Snapshot{Name: "n", Key: "k", Algorithm: a, ExpireAt: t0.UnixNano() + 1e9}
		switch a {
		case GCRA:
			sn.Words = [3]int64{t0.UnixNano(), 1000, 0}
		case SlidingWindowLog:
			sn.Log = []LogEntry{{At: t0.UnixNano(), Hits: 2}}
		}
		b, _ := sn.MarshalBinary()
		f.Add(b)
	}
	// Version 2: calendar rates in zones, a version 1 state as version 2,
	// and damaged calendar fields.
	for _, g := range []string{goldenV1, goldenV2} {
		b, _ := hex.DecodeString(g)
		f.Add(b)
	}
	for _, c := range []struct {
		cal Calendar
		loc *time.Location
	}{{Minute, nil}, {Week, mustZone("Asia/Kathmandu")}, {Year, mustZone("America/Argentina/Buenos_Aires")}} {
		sn := Snapshot{Name: "n", Key: "k", Algorithm: FixedWindow, ExpireAt: t0.UnixNano() + 1e9, Words: [3]int64{t0.UnixNano(), 3, 0},
			RateLimit: 5, RateBurst: 5, RateCalendar: c.cal, RateLocation: c.loc}
		b, _ := sn.MarshalBinary()
		f.Add(b)
		f.Add(bytes.ReplaceAll(b, []byte("Asia"), []byte("../a")))
		f.Add(bytes.ReplaceAll(b, []byte("Argentina"), []byte("Argentinx")))
	}
	// Version 3: reset marks, with a state and alone.
	for _, a := range Algorithms {
		sn := Snapshot{Name: "n", Key: "k", Algorithm: a, ResetAt: t0.UnixNano() - 1e9, ResetUntil: t0.UnixNano() + 1e9}
		b, _ := sn.MarshalBinary()
		f.Add(b)
	}
	withMark := goldenSnapshot()
	withMark.ExpireAt, withMark.Words[0] = t0.UnixNano()+1e9, t0.UnixNano()/60e9*60e9
	withMark.ResetAt, withMark.ResetUntil = t0.UnixNano()-1e9, t0.UnixNano()+1e9
	if b, err := withMark.MarshalBinary(); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var sn Snapshot
		if err := sn.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, ErrStateFormat) && !errors.Is(err, ErrInvalidSnapshot) {
				t.Fatalf("error %v wraps neither sentinel", err)
			}
			return
		}
		if err := sn.Validate(); err != nil {
			t.Fatalf("decoded an invalid snapshot %+v: %v", sn, err)
		}
		// Varints may be written longer than needed: the state, not the
		// bytes, must survive a second round.
		b, err := sn.MarshalBinary()
		var again Snapshot
		if err != nil || again.UnmarshalBinary(b) != nil || !sameSnapshot(again, sn) {
			t.Fatalf("re-encoded %x (%v) to %+v, decoded %+v from %x", b, err, again, sn, data)
		}
		s := newTestStore(t)
		s.Merge([]Snapshot{sn}, t0) // may refuse times too far off; must not panic
		// A KeepStrictest store takes the rate too, and decides a
		// check at another rate against it.
		strict := newStrictStore(t)
		strict.Merge([]Snapshot{sn}, t0)
		req := Request{Name: sn.Name, Key: sn.Key, Hits: 1, Limit: 5, Period: time.Second, Algorithm: sn.Algorithm}
		if _, err := strict.CheckAt(req, t0); err != nil {
			t.Fatalf("a check after merging %+v: %v", sn, err)
		}
	})
}
