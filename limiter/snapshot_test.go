package limiter

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// snapOf returns the live snapshot of req's key in s, failing if none.
func snapOf(t *testing.T, s *Store, req Request, now time.Time) Snapshot {
	t.Helper()
	sn, ok := s.Snapshot(req.Name, req.Key, now)
	if !ok {
		t.Fatalf("%s: no live snapshot of %s/%s", req.Algorithm, req.Name, req.Key)
	}
	return sn
}

// randomTrace returns a store that has decided a random trace of 1 to 20
// requests of algorithm a, the request and the time after its last step.
func randomTrace(t *testing.T, rng *rand.Rand, a Algorithm) (Request, *Store, int64) {
	t.Helper()
	req := randomRequest(t, rng, a)
	s := newTestStore(t)
	now := randomStart(rng)
	for range 1 + rng.IntN(20) {
		r := req
		r.Hits = randomHits(rng, req.Capacity())
		if _, err := s.CheckAt(r, nsTime(now)); err != nil {
			t.Fatal(err)
		}
		now += randomGap(rng, req)
	}
	return req, s, now
}

func mustMerge(t *testing.T, s *Store, snaps []Snapshot, now time.Time) int {
	t.Helper()
	n, err := s.Merge(snaps, now)
	if err != nil {
		t.Fatalf("Merge: %v", err)
	}
	return n
}

// TestSnapshotRoundTrip: a store that merges another's snapshots into an
// empty store decides every later request exactly as the original does.
func TestSnapshotRoundTrip(t *testing.T) {
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(a)))
			for trace := range 200 {
				req, orig, now := randomTrace(t, rng, a)
				copyStore := newTestStore(t)
				var snaps []Snapshot
				orig.Range(nsTime(now), func(sn Snapshot) bool {
					snaps = append(snaps, sn)
					return true
				})
				mustMerge(t, copyStore, snaps, nsTime(now))
				for i := range 10 {
					r := req
					r.Hits = randomHits(rng, req.Capacity())
					d1, err1 := orig.CheckAt(r, nsTime(now))
					d2, err2 := copyStore.CheckAt(r, nsTime(now))
					if err1 != nil || err2 != nil {
						t.Fatal(err1, err2)
					}
					if d1 != d2 {
						t.Fatalf("trace %d step %d: original %+v, copy %+v", trace, i, d1, d2)
					}
					now += randomGap(rng, req)
				}
			}
		})
	}
}

// TestMergeMoreConsumedWins: merging either way keeps the state that has
// consumed more, for every algorithm.
func TestMergeMoreConsumedWins(t *testing.T) {
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			req := Request{Name: "n", Key: "k", Limit: 1000, Period: time.Hour, Algorithm: a}
			more, less := newTestStore(t), newTestStore(t)
			consume := func(s *Store, hits int64, at time.Time) {
				r := req
				r.Hits = hits
				if d, err := s.CheckAt(r, at); err != nil || !d.Allowed {
					t.Fatalf("consume %d: %+v %v", hits, d, err)
				}
			}
			consume(less, 300, t0)
			consume(more, 600, t0.Add(time.Millisecond))
			now := t0.Add(2 * time.Millisecond)
			remaining := func(s *Store) int64 {
				r := req
				r.Hits = 0
				d, err := s.CheckAt(r, now)
				if err != nil {
					t.Fatal(err)
				}
				return d.Remaining
			}
			want := remaining(more)
			if want > 400 {
				t.Fatalf("after 600 of 1000, %d remain", want)
			}
			if n := mustMerge(t, less, []Snapshot{snapOf(t, more, req, now)}, now); n != 1 {
				t.Errorf("merging the more consumed state changed %d keys, want 1", n)
			}
			if got := remaining(less); got != want {
				t.Errorf("after merging the more consumed state: %d remain, want %d", got, want)
			}
			lessSnap := Snapshot{}
			other := newTestStore(t)
			consume(other, 300, t0)
			lessSnap = snapOf(t, other, req, now)
			if n := mustMerge(t, more, []Snapshot{lessSnap}, now); n != 0 {
				t.Errorf("merging the less consumed state changed %d keys, want 0", n)
			}
			if got := remaining(more); got != want {
				t.Errorf("after merging the less consumed state: %d remain, want %d", got, want)
			}
		})
	}
}

// TestMergeLaterWindow: a sliding window counter merged with one of the
// previous window keeps the later window and carries the earlier window's
// count as its previous one.
func TestMergeLaterWindow(t *testing.T) {
	for _, a := range []Algorithm{SlidingWindowCounter} {
		req := Request{Name: "n", Key: "k", Hits: 10, Limit: 100, Period: time.Minute, Algorithm: a}
		old, cur := newTestStore(t), newTestStore(t)
		if _, err := old.CheckAt(req, t0); err != nil {
			t.Fatal(err)
		}
		now := t0.Add(time.Minute)
		req.Hits = 5
		if _, err := cur.CheckAt(req, now); err != nil {
			t.Fatal(err)
		}
		mustMerge(t, cur, []Snapshot{snapOf(t, old, req, now)}, now)
		got := snapOf(t, cur, req, now)
		if got.Words[0] != now.UnixNano() || got.Words[1] != 5 {
			t.Errorf("%s: merged window start %v count %d, want %v and 5", a, nsTime(got.Words[0]), got.Words[1], now)
		}
		if got.Words[2] != 10 {
			t.Errorf("%s: previous window count %d, want 10", a, got.Words[2])
		}
	}
}

func TestSnapshotValidate(t *testing.T) {
	good := Snapshot{Name: "n", Key: "k", Algorithm: FixedWindow, ExpireAt: t0.UnixNano(), Words: [3]int64{t0.UnixNano(), 3, 0}}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid snapshot: %v", err)
	}
	tests := []struct {
		name string
		mut  func(*Snapshot)
	}{
		{"empty name", func(s *Snapshot) { s.Name = "" }},
		{"long key", func(s *Snapshot) { s.Key = string(make([]byte, MaxKeyLen+1)) }},
		{"bad utf8", func(s *Snapshot) { s.Key = "\xff" }},
		{"algorithm 0", func(s *Snapshot) { s.Algorithm = 0 }},
		{"algorithm 99", func(s *Snapshot) { s.Algorithm = 99 }},
		{"negative count", func(s *Snapshot) { s.Words[1] = -1 }},
		{"huge count", func(s *Snapshot) { s.Words[1] = MaxLimit + 1 }},
		{"word 2 set", func(s *Snapshot) { s.Words[2] = 1 << 62 }},
		{"log on a window", func(s *Snapshot) { s.Log = []LogEntry{{1, 1}} }},
		{"NaN level", func(s *Snapshot) {
			s.Algorithm = TokenBucket
			s.Words[0] = int64(math.Float64bits(math.NaN()))
		}},
		{"negative level", func(s *Snapshot) {
			s.Algorithm = LeakyBucket
			s.Words[0] = int64(math.Float64bits(-1))
		}},
		{"GCRA interval 0", func(s *Snapshot) { s.Algorithm, s.Words = GCRA, [3]int64{1, 0, 0} }},
		{"log words", func(s *Snapshot) { s.Algorithm = SlidingWindowLog }},
		{"log out of order", func(s *Snapshot) {
			s.Algorithm, s.Words, s.Log = SlidingWindowLog, [3]int64{}, []LogEntry{{5, 1}, {5, 1}}
		}},
		{"log zero hits", func(s *Snapshot) {
			s.Algorithm, s.Words, s.Log = SlidingWindowLog, [3]int64{}, []LogEntry{{5, 0}}
		}},
		{"log too long", func(s *Snapshot) {
			s.Algorithm, s.Words = SlidingWindowLog, [3]int64{}
			for i := range MaxSnapshotLog + 1 {
				s.Log = append(s.Log, LogEntry{int64(i + 1), 1})
			}
		}},
	}
	for _, tt := range tests {
		s := good
		tt.mut(&s)
		err := s.Validate()
		if !errors.Is(err, ErrInvalidSnapshot) {
			t.Errorf("%s: Validate = %v, want ErrInvalidSnapshot", tt.name, err)
		}
		st := newTestStore(t)
		if n, err := st.Merge([]Snapshot{s, good}, t0.Add(-time.Second)); !errors.Is(err, ErrInvalidSnapshot) || n != 1 {
			t.Errorf("%s: Merge = %d, %v; want the valid one merged and ErrInvalidSnapshot", tt.name, n, err)
		}
	}
}

// TestSnapshotLogCompaction: a log longer than MaxSnapshotLog is exported
// within it, keeping every hit, and a store that merges it admits no more
// than the original at any later time.
func TestSnapshotLogCompaction(t *testing.T) {
	req := Request{Name: "n", Key: "k", Hits: 1, Limit: 20000, Period: time.Second, Algorithm: SlidingWindowLog}
	orig := newTestStore(t)
	at := t0
	for range 10000 {
		if d, err := orig.CheckAt(req, at); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
		at = at.Add(50 * time.Microsecond)
	}
	sn := snapOf(t, orig, req, at)
	var total int64
	for _, e := range sn.Log {
		total += e.Hits
	}
	if len(sn.Log) > MaxSnapshotLog || total != 10000 {
		t.Fatalf("snapshot log: %d entries holding %d hits; want at most %d holding 10000", len(sn.Log), total, MaxSnapshotLog)
	}
	cp := newTestStore(t)
	mustMerge(t, cp, []Snapshot{sn}, at)
	peek := req
	peek.Hits = 0
	for now := at; now.Before(at.Add(1100 * time.Millisecond)); now = now.Add(7 * time.Millisecond) {
		d1, _ := orig.CheckAt(peek, now)
		d2, _ := cp.CheckAt(peek, now)
		if d2.Remaining > d1.Remaining {
			t.Fatalf("at +%v the compacted copy has %d remaining, the original %d", now.Sub(at), d2.Remaining, d1.Remaining)
		}
	}
}

// TestChanged: with TrackChanges every changed key is reported once per
// call of Changed.
func TestChanged(t *testing.T) {
	s, err := NewStore(StoreConfig{Shards: 4, TrackChanges: true})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Name: "n", Hits: 1, Limit: 10, Period: time.Minute, Algorithm: TokenBucket}
	for i := range 50 {
		req.Key = string(rune('a' + i%25))
		if _, err := s.CheckAt(req, t0); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	if n := s.Changed(t0, func(sn Snapshot) { seen[sn.Key]++ }); n != 25 {
		t.Errorf("Changed reported %d keys, want 25", n)
	}
	for k, c := range seen {
		if c != 1 {
			t.Errorf("key %q reported %d times", k, c)
		}
	}
	if n := s.Changed(t0, func(Snapshot) {}); n != 0 {
		t.Errorf("second Changed reported %d, want 0", n)
	}
	req.Key = "a"
	if _, err := s.CheckAt(req, t0); err != nil {
		t.Fatal(err)
	}
	peek := req
	peek.Hits, peek.Key = 0, "b"
	if _, err := s.CheckAt(peek, t0); err != nil {
		t.Fatal(err)
	}
	var got []string
	s.Changed(t0, func(sn Snapshot) { got = append(got, sn.Key) })
	if len(got) != 1 || got[0] != "a" {
		t.Errorf("after one more check and a peek Changed reported %q, want [a]", got)
	}
	untracked := newTestStore(t)
	untracked.CheckAt(req, t0)
	if n := untracked.Changed(t0, func(Snapshot) {}); n != 0 {
		t.Errorf("a store without TrackChanges reported %d changes", n)
	}
}

func TestTakeAt(t *testing.T) {
	for _, a := range Algorithms {
		req := Request{Name: "n", Key: "k", Limit: 100, Period: time.Minute, Algorithm: a}
		s := newTestStore(t)
		for i, want := range []struct{ ask, got int64 }{{30, 30}, {100, 70}, {5, 0}} {
			got, d, err := s.TakeAt(req, want.ask, t0)
			if err != nil {
				t.Fatal(err)
			}
			if got != want.got || d.Allowed != (got > 0) {
				t.Errorf("%s take %d: took %d (allowed %v), want %d", a, i, got, d.Allowed, want.got)
			}
			if got == 0 && d.RetryAfter <= 0 {
				t.Errorf("%s: nothing taken but RetryAfter %v", a, d.RetryAfter)
			}
		}
		if _, _, err := s.TakeAt(req, 0, t0); !errors.Is(err, ErrInvalidHits) {
			t.Errorf("%s: want 0 gave %v", a, err)
		}
	}
}

// FuzzMerge: no snapshot, however malformed, makes Merge or a later check
// panic; a merged store never admits a hit beyond the limit, and limits
// the key at most as long as a fresh key consumed whole.
func FuzzMerge(f *testing.F) {
	f.Add(uint8(1), int64(1), int64(2), int64(3), int64(4), int64(5), int64(1))
	f.Add(uint8(4), int64(0), int64(0), int64(0), int64(10), int64(5), int64(3))
	f.Fuzz(func(t *testing.T, algo uint8, w0, w1, w2, expire, logAt, logHits int64) {
		sn := Snapshot{Name: "n", Key: "k", Algorithm: Algorithm(algo), ExpireAt: t0.UnixNano() + expire, Words: [3]int64{w0, w1, w2}}
		if sn.Algorithm == SlidingWindowLog {
			sn.Log = []LogEntry{{t0.UnixNano() + logAt, logHits}}
		}
		s := newTestStore(t)
		if _, err := s.Merge([]Snapshot{sn}, t0); err != nil {
			return
		}
		req := Request{Name: "n", Key: "k", Hits: 1, Limit: 5, Period: time.Second, Algorithm: sn.Algorithm}
		if !req.Algorithm.Valid() {
			t.Fatalf("merged a snapshot of algorithm %d", algo)
		}
		full := newTestStore(t)
		if _, _, err := full.TakeAt(req, req.Capacity(), t0); err != nil {
			t.Fatal(err)
		}
		bound := mustCheck(t, full, req, t0)
		admitted := 0
		for i := range 10 {
			d, err := s.CheckAt(req, t0)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
			// The buckets may be up to 2*bucketEpsilon hits later.
			if i == 0 && (d.RetryAfter > bound.RetryAfter+1 || d.ResetAt.After(bound.ResetAt.Add(1))) {
				t.Fatalf("after merging %+v: %+v; a fresh key consumed whole: %+v", sn, d, bound)
			}
		}
		if admitted > 5 {
			t.Fatalf("admitted %d of a limit of 5 after merging %+v", admitted, sn)
		}
	})
}

// TestMergeStaleLog: a replica's log that no decision has expired still
// holds hits that are over; a newer snapshot whose window holds more hits
// wins, even though the stale log holds more in all.
func TestMergeStaleLog(t *testing.T) {
	req := Request{Name: "n", Key: "k", Hits: 10, Limit: 20, Period: time.Second, Algorithm: SlidingWindowLog}
	owner, replica := newTestStore(t), newTestStore(t)
	mustCheck(t, owner, req, t0)
	mustMerge(t, replica, []Snapshot{snapOf(t, owner, req, t0)}, t0)
	req.Hits = 3
	mustCheck(t, owner, req, t0.Add(1200*time.Millisecond))
	now := t0.Add(1500 * time.Millisecond)
	if n := mustMerge(t, replica, []Snapshot{snapOf(t, owner, req, now)}, now); n != 1 {
		t.Fatalf("the newer log changed %d keys, want 1", n)
	}
	req.Hits = 0
	if d := mustCheck(t, replica, req, now); d.Remaining != 17 {
		t.Fatalf("after the newer log: %+v, want 17 remaining as on the owner", d)
	}
}

// TestSnapshotShiftTimes: a shift moves a bucket's level time, a GCRA
// arrival time, log entries and the expiry, saturating; windows stay.
func TestSnapshotShiftTimes(t *testing.T) {
	const d = 3 * time.Second
	for _, tc := range []struct {
		in, want Snapshot
	}{
		{Snapshot{Algorithm: TokenBucket, ExpireAt: 10, Words: [3]int64{7, 5, 0}}, Snapshot{Algorithm: TokenBucket, ExpireAt: 10 + int64(d), Words: [3]int64{7, 5 + int64(d), 0}}},
		{Snapshot{Algorithm: LeakyBucket, ExpireAt: 10, Words: [3]int64{7, 5, 0}}, Snapshot{Algorithm: LeakyBucket, ExpireAt: 10 + int64(d), Words: [3]int64{7, 5 + int64(d), 0}}},
		{Snapshot{Algorithm: GCRA, ExpireAt: 10, Words: [3]int64{10, 4, 0}}, Snapshot{Algorithm: GCRA, ExpireAt: 10 + int64(d), Words: [3]int64{10 + int64(d), 4, 0}}},
		{Snapshot{Algorithm: SlidingWindowLog, ExpireAt: 10, Log: []LogEntry{{At: 1, Hits: 2}}}, Snapshot{Algorithm: SlidingWindowLog, ExpireAt: 10 + int64(d), Log: []LogEntry{{At: 1 + int64(d), Hits: 2}}}},
		{Snapshot{Algorithm: FixedWindow, ExpireAt: 10, Words: [3]int64{0, 3, 0}}, Snapshot{Algorithm: FixedWindow, ExpireAt: 10, Words: [3]int64{0, 3, 0}}},
		{Snapshot{Algorithm: SlidingWindowCounter, ExpireAt: 10, Words: [3]int64{0, 3, 1}}, Snapshot{Algorithm: SlidingWindowCounter, ExpireAt: 10, Words: [3]int64{0, 3, 1}}},
		{Snapshot{Algorithm: GCRA, ExpireAt: math.MaxInt64 - 1, Words: [3]int64{math.MaxInt64 - 1, 4, 0}}, Snapshot{Algorithm: GCRA, ExpireAt: math.MaxInt64, Words: [3]int64{math.MaxInt64, 4, 0}}},
	} {
		got := tc.in
		got.Log = append([]LogEntry(nil), tc.in.Log...)
		got.ShiftTimes(d)
		if got.ExpireAt != tc.want.ExpireAt || got.Words != tc.want.Words || len(got.Log) != len(tc.want.Log) || (len(got.Log) > 0 && got.Log[0] != tc.want.Log[0]) {
			t.Errorf("%v: shifted %+v, want %+v", tc.in.Algorithm, got, tc.want)
		}
	}
}
