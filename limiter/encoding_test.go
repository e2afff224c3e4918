package limiter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
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
		a.RateLimit == b.RateLimit && a.RateBurst == b.RateBurst && a.RatePeriod == b.RatePeriod
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
			b, err := sn.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			var got Snapshot
			if err := got.UnmarshalBinary(b); err != nil {
				t.Fatal(err)
			}
			if !sameSnapshot(got, sn) {
				t.Fatalf("%s: decoded %+v, want %+v", a, got, sn)
			}
			return true
		})
		if seen != 1 {
			t.Fatalf("%s: %d snapshots, want 1", a, seen)
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
	steps := []struct {
		name    string
		data    []byte
		wantErr error
		wantMsg string
	}{
		{"empty", nil, ErrStateFormat, "format version"},
		{"version 2", append([]byte{2}, bucket[1:]...), ErrStateFormat, "format version 2"},
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
	})
}
