package limiter

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestKeepStrictestMisalignedRandom draws pairs of rates of a fixed window
// or a sliding window counter (periods of 1 to 168 hours, calendar units
// in zones with DST and half-hour offsets) and start instants through the
// year, and interleaves the rightful caller's checks at one with another's
// at the other over 200 steps of 5 to 65 minutes: the rightful caller gets
// no more than alone, and both together no more than at the caller's rate.
// (Other seeds draw the case TestKeepStrictestClaimedByAWindowEndingFirst
// holds, which still fails.)
func TestKeepStrictestMisalignedRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	zones := []*time.Location{nil, mustZone("America/New_York"), mustZone("Australia/Lord_Howe"), mustZone("Asia/Kolkata"), mustZone("Europe/Paris")}
	periods := []time.Duration{time.Hour, 2 * time.Hour, 3 * time.Hour, 90 * time.Minute, 24 * time.Hour, 25 * time.Hour, 7 * 24 * time.Hour}
	randRate := func(a Algorithm) Request {
		r := Request{Name: "n", Key: "k", Hits: 1, Limit: int64(5 + rng.IntN(10)), Algorithm: a}
		if a == FixedWindow && rng.IntN(2) == 0 {
			r.Calendar = []Calendar{Hour, Day, Week, Month}[rng.IntN(4)]
			r.Location = zones[rng.IntN(len(zones))]
		} else {
			r.Period = periods[rng.IntN(len(periods))]
		}
		return r
	}
	fails := 0
	for iter := 0; iter < 600 && fails < 10; iter++ {
		a := []Algorithm{FixedWindow, SlidingWindowCounter}[rng.IntN(2)]
		base, bad := randRate(a), randRate(a)
		t0 := time.Date(2026, time.Month(1+rng.IntN(12)), 1+rng.IntN(28), rng.IntN(24), rng.IntN(60), 0, 0, time.UTC)
		attacked, alone, asBase := newStrictStore(t), newStrictStore(t), newStrictStore(t)
		chk := func(s *Store, r Request, at time.Time) int64 {
			d, err := s.CheckAt(r, at)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				return r.Hits
			}
			return 0
		}
		var legit, legitAlone, total, totalBase int64
		step := time.Duration(5+rng.IntN(60)) * time.Minute
		for i := 0; i < 200; i++ {
			at := t0.Add(time.Duration(i) * step)
			for range 2 {
				n := chk(attacked, base, at)
				legit, total = legit+n, total+n
				legitAlone += chk(alone, base, at)
				totalBase += chk(asBase, base, at)
			}
			if rng.IntN(3) == 0 {
				total += chk(attacked, bad, at)
				totalBase += chk(asBase, base, at)
			}
			if legit > legitAlone || total > totalBase {
				t.Errorf("iter %d step %d at %v: algo %v base %v/%v/%v bad %v/%v/%v: legit %d alone %d total %d base %d", iter, i, at, a, base.Limit, base.Period, base.Calendar, bad.Limit, bad.Period, bad.Calendar, legit, legitAlone, total, totalBase)
				fails++
				break
			}
		}
	}
}
