package redislimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testredis"
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

// Periods are whole microseconds, as Redis needs; 8 and 7 per 3s drain
// the buckets by inexact floats.
var traceMoves = []traceParams{
	{limit: 10, burst: 0, period: time.Second},
	{limit: 8, burst: 12, period: 3 * time.Second},
	{limit: 40, burst: 20, period: 200 * time.Millisecond},
	{limit: 3, burst: 5, period: time.Minute},
	{limit: 1000, burst: 0, period: time.Second},
	{limit: 7, burst: 9, period: 3 * time.Second}, // 428571.43 us a hit
}

// GCRA's moves keep its emission interval, 100 ms: after a change of
// interval Redis rounds the rescheduled arrival time up to a microsecond
// where limiter rounds it up to a nanosecond, and the next change scales
// that difference by the ratio of the intervals (TestGCRAIntervalChange
// covers the change itself). For the same reason a trace switches a key
// to GCRA only where Period/Limit is a whole number of microseconds.
var gcraTraceMoves = []traceParams{
	{limit: 10, burst: 0, period: time.Second},
	{limit: 20, burst: 15, period: 2 * time.Second},
	{limit: 30, burst: 4, period: 3 * time.Second},
}

// differential runs traces through Redis (rl) and the in-memory limiter
// (mem) at the instants of one clock.
type differential struct {
	rl  *Limiter
	mem sluice.Limiter
	// store is mem's store.
	store  *limiter.Store
	clock  *testClock
	berlin *time.Location
	// stepsBack: the clock steps back by more than 100 ms now and then.
	stepsBack bool
	// bigSteps: with stepsBack, the clock also steps ahead by this much now
	// and then, and back by as much later (0: never).
	bigSteps time.Duration
	// strictest: both keep the strictest rate (KeepStrictest).
	strictest bool
	// switches and foreignPeeks count the requests of another algorithm
	// than the key's, and those of them with 0 hits.
	switches, foreignPeeks int
	// narrowed counts the decisions whose Limit is not the request's:
	// decided at a stricter rate than its own.
	narrowed int
	// rounded counts the decisions whose times Redis placed later than
	// limiter's by more than the tolerance, within gcraSlack.
	rounded int
}

// run sends one trace of steps random requests of algo's key, drawn from
// rng: time moves by whole microseconds, parameters change, behaviors and
// peeks come and go, and now and then a request of another algorithm
// converts the key. It fails t at the first decision that differs.
func (d *differential) run(t *testing.T, rng *rand.Rand, seed int, algo limiter.Algorithm, steps int) {
	t.Helper()
	ctx := context.Background()
	key := fmt.Sprintf("k%d", seed)
	name := algo.String()
	moves := traceMoves
	if algo == limiter.GCRA {
		moves = gcraTraceMoves
	}
	p := moves[rng.IntN(len(moves))]
	var history []string
	var charged limiter.Window // the window the last admitted hits went into
	// windows draws which refunds carry it, apart from rng, which draws
	// the trace.
	windows := rand.New(rand.NewPCG(uint64(seed), 1))
	for step := range steps {
		// Time moves by whole microseconds, mostly little.
		switch rng.IntN(10) {
		case 0:
			d.clock.now = d.clock.now.Add(time.Duration(rng.Int64N(int64(5*p.period)/1000)) * time.Microsecond)
		case 1, 2:
		default:
			d.clock.now = d.clock.now.Add(time.Duration(rng.Int64N(int64(p.period/20)/1000+1)) * time.Microsecond)
		case 3:
			if d.stepsBack && rng.IntN(3) == 0 {
				// Back from the last instant by more than the 100 ms
				// within which limiter.Store reads a reading as its
				// shard's latest (the script reads the time under its
				// own atomicity, and has no such rule).
				back := 100*time.Millisecond + time.Duration(1+rng.Int64N(int64(2*p.period)/1000))*time.Microsecond
				d.clock.now = d.clock.now.Add(-back)
			} else if d.bigSteps > 0 && rng.IntN(6) == 0 {
				if rng.IntN(2) == 0 {
					d.clock.now = d.clock.now.Add(d.bigSteps)
				} else {
					d.clock.now = d.clock.now.Add(-d.bigSteps)
				}
			}
		}
		if rng.IntN(40) == 0 {
			p = moves[rng.IntN(len(moves))]
		}
		req := limiter.Request{Name: name, Key: key, Limit: p.limit, Period: p.period, Burst: p.burst, Algorithm: algo}
		if algo == limiter.FixedWindow && seed%3 == 2 {
			req.Calendar, req.Location, req.Period = limiter.Minute, d.berlin, 0
		}
		req.Hits = rng.Int64N(min(req.Capacity(), 4) + 1)
		switch rng.IntN(30) {
		case 0:
			req.Behavior = limiter.Reset
		case 1, 2:
			req.Behavior = limiter.DrainOverLimit
		case 3:
			req.Behavior = limiter.Refund
			if windows.IntN(3) != 0 { // mostly to the window of the last hits
				req.Charged = charged
			}
		}
		if rng.IntN(60) == 0 { // another algorithm on the same key
			req.Algorithm = limiter.Algorithms[rng.IntN(len(limiter.Algorithms))]
			if req.Algorithm == limiter.GCRA && int64(p.period/time.Microsecond)%p.limit != 0 {
				req.Algorithm = algo // GCRA's interval would differ (see gcraTraceMoves)
			}
			req.Calendar, req.Location, req.Period = limiter.NoCalendar, nil, p.period
			req.Hits = min(req.Hits, req.Capacity())
			if req.Algorithm != algo {
				d.switches++
				if req.Hits == 0 {
					d.foreignPeeks++
				}
			}
		}
		history = append(history, fmt.Sprintf("%v %+v", d.clock.now.Format(time.RFC3339Nano), req))
		if len(history) > 6 {
			history = history[1:]
		}
		want, werr := d.mem.Check(ctx, req)
		got, gerr := d.rl.Check(ctx, req)
		if (werr != nil) != (gerr != nil) {
			t.Fatalf("seed %d %s step %d %+v: limiter error %v, redis error %v", seed, algo, step, req, werr, gerr)
		}
		if werr != nil {
			continue
		}
		if want.Limit != req.Limit {
			d.narrowed++
		}
		if got.WithoutOwner {
			t.Fatalf("seed %d %s step %d: decided without Redis", seed, algo, step)
		}
		if req.Behavior&limiter.Refund == 0 && !want.Window.IsZero() {
			charged = want.Window
		}
		if slack := d.gcraSlack(name, key); slack > 0 && compareDecisions(want.Decision, got.Decision) != "" {
			d.rounded++
		}
		if msg := compareDecisionsLater(want.Decision, got.Decision, d.gcraSlack(name, key)); msg != "" {
			t.Fatalf("seed %d %s step %d at %v, %+v:\n%s\nlimiter %+v\nredis   %+v\nlast requests:\n%s",
				seed, algo, step, d.clock.now.Format(time.RFC3339Nano), req, msg, want.Decision, got.Decision, strings.Join(history, "\n"))
		}
	}
}

// newDifferential returns a differential on a redis-server of its own.
func newDifferential(t *testing.T, stepsBack bool) *differential {
	srv := testredis.Start(t)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no zone database: %v", err)
	}
	clock := &testClock{now: time.Date(2026, 3, 29, 0, 59, 0, 0, time.UTC)}
	return &differential{rl: newTestLimiter(t, clock, srv.Addr()), clock: clock, berlin: berlin, stepsBack: stepsBack}
}

// newMemory returns sluice.Local over a new limiter.Store on d's clock.
func (d *differential) newMemory(t *testing.T) sluice.Limiter {
	cfg := limiter.DefaultStoreConfig()
	cfg.KeepStrictest = d.strictest
	store, err := limiter.NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.store = store
	return sluice.NewLocal(store, d.clock.read)
}

// gcraSlack is how much later than limiter's Redis may place the times of
// a decision on (name, key) whose state limiter keeps as GCRA with an
// emission interval that is not a whole number of microseconds (a meet
// of two rates under KeepStrictest): Redis rounds the interval up to a
// microsecond, so its times are later by less than a microsecond per hit
// outstanding (the package's documented rounding). 0 for every other
// state.
func (d *differential) gcraSlack(name, key string) time.Duration {
	sn, ok := d.store.Snapshot(name, key, d.clock.now)
	if !ok || sn.Algorithm != limiter.GCRA {
		return 0
	}
	v := sn.View()
	if v.Interval <= 0 || v.Interval%time.Microsecond == 0 || !v.TAT.After(d.clock.now) {
		return 0
	}
	outstanding := (v.TAT.Sub(d.clock.now) + v.Interval - 1) / v.Interval
	return time.Duration(outstanding) * time.Microsecond
}

// TestDifferential runs the same random traces, parameter changes,
// behaviors, algorithm switches and peeks with other parameters included,
// through Redis and through limiter.Store at the same instants, and
// requires the same decisions: Allowed and Remaining exactly, ResetAt,
// RetryAfter and Delay within timeTolerance. The clock never steps back
// here: limiter.Store reads a reading at most 100 ms behind its shard's
// latest as the latest, where the script reads TIME under its own
// atomicity, so a step back within that reach would differ for that
// reason alone (TestDifferentialClockSteps steps back further).
func TestDifferential(t *testing.T) {
	newDifferential(t, false).runAll(t, 12, 22)
}

// TestDifferentialClockSteps runs traces as TestDifferential does through
// a clock that also steps back, by more than 100 ms and up to two
// periods: Redis bounds the state's times by now as limiter's boundTimes
// does, converting and peeking included.
func TestDifferentialClockSteps(t *testing.T) {
	newDifferential(t, true).runAll(t, 8, 23)
}

// TestDifferentialStrictest runs traces as TestDifferential does with
// KeepStrictest on both sides: every change of Limit, Burst, Period,
// Calendar or Algorithm on a live key is decided at the strictest of the
// key's rate and the request's, as limiter decides it, peeks and requests
// for more hits than the strictest capacity included.
func TestDifferentialStrictest(t *testing.T) {
	d := newDifferential(t, false)
	d.strictest, d.rl.cfg.KeepStrictest = true, true
	d.runAll(t, 12, 24)
}

// TestDifferentialStrictestClockSteps is TestDifferentialStrictest with
// a clock that also steps back.
func TestDifferentialStrictestClockSteps(t *testing.T) {
	d := newDifferential(t, true)
	d.strictest, d.rl.cfg.KeepStrictest = true, true
	d.runAll(t, 8, 25)
}

// runAll runs a trace of 400 steps (150 with -short, and a quarter of
// the seeds) for every algorithm and seed, the random numbers of a seed
// drawn from its PCG stream, and requires that the traces switched
// algorithms and peeked with another one. When the clock steps back each
// trace has a store of its own, so that the latest reading of the key's
// shard is the trace's own last instant.
func (d *differential) runAll(t *testing.T, seeds int, stream uint64) {
	t.Helper()
	steps := 400
	if testing.Short() {
		seeds, steps = max(seeds/4, 2), 150
	}
	d.mem = d.newMemory(t)
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), stream))
		for _, algo := range limiter.Algorithms {
			if d.stepsBack {
				d.mem = d.newMemory(t)
			}
			d.run(t, rng, seed, algo, steps)
		}
	}
	if d.switches == 0 || d.foreignPeeks == 0 {
		t.Errorf("the traces switched algorithms %d times, %d of them peeks: want both", d.switches, d.foreignPeeks)
	}
	t.Logf("%d switches of algorithm, %d of them peeks; %d decisions at a stricter rate than the request's; "+
		"%d later on Redis by GCRA's interval rounded up to a microsecond", d.switches, d.foreignPeeks, d.narrowed, d.rounded)
	if d.strictest && d.narrowed == 0 {
		t.Errorf("no decision was narrowed to a stricter rate")
	}
}

// compareDecisions says how got differs from want beyond the tolerance.
func compareDecisions(want, got limiter.Decision) string {
	return compareDecisionsLater(want, got, 0)
}

// compareDecisionsLater is compareDecisions with got's times allowed
// later than want's by up to later more.
func compareDecisionsLater(want, got limiter.Decision, later time.Duration) string {
	within := func(w, g time.Duration) bool { return g-w <= timeTolerance+later && w-g <= timeTolerance }
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
	case want.Window != got.Window:
		return "Window differs"
	}
	return ""
}
