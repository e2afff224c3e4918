package limiter

import (
	"errors"
	"math"
	"testing"
	"time"
)

// MergeCharged adds the hits charged to the store's own state, then keeps
// the larger of that and the state merged, never charging more than the
// state merged still counts.
func TestMergeChargedAddsThenMerges(t *testing.T) {
	t0 := time.Unix(1_700_000_040, 0).Truncate(time.Hour)
	for _, a := range Algorithms {
		req := Request{Name: "n", Key: "k", Limit: 100, Period: time.Hour, Algorithm: a}
		if a == LeakyBucket {
			continue // a queue: its hits are delays, not a count to add
		}
		t.Run(a.String(), func(t *testing.T) {
			owner, standIn := newTestStore(t), newTestStore(t)
			checkHits(t, owner, req, 50, t0)
			checkHits(t, standIn, req, 30, t0.Add(time.Second))
			sn, _ := standIn.Snapshot("n", "k", t0.Add(time.Second))
			charge := req
			charge.Hits = 30
			if n, _, err := owner.MergeCharged(&sn, charge, 0, t0.Add(2*time.Second)); err != nil || n != 30 {
				t.Fatalf("charged %d, %v; want 30", n, err)
			}
			if r := remainingAt(t, owner, req, t0.Add(2*time.Second)); r > 20 || r < 19 {
				t.Fatalf("%d remaining after 50 and 30 more charged, want 20", r)
			}
			// Charged again with the same state, as a second copy would
			// be without its parts: the charge adds up, past the limit.
			if n, _, err := owner.MergeCharged(&sn, charge, 0, t0.Add(2*time.Second)); err != nil || n != 30 {
				t.Fatalf("charged again %d, %v; want 30", n, err)
			}
			if r := remainingAt(t, owner, req, t0.Add(2*time.Second)); r != 0 {
				t.Fatalf("%d remaining after 110 charged, want 0", r)
			}
		})
	}
}

// A store's own stand-in hits are charged to the state merged when that
// state is the other history: the owner's 50 meet the stand-in's 30 at the
// stand-in, and the key holds 80.
func TestMergeChargedChargesTheStateMerged(t *testing.T) {
	t0 := time.Unix(1_700_000_040, 0).Truncate(time.Hour)
	for _, a := range []Algorithm{FixedWindow, SlidingWindowCounter, TokenBucket, GCRA, SlidingWindowLog} {
		req := Request{Name: "n", Key: "k", Limit: 100, Period: time.Hour, Algorithm: a}
		owner, standIn := newTestStore(t), newTestStore(t)
		checkHits(t, owner, req, 50, t0)
		checkHits(t, standIn, req, 30, t0.Add(time.Second))
		sn, _ := owner.Snapshot("n", "k", t0.Add(time.Second))
		if _, _, err := standIn.MergeCharged(&sn, req, 30, t0.Add(2*time.Second)); err != nil {
			t.Fatal(err)
		}
		if r := remainingAt(t, standIn, req, t0.Add(2*time.Second)); r > 20 || r < 19 {
			t.Fatalf("%s: %d remaining after 50 merged onto 30 of its own, want 20", a, r)
		}
	}
}

// A state that counts fewer hits than the charge (its window ended, its
// bucket drained) charges only what it counts, and MergeCharged says how
// many it charged: to a live state of the store, to none (the state is
// adopted), and of a state expired on arrival, none.
func TestMergeChargedAtMostWhatTheStateCounts(t *testing.T) {
	t0 := time.Unix(1_700_000_040, 0).Truncate(time.Minute)
	req := Request{Name: "n", Key: "k", Limit: 100, Period: time.Minute, Algorithm: TokenBucket}
	standIn := newTestStore(t)
	checkHits(t, standIn, req, 40, t0)
	sn, _ := standIn.Snapshot("n", "k", t0)
	charge := req
	charge.Hits = 40
	later := t0.Add(18 * time.Second) // 30 of 40 drained
	for _, tc := range []struct {
		name  string
		owner int64 // hits the owner admitted at later, 0 for no state
		at    time.Time
		want  int64 // hits charged
		left  int64 // remaining after, at most and at least one less
	}{
		{"adopted", 0, later, 10, 90},
		{"live state", 5, later, 10, 85},
		{"expired on arrival", 5, t0.Add(time.Minute), 0, 95},
	} {
		t.Run(tc.name, func(t *testing.T) {
			owner := newTestStore(t)
			if tc.owner > 0 {
				checkHits(t, owner, req, tc.owner, tc.at)
			}
			n, _, err := owner.MergeCharged(&sn, charge, 0, tc.at)
			if err != nil || n != tc.want {
				t.Fatalf("charged %d, %v; want %d of the 40: what the state still counts", n, err, tc.want)
			}
			if r := remainingAt(t, owner, req, tc.at); r < tc.left-1 || r > tc.left {
				t.Fatalf("%d remaining, want %d", r, tc.left)
			}
		})
	}
	owner := newTestStore(t)
	charge.Key = "other"
	if n, _, err := owner.MergeCharged(&sn, charge, 0, later); !errors.Is(err, ErrInvalidSnapshot) || n != 0 {
		t.Fatalf("a charge of another key: charged %d, err %v; want 0, ErrInvalidSnapshot", n, err)
	}
}

func checkHits(t *testing.T, s *Store, req Request, hits int64, at time.Time) {
	t.Helper()
	req.Hits = hits
	if d, err := s.CheckAt(req, at); err != nil || !d.Allowed {
		t.Fatalf("%d hits: allowed %v, err %v", hits, d.Allowed, err)
	}
}

func remainingAt(t *testing.T, s *Store, req Request, at time.Time) int64 {
	t.Helper()
	req.Hits = 0
	d, err := s.CheckAt(req, at)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// A stand-in's hits enter the owner's state under the owner's rate,
// whatever the stand-in's, and count past the limit: the owner checked
// the key under 200 (140 counted) or 50 (50 counted) while the stand-in
// admitted 30 under 100 from the 40 both sides had; merged, the owner
// admits 30 more under 200, or nothing under 50 and 20 under 100.
func TestMergeChargedUnderTheOwnersRate(t *testing.T) {
	t0 := time.Unix(1_700_000_040, 0).Truncate(24 * time.Hour).Add(time.Hour)
	for _, tc := range []struct {
		name              string
		ownerLimit, owner int64 // the owner's limit during the partition, and its hits
		want              map[int64]int64
	}{
		{"owner raises", 200, 100, map[int64]int64{200: 30, 100: 0}},
		{"owner lowers", 50, 10, map[int64]int64{50: 0, 100: 20}},
	} {
		for _, a := range Algorithms {
			t.Run(tc.name+"/"+a.String(), func(t *testing.T) {
				req := Request{Name: "n", Key: "k", Limit: 100, Period: 24 * time.Hour, Algorithm: a}
				owner, standIn := newTestStore(t), newTestStore(t)
				checkHits(t, owner, req, 40, t0)
				base, _ := owner.Snapshot("n", "k", t0)
				if _, err := standIn.Merge([]Snapshot{base}, t0); err != nil {
					t.Fatal(err)
				}
				checkHits(t, standIn, req, 30, t0.Add(time.Second))
				at := req
				at.Limit = tc.ownerLimit
				checkHits(t, owner, at, tc.owner, t0.Add(time.Second))

				now := t0.Add(2 * time.Second)
				sn, _ := standIn.Snapshot("n", "k", now)
				charge := req
				charge.Hits = 30
				if _, _, err := owner.MergeCharged(&sn, charge, 0, now); err != nil {
					t.Fatal(err)
				}
				for _, limit := range []int64{tc.ownerLimit, 100, 200} {
					want, ok := tc.want[limit]
					if !ok {
						continue
					}
					r := req
					r.Limit = limit
					if got := remainingAt(t, owner, r, now); got != want {
						t.Errorf("under %d: %d remaining after %d admitted, want %d", limit, got, 40+30+tc.owner, want)
					}
				}
			})
		}
	}
}

// The owner's state keeps its own Period: a stand-in that counted the key
// by the hour charges its hits to the owner's day, and the day's count
// stays once the stand-in's hour is over.
func TestMergeChargedKeepsTheOwnersPeriod(t *testing.T) {
	t0 := time.Unix(1_700_000_040, 0).Truncate(24 * time.Hour).Add(time.Hour)
	for _, a := range []Algorithm{FixedWindow, SlidingWindowLog, SlidingWindowCounter, GCRA, TokenBucket} {
		t.Run(a.String(), func(t *testing.T) {
			day := Request{Name: "n", Key: "k", Limit: 100, Period: 24 * time.Hour, Algorithm: a}
			hour := day
			hour.Period = time.Hour
			owner, standIn := newTestStore(t), newTestStore(t)
			checkHits(t, owner, day, 60, t0)
			checkHits(t, standIn, hour, 30, t0.Add(time.Second))
			now := t0.Add(2 * time.Second)
			sn, _ := standIn.Snapshot("n", "k", now)
			charge := hour
			charge.Hits = 30
			if _, _, err := owner.MergeCharged(&sn, charge, 0, now); err != nil {
				t.Fatal(err)
			}
			later := now.Add(90 * time.Minute)
			// The buckets and GCRA drain about 6 of a day's 100 in 90 minutes.
			if got := remainingAt(t, owner, day, later); got > 16 || got < 10 {
				t.Errorf("%d remaining of the day after 60 and 30 charged, want 10 (16 drained)", got)
			}
		})
	}
}

// A charge made in a later window than the state's last decision lands
// in the window of its instant, at the state's Period: a counter's
// previous window weighs as it would, a log's charged hits leave the
// window a Period after the charge, not with the owner's older hits.
func TestMergeChargedInALaterWindow(t *testing.T) {
	t0 := time.Unix(1_700_000_040, 0).Truncate(time.Hour)
	for _, tc := range []struct {
		a     Algorithm
		at    []time.Duration // peeks, after t0
		wants []int64
	}{
		// 60 in [t0, t0+1h); 30 charged at t0+1h30m, weighed 60/2+30.
		{SlidingWindowCounter, []time.Duration{90 * time.Minute}, []int64{40}},
		// 60 at t0+30m, 30 charged at t0+1h10m: 10 left, then 70 once
		// the 60 left the window, then 100.
		{SlidingWindowLog, []time.Duration{70 * time.Minute, 91 * time.Minute, 131 * time.Minute}, []int64{10, 70, 100}},
	} {
		t.Run(tc.a.String(), func(t *testing.T) {
			req := Request{Name: "n", Key: "k", Limit: 100, Period: time.Hour, Algorithm: tc.a}
			owner, standIn := newTestStore(t), newTestStore(t)
			first, charged := t0, t0.Add(90*time.Minute)
			if tc.a == SlidingWindowLog {
				first, charged = t0.Add(30*time.Minute), t0.Add(70*time.Minute)
			}
			// The stand-in's rate is not the owner's: the owner's state's
			// own is used. (A counter's windows of another Period merge
			// as Merge places them, which the test leaves aside.)
			charge := req
			charge.Limit = 1000
			if tc.a == SlidingWindowLog {
				charge.Period = time.Minute
			}
			checkHits(t, owner, req, 60, first)
			checkHits(t, standIn, charge, 30, charged)
			sn, _ := standIn.Snapshot("n", "k", charged)
			charge.Hits = 30
			if _, _, err := owner.MergeCharged(&sn, charge, 0, charged); err != nil {
				t.Fatal(err)
			}
			for i, at := range tc.at {
				if got := remainingAt(t, owner, req, t0.Add(at)); got != tc.wants[i] {
					t.Errorf("at t0+%v: %d remaining, want %d", at, got, tc.wants[i])
				}
			}
		})
	}
}

// FuzzMergeCharged: two histories of a key written by valid requests of
// any algorithms and rates, merged with any charge: nothing panics, the
// store's key never counts less than before (a peek with the owner's
// request finds no more remaining), and at one rate (a window's Limit
// aside) the hits charged count, past the limit too, up to what the state
// sent holds.
func FuzzMergeCharged(f *testing.F) {
	f.Add(uint8(0), uint8(0), int64(100), int64(3600), int64(140), int64(100), int64(60), int64(30), int64(30), int64(5), int64(0))
	f.Add(uint8(5), uint8(2), int64(50), int64(60), int64(50), int64(1000), int64(1), int64(10), int64(40), int64(70), int64(3))
	f.Fuzz(func(t *testing.T, a1, a2 uint8, l1, p1, h1, l2, p2, h2, theirs, later, mine int64) {
		alg := func(a uint8) Algorithm { return Algorithms[int(a)%len(Algorithms)] }
		mk := func(a Algorithm, limit, period, hits int64) (Request, bool) {
			r := Request{Name: "n", Key: "k", Algorithm: a, Limit: 1 + abs(limit)%1000, Period: time.Duration(1+abs(period)%86400) * time.Second}
			r.Hits = abs(hits) % (r.Capacity() + 1)
			return r, r.Validate() == nil
		}
		own, ok1 := mk(alg(a1), l1, p1, h1)
		sent, ok2 := mk(alg(a2), l2, p2, h2)
		if !ok1 || !ok2 {
			return
		}
		t1 := t0.Add(time.Duration(abs(later)%600) * time.Second)
		owner, standIn := newTestStore(t), newTestStore(t)
		if _, err := owner.CheckAt(own, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := standIn.CheckAt(sent, t0.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		sn, ok := standIn.Snapshot("n", "k", t1)
		if !ok {
			return
		}
		peek := own
		peek.Hits = 0
		before := mustCheck(t, owner, peek, t1).Remaining
		charge := sent
		charge.Hits = abs(theirs) % (limiterMaxTest + 1)
		charged, _, err := owner.MergeCharged(&sn, charge, abs(mine)%(limiterMaxTest+1), t1)
		if err != nil {
			t.Fatalf("%+v with %+v: %v", sn, charge, err)
		}
		if charged < 0 || charged > charge.Hits {
			t.Fatalf("%+v with %+v: %d charged of %d", sn, charge, charged, charge.Hits)
		}
		after := mustCheck(t, owner, peek, t1).Remaining
		if after > before {
			t.Fatalf("%v %+v then %+v charged %d: %d remaining, %d before", own.Algorithm, own, sent, charge.Hits, after, before)
		}
		sameRate := own.Algorithm == sent.Algorithm && own.Period == sent.Period && (!own.Algorithm.HasBurst() || own.Limit == sent.Limit)
		if sameRate && own.Algorithm != LeakyBucket && own.Hits > 0 && after > 0 {
			// What the state sent counts at t1.
			sp := sent
			sp.Hits = 0
			counted := sent.Capacity() - mustCheck(t, standIn, sp, t1).Remaining
			want := before - min(charge.Hits, counted)
			if own.Algorithm == TokenBucket || own.Algorithm == GCRA {
				want++ // a hit drained meanwhile, rounded
			}
			if after > max(want, 0) {
				t.Fatalf("%+v then %+v charged %d: %d remaining, want at most %d", own, sent, charge.Hits, after, want)
			}
		}
		for range 3 {
			r := own
			r.Hits = 1
			mustCheck(t, owner, r, t1.Add(time.Second))
		}
	})
}

const limiterMaxTest = 10_000

func abs(x int64) int64 {
	if x < 0 {
		if x == math.MinInt64 {
			return math.MaxInt64
		}
		return -x
	}
	return x
}

// What a merge of two histories counts past the limit stays counted: the
// owner lowered the limit to 50 and counts 50, the stand-in's 30 are
// charged (80), and then a replica's copy from before the charge comes
// back charged with the same 30 at a later instant. Checked under 50 (and
// denied), then under 100 again, the key admits 20.
func TestMergeChargedPastTheLimitStays(t *testing.T) {
	t0 := time.Unix(1_700_000_040, 0).Truncate(24 * time.Hour).Add(time.Hour)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			req := Request{Name: "n", Key: "k", Limit: 100, Period: 24 * time.Hour, Algorithm: a}
			lower := req
			lower.Limit = 50
			owner, standIn := newTestStore(t), newTestStore(t)
			checkHits(t, owner, req, 40, t0)
			checkHits(t, owner, lower, 10, t0.Add(time.Second))
			copied, _ := owner.Snapshot("n", "k", t0.Add(time.Second))
			checkHits(t, standIn, req, 30, t0.Add(time.Second))

			now := t0.Add(2 * time.Second)
			sn, _ := standIn.Snapshot("n", "k", now)
			charge := req
			charge.Hits = 30
			if _, _, err := owner.MergeCharged(&sn, charge, 0, now); err != nil {
				t.Fatal(err)
			}
			later := now.Add(time.Second)
			charge.Hits = 0
			if _, _, err := owner.MergeCharged(&copied, charge, 30, later); err != nil {
				t.Fatal(err)
			}
			lower.Hits = 1
			if d := mustCheck(t, owner, lower, later); d.Allowed {
				t.Fatalf("under 50 after 80: admitted")
			}
			if got := remainingAt(t, owner, req, later); got != 20 {
				t.Errorf("under 100 after 80: %d remaining, want 20", got)
			}
		})
	}
}

// A state marked received by a copy before the stand-in's hits are
// charged to it keeps them past its limit: the owner lowered the limit to
// 50 and counts 50, a copy counting one more merges in (Merge marks the
// state received: 51), then the stand-in's 30 are charged (81). Checked
// under 50 (and denied), then under 100 again, the key admits 19, not 50
// (GCRA fewer).
func TestMergeChargedAfterACopyStays(t *testing.T) {
	t0 := time.Unix(1_700_000_040, 0).Truncate(24 * time.Hour).Add(time.Hour)
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			req := Request{Name: "n", Key: "k", Limit: 100, Period: 24 * time.Hour, Algorithm: a}
			lower := req
			lower.Limit = 50
			owner, replica, standIn := newTestStore(t), newTestStore(t), newTestStore(t)
			checkHits(t, owner, req, 40, t0)
			checkHits(t, owner, lower, 10, t0.Add(time.Second))
			copied, _ := owner.Snapshot("n", "k", t0.Add(time.Second))
			if _, err := replica.Merge([]Snapshot{copied}, t0.Add(2*time.Second)); err != nil {
				t.Fatal(err)
			}
			checkHits(t, replica, req, 1, t0.Add(2*time.Second))
			checkHits(t, standIn, req, 30, t0.Add(time.Second))

			now := t0.Add(3 * time.Second)
			back, _ := replica.Snapshot("n", "k", now)
			if _, err := owner.Merge([]Snapshot{back}, now); err != nil {
				t.Fatal(err)
			}
			sn, _ := standIn.Snapshot("n", "k", now)
			charge := req
			charge.Hits = 30
			if _, _, err := owner.MergeCharged(&sn, charge, 0, now); err != nil {
				t.Fatal(err)
			}
			later := now.Add(time.Second)
			lower.Hits = 1
			if d := mustCheck(t, owner, lower, later); d.Allowed {
				t.Fatalf("under 50 after 81: admitted")
			}
			// GCRA may count more: the hits enter at the interval of 50,
			// read under 100 as twice as many.
			if got := remainingAt(t, owner, req, later); got > 19 || a != GCRA && got != 19 {
				t.Errorf("under 100 after 81: %d remaining, want 19", got)
			}
		})
	}
}
