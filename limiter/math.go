package limiter

import (
	"math"
	"math/bits"
	"time"
)

// u128 is an unsigned 128-bit integer, for exact products of counts and
// nanoseconds.
type u128 struct{ hi, lo uint64 }

func mul(a, b int64) u128 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	return u128{hi, lo}
}

func (x u128) add(y u128) u128 {
	lo, c := bits.Add64(x.lo, y.lo, 0)
	return u128{x.hi + y.hi + c, lo}
}

// sub returns x-y; callers ensure x >= y.
func (x u128) sub(y u128) u128 {
	lo, b := bits.Sub64(x.lo, y.lo, 0)
	return u128{x.hi - y.hi - b, lo}
}

func (x u128) less(y u128) bool { return x.hi < y.hi || (x.hi == y.hi && x.lo < y.lo) }

// div returns floor(x/d), saturated to MaxInt64.
func (x u128) div(d int64) int64 {
	if x.hi >= uint64(d) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(x.hi, x.lo, uint64(d))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// divCeil returns ceil(x/d), saturated to MaxInt64.
func (x u128) divCeil(d int64) int64 {
	if x.hi >= uint64(d) {
		return math.MaxInt64
	}
	q, r := bits.Div64(x.hi, x.lo, uint64(d))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// horizon is the latest instant (Unix ns) a decision at now reaches: the
// latest instant Unix nanoseconds represent (2262-04-11T23:47:16.854775807Z),
// or, for a now before 1970, now plus the longest Duration. Every time a
// decision computes saturates there (expireAt, ResetAt, now+RetryAfter), so
// that time-now and now+RetryAfter never overflow. A state that would last
// longer is fresh from the horizon on, and RetryAfter says so exactly.
func horizon(now int64) int64 {
	if now < 0 {
		return now + math.MaxInt64
	}
	return math.MaxInt64
}

// addSat is t+d for d >= 0, saturated to the latest representable instant.
func addSat(t, d int64) int64 {
	if t > math.MaxInt64-d {
		return math.MaxInt64
	}
	return t + d
}

// floorDiv is a/b rounded toward minus infinity, for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// nsTime converts Unix nanoseconds to a time.Time.
func nsTime(ns int64) time.Time { return time.Unix(0, ns) }
