package limiter

import (
	"fmt"
	"maps"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// The reference models below are written for obviousness, not speed, and
// share no code with the implementation: per-hit logs, maps from window
// index to count, big.Int and big.Rat arithmetic, linear and binary searches
// over time. Each takes requests in time order. A request may change Limit,
// Period and Burst; each model then applies the rules of doc.go for
// changes in its own terms, and saturates time at the horizon (refHorizon).

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

// refHorizon is the latest instant a decision at now may name, per doc.go:
// the largest int64 Unix ns, or now plus the largest Duration if less.
func refHorizon(now int64) int64 {
	h := new(big.Int).Add(big.NewInt(now), big.NewInt(math.MaxInt64))
	if h.Cmp(big.NewInt(math.MaxInt64)) > 0 {
		return math.MaxInt64
	}
	return h.Int64()
}

// fixedWindowRef counts the hits of each window, by window index under
// period, the Period of the last request.
type fixedWindowRef struct {
	counts map[int64]int64
	period int64
	last   int64 // the last request's window index
}

func (m *fixedWindowRef) decide(r Request, now int64) refDecision {
	p := int64(r.Period)
	w := refFloorDiv(now, p)
	if r.Behavior&Reset != 0 {
		clear(m.counts)
	}
	if m.period != 0 && m.period != p {
		// The count of the last window, if that is not over, counts in
		// the current window.
		c, end := m.counts[m.last], (m.last+1)*m.period
		clear(m.counts)
		if now < end {
			m.counts[w] = c
		}
	}
	m.period, m.last = p, w
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

// slidingLogRef keeps every admission, unmerged. An entry is dropped once a
// request finds it outside its window, and the whole log once it was empty
// under the Period of the last request.
type slidingLogRef struct {
	log    []struct{ at, hits int64 }
	period int64 // of the last request
}

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
	p, probe := int64(r.Period), max(r.Hits, 1)
	if r.Behavior&Reset != 0 || m.count(now, m.period) == 0 {
		m.log = nil // reset, or fresh under the last request's Period
	}
	m.period = p
	live := m.log[:0]
	for _, e := range m.log {
		if e.at > now-p {
			live = append(live, e)
		}
	}
	m.log = live
	live0 := m.count(now, p)
	var d refDecision
	if live0+probe <= r.Limit {
		d.allowed = true
		if r.Hits > 0 {
			m.add(now, r.Hits)
		}
	} else {
		if r.Behavior&DrainOverLimit != 0 && r.Hits > 0 && live0 < r.Limit {
			m.add(now, r.Limit-live0)
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

// slidingCounterRef counts the hits of each window, by window index under
// period, the Period of the last request, and evaluates the documented
// formula cur + hits + prev*(P-elapsed)/P <= Limit with big.Int.
type slidingCounterRef struct {
	counts map[int64]int64
	period int64
	last   int64 // the last request's window index
}

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

// expireAt is when the counts are fresh under the last request's Period.
func (m *slidingCounterRef) expireAt() int64 {
	switch {
	case m.period == 0:
	case m.counts[m.last] > 0:
		return (m.last + 2) * m.period
	case m.counts[m.last-1] > 0:
		return (m.last + 1) * m.period
	}
	return math.MinInt64
}

func (m *slidingCounterRef) decide(r Request, now int64) refDecision {
	p, probe := int64(r.Period), max(r.Hits, 1)
	w := refFloorDiv(now, p)
	if r.Behavior&Reset != 0 || now >= m.expireAt() {
		clear(m.counts)
	}
	if m.period != 0 && m.period != p {
		// Each count of the last request's two windows goes to the
		// window of Period p holding its window's last nanosecond, or
		// to the current one if that is later; saturated at MaxLimit.
		old := map[int64]int64{}
		for _, i := range []int64{m.last, m.last - 1} {
			if c := m.counts[i]; c > 0 {
				lastNs := min((i+1)*m.period-1, now)
				old[refFloorDiv(lastNs, p)] += c
			}
		}
		clear(m.counts)
		for i, c := range old {
			m.counts[i] = min(c, MaxLimit)
		}
	}
	m.period, m.last = p, w
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
	d.resetAt = max(m.expireAt(), now)
	return d
}

// gcraRef is GCRA in its continuous-state leaky bucket form: a counter x
// (ns) that drains one per nanosecond, T per hit, limit tau = Burst*T. A
// change of T converts x to the new interval, rounded up; x never reaches
// past the horizon.
type gcraRef struct {
	x, lct, t int64
	used      bool
}

func (m *gcraRef) decide(r Request, now int64) refDecision {
	p := int64(r.Period)
	T := p / r.Limit
	if p%r.Limit != 0 {
		T++
	}
	tau := refBurst(r) * T
	ahead := refHorizon(now) - now
	x := int64(0)
	if m.used && r.Behavior&Reset == 0 {
		x = max(m.x-(now-m.lct), 0)
		if T != m.t {
			conv := new(big.Int).Mul(big.NewInt(x), big.NewInt(T))
			conv.Add(conv, big.NewInt(m.t-1))
			conv.Quo(conv, big.NewInt(m.t))
			if conv.Cmp(big.NewInt(ahead)) > 0 {
				conv.SetInt64(ahead)
			}
			x = conv.Int64()
		}
	}
	probe := max(r.Hits, 1)
	var d refDecision
	// x + probe*T <= tau, with x up to the horizon's distance.
	need := new(big.Int).Add(big.NewInt(x), new(big.Int).Mul(big.NewInt(probe), big.NewInt(T)))
	if need.Cmp(big.NewInt(tau)) <= 0 {
		d.allowed = true
		x = min(x+r.Hits*T, ahead)
	} else {
		if r.Behavior&DrainOverLimit != 0 && r.Hits > 0 && x < tau {
			x = min(tau, ahead)
		}
		d.retry = new(big.Int).Sub(need.Add(big.NewInt(x), big.NewInt(probe*T)), big.NewInt(tau)).Int64()
	}
	m.x, m.lct, m.t, m.used = x, now, T, true
	d.remaining = max((tau-x)/T, 0)
	d.resetAt = now + x
	return d
}

// bucketRef is an exact bucket in big.Rat: the level is the tokens consumed
// (token bucket) or the hits queued (leaky bucket), 0 when fresh; a request
// is admitted when level + hits <= Burst. The level drains at the rate of
// each request from the request before it on; it is fresh from end, when it
// would have drained at the rate of the request that wrote it (capped at
// that request's horizon). margin reports how far a request is from the
// boundary (admitted iff margin >= 0); decide is then told whether to admit,
// and at is told whether the implementation found the state fresh, so that
// the model can follow the implementation where the two may differ by float
// rounding.
type bucketRef struct {
	leaky bool
	level *big.Rat
	last  int64
	end   *big.Rat // Unix ns
	used  bool
	// endTol is how far (ns) the implementation's end may be from end.
	endTol float64
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

// at returns the level at now, without changing the model. implFresh is
// whether the implementation found the state fresh; the model follows it
// within endTol of end.
func (m *bucketRef) at(r Request, now int64, implFresh bool) *big.Rat {
	if !m.used || r.Behavior&Reset != 0 {
		return rat(0)
	}
	gap := new(big.Rat).Sub(rat(now), m.end)
	fresh := gap.Sign() >= 0
	if math.Abs(ratFloat(gap)) <= m.endTol {
		fresh = implFresh
	}
	if fresh {
		return rat(0)
	}
	flow := new(big.Rat).Mul(rat(now-m.last), big.NewRat(r.Limit, int64(r.Period)))
	a := new(big.Rat).Sub(m.level, flow)
	if a.Sign() < 0 {
		a.SetInt64(0)
	}
	return a
}

func (m *bucketRef) margin(r Request, now int64, implFresh bool) *big.Rat {
	a := m.at(r, now, implFresh)
	probe := rat(max(r.Hits, 1))
	return a.Sub(new(big.Rat).Sub(rat(refBurst(r)), a), probe) // room after the request
}

// capNs is min(x, limit) for durations in ns.
func capNs(x *big.Rat, limit int64) *big.Rat {
	if x.Cmp(rat(limit)) > 0 {
		return rat(limit)
	}
	return x
}

func (m *bucketRef) decide(r Request, now int64, admit, implFresh bool, tolNs float64) bucketOut {
	a := m.at(r, now, implFresh)
	b := rat(refBurst(r))
	hits, probe := rat(r.Hits), rat(max(r.Hits, 1))
	perHit := big.NewRat(int64(r.Period), r.Limit) // ns
	ahead := refHorizon(now) - now
	out := bucketOut{allowed: admit}
	if admit {
		if m.leaky {
			out.delay, out.delayValid = new(big.Rat).Mul(a, perHit), true
		}
		a.Add(a, hits)
	} else {
		if r.Behavior&DrainOverLimit != 0 && r.Hits > 0 && a.Cmp(b) < 0 {
			a.Set(b)
		}
		need := new(big.Rat).Sub(new(big.Rat).Add(a, probe), b)
		out.retry, out.retryValid = capNs(need.Mul(need, perHit), ahead), true
	}
	out.remaining = new(big.Rat).Sub(b, a)
	out.resetAt = capNs(new(big.Rat).Mul(a, perHit), ahead)
	m.level, m.last, m.used = a, now, true
	m.end = new(big.Rat).Add(rat(now), out.resetAt)
	m.endTol = tolNs
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

// validRandom draws requests of a with draw, GCRA's Limit cut to its
// Period in nanoseconds, until one is valid, and fails tb after 1000 tries.
func validRandom(tb testing.TB, a Algorithm, draw func() Request) Request {
	tb.Helper()
	for range 1000 {
		r := draw()
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

func randomRequest(tb testing.TB, rng *rand.Rand, a Algorithm) Request {
	tb.Helper()
	return validRandom(tb, a, func() Request {
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
		return r
	})
}

// randomExtremeRequest is a valid request whose Limit, Period and Burst are
// often at the ends of their ranges, for traces that change them: a change
// from one to the next may cut or raise the rate by up to 10^29.
func randomExtremeRequest(tb testing.TB, rng *rand.Rand, a Algorithm) Request {
	tb.Helper()
	limits := []int64{1, 2, 7, 1000, 1_000_000, 1_000_000_000, MaxLimit}
	periods := []time.Duration{MinPeriod, 7 * time.Microsecond, time.Millisecond, time.Second, time.Hour, 24 * time.Hour, 365 * 24 * time.Hour, MaxPeriod}
	return validRandom(tb, a, func() Request {
		r := Request{Name: "diff", Key: "k", Algorithm: a}
		if rng.IntN(3) > 0 {
			r.Limit = limits[rng.IntN(len(limits))]
		} else { // log-uniform in [1, MaxLimit]
			r.Limit = max(int64(math.Exp(rng.Float64()*math.Log(MaxLimit))), 1)
		}
		if rng.IntN(3) > 0 {
			r.Period = periods[rng.IntN(len(periods))]
		} else { // log-uniform in [MinPeriod, MaxPeriod]
			r.Period = time.Duration(float64(MinPeriod) * math.Exp(rng.Float64()*math.Log(float64(MaxPeriod/MinPeriod))))
		}
		if a.HasBurst() {
			switch rng.IntN(4) {
			case 1:
				r.Burst = 1
			case 2:
				r.Burst = min(1+rng.Int64N(2*r.Limit), MaxLimit)
			case 3:
				r.Burst = MaxLimit
			}
		}
		return r
	})
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
// tol*Period/Limit + 1ns; within as much of the instant the level would have
// drained, the model follows the implementation on whether the state is
// fresh. Every decision also passes checkInvariants, which makes RetryAfter
// and Remaining exact for the buckets too.
func TestDifferential(t *testing.T) {
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(20240515, uint64(a)))
			for trace := range traceCount() {
				runTrace(t, rng, a, trace, false)
			}
		})
	}
}

// TestDifferentialChanges is TestDifferential with a change of Limit, Period
// and Burst (randomExtremeRequest) before one request in four: limits 1 to
// MaxLimit, periods MinPeriod to MaxPeriod, bursts 1 to MaxLimit, so that
// cuts carry consumption past the horizon and raises shorten it to
// nanoseconds. tol uses the largest capacity of the trace, which bounds the
// level.
func TestDifferentialChanges(t *testing.T) {
	for _, a := range Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(20260101, uint64(a)))
			for trace := range traceCount() {
				runTrace(t, rng, a, trace, true)
			}
		})
	}
}

// traceEnd bounds the time of traces (2198), so that the window models need
// not saturate near the horizon. Consumption carried past the horizon is in
// the traces; TestCutToHorizon has step tables for it.
const traceEnd = 7_200_000_000e9

func runTrace(t *testing.T, rng *rand.Rand, a Algorithm, trace int, changes bool) {
	base := randomRequest(t, rng, a)
	if changes {
		base = randomExtremeRequest(t, rng, a)
	}
	s := newTestStore(t)
	var exact exactRef
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
	maxCapacity := base.Capacity()
	var tol *big.Rat
	var tolNs float64
	setTol := func() {
		maxCapacity = max(maxCapacity, base.Capacity())
		tol = new(big.Rat).SetFloat64(2*bucketEpsilon + 1e-12*float64(maxCapacity))
		tolNs = ratFloat(new(big.Rat).Mul(tol, big.NewRat(int64(base.Period), base.Limit))) + 1
	}
	setTol()

	// hist is the trace so far, for failure messages: its parameters and
	// the last steps.
	header := fmt.Sprintf("trace %d: limit %d period %v burst %d\n", trace, base.Limit, base.Period, base.Burst)
	var steps []string
	hist := func() string {
		return header + strings.Join(steps[max(len(steps)-15, 0):], "")
	}
	now := randomStart(rng)
	for i := range 10 + rng.IntN(70) {
		if changes && rng.IntN(4) == 0 {
			base = randomExtremeRequest(t, rng, a)
			setTol()
			steps = append(steps, fmt.Sprintf("change: limit %d period %v burst %d\n", base.Limit, base.Period, base.Burst))
		}
		gap := randomGap(rng, base)
		if now > traceEnd-gap {
			gap = rng.Int64N(3)
		}
		now += gap
		req := base
		req.Hits = randomHits(rng, base.Capacity())
		switch x := rng.IntN(100); {
		case x < 8:
			req.Behavior = DrainOverLimit
		case x < 10:
			req.Behavior = Reset
		case x < 11:
			req.Behavior = Reset | DrainOverLimit
		}
		// A peek keeps nothing (TestPeekKeepsNothing): the models decide
		// it on a copy.
		exact, bucket := exact, bucket
		if req.reads() {
			exact, bucket = cloneRef(exact), bucket.clone()
		}
		at := time.Unix(0, now)
		var margin *big.Rat
		implFresh := false
		if bucket != nil {
			pre := copyState(s, &req)
			implFresh = pre.st.algo() != a || pre.st.expireAt <= now
			margin = bucket.margin(req, now, implFresh)
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
			want := bucket.decide(req, now, d.Allowed, implFresh, tolNs) // follow it near the boundary
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

// exactRef is a model that decides exactly.
type exactRef interface {
	decide(Request, int64) refDecision
}

// cloneRef returns a copy of m that shares nothing with it.
func cloneRef(m exactRef) exactRef {
	switch m := m.(type) {
	case *fixedWindowRef:
		c := *m
		c.counts = maps.Clone(m.counts)
		return &c
	case *slidingLogRef:
		c := *m
		c.log = slices.Clone(m.log)
		return &c
	case *slidingCounterRef:
		return &slidingCounterRef{counts: maps.Clone(m.counts), period: m.period, last: m.last}
	case *gcraRef:
		c := *m
		return &c
	}
	return m // nil: a bucket
}

// clone returns a copy of m that shares nothing with it; nil for nil.
func (m *bucketRef) clone() *bucketRef {
	if m == nil {
		return nil
	}
	c := *m
	for _, r := range []**big.Rat{&c.level, &c.end} {
		if *r != nil {
			*r = new(big.Rat).Set(*r)
		}
	}
	return &c
}
