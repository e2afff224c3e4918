package redislimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// Attacks on the drop marks: the differential traces of
// differential_test.go with more seeds, on streams of their own, and with
// a clock that also steps two hours ahead and back, so that keys go fresh
// on the clock ahead, resets and refunds leave drop marks, and decisions
// with the clock set right turn them into reset marks, on both sides.

// TestAtkClockDifferentialMoreSeeds runs TestDifferentialClockSteps's
// traces with 16 more seeds on another stream.
func TestAtkClockDifferentialMoreSeeds(t *testing.T) {
	newDifferential(t, true).runAll(t, 16, 71)
}

// TestAtkClockDifferentialBigSteps runs traces whose clock also steps two
// hours ahead and back.
func TestAtkClockDifferentialBigSteps(t *testing.T) {
	d := newDifferential(t, true)
	d.bigSteps = 2 * time.Hour
	d.runAll(t, 16, 72)
}

// TestAtkClockDifferentialStrictestBigSteps is
// TestAtkClockDifferentialBigSteps with KeepStrictest on both sides.
func TestAtkClockDifferentialStrictestBigSteps(t *testing.T) {
	d := newDifferential(t, true)
	d.bigSteps = 2 * time.Hour
	d.strictest, d.rl.cfg.KeepStrictest = true, true
	d.runAll(t, 16, 73)
}

// atkStep is one request of an atkDiff trace, at t0+at.
type atkStep struct {
	at  time.Duration
	req limiter.Request
}

// atkDiff sends steps through Redis and limiter.Store (KeepStrictest as
// keep) at the same instants and reports each decision that differs.
func atkDiff(t *testing.T, keep bool, steps []atkStep) {
	t.Helper()
	ctx := context.Background()
	d := newDifferential(t, true)
	d.strictest, d.rl.cfg.KeepStrictest = keep, keep
	d.mem = d.newMemory(t)
	t0 := time.Date(2026, 3, 4, 5, 0, 30, 0, time.UTC)
	for i, st := range steps {
		d.clock.now = t0.Add(st.at)
		r := st.req
		if r.Location == nil && r.Calendar != limiter.NoCalendar {
			r.Location = d.berlin
		}
		want, werr := d.mem.Check(ctx, r)
		got, gerr := d.rl.Check(ctx, r)
		if werr != nil || gerr != nil {
			t.Fatalf("step %d %+v: limiter %v, redis %v", i, r, werr, gerr)
		}
		if msg := compareDecisions(want.Decision, got.Decision); msg != "" {
			t.Errorf("step %d at %v %+v: %s\nlimiter %+v\nredis   %+v", i, st.at, r, msg, want.Decision, got.Decision)
		}
	}
}

// TestAtkClockDifferentialCalendarStepsBack runs traces whose clock also
// steps 90 seconds or a day ahead and back, on streams where a refund of
// a calendar key (a minute in Berlin) after a step back names a window
// the clock ahead charged, outside the windows around now: the caller
// hands the script the windows around the charged one too.
func TestAtkClockDifferentialCalendarStepsBack(t *testing.T) {
	for _, c := range []struct {
		big    time.Duration
		stream uint64
	}{{90 * time.Second, 206}, {24 * time.Hour, 208}} {
		t.Run(c.big.String(), func(t *testing.T) {
			d := newDifferential(t, true)
			d.bigSteps = c.big
			d.runAll(t, 40, c.stream)
		})
	}
}

// TestAtkClockDifferentialStrictestLogResetAt runs
// TestDifferentialStrictestClockSteps's traces with 40 seeds on stream 301,
// where a key kept as GCRA meets a log request of 7 per 3 s: the meet's
// emission interval, 428571.43 µs, is not a whole number of microseconds,
// and Redis's times are later by less than a microsecond per hit
// outstanding (3.3 µs with 5.5 hits outstanding at seed 16, step 197),
// as the package documents.
func TestAtkClockDifferentialStrictestLogResetAt(t *testing.T) {
	d := newDifferential(t, true)
	d.strictest, d.rl.cfg.KeepStrictest = true, true
	d.runAll(t, 40, 301)
}

// TestAtkClockStrictestCalendarStepBack: a calendar key (a minute in
// Berlin, 3 a minute, burst 5) spent with the clock two hours ahead, then
// checked with the clock set right by a request of a one-minute period
// and no calendar, under KeepStrictest: Redis and limiter decide alike,
// and the key waits no longer than the minute (the script asks the
// caller for the calendar's windows around its now).
func TestAtkClockStrictestCalendarStepBack(t *testing.T) {
	cal := limiter.Request{Name: "cal", Key: "k", Limit: 3, Burst: 5, Calendar: limiter.Minute, Algorithm: limiter.FixedWindow}
	per := limiter.Request{Name: "cal", Key: "k", Limit: 3, Burst: 5, Period: time.Minute, Algorithm: limiter.FixedWindow, Behavior: limiter.DrainOverLimit}
	spend := cal
	spend.Hits = 3
	atkDiff(t, true, []atkStep{
		{2 * time.Hour, spend},
		{0, per},
	})
}

// TestAtkClockStrictestCalendarStepBackZoneUnknown is
// TestAtkClockStrictestCalendarStepBack with the check made by another
// Limiter, which has sent no request of the calendar's zone and cannot
// name its windows: the script reads the state's window from now to its
// expiry, so the key waits until the window written ahead ends (2h0m30s),
// never less than the minute.
func TestAtkClockStrictestCalendarStepBackZoneUnknown(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 4, 5, 0, 30, 0, time.UTC)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip(err)
	}
	clock := &testClock{now: t0.Add(2 * time.Hour)}
	ahead := newTestLimiter(t, clock, srv.Addr())
	ahead.cfg.KeepStrictest = true
	other := newTestLimiter(t, clock, srv.Addr())
	other.cfg.KeepStrictest, other.cfg.Prefix = true, ahead.cfg.Prefix
	spend := limiter.Request{Name: "cal", Key: "k", Hits: 3, Limit: 3, Burst: 5, Calendar: limiter.Minute, Location: berlin, Algorithm: limiter.FixedWindow}
	if d, err := ahead.Check(ctx, spend); err != nil || !d.Allowed {
		t.Fatalf("the spend ahead: %+v %v", d, err)
	}
	clock.now = t0
	per := limiter.Request{Name: "cal", Key: "k", Limit: 3, Burst: 5, Period: time.Minute, Algorithm: limiter.FixedWindow, Behavior: limiter.DrainOverLimit}
	d, err := other.Check(ctx, per)
	if err != nil || d.WithoutOwner {
		t.Fatalf("%+v %v", d, err)
	}
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != 2*time.Hour+30*time.Second {
		t.Errorf("checked by a Limiter that does not know the zone: %+v, want denied, RetryAfter 2h0m30s", d.Decision)
	}
	if d, err := ahead.Check(ctx, per); err != nil || d.Allowed || d.RetryAfter != 30*time.Second {
		t.Errorf("checked by the Limiter that knows it: %+v %v, want denied, RetryAfter 30s", d.Decision, err)
	}
}

// TestAtkClockDropMarkBeforeItsInstantOnARollback: a drop mark left two
// hours ahead (TestDropMarkOnRedis's), then, with the clock set right,
// the others' charge and refunds decided by the script before drop marks
// (a rollback) or by the current one: the key never admits more than it
// would had the others' charge been its first. The refund of the first 3,
// which the first reset cleared, takes none of the others' hits with the
// current script; the script before drop marks reads the key as fresh.
func TestAtkClockDropMarkBeforeItsInstantOnARollback(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range limiter.Algorithms {
		for _, old := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/old=%v", a, old), func(t *testing.T) {
				clock := &testClock{now: t0}
				l := newTestLimiter(t, clock, srv.Addr())
				base := limiter.Request{Name: "drop", Key: a.String(), Limit: 10, Period: time.Hour, Algorithm: a}
				check := func(at time.Duration, hits int64, b limiter.Behavior, charged limiter.Window) limiter.Decision {
					t.Helper()
					clock.now = t0.Add(at)
					r := base
					r.Hits, r.Behavior, r.Charged = hits, b, charged
					d, err := l.Check(ctx, r)
					if err != nil || d.WithoutOwner {
						t.Fatalf("%+v %v", d, err)
					}
					return d.Decision
				}
				mine := check(time.Second, 3, 0, limiter.Window{})
				check(2*time.Second, 0, limiter.Reset, limiter.Window{})
				check(2*time.Hour, 0, limiter.Reset, limiter.Window{})
				if old {
					l.script = redis.NewScript(decideBeforeDropMarks)
				}
				theirs := check(3*time.Second, 4, 0, limiter.Window{})
				if !theirs.Allowed || theirs.Remaining != 6 {
					t.Fatalf("the others' charge: %+v", theirs)
				}
				d := check(4*time.Second, 3, limiter.Refund, mine.Window)
				if !old && d.Remaining != 6 {
					t.Errorf("the refund of the charge the first reset cleared: remaining %d, want 6", d.Remaining)
				}
				if d.Remaining > 9 || d.Remaining < 6 {
					t.Errorf("the refund of the charge the first reset cleared: remaining %d, want 6 (9 at most)", d.Remaining)
				}
				t.Logf("old %v: remaining %d after the refund of the cleared charge", old, d.Remaining)
				if d := check(5*time.Second, 4, limiter.Refund, theirs.Window); d.Remaining > 10 {
					t.Errorf("the others' refund: remaining %d", d.Remaining)
				}
			})
		}
	}
}

// TestAtkClockExtremeInstantsOnRedis: charges, resets and refunds with the
// clock before 1970, at 1970, far ahead (past 2^53 µs, and within an hour
// of the script's horizon, limiter's) and back, for every algorithm: the
// script decides each (no error, the key kept within its limit).
func TestAtkClockExtremeInstantsOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	instants := []time.Time{
		time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC),
		time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC),
		time.Unix(0, 0),
		time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2255, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2262, 4, 11, 23, 0, 0, 1000, time.UTC),
		time.Date(2026, 3, 4, 5, 0, 1, 0, time.UTC),
	}
	for _, a := range limiter.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			clock := &testClock{}
			l := newTestLimiter(t, clock, srv.Addr())
			base := limiter.Request{Name: "extreme", Key: a.String(), Limit: 10, Period: time.Hour, Algorithm: a}
			var last limiter.Window
			for _, at := range instants {
				for _, b := range []limiter.Behavior{0, limiter.Reset, 0, limiter.Refund} {
					clock.now = at
					r := base
					r.Hits, r.Behavior = 3, b
					switch b {
					case limiter.Reset:
						r.Hits = 0
					case limiter.Refund:
						r.Charged = last
					}
					d, err := l.Check(ctx, r)
					if err != nil || d.WithoutOwner {
						t.Errorf("at %v %+v: %+v %v", at, r, d, err)
						continue
					}
					if d.Remaining < 0 || d.Remaining > r.Limit {
						t.Errorf("at %v %+v: remaining %d", at, r, d.Remaining)
					}
					if b == 0 {
						last = d.Window
					}
				}
			}
		})
	}
}

// TestAtkClockFarFutureOnRedis: with the clock in 2256 or 2262, a key of 10
// an hour admits 10 of 30 hits, as limiter.Store's does
// (TestAtkClockFarFutureStaysLimited).
func TestAtkClockFarFutureOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	for _, at := range []time.Time{time.Date(2256, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2262, 4, 11, 0, 0, 0, 0, time.UTC)} {
		for _, a := range limiter.Algorithms {
			t.Run(fmt.Sprintf("%d/%s", at.Year(), a), func(t *testing.T) {
				l := newTestLimiter(t, &testClock{now: at}, srv.Addr())
				base := limiter.Request{Name: "far", Key: a.String(), Limit: 10, Period: time.Hour, Algorithm: a, Hits: 1}
				n := 0
				for range 30 {
					if d, err := l.Check(ctx, base); err == nil && d.Allowed {
						n++
					}
				}
				if n != 10 {
					t.Errorf("admitted %d of 30 at 10 an hour", n)
				}
			})
		}
	}
}
