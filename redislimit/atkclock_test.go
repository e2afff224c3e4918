package redislimit

import (
	"context"
	"os"
	"testing"
	"time"

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
// a calendar key (a minute in Berlin) after a step back is decided
// differently.
func TestAtkClockDifferentialCalendarStepsBack(t *testing.T) {
	if os.Getenv("SLUICE_ATTACK") != "1" {
		t.Skip("broke, open: after a step back, a refund of a calendar key (a minute in Berlin) naming a window the " +
			"clock ahead charged is decided apart: limiter names a window where Redis names none (stream 206, seed 14, " +
			"90s steps), and limiter gives 1 hit back where Redis gives none (stream 208, seed 38, a day's steps: " +
			"remaining 21 against 20); set SLUICE_ATTACK=1 to run")
	}
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

// TestAtkClockStrictestCalendarStepBack: a calendar key (a minute in
// Berlin, 3 a minute, burst 5) spent with the clock two hours ahead, then
// checked with the clock set right by a request of a one-minute period
// and no calendar, under KeepStrictest: Redis and limiter decide alike,
// and the key waits no longer than the minute.
func TestAtkClockStrictestCalendarStepBack(t *testing.T) {
	if os.Getenv("SLUICE_ATTACK") != "1" {
		t.Skip("broke, open: under KeepStrictest the script reads a state of another calendar's rate as its own " +
			"window [start, expiry), which a state written two hours ahead ends two hours ahead: Redis denies with " +
			"RetryAfter 2h0m30s where limiter, which knows the calendar, says 30s; set SLUICE_ATTACK=1 to run")
	}
	cal := limiter.Request{Name: "cal", Key: "k", Limit: 3, Burst: 5, Calendar: limiter.Minute, Algorithm: limiter.FixedWindow}
	per := limiter.Request{Name: "cal", Key: "k", Limit: 3, Burst: 5, Period: time.Minute, Algorithm: limiter.FixedWindow, Behavior: limiter.DrainOverLimit}
	spend := cal
	spend.Hits = 3
	atkDiff(t, true, []atkStep{
		{2 * time.Hour, spend},
		{0, per},
	})
}
