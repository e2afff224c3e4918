package limiter

import (
	"testing"
	"time"
)

// TestSharedSteps runs one table against every algorithm. With Burst 0 every
// algorithm admits Limit hits at one instant and is fresh two periods later,
// so Allowed and Remaining agree; RetryAfter, ResetAt and Delay differ and are
// checked by checkInvariants and the per-algorithm tables.
func TestSharedSteps(t *testing.T) {
	type row struct {
		at            time.Duration
		hits          int64
		behavior      Behavior
		limit         int64
		period        time.Duration
		wantAllowed   bool
		wantRemaining int64
	}
	const s, h, ms = time.Second, time.Hour, time.Millisecond
	rows := []row{
		{at: 0, hits: 1, wantAllowed: true, wantRemaining: 4},
		{at: 0, hits: 0, wantAllowed: true, wantRemaining: 4}, // a peek consumes nothing
		{at: 0, hits: 3, wantAllowed: true, wantRemaining: 1},
		{at: 0, hits: 2, wantAllowed: false, wantRemaining: 1}, // rejected: consumes nothing
		{at: 0, hits: 0, wantAllowed: true, wantRemaining: 1},
		{at: 0, hits: 1, wantAllowed: true, wantRemaining: 0},
		{at: 0, hits: 0, wantAllowed: false, wantRemaining: 0},
		{at: 0, hits: 1, behavior: DrainOverLimit, wantAllowed: false, wantRemaining: 0},
		{at: 2 * s, hits: 0, wantAllowed: true, wantRemaining: 5}, // fresh again
		{at: 2 * s, hits: 3, wantAllowed: true, wantRemaining: 2},
		// Limit changes keep what was consumed.
		{at: 2 * s, hits: 0, limit: 8, wantAllowed: true, wantRemaining: 5},
		{at: 2 * s, hits: 0, limit: 4, wantAllowed: true, wantRemaining: 1},
		{at: 2 * s, hits: 2, limit: 4, wantAllowed: false, wantRemaining: 1},
		{at: 2 * s, hits: 0, limit: 3, wantAllowed: false, wantRemaining: 0},
		{at: 2 * s, hits: 0, limit: 2, wantAllowed: false, wantRemaining: 0},
		// So do Period changes, longer and shorter.
		{at: 2 * s, hits: 0, period: h, wantAllowed: true, wantRemaining: 2},
		{at: 2 * s, hits: 0, period: ms, wantAllowed: true, wantRemaining: 2},
		{at: 2 * s, hits: 0, wantAllowed: true, wantRemaining: 2},
		// Reset forgets, then decides.
		{at: 2 * s, hits: 5, behavior: Reset, wantAllowed: true, wantRemaining: 0},
		{at: 2 * s, hits: 1, wantAllowed: false, wantRemaining: 0},
		{at: 4 * s, hits: 5, wantAllowed: true, wantRemaining: 0},
		{at: 4 * s, hits: 2, behavior: DrainOverLimit, wantAllowed: false, wantRemaining: 0},
		{at: 4 * s, hits: 0, behavior: Reset, wantAllowed: true, wantRemaining: 5},
		{at: 4 * s, hits: 5, wantAllowed: true, wantRemaining: 0}, // the reset peek consumed nothing
		// DrainOverLimit takes what remains.
		{at: 6 * s, hits: 2, wantAllowed: true, wantRemaining: 3},
		{at: 6 * s, hits: 4, behavior: DrainOverLimit, wantAllowed: false, wantRemaining: 0},
		{at: 6 * s, hits: 1, wantAllowed: false, wantRemaining: 0},
		// Reset with DrainOverLimit: reset first, so admitted.
		{at: 6 * s, hits: 4, behavior: Reset | DrainOverLimit, wantAllowed: true, wantRemaining: 1},
	}
	steps := make([]step, len(rows))
	for i, r := range rows {
		steps[i] = step{
			at: r.at, hits: r.hits, behavior: r.behavior, limit: r.limit, period: r.period,
			wantAllowed: r.wantAllowed, wantRemaining: r.wantRemaining,
			wantRetryAfter: unchecked, wantResetAt: unchecked, wantDelay: unchecked,
		}
	}
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			runSteps(t, Request{Name: "api", Key: "user:1", Limit: 5, Period: s, Algorithm: a}, steps)
		})
	}
}

// TestBurstSteps runs one table against the algorithms with a burst: a
// capacity of 20 refilled at 10 per second.
func TestBurstSteps(t *testing.T) {
	const ms = time.Millisecond
	steps := []step{
		{at: 0, hits: 20, wantAllowed: true, wantRemaining: 0},
		{at: 0, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 100 * ms},
		{at: 1000 * ms, hits: 0, wantAllowed: true, wantRemaining: 10},
		// Burst changes keep what was consumed.
		{at: 1000 * ms, hits: 0, burst: 15, wantAllowed: true, wantRemaining: 5},
		{at: 1000 * ms, hits: 6, burst: 15, wantAllowed: false, wantRemaining: 5, wantRetryAfter: 100 * ms},
		{at: 1000 * ms, hits: 0, burst: 10, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 100 * ms},
		{at: 1000 * ms, hits: 0, burst: 5, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 600 * ms},
		{at: 1000 * ms, hits: 0, burst: 30, wantAllowed: true, wantRemaining: 20},
		{at: 1000 * ms, hits: 20, burst: 30, wantAllowed: true, wantRemaining: 0},
	}
	for i := range steps {
		steps[i].wantResetAt, steps[i].wantDelay = unchecked, unchecked
	}
	for _, a := range []Algorithm{TokenBucket, LeakyBucket, GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			runSteps(t, Request{Name: "api", Key: "k", Limit: 10, Period: time.Second, Burst: 20, Algorithm: a}, steps)
		})
	}
	// The windows ignore Burst: at most Limit per window.
	for _, a := range []Algorithm{FixedWindow, SlidingWindowLog, SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) {
			runSteps(t, Request{Name: "api", Key: "k", Limit: 10, Period: time.Second, Burst: 20, Algorithm: a}, []step{
				{hits: 10, wantAllowed: true, wantRemaining: 0, wantRetryAfter: unchecked, wantResetAt: unchecked},
				{hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: unchecked, wantResetAt: unchecked},
			})
		})
	}
}

func TestTokenBucketSteps(t *testing.T) {
	const ms, s = time.Millisecond, time.Second
	base := Request{Name: "api", Key: "k", Limit: 10, Period: s, Algorithm: TokenBucket}
	runSteps(t, base, []step{
		{at: 0, hits: 10, wantAllowed: true, wantRemaining: 0, wantResetAt: s},
		{at: 0, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 100 * ms, wantResetAt: s},
		{at: 50 * ms, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 50 * ms, wantResetAt: s},
		// Refills continuously: one token after 100ms, not ten after a second.
		{at: 100*ms - 1, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 1, wantResetAt: s},
		{at: 100 * ms, hits: 1, wantAllowed: true, wantRemaining: 0, wantResetAt: 1100 * ms},
		{at: 350 * ms, hits: 0, wantAllowed: true, wantRemaining: 2, wantResetAt: 1100 * ms},
		{at: 350 * ms, hits: 3, wantAllowed: false, wantRemaining: 2, wantRetryAfter: 50 * ms, wantResetAt: 1100 * ms},
		{at: 400 * ms, hits: 3, wantAllowed: true, wantRemaining: 0, wantResetAt: 1400 * ms},
		// DrainOverLimit: the RetryAfter is from the drained bucket.
		{at: 1400 * ms, hits: 7, wantAllowed: true, wantRemaining: 3, wantResetAt: 2100 * ms},
		{at: 1400 * ms, hits: 5, behavior: DrainOverLimit, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 500 * ms, wantResetAt: 2400 * ms},
		{at: 1900 * ms, hits: 5, wantAllowed: true, wantRemaining: 0, wantResetAt: 2900 * ms},
		// A peek with DrainOverLimit consumes nothing.
		{at: 1950 * ms, hits: 0, behavior: DrainOverLimit, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 50 * ms, wantResetAt: 2900 * ms},
		{at: 2000 * ms, hits: 1, wantAllowed: true, wantRemaining: 0, wantResetAt: 3000 * ms},
		// A Period change keeps the level, which drains at the new rate
		// (here 2 per second) from the previous request on.
		{at: 2250 * ms, hits: 0, period: 5 * s, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 250 * ms, wantResetAt: 7000 * ms},
		{at: 2500 * ms, hits: 1, period: 5 * s, wantAllowed: true, wantRemaining: 0, wantResetAt: 7500 * ms},
		// State that had drained under the parameters that wrote it is fresh.
		{at: 20 * s, hits: 10, wantAllowed: true, wantRemaining: 0, wantResetAt: 21 * s},
	})
	// A token every 333333.33ns: not a whole nanosecond.
	runSteps(t, Request{Name: "api", Key: "k", Limit: 3, Period: ms, Algorithm: TokenBucket}, []step{
		{at: 0, hits: 3, wantAllowed: true, wantRemaining: 0, wantResetAt: ms},
		{at: 0, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 333334, wantResetAt: ms},
		// (ResetAt is 1ns late here: float64 rounding of 2.000001 tokens.)
		{at: 333333, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 1, wantResetAt: unchecked},
		{at: 333334, hits: 1, wantAllowed: true, wantRemaining: 0, wantResetAt: 1333334},
	})
}

func TestLeakyBucketSteps(t *testing.T) {
	const ms = time.Millisecond
	// Ten per second drain: a hit leaves every 100ms. The queue holds 3.
	base := Request{Name: "api", Key: "k", Limit: 10, Period: time.Second, Burst: 3, Algorithm: LeakyBucket}
	runSteps(t, base, []step{
		{at: 0, hits: 1, wantAllowed: true, wantRemaining: 2, wantDelay: 0, wantResetAt: 100 * ms},
		{at: 0, hits: 1, wantAllowed: true, wantRemaining: 1, wantDelay: 100 * ms, wantResetAt: 200 * ms},
		{at: 0, hits: 1, wantAllowed: true, wantRemaining: 0, wantDelay: 200 * ms, wantResetAt: 300 * ms},
		{at: 0, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 100 * ms, wantResetAt: 300 * ms},
		{at: 50 * ms, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 50 * ms, wantResetAt: 300 * ms},
		{at: 100 * ms, hits: 1, wantAllowed: true, wantRemaining: 0, wantDelay: 200 * ms, wantResetAt: 400 * ms},
		{at: 250 * ms, hits: 0, wantAllowed: true, wantRemaining: 1, wantDelay: 150 * ms, wantResetAt: 400 * ms},
		{at: 250 * ms, hits: 2, wantAllowed: false, wantRemaining: 1, wantRetryAfter: 50 * ms, wantResetAt: 400 * ms},
		{at: 300 * ms, hits: 2, wantAllowed: true, wantRemaining: 0, wantDelay: 100 * ms, wantResetAt: 600 * ms},
		// An empty queue: no delay.
		{at: 600 * ms, hits: 3, wantAllowed: true, wantRemaining: 0, wantDelay: 0, wantResetAt: 900 * ms},
		{at: 700 * ms, hits: 1, behavior: DrainOverLimit, wantAllowed: true, wantRemaining: 0, wantDelay: 200 * ms, wantResetAt: 1000 * ms},
		{at: 700 * ms, hits: 2, behavior: DrainOverLimit, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 200 * ms, wantResetAt: 1000 * ms},
	})
}

func TestFixedWindowSteps(t *testing.T) {
	const ms, s = time.Millisecond, time.Second
	base := Request{Name: "api", Key: "k", Limit: 3, Period: s, Algorithm: FixedWindow}
	runSteps(t, base, []step{
		{at: 300 * ms, hits: 2, wantAllowed: true, wantRemaining: 1, wantResetAt: s},
		{at: s - 1, hits: 2, wantAllowed: false, wantRemaining: 1, wantRetryAfter: 1, wantResetAt: s},
		{at: s - 1, hits: 1, wantAllowed: true, wantRemaining: 0, wantResetAt: s},
		// Exactly at the window end a new window begins.
		{at: s, hits: 3, wantAllowed: true, wantRemaining: 0, wantResetAt: 2 * s},
		{at: 1500 * ms, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 500 * ms, wantResetAt: 2 * s},
		{at: 1500 * ms, hits: 1, behavior: DrainOverLimit, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 500 * ms, wantResetAt: 2 * s},
		{at: 2 * s, hits: 0, wantAllowed: true, wantRemaining: 3, wantResetAt: 2 * s},
		{at: 2 * s, hits: 1, wantAllowed: true, wantRemaining: 2, wantResetAt: 3 * s},
		{at: 2500 * ms, hits: 3, behavior: DrainOverLimit, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 500 * ms, wantResetAt: 3 * s},
		// A longer Period keeps the count in the longer window (a peek
		// keeps nothing; a check keeps the change).
		{at: 2500 * ms, hits: 0, period: time.Minute, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 57500 * ms, wantResetAt: time.Minute},
		{at: 2500 * ms, hits: 1, period: time.Minute, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 57500 * ms, wantResetAt: time.Minute},
		{at: 3 * s, hits: 0, period: time.Minute, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 57 * s, wantResetAt: time.Minute},
		{at: time.Minute, hits: 2, period: time.Minute, wantAllowed: true, wantRemaining: 1, wantResetAt: 2 * time.Minute},
		// A shorter one keeps it in the current shorter window.
		{at: time.Minute + 100*ms, hits: 0, wantAllowed: true, wantRemaining: 1, wantResetAt: time.Minute + s},
		{at: time.Minute + 100*ms, hits: 1, wantAllowed: true, wantRemaining: 0, wantResetAt: time.Minute + s},
		{at: time.Minute + s, hits: 3, wantAllowed: true, wantRemaining: 0, wantResetAt: time.Minute + 2*s},
	})
}

func TestSlidingWindowLogSteps(t *testing.T) {
	const ms, s = time.Millisecond, time.Second
	base := Request{Name: "api", Key: "k", Limit: 3, Period: s, Algorithm: SlidingWindowLog}
	runSteps(t, base, []step{
		{at: 0, hits: 1, wantAllowed: true, wantRemaining: 2, wantResetAt: s},
		{at: 400 * ms, hits: 2, wantAllowed: true, wantRemaining: 0, wantResetAt: 1400 * ms},
		// The window is (now-Period, now]: the hit at 0 leaves at 1s.
		{at: s - 1, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 1, wantResetAt: 1400 * ms},
		{at: s, hits: 1, wantAllowed: true, wantRemaining: 0, wantResetAt: 2 * s},
		{at: s, hits: 2, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 400 * ms, wantResetAt: 2 * s},
		{at: 1400 * ms, hits: 2, wantAllowed: true, wantRemaining: 0, wantResetAt: 2400 * ms},
		{at: 1400 * ms, hits: 2, wantAllowed: false, wantRemaining: 0, wantRetryAfter: s, wantResetAt: 2400 * ms},
		{at: 2 * s, hits: 0, wantAllowed: true, wantRemaining: 1, wantResetAt: 2400 * ms},
		{at: 2400 * ms, hits: 0, wantAllowed: true, wantRemaining: 3, wantResetAt: 2400 * ms},
	})
	// DrainOverLimit logs what remained at now; RetryAfter counts it.
	base.Limit = 10
	runSteps(t, base, []step{
		{at: 0, hits: 7, wantAllowed: true, wantRemaining: 3, wantResetAt: s},
		{at: 500 * ms, hits: 8, behavior: DrainOverLimit, wantAllowed: false, wantRemaining: 0, wantRetryAfter: s, wantResetAt: 1500 * ms},
		{at: 1000 * ms, hits: 8, wantAllowed: false, wantRemaining: 7, wantRetryAfter: 500 * ms, wantResetAt: 1500 * ms},
		{at: 1500 * ms, hits: 8, wantAllowed: true, wantRemaining: 2, wantResetAt: 2500 * ms},
		// A Limit below what the log holds admits nothing until enough leaves.
		{at: 1500 * ms, hits: 1, limit: 5, wantAllowed: false, wantRemaining: 0, wantRetryAfter: s, wantResetAt: 2500 * ms},
		// A Period change keeps the log: at 2s with 600ms, the hits of
		// 1.5s are still inside.
		{at: 2 * s, hits: 0, period: 600 * ms, wantAllowed: true, wantRemaining: 2, wantResetAt: 2100 * ms},
		{at: 2100 * ms, hits: 0, period: 600 * ms, wantAllowed: true, wantRemaining: 10, wantResetAt: 2100 * ms},
	})
}

func TestSlidingWindowCounterSteps(t *testing.T) {
	const ms, s = time.Millisecond, time.Second
	base := Request{Name: "api", Key: "k", Limit: 10, Period: s, Algorithm: SlidingWindowCounter}
	runSteps(t, base, []step{
		{at: 0, hits: 6, wantAllowed: true, wantRemaining: 4, wantResetAt: 2 * s},
		// 6+5 > 10 in this window; in the next, 5 + 6*(P-e)/P <= 10 from
		// e = P - floor(5P/6) = 166666667ns.
		{at: 500 * ms, hits: 5, wantAllowed: false, wantRemaining: 4, wantRetryAfter: 666666667, wantResetAt: 2 * s},
		{at: 1166666666, hits: 5, wantAllowed: false, wantRemaining: 4, wantRetryAfter: 1, wantResetAt: 2 * s},
		{at: s, hits: 0, wantAllowed: true, wantRemaining: 4, wantResetAt: 2 * s},
		{at: 1500 * ms, hits: 0, wantAllowed: true, wantRemaining: 7, wantResetAt: 2 * s},
		{at: 1500 * ms, hits: 7, wantAllowed: true, wantRemaining: 0, wantResetAt: 3 * s},
		// 7+1 <= 10: wait in this window for 6*(P-e) <= 2P.
		{at: 1500 * ms, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 166666667, wantResetAt: 3 * s},
		{at: 2 * s, hits: 0, wantAllowed: true, wantRemaining: 3, wantResetAt: 3 * s},
		{at: 3 * s, hits: 0, wantAllowed: true, wantRemaining: 10, wantResetAt: 3 * s},
		// DrainOverLimit fills the current window; RetryAfter is from there.
		{at: 4 * s, hits: 7, wantAllowed: true, wantRemaining: 3, wantResetAt: 6 * s},
		{at: 4500 * ms, hits: 5, behavior: DrainOverLimit, wantAllowed: false, wantRemaining: 0, wantRetryAfter: s, wantResetAt: 6 * s},
		{at: 5500 * ms, hits: 5, wantAllowed: true, wantRemaining: 0, wantResetAt: 7 * s},
		// cur+hits of exactly Limit: wait until prev weighs nothing.
		{at: 6 * s, hits: 0, wantAllowed: true, wantRemaining: 5, wantResetAt: 7 * s},
		{at: 6 * s, hits: 10, wantAllowed: false, wantRemaining: 5, wantRetryAfter: s, wantResetAt: 7 * s},
		{at: 7 * s, hits: 10, wantAllowed: true, wantRemaining: 0, wantResetAt: 9 * s},
		// A Limit change keeps both counts.
		{at: 8500 * ms, hits: 0, limit: 20, wantAllowed: true, wantRemaining: 15, wantResetAt: 9 * s},
	})
}

func TestGCRASteps(t *testing.T) {
	const ms, s = time.Millisecond, time.Second
	base := Request{Name: "api", Key: "k", Limit: 10, Period: s, Algorithm: GCRA} // T = 100ms
	runSteps(t, base, []step{
		{at: 0, hits: 10, wantAllowed: true, wantRemaining: 0, wantResetAt: s},
		{at: 0, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 100 * ms, wantResetAt: s},
		{at: 100 * ms, hits: 1, wantAllowed: true, wantRemaining: 0, wantResetAt: 1100 * ms},
		{at: 550 * ms, hits: 0, wantAllowed: true, wantRemaining: 4, wantResetAt: 1100 * ms},
		{at: 550 * ms, hits: 5, wantAllowed: false, wantRemaining: 4, wantRetryAfter: 50 * ms, wantResetAt: 1100 * ms},
		{at: 600 * ms, hits: 5, wantAllowed: true, wantRemaining: 0, wantResetAt: 1600 * ms},
		// DrainOverLimit: TAT moves to now+Burst*T.
		{at: 1000 * ms, hits: 5, behavior: DrainOverLimit, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 500 * ms, wantResetAt: 2 * s},
		// A peek with DrainOverLimit consumes nothing.
		{at: 1050 * ms, hits: 0, behavior: DrainOverLimit, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 50 * ms, wantResetAt: 2 * s},
		{at: 1100 * ms, hits: 1, wantAllowed: true, wantRemaining: 0, wantResetAt: 2100 * ms},
		// A Period change converts the outstanding time to the new
		// interval: 10 hits of 100ms become 10 of 1s.
		{at: 1100 * ms, hits: 0, period: 10 * s, wantAllowed: false, wantRemaining: 0, wantRetryAfter: s, wantResetAt: 11100 * ms},
		{at: 1100 * ms, hits: 1, period: 10 * s, wantAllowed: false, wantRemaining: 0, wantRetryAfter: s, wantResetAt: 11100 * ms},
		{at: 2100 * ms, hits: 0, period: 10 * s, wantAllowed: true, wantRemaining: 1, wantResetAt: 11100 * ms},
		{at: 2100 * ms, hits: 0, wantAllowed: true, wantRemaining: 1, wantResetAt: 3000 * ms},
	})
	// The emission interval is rounded up: 3 per µs is one per 334ns.
	runSteps(t, Request{Name: "api", Key: "k", Limit: 3, Period: time.Microsecond, Algorithm: GCRA}, []step{
		{at: 0, hits: 3, wantAllowed: true, wantRemaining: 0, wantResetAt: 1002},
		{at: 0, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 334, wantResetAt: 1002},
		{at: 334, hits: 1, wantAllowed: true, wantRemaining: 0, wantResetAt: 1336},
	})
}

// TestExtremePeriods consumes the whole capacity and checks the invariants
// (exact RetryAfter among them) at MinPeriod and MaxPeriod, with the smallest
// and largest limits each algorithm accepts there.
func TestExtremePeriods(t *testing.T) {
	cases := []struct {
		limit, burst int64
		period       time.Duration
	}{
		{1, 0, MaxPeriod},
		{10, 0, MaxPeriod},
		{1, 10, MaxPeriod}, // the longest drain: Burst*Period/Limit = MaxDrain
		{MaxLimit, 0, MaxPeriod},
		{MaxLimit, MaxLimit, MaxPeriod},
		{1, 0, MinPeriod},
		{7, 0, MinPeriod},
		{1000, 0, MinPeriod}, // GCRA: one hit per nanosecond
		{MaxLimit, 0, MinPeriod},
	}
	for _, a := range Algorithms {
		for _, c := range cases {
			req := Request{Name: "x", Key: "y", Limit: c.limit, Burst: c.burst, Period: c.period, Algorithm: a}
			if req.Validate() != nil { // GCRA above one hit per ns
				continue
			}
			capacity := req.Capacity()
			t.Run(a.String(), func(t *testing.T) {
				s := newTestStore(t)
				check := func(at time.Time, hits int64, wantAllowed bool) Decision {
					t.Helper()
					r := req
					r.Hits = hits
					d, err := s.CheckAt(r, at)
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed != wantAllowed {
						t.Fatalf("limit %d burst %d period %v: %d hits at %v: allowed %v", c.limit, c.burst, c.period, hits, at.Sub(t0), d.Allowed)
					}
					checkInvariants(t, s, r, at, d)
					return d
				}
				check(t0, capacity, true)
				d := check(t0, 1, false)
				if c.burst == 0 && c.limit == 1 {
					// One per period: the next hit a period later. The
					// token bucket admits within bucketEpsilon hits of a
					// token, here bucketEpsilon periods early.
					slack := time.Duration(0)
					if a == TokenBucket || a == LeakyBucket {
						slack = time.Duration(2 * bucketEpsilon * float64(c.period))
					}
					if a != FixedWindow && a != SlidingWindowCounter && (d.RetryAfter > c.period || d.RetryAfter < c.period-slack) {
						t.Errorf("one per %v: RetryAfter %v", c.period, d.RetryAfter)
					}
				}
				d = check(t0.Add(d.RetryAfter), 1, true)
				check(d.ResetAt, capacity, true)
			})
		}
	}
}
