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
	level := math.Float64frombits(uint64(st.w[0]))
	last := st.w[1]
	limit, period := float64(req.Limit), float64(req.Period)
	if now > last {
		if level > 0 {
			// elapsed*Limit is exact in float64 up to 2^53, so a refill at
			// an exact instant gives an exact level.
			level -= float64(now-last) * limit / period
			if level < bucketEpsilon {
				level = 0
			}
		}
		last = now
	}
	capacity := float64(req.burst())
	hits := float64(req.Hits)
	probe := hits
	if req.Hits == 0 {
		probe = 1
	}
	d := Decision{Limit: req.Limit}
	if level+probe <= capacity+bucketEpsilon {
		d.Allowed = true
		if leaky {
			d.Delay = drainTime(level, limit, period)
		}
		level += hits
	} else {
		d.RetryAfter = drainTime(level+probe-capacity, limit, period)
		if req.Behavior&DrainOverLimit != 0 && level < capacity {
			level = capacity
		}
	}
	if rem := capacity - level + bucketEpsilon; rem > 0 {
		d.Remaining = int64(rem)
	}
	st.w[0] = int64(math.Float64bits(level))
	st.w[1] = last
	st.expireAt = now + int64(drainTime(level, limit, period))
	d.ResetAt = nsTime(st.expireAt)
	return d
}

// drainTime is how long a level of amount drains at limit per period,
// rounded up to a whole nanosecond.
func drainTime(amount, limit, period float64) time.Duration {
	if amount <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(amount * period / limit))
}
