package limiter

import (
	"math"
	"time"
)

// bucketEpsilon absorbs float64 rounding in the bucket level: a level within
// this many hits of admitting is taken to admit. It is the stated tolerance
// of the token and leaky buckets against an exact model.
const bucketEpsilon = 1e-9

// decideBucket is the token bucket (leaky == false) and the leaky bucket as a
// queue (leaky == true). Both keep a level that drains at Limit/Period: the
// tokens consumed for the token bucket, the hits queued for the leaky bucket.
func decideBucket(st *state, req *Request, now int64, leaky bool) Decision {
	limit, period := float64(req.Limit), float64(req.Period)
	// boundTimes has bounded the level's time by now: from here on the
	// level is that at now.
	level := bucketLevelAt(st.level(), st.levelTime(), now, limit, period)
	capacity := float64(req.burst())
	hits := float64(req.Hits)
	probe := hits
	if req.Hits == 0 {
		probe = 1
	}
	d := Decision{Limit: req.Limit}
	if level+probe <= capacity+bucketEpsilon || req.Behavior&Charge != 0 {
		d.Allowed = true
		if leaky {
			// An admitted level is at most the capacity, which
			// Validate bounds to drain in MaxDrain.
			d.Delay = time.Duration(drainTime(level, limit, period))
		}
		level += hits
		if req.Hits > 0 {
			d.Window = Window{now, now}
		}
	} else if req.Behavior&DrainOverLimit != 0 && req.Hits > 0 && level < capacity {
		level = capacity
	}
	d.Remaining = bucketRemaining(level, capacity)
	st.setLevel(level, now)
	// A level carried over from a faster rate may drain past the horizon:
	// the state is then fresh at the horizon, and not before.
	st.expireAt = min(addSat(now, drainTime(level, limit, period)), horizon(now))
	if !d.Allowed {
		d.RetryAfter = bucketRetry(level, now, st.expireAt, probe, capacity, limit, period)
	}
	d.ResetAt = nsTime(st.expireAt)
	return d
}

// bucketRemaining is the most hits the admission rule admits at level: the
// largest n with level+n <= capacity+bucketEpsilon, as computed in float64.
// Near a capacity of 2^40 an ulp is 2^-12, and capacity-level rounds
// otherwise than level+n does, so the estimate is checked against the rule.
func bucketRemaining(level, capacity float64) int64 {
	bound := capacity + bucketEpsilon
	if level+1 > bound { // the common case of a full bucket
		return 0
	}
	n := int64(bound - level)
	for level+float64(n+1) <= bound {
		n++
	}
	for n > 0 && level+float64(n) > bound {
		n--
	}
	return n
}

// bucketLevelAt is a level stored at last as it stands at now: drained at
// limit per period, and taken to be empty within bucketEpsilon. decideBucket
// and bucketRetry both use it, so that RetryAfter agrees exactly with the
// admission rule, float rounding included.
func bucketLevelAt(level float64, last, now int64, limit, period float64) float64 {
	if level > 0 && now > last {
		// elapsed*Limit is exact in float64 up to 2^53, so a refill at
		// an exact instant gives an exact level.
		level -= float64(now-last) * limit / period
		if level < bucketEpsilon {
			level = 0
		}
	}
	return level
}

// bucketRetry is the least d such that a request probing probe hits at now+d
// is admitted by a bucket whose level is level at now and which is fresh at
// expireAt, given that it is not admitted at now. The level drains
// monotonically, so a bisection around the closed-form estimate finds it; at
// expireAt the state is fresh and admits.
func bucketRetry(level float64, now, expireAt int64, probe, capacity, limit, period float64) time.Duration {
	admits := func(d int64) bool {
		return bucketLevelAt(level, now, now+d, limit, period)+probe <= capacity+bucketEpsilon
	}
	lo := int64(0)       // not admitted
	hi := expireAt - now // admitted (fresh); at most the horizon's distance
	guess := min(addSat(now, drainTime(level+probe-capacity-bucketEpsilon, limit, period)), expireAt) - now
	if guess > lo && guess < hi {
		if admits(guess) {
			hi = guess
			if !admits(guess - 1) {
				return time.Duration(guess)
			}
		} else {
			lo = guess
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if admits(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return time.Duration(hi)
}

// drainTime is how long (ns) a level of amount drains at limit per period,
// rounded up to a whole nanosecond and saturated to MaxInt64.
func drainTime(amount, limit, period float64) int64 {
	if amount <= 0 {
		return 0
	}
	ns := math.Ceil(amount * period / limit)
	if ns >= math.MaxInt64 { // 2^63 as a float64
		return math.MaxInt64
	}
	return int64(ns)
}
