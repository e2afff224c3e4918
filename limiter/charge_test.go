package limiter

import (
	"errors"
	"testing"
	"time"
)

// TestChargeSteps: charged hits count past the capacity and drain at the
// request's rate; no limit change drops them. Capacity 10, 10 per second.
func TestChargeSteps(t *testing.T) {
	const ms = time.Millisecond
	steps := []step{
		{at: 0, hits: 8, wantAllowed: true, wantRemaining: 2},
		// 10 more charged: the level is 18 of 10, nothing dropped.
		{at: 0, hits: 10, behavior: Charge, wantAllowed: true, wantRemaining: 0},
		{at: 0, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: unchecked},
		// A larger limit finds all 18: 2 of 20 remain.
		{at: 0, hits: 0, limit: 20, burst: 20, wantAllowed: true, wantRemaining: 2},
		// 800 ms drain 8 at 10/s: the level is 10, still full.
		{at: 800 * ms, hits: 1, wantAllowed: false, wantRemaining: 0, wantRetryAfter: 100 * ms},
		{at: 900 * ms, hits: 1, wantAllowed: true, wantRemaining: 0},
	}
	for _, a := range []Algorithm{TokenBucket, LeakyBucket, GCRA} {
		for i := range steps {
			if steps[i].wantDelay == 0 {
				steps[i].wantDelay = unchecked
			}
			if steps[i].wantResetAt == 0 {
				steps[i].wantResetAt = unchecked
			}
		}
		t.Run(a.String(), func(t *testing.T) {
			runSteps(t, Request{Name: "api", Key: "k", Limit: 10, Period: time.Second, Algorithm: a}, steps)
		})
	}
}

func TestChargeValidate(t *testing.T) {
	base := Request{Name: "api", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Behavior: Charge}
	for _, tc := range []struct {
		algo     Algorithm
		behavior Behavior
		ok       bool
	}{
		{TokenBucket, Charge, true},
		{LeakyBucket, Charge, true},
		{GCRA, Charge, true},
		{FixedWindow, Charge, false},
		{SlidingWindowLog, Charge, false},
		{SlidingWindowCounter, Charge, false},
		{TokenBucket, Charge | Reset, false},
		{TokenBucket, Charge | Refund, false},
	} {
		r := base
		r.Algorithm, r.Behavior = tc.algo, tc.behavior
		err := r.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidBehavior)) {
			t.Errorf("%v %#x: Validate = %v, want ok %v", tc.algo, tc.behavior, err, tc.ok)
		}
	}
}
