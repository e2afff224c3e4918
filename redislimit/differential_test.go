package redislimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
)

// testClock is an instant that a test moves, read by the scripts (in
// place of TIME) and by the in-memory limiter alike.
type testClock struct{ now time.Time }

func (c *testClock) read() time.Time { return c.now }

// newTestLimiter returns a Limiter on addrs whose scripts read clock
// instead of the server's TIME, closed when t ends.
func newTestLimiter(t testing.TB, clock *testClock, addrs ...string) *Limiter {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Addrs = addrs
	cfg.Timeout = 5 * time.Second // generous: -race on 2 shared cores
	cfg.Prefix = fmt.Sprintf("t%d:", rand.Int64())
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if clock != nil {
		l.serverNow = clock.read
		l.clock = clock.read
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// The tolerance of ResetAt, RetryAfter and Delay against limiter: Redis
// keeps time in whole microseconds and rounds a bucket's drain time up to
// one, where limiter rounds up to a nanosecond (float64 rounding of the
// two products differs by an ulp, which a ceiling can turn into a whole
// unit either way).
const timeTolerance = time.Microsecond

// traceParams are the parameter sets a trace moves between: limits,
// periods and bursts change mid-trace, and algorithms switch.
type traceParams struct {
	limit, burst int64
	period       time.Duration
}

// TestDifferential runs the same random traces, parameter changes,
// behaviors and algorithm switches included, through Redis and through
// limiter.Store at the same instants, and requires the same decisions:
// Allowed and Remaining exactly, ResetAt, RetryAfter and Delay within
// timeTolerance.
func TestDifferential(t *testing.T) {
	srv := startRedis(t)
	clock := &testClock{now: time.Date(2026, 3, 29, 0, 59, 0, 0, time.UTC)}
	rl := newTestLimiter(t, clock, srv.addr())
	store, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	mem := sluice.NewLocal(store, clock.read)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no zone database: %v", err)
	}
	// Periods are whole microseconds, as Redis needs; 8 and 7 per 3s
	// drain the buckets by inexact floats.
	params := []traceParams{
		{limit: 10, burst: 0, period: time.Second},
		{limit: 8, burst: 12, period: 3 * time.Second},
		{limit: 40, burst: 20, period: 200 * time.Millisecond},
		{limit: 3, burst: 5, period: time.Minute},
		{limit: 1000, burst: 0, period: time.Second},
		{limit: 7, burst: 9, period: 3 * time.Second}, // 428571.43 us a hit
	}
	// GCRA's moves keep its emission interval, 100 ms: after a change of
	// interval Redis rounds the rescheduled arrival time up to a
	// microsecond where limiter rounds it up to a nanosecond, and the next
	// change scales that difference by the ratio of the intervals
	// (TestGCRAIntervalChange covers the change itself).
	gcraParams := []traceParams{
		{limit: 10, burst: 0, period: time.Second},
		{limit: 20, burst: 15, period: 2 * time.Second},
		{limit: 30, burst: 4, period: 3 * time.Second},
	}
	ctx := context.Background()
	seeds := 12
	steps := 400
	if testing.Short() {
		seeds, steps = 3, 150
	}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 22))
		for _, algo := range limiter.Algorithms {
			key := fmt.Sprintf("k%d", seed)
			name := algo.String()
			moves := params
			if algo == limiter.GCRA {
				moves = gcraParams
			}
			p := moves[rng.IntN(len(moves))]
			var history []string
			for step := range steps {
				// Time moves by whole microseconds, mostly little.
				switch rng.IntN(10) {
				case 0:
					clock.now = clock.now.Add(time.Duration(rng.Int64N(int64(5*p.period)/1000)) * time.Microsecond)
				case 1, 2:
				default:
					clock.now = clock.now.Add(time.Duration(rng.Int64N(int64(p.period/20)/1000+1)) * time.Microsecond)
				}
				if rng.IntN(40) == 0 {
					p = moves[rng.IntN(len(moves))]
				}
				req := limiter.Request{Name: name, Key: key, Limit: p.limit, Period: p.period, Burst: p.burst, Algorithm: algo}
				if algo == limiter.FixedWindow && seed%3 == 2 {
					req.Calendar, req.Location, req.Period = limiter.Minute, berlin, 0
				}
				req.Hits = rng.Int64N(min(req.Capacity(), 4) + 1)
				switch rng.IntN(30) {
				case 0:
					req.Behavior = limiter.Reset
				case 1, 2:
					req.Behavior = limiter.DrainOverLimit
				case 3:
					req.Behavior = limiter.Refund
				}
				if rng.IntN(60) == 0 { // another algorithm on the same key
					req.Algorithm = limiter.Algorithms[rng.IntN(len(limiter.Algorithms))]
					if req.Algorithm == limiter.GCRA && int64(p.period/time.Microsecond)%p.limit != 0 {
						req.Algorithm = algo // GCRA's interval would differ (see gcraParams)
					}
					req.Calendar, req.Location, req.Period = limiter.NoCalendar, nil, p.period
					req.Hits = min(req.Hits, req.Capacity())
				}
				history = append(history, fmt.Sprintf("%v %+v", clock.now.Format(time.RFC3339Nano), req))
				if len(history) > 6 {
					history = history[1:]
				}
				want, werr := mem.Check(ctx, req)
				got, gerr := rl.Check(ctx, req)
				if (werr != nil) != (gerr != nil) {
					t.Fatalf("seed %d %s step %d %+v: limiter error %v, redis error %v", seed, algo, step, req, werr, gerr)
				}
				if werr != nil {
					continue
				}
				if got.WithoutOwner {
					t.Fatalf("seed %d %s step %d: decided without Redis", seed, algo, step)
				}
				if msg := compareDecisions(want.Decision, got.Decision); msg != "" {
					t.Fatalf("seed %d %s step %d at %v, %+v:\n%s\nlimiter %+v\nredis   %+v\nlast requests:\n%s",
						seed, algo, step, clock.now.Format(time.RFC3339Nano), req, msg, want.Decision, got.Decision, strings.Join(history, "\n"))
				}
			}
		}
	}
}

// compareDecisions says how got differs from want beyond the tolerance.
func compareDecisions(want, got limiter.Decision) string {
	within := func(w, g time.Duration) bool { return g-w <= timeTolerance && w-g <= timeTolerance }
	switch {
	case want.Allowed != got.Allowed:
		return "Allowed differs"
	case want.Remaining != got.Remaining:
		return "Remaining differs"
	case want.Limit != got.Limit:
		return "Limit differs"
	case !within(0, got.ResetAt.Sub(want.ResetAt)):
		return "ResetAt differs"
	case !within(want.RetryAfter, got.RetryAfter):
		return "RetryAfter differs"
	case !within(want.Delay, got.Delay):
		return "Delay differs"
	}
	return ""
}
