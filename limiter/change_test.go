package limiter

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// horizonSinceT0 is the horizon of every decision in the tables (all after
// 1970), as a step's wantResetAt: the latest instant Unix nanoseconds
// represent.
const horizonSinceT0 = time.Duration(math.MaxInt64 - 1_699_999_200*int64(time.Second))

// TestCutToHorizon takes a key that has consumed a million hits at a million
// per second to one per day: draining that takes a million days, past the
// horizon. The key stays limited until the horizon, which ResetAt and
// RetryAfter say, and is not reset.
func TestCutToHorizon(t *testing.T) {
	const ms, day = time.Millisecond, 24 * time.Hour
	for _, a := range []Algorithm{TokenBucket, LeakyBucket, GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			steps := []step{
				{at: 0, hits: 1_000_000, wantAllowed: true, wantRemaining: 0, wantRetryAfter: unchecked, wantResetAt: time.Second},
				{at: 0, hits: 1, limit: 1, period: day, wantAllowed: false, wantRemaining: 0,
					wantRetryAfter: horizonSinceT0, wantResetAt: horizonSinceT0},
				{at: ms, hits: 1, limit: 1, period: day, wantAllowed: false, wantRemaining: 0,
					wantRetryAfter: horizonSinceT0 - ms, wantResetAt: horizonSinceT0},
				{at: 1000 * day, hits: 0, limit: 1, period: day, wantAllowed: false, wantRemaining: 0,
					wantRetryAfter: horizonSinceT0 - 1000*day, wantResetAt: horizonSinceT0},
			}
			back := 1000*day + time.Second
			if isBucket(a) {
				// Back at the fast rate the level, a million hits
				// less the thousand a thousand days drained, has
				// drained a second after the last request.
				steps = append(steps, step{at: back, hits: 1_000_000, wantAllowed: true, wantRemaining: 0,
					wantRetryAfter: unchecked, wantResetAt: back + time.Second, wantDelay: 0})
			} else {
				// GCRA keeps time, not hits: its TAT stopped at the
				// horizon, and back at 1µs a hit the time left until
				// then is rescheduled: ceil(left*1µs/day).
				left := time.Duration(math.MaxInt64 - t0.Add(back).UnixNano())
				behind := (left/day)*time.Microsecond + (left%day*1000+day-1)/day
				steps = append(steps, step{at: back, hits: 0, wantAllowed: true,
					wantRemaining: int64((time.Second - behind) / time.Microsecond), wantResetAt: back + behind})
			}
			runSteps(t, Request{Name: "api", Key: "k", Limit: 1_000_000, Period: time.Second, Algorithm: a}, steps)
		})
	}
}

// TestCutToHorizonBefore1970 is TestCutToHorizon in 1900, where the horizon
// is the longest Duration away: RetryAfter saturates there, and is exact.
func TestCutToHorizonBefore1970(t *testing.T) {
	const ms, day = time.Millisecond, 24 * time.Hour
	at := time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC).Sub(t0)
	for _, a := range []Algorithm{TokenBucket, LeakyBucket, GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			runSteps(t, Request{Name: "api", Key: "k", Limit: 1_000_000, Period: time.Second, Algorithm: a}, []step{
				{at: at, hits: 1_000_000, wantAllowed: true, wantRemaining: 0, wantRetryAfter: unchecked, wantResetAt: at + time.Second},
				{at: at, hits: 1, limit: 1, period: day, wantAllowed: false, wantRemaining: 0,
					wantRetryAfter: math.MaxInt64, wantResetAt: at + math.MaxInt64},
				{at: at + ms, hits: 0, limit: 1, period: day, wantAllowed: false, wantRemaining: 0,
					wantRetryAfter: unchecked, wantResetAt: unchecked},
			})
		})
	}
}

// TestCutDrainsAtNewRate cuts a key that consumed a thousand hits at a
// thousand per second to one per hour: it stays limited for a thousand
// hours, the time the thousand hits take at the new rate.
func TestCutDrainsAtNewRate(t *testing.T) {
	const h = time.Hour
	for _, a := range []Algorithm{TokenBucket, LeakyBucket, GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			// The buckets admit within bucketEpsilon hits of the
			// boundary, here 3600ns early; GCRA is exact.
			early := time.Duration(0)
			if isBucket(a) {
				early = time.Duration(bucketEpsilon * float64(h))
			}
			runSteps(t, Request{Name: "api", Key: "k", Limit: 1000, Period: time.Second, Algorithm: a}, []step{
				{at: 0, hits: 1000, wantAllowed: true, wantRemaining: 0, wantRetryAfter: unchecked, wantResetAt: time.Second},
				{at: 0, hits: 1, limit: 1, period: h, wantAllowed: false, wantRemaining: 0,
					wantRetryAfter: 1000*h - early, wantResetAt: 1000 * h},
				{at: 999*h - early, hits: 1, limit: 1, period: h, wantAllowed: false, wantRemaining: 0,
					wantRetryAfter: h, wantResetAt: 1000 * h},
				{at: 1000*h - early - 1, hits: 1, limit: 1, period: h, wantAllowed: false, wantRemaining: 0,
					wantRetryAfter: 1, wantResetAt: 1000 * h},
				{at: 1000*h - early, hits: 1, limit: 1, period: h, wantAllowed: true, wantRemaining: 0,
					wantRetryAfter: 0, wantResetAt: unchecked, wantDelay: unchecked},
			})
		})
	}
}

// TestSlidingCounterPeriodChange places the counts after a Period change in
// the window of the new alignment holding the last nanosecond of their own
// window (the current one if that is later), as doc.go says; Remaining,
// ResetAt and RetryAfter follow from the placed counts.
func TestSlidingCounterPeriodChange(t *testing.T) {
	const ms, s = time.Millisecond, time.Second
	t.Run("shorter", func(t *testing.T) {
		// [0, 2s) holds 10 hits and is not over at 1.5s: they count in
		// the current window [1s, 2s), so 5 more are denied until the
		// weight of the 10, now the previous window's, falls to 5 at 2.5s.
		runSteps(t, Request{Name: "api", Key: "k", Limit: 10, Period: 2 * s, Algorithm: SlidingWindowCounter}, []step{
			{at: s, hits: 10, wantAllowed: true, wantRemaining: 0, wantResetAt: 4 * s},
			{at: 1500 * ms, hits: 5, period: s, wantAllowed: false, wantRemaining: 0, wantRetryAfter: s, wantResetAt: 3 * s},
			{at: 2500*ms - 1, hits: 5, period: s, wantAllowed: false, wantRemaining: 4, wantRetryAfter: 1, wantResetAt: 3 * s},
			{at: 2500 * ms, hits: 5, period: s, wantAllowed: true, wantRemaining: 0, wantResetAt: 4 * s},
		})
	})
	t.Run("longer", func(t *testing.T) {
		// At 1.5s with 2s windows, [1s, 2s) is not over and [0, 1s)
		// ended inside the current window [0, 2s): both hits count in
		// it. In [2s, 4s) they are the previous window's, and weigh 1
		// from 3s.
		runSteps(t, Request{Name: "api", Key: "k", Limit: 2, Period: s, Algorithm: SlidingWindowCounter}, []step{
			{at: 500 * ms, hits: 1, wantAllowed: true, wantRemaining: 1, wantResetAt: 2 * s},
			{at: s, hits: 1, wantAllowed: true, wantRemaining: 0, wantResetAt: 3 * s},
			{at: 1500 * ms, hits: 1, period: 2 * s, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 1500 * ms, wantResetAt: 4 * s},
			{at: 3*s - 1, hits: 1, period: 2 * s, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 1, wantResetAt: 4 * s},
			{at: 3 * s, hits: 1, period: 2 * s, wantAllowed: true, wantRemaining: 0, wantResetAt: 6 * s},
		})
	})
	t.Run("previous", func(t *testing.T) {
		// 4 hits in [0, 1s) and 2 in [1s, 2s). At 2.2s with 500ms
		// windows, [1s, 2s) ended in the previous window [1.5s, 2s) and
		// [0, 1s) before it: only the 2 count, as the previous window's,
		// weighing 2*(500ms-200ms)/500ms = 1.2.
		runSteps(t, Request{Name: "api", Key: "k", Limit: 6, Period: s, Algorithm: SlidingWindowCounter}, []step{
			{at: 0, hits: 4, wantAllowed: true, wantRemaining: 2, wantResetAt: 2 * s},
			{at: 1999 * ms, hits: 2, wantAllowed: true, wantRemaining: 3, wantResetAt: 3 * s},
			{at: 2200 * ms, hits: 0, period: 500 * ms, wantAllowed: true, wantRemaining: 4, wantResetAt: 2500 * ms},
			{at: 2200 * ms, hits: 6, period: 500 * ms, wantAllowed: false, wantRemaining: 4, wantRetryAfter: 300 * ms, wantResetAt: 2500 * ms},
			{at: 2500 * ms, hits: 6, period: 500 * ms, wantAllowed: true, wantRemaining: 0, wantResetAt: 3500 * ms},
		})
	})
	t.Run("extremes", func(t *testing.T) {
		// MaxLimit hits in a MinPeriod window, then 2 per MaxPeriod:
		// the window ended inside the current one, so nothing more is
		// admitted until that is over and the count, as the previous
		// window's, weighs at most one hit, a MaxLimit-th of MaxPeriod
		// before the next window ends.
		start := time.Duration(floorDiv(t0.UnixNano(), int64(MaxPeriod))*int64(MaxPeriod) - t0.UnixNano())
		runSteps(t, Request{Name: "api", Key: "k", Limit: MaxLimit, Period: MinPeriod, Algorithm: SlidingWindowCounter}, []step{
			{at: 0, hits: MaxLimit, wantAllowed: true, wantRemaining: 0, wantResetAt: 2 * MinPeriod},
			{at: MinPeriod, hits: 1, limit: 2, period: MaxPeriod, wantAllowed: false, wantRemaining: 0,
				wantRetryAfter: start + 2*MaxPeriod - MaxPeriod/MaxLimit - MinPeriod, wantResetAt: start + 2*MaxPeriod},
			// Back to MinPeriod the count is of a window that is not
			// over: it counts in the current one, then the previous,
			// where it weighs at most MaxLimit-1 after 999ns.
			{at: 2 * MinPeriod, hits: 1, wantAllowed: false, wantRemaining: 0,
				wantRetryAfter: MinPeriod + 1, wantResetAt: 4 * MinPeriod},
			{at: 4 * MinPeriod, hits: MaxLimit, wantAllowed: true, wantRemaining: 0, wantResetAt: 6 * MinPeriod},
		})
	})
}

// TestRetryAfterExactAfterChange is a property: whatever a key consumed
// under one Limit, Period and Burst, a request under any other that is
// denied is admitted at now+RetryAfter and denied at now+RetryAfter-1ns, and
// now+RetryAfter is at most the horizon. Parameters come from
// randomExtremeRequest, times from before 1970 to 2198.
func TestRetryAfterExactAfterChange(t *testing.T) {
	n := traceCount()
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(31337, uint64(a)))
			denied := 0
			for i := range n {
				s := newTestStore(t)
				before := randomExtremeRequest(t, rng, a)
				now := randomStart(rng)
				for range 1 + rng.IntN(3) {
					r := before
					r.Hits = randomHits(rng, r.Capacity())
					if rng.IntN(2) == 0 {
						r.Hits = r.Capacity()
					}
					if _, err := s.CheckAt(r, time.Unix(0, now)); err != nil {
						t.Fatal(err)
					}
					now += randomGap(rng, before)
				}
				after := randomExtremeRequest(t, rng, a)
				after.Hits = randomHits(rng, after.Capacity())
				if rng.IntN(4) == 0 {
					after.Behavior = DrainOverLimit
				}
				d, err := s.CheckAt(after, time.Unix(0, now))
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					continue
				}
				denied++
				fail := func(what string) {
					t.Helper()
					t.Fatalf("case %d: %+v, then at %d %+v: %+v: %s", i, before, now, after, d, what)
				}
				if d.RetryAfter <= 0 || int64(d.RetryAfter) > horizon(now)-now {
					fail("RetryAfter outside (0, horizon-now]")
				}
				if d.ResetAt.UnixNano() < now+int64(d.RetryAfter) {
					fail("ResetAt before now+RetryAfter")
				}
				sn := copyState(s, &after)
				if after.reads() {
					// A peek answers for the state its parameters make
					// of the key's, which the store does not keep.
					sn.apply(after, now)
				}
				after.Behavior = 0
				if !sn.decideAt(after, now+int64(d.RetryAfter)).Allowed {
					fail("not admitted at now+RetryAfter")
				}
				if sn.decideAt(after, now+int64(d.RetryAfter)-1).Allowed {
					fail("admitted at now+RetryAfter-1ns")
				}
			}
			if denied < n/10 {
				t.Errorf("only %d of %d cases denied: the property is hardly tested", denied, n)
			}
		})
	}
}
