package limiter

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// The reference models below are written for obviousness, not speed, and
// share no code with the implementation: per-hit logs, maps from window
// index to count, big.Int and big.Rat arithmetic, linear and binary searches
// over time. Each takes requests in time order with fixed Limit, Period and
// Burst (parameter changes are covered by the step tables).

// refDecision is a model's answer. Durations are nanoseconds.
type refDecision struct {
	allowed   bool
	remaining int64
	retry     int64
	resetAt   int64 // Unix ns
}

func refBurst(r Request) int64 {
	if r.Burst == 0 || r.Algorithm == FixedWindow || r.Algorithm == SlidingWindowLog || r.Algorithm == SlidingWindowCounter {
		return r.Limit
	}
	return r.Burst
}

// refFloorDiv is a/b rounded down, for b > 0.
func refFloorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// fixedWindowRef counts the hits of each window, by window index.
type fixedWindowRef struct{ counts map[int64]int64 }

func (m *fixedWindowRef) decide(r Request, now int64) refDecision {
	if r.Behavior&Reset != 0 {
		clear(m.counts)
	}
	p := int64(r.Period)
	w := refFloorDiv(now, p)
	c := m.counts[w]
	var d refDecision
	if c+max(r.Hits, 1) <= r.Limit {
		d.allowed = true
		c += r.Hits
	} else {
		if r.Behavior&DrainOverLimit != 0 && r.Hits > 0 && c < r.Limit {
			c = r.Limit
		}
		d.retry = (w+1)*p - now // the next window is empty
	}
	m.counts[w] = c
	d.remaining = max(r.Limit-c, 0)
	d.resetAt = now
	if c > 0 {
		d.resetAt = (w + 1) * p
	}
	return d
}

// slidingLogRef keeps every admission, unmerged, forever.
type slidingLogRef struct{ log []struct{ at, hits int64 } }

// count is the hits admitted in (at-p, at].
func (m *slidingLogRef) count(at, p int64) int64 {
	n := int64(0)
	for _, e := range m.log {
		if e.at > at-p && e.at <= at {
			n += e.hits
		}
	}
	return n
}

func (m *slidingLogRef) add(at, hits int64) {
	m.log = append(m.log, struct{ at, hits int64 }{at, hits})
}

func (m *slidingLogRef) decide(r Request, now int64) refDecision {
	if r.Behavior&Reset != 0 {
		m.log = nil
	}
	p, probe := int64(r.Period), max(r.Hits, 1)
	live := m.count(now, p)
	var d refDecision
	if live+probe <= r.Limit {
		d.allowed = true
		if r.Hits > 0 {
			m.add(now, r.Hits)
		}
	} else {
		if r.Behavior&DrainOverLimit != 0 && r.Hits > 0 && live < r.Limit {
			m.add(now, r.Limit-live)
		}
		// The count only falls when an entry leaves, at its time + p:
		// try every such instant.
		best := int64(math.MaxInt64)
		for _, e := range m.log {
			if at := e.at + p; at > now && at < best && m.count(at, p)+probe <= r.Limit {
				best = at
			}
		}
		d.retry = best - now
	}
	d.remaining = max(r.Limit-m.count(now, p), 0)
	d.resetAt = now
	for _, e := range m.log {
		if e.at > now-p {
			d.resetAt = max(d.resetAt, e.at+p)
		}
	}
	return d
}

// slidingCounterRef counts the hits of each window and evaluates the
// documented formula cur + hits + prev*(P-elapsed)/P <= Limit with big.Int.
type slidingCounterRef struct{ counts map[int64]int64 }

// room is Limit*P - cur*P - prev*(P-elapsed) at time at: P times what a
// request may still add.
func (m *slidingCounterRef) room(r Request, at int64) *big.Int {
	p := int64(r.Period)
	w := refFloorDiv(at, p)
	elapsed := at - w*p
	room := new(big.Int).Mul(big.NewInt(r.Limit), big.NewInt(p))
	room.Sub(room, new(big.Int).Mul(big.NewInt(m.counts[w]), big.NewInt(p)))
	return room.Sub(room, new(big.Int).Mul(big.NewInt(m.counts[w-1]), big.NewInt(p-elapsed)))
}

func (m *slidingCounterRef) admits(r Request, at, hits int64) bool {
	return new(big.Int).Mul(big.NewInt(hits), big.NewInt(int64(r.Period))).Cmp(m.room(r, at)) <= 0
}

func (m *slidingCounterRef) remaining(r Request, at int64) int64 {
	room := m.room(r, at)
	if room.Sign() <= 0 {
		return 0
	}
	return room.Quo(room, big.NewInt(int64(r.Period))).Int64()
}

func (m *slidingCounterRef) decide(r Request, now int64) refDecision {
	if r.Behavior&Reset != 0 {
		clear(m.counts)
	}
	p, probe := int64(r.Period), max(r.Hits, 1)
	w := refFloorDiv(now, p)
	var d refDecision
	if m.admits(r, now, probe) {
		d.allowed = true
		m.counts[w] += r.Hits
	} else {
		if r.Behavior&DrainOverLimit != 0 && r.Hits > 0 {
			m.counts[w] += m.remaining(r, now)
		}
		// Admission only gets easier with time; two periods on, both
		// windows are empty. Bisect.
		lo, hi := int64(0), 2*p
		for hi-lo > 1 {
			mid := lo + (hi-lo)/2
			if m.admits(r, now+mid, probe) {
				hi = mid
			} else {
				lo = mid
			}
		}
		d.retry = hi
	}
	d.remaining = m.remaining(r, now)
	switch {
	case m.counts[w] > 0:
		d.resetAt = (w + 2) * p
	case m.counts[w-1] > 0:
		d.resetAt = (w + 1) * p
	default:
		d.resetAt = now
	}
	return d
}

// gcraRef is GCRA in its continuous-state leaky bucket form: a counter x
// (ns) that drains one per nanosecond, T per hit, limit tau = Burst*T.
type gcraRef struct {
	x, lct int64
	used   bool
}

func (m *gcraRef) decide(r Request, now int64) refDecision {
	p := int64(r.Period)
	T := p / r.Limit
	if p%r.Limit != 0 {
		T++
	}
	tau := refBurst(r) * T
	x := int64(0)
	if m.used && r.Behavior&Reset == 0 {
		x = max(m.x-(now-m.lct), 0)
	}
	probe := max(r.Hits, 1)
	var d refDecision
	if x+probe*T <= tau {
		d.allowed = true
		x += r.Hits * T
	} else {
		if r.Behavior&DrainOverLimit != 0 && r.Hits > 0 && x < tau {
			x = tau
		}
		d.retry = x + probe*T - tau
	}
	m.x, m.lct, m.used = x, now, true
	d.remaining = max((tau-x)/T, 0)
	d.resetAt = now + x
	return d
}

// bucketRef is an exact bucket in big.Rat: the token bucket counts the
// tokens present (full when fresh), the leaky bucket the hits queued (empty
// when fresh). margin reports how far a request is from the boundary
// (admitted iff margin >= 0); decide is then told whether to admit, so that
// the model can follow the implementation where the two may differ.
type bucketRef struct {
	leaky  bool
	amount *big.Rat // tokens present, or hits queued
	last   int64
	used   bool
}

// bucketOut is a bucket model's exact answer, for comparison within the
// tolerance.
type bucketOut struct {
	allowed                bool
	remaining              *big.Rat // before flooring
	retry, resetAt, delay  *big.Rat // ns; resetAt since now
	retryValid, delayValid bool
}

func rat(a int64) *big.Rat { return new(big.Rat).SetInt64(a) }

// at returns the amount at now, without changing the model.
func (m *bucketRef) at(r Request, now int64) *big.Rat {
	b := rat(refBurst(r))
	if !m.used || r.Behavior&Reset != 0 {
		if m.leaky {
			return rat(0)
		}
		return b
	}
	flow := new(big.Rat).Mul(rat(now-m.last), big.NewRat(r.Limit, int64(r.Period)))
	if m.leaky {
		a := new(big.Rat).Sub(m.amount, flow)
		if a.Sign() < 0 {
			a.SetInt64(0)
		}
		return a
	}
	a := new(big.Rat).Add(m.amount, flow)
	if a.Cmp(b) > 0 {
		a.Set(b)
	}
	return a
}

func (m *bucketRef) margin(r Request, now int64) *big.Rat {
	a := m.at(r, now)
	probe := rat(max(r.Hits, 1))
	if m.leaky { // room left in the queue after the request
		return a.Sub(new(big.Rat).Sub(rat(refBurst(r)), a), probe)
	}
	return a.Sub(a, probe) // tokens left after the request
}

func (m *bucketRef) decide(r Request, now int64, admit bool) bucketOut {
	a := m.at(r, now)
	b := rat(refBurst(r))
	hits, probe := rat(r.Hits), rat(max(r.Hits, 1))
	perHit := big.NewRat(int64(r.Period), r.Limit) // ns
	out := bucketOut{allowed: admit}
	drain := r.Behavior&DrainOverLimit != 0 && r.Hits > 0
	if m.leaky {
		if admit {
			out.delay, out.delayValid = new(big.Rat).Mul(a, perHit), true
			a.Add(a, hits)
		} else {
			if drain && a.Cmp(b) < 0 {
				a.Set(b)
			}
			need := new(big.Rat).Sub(new(big.Rat).Add(a, probe), b)
			out.retry, out.retryValid = need.Mul(need, perHit), true
		}
		out.remaining = new(big.Rat).Sub(b, a)
		out.resetAt = new(big.Rat).Mul(a, perHit)
	} else {
		if admit {
			a.Sub(a, hits)
		} else {
			if drain && a.Sign() > 0 {
				a.SetInt64(0)
			}
			need := new(big.Rat).Sub(probe, a)
			out.retry, out.retryValid = need.Mul(need, perHit), true
		}
		out.remaining = new(big.Rat).Set(a)
		missing := new(big.Rat).Sub(b, a)
		out.resetAt = missing.Mul(missing, perHit)
	}
	if out.resetAt.Sign() < 0 {
		out.resetAt.SetInt64(0)
	}
	m.amount, m.last, m.used = a, now, true
	return out
}

func ratFloat(x *big.Rat) float64 {
	f, _ := x.Float64()
	return f
}

// traceCount is how many random traces each algorithm runs.
func traceCount() int {
	switch {
	case testing.Short():
		return 200
	case raceEnabled:
		return 400
	}
	return 2000
}

func randomRequest(tb testing.TB, rng *rand.Rand, a Algorithm) Request {
	tb.Helper()
	for range 1000 {
		r := Request{Name: "diff", Key: "k", Algorithm: a}
		switch rng.IntN(10) {
		case 0, 1, 2, 3:
			r.Limit = 1 + rng.Int64N(10)
		case 4, 5, 6, 7:
			r.Limit = 1 + rng.Int64N(100)
		case 8:
			r.Limit = 1 + rng.Int64N(10_000)
		default:
			r.Limit = 1 + rng.Int64N(1_000_000)
		}
		if rng.IntN(2) == 0 {
			r.Period = []time.Duration{time.Microsecond, 7 * time.Microsecond, time.Millisecond, 333 * time.Millisecond, time.Second, time.Minute, time.Hour}[rng.IntN(7)]
		} else { // log-uniform in [1µs, 1000s]
			r.Period = time.Duration(1e3 * math.Exp(rng.Float64()*math.Log(1e9)))
		}
		if a.HasBurst() && rng.IntN(5) > 1 {
			r.Burst = 1 + rng.Int64N(2*r.Limit+1)
		}
		if a == GCRA && r.Limit > int64(r.Period) {
			r.Limit = int64(r.Period)
		}
		if r.Validate() == nil {
			return r
		}
	}
	tb.Fatalf("%v: no valid random request in 1000 tries", a)
	return Request{}
}

func randomHits(rng *rand.Rand, capacity int64) int64 {
	switch x := rng.IntN(10); {
	case x == 0:
		return 0
	case x < 7:
		return 1 + rng.Int64N(min(capacity, 3))
	}
	return 1 + rng.Int64N(capacity)
}

func randomGap(rng *rand.Rand, r Request) int64 {
	p := int64(r.Period)
	perHit := max(p/r.Limit, 1)
	switch x := rng.IntN(20); {
	case x < 6:
		return 0 // the same instant
	case x < 8:
		return 1 + rng.Int64N(3)
	case x < 13:
		return rng.Int64N(2*perHit + 1)
	case x < 18:
		return rng.Int64N(2*p + 1)
	}
	return rng.Int64N(5*p + 1)
}

func randomStart(rng *rand.Rand) int64 {
	switch rng.IntN(10) {
	case 0:
		return -rng.Int64N(1e18) // before 1970
	case 1:
		return rng.Int64N(1e9) // at the epoch
	}
	return 1_700_000_000e9 + rng.Int64N(1e17)
}

// TestDifferential runs thousands of random traces per algorithm (random
// limits, bursts, periods, hits, peeks, DrainOverLimit and Reset, time gaps
// including same-instant arrivals) through a Store and a reference model.
// Fixed window, sliding log, sliding window counter and GCRA must agree
// exactly on Allowed, Remaining, RetryAfter and ResetAt. The buckets keep a
// float64 level: they must agree on Allowed unless the exact level is within
// tol = 2*bucketEpsilon + 1e-12*capacity hits of the admission boundary (the
// implementation admits within bucketEpsilon; float64 rounding of a level of
// up to the capacity stays far below 1e-12*capacity over a trace), on
// Remaining within tol, and on RetryAfter, ResetAt and Delay within
// tol*Period/Limit + 1ns. Every decision also passes checkInvariants, which
// makes RetryAfter and Remaining exact for the buckets too.
func TestDifferential(t *testing.T) {
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(20240515, uint64(a)))
			for trace := range traceCount() {
				runTrace(t, rng, a, trace)
			}
		})
	}
}

func runTrace(t *testing.T, rng *rand.Rand, a Algorithm, trace int) {
	base := randomRequest(t, rng, a)
	s := newTestStore(t)
	var exact interface {
		decide(Request, int64) refDecision
	}
	var bucket *bucketRef
	switch a {
	case TokenBucket, LeakyBucket:
		bucket = &bucketRef{leaky: a == LeakyBucket}
	case FixedWindow:
		exact = &fixedWindowRef{counts: map[int64]int64{}}
	case SlidingWindowLog:
		exact = &slidingLogRef{}
	case SlidingWindowCounter:
		exact = &slidingCounterRef{counts: map[int64]int64{}}
	case GCRA:
		exact = &gcraRef{}
	}
	capacity := base.Capacity()
	tol := new(big.Rat).SetFloat64(2*bucketEpsilon + 1e-12*float64(capacity))
	tolNs := ratFloat(new(big.Rat).Mul(tol, big.NewRat(int64(base.Period), base.Limit))) + 1

	// hist is the trace so far, for failure messages: its parameters and
	// the last steps.
	header := fmt.Sprintf("trace %d: limit %d period %v burst %d\n", trace, base.Limit, base.Period, base.Burst)
	var steps []string
	hist := func() string {
		return header + strings.Join(steps[max(len(steps)-15, 0):], "")
	}
	now := randomStart(rng)
	for i := range 10 + rng.IntN(70) {
		now += randomGap(rng, base)
		req := base
		req.Hits = randomHits(rng, capacity)
		switch x := rng.IntN(100); {
		case x < 8:
			req.Behavior = DrainOverLimit
		case x < 10:
			req.Behavior = Reset
		case x < 11:
			req.Behavior = Reset | DrainOverLimit
		}
		at := time.Unix(0, now)
		var margin *big.Rat
		if bucket != nil {
			margin = bucket.margin(req, now)
		}
		d, err := s.CheckAt(req, at)
		if err != nil {
			t.Fatalf("%sstep %d: %v", hist(), i, err)
		}
		steps = append(steps, fmt.Sprintf("step %d: at %d hits %d behavior %d: %+v\n", i, now, req.Hits, req.Behavior, d))
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("%s%v: "+format, append([]any{hist(), a}, args...)...)
		}
		if exact != nil {
			want := exact.decide(req, now)
			got := refDecision{d.Allowed, d.Remaining, int64(d.RetryAfter), d.ResetAt.UnixNano()}
			if got != want {
				fail("got %+v, the model says %+v", got, want)
			}
		} else {
			admit := margin.Sign() >= 0
			near := new(big.Rat).Abs(margin).Cmp(tol) <= 0
			if d.Allowed != admit && !near {
				fail("allowed %v, the model's margin is %s hits", d.Allowed, margin.FloatString(12))
			}
			want := bucket.decide(req, now, d.Allowed) // follow it near the boundary
			rem := ratFloat(want.remaining)
			lo, hi := math.Floor(rem-ratFloat(tol)), math.Floor(rem+ratFloat(tol))
			if float64(d.Remaining) < max(lo, 0) || float64(d.Remaining) > max(hi, 0) {
				fail("remaining %d, the model has %s", d.Remaining, want.remaining.FloatString(12))
			}
			closeNs := func(what string, got time.Duration, want *big.Rat) {
				t.Helper()
				if diff := math.Abs(float64(got) - ratFloat(want)); diff > tolNs {
					fail("%s %v (%d ns), the model says %s ns (tolerance %.3f ns)", what, got, int64(got), want.FloatString(3), tolNs)
				}
			}
			if want.retryValid && !d.Allowed {
				closeNs("retryAfter", d.RetryAfter, want.retry)
			}
			closeNs("resetAt-now", d.ResetAt.Sub(at), want.resetAt)
			if want.delayValid {
				closeNs("delay", d.Delay, want.delay)
			}
		}
		checkInvariants(t, s, req, at, d)
	}
}
