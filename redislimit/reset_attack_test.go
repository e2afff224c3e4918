package redislimit

import (
	"context"
	_ "embed"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// decideBeforeResetMarks is decide.lua as it was before reset marks
// (formats 3 and 4): the script a deployment upgrades from, or rolls
// back to.
//
//go:embed testdata/decide_before_reset_marks.lua
var decideBeforeResetMarks string

// TestResetMarksAcrossAnUpgradeAndARollback: keys written by the script
// before reset marks (formats 1 and 2) keep their counts when this one
// reads them, for every algorithm, with and without KeepStrictest; and a
// key this script reset while live (format 3 or 4), read by the script
// before, is refused as a bad state (ErrBadState) until the mark lapses,
// rather than read as fresh: a rollback lowers no count, it fails the
// key's checks for as long as the state it cleared would have lived.
func TestResetMarksAcrossAnUpgradeAndARollback(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range limiter.Algorithms {
		for _, strict := range []bool{false, true} {
			clock := &testClock{now: t0}
			cur := newTestLimiter(t, clock, srv.Addr())
			cur.cfg.KeepStrictest = strict
			old := newTestLimiter(t, clock, srv.Addr())
			old.cfg.Prefix, old.cfg.KeepStrictest = cur.cfg.Prefix, strict
			old.script = redis.NewScript(decideBeforeResetMarks)
			base := limiter.Request{Name: "upgrade", Key: a.String(), Limit: 10, Period: time.Hour, Algorithm: a}
			check := func(l *Limiter, at time.Duration, hits int64, b limiter.Behavior) (limiter.Decision, error) {
				t.Helper()
				clock.now = t0.Add(at)
				r := base
				r.Hits, r.Behavior = hits, b
				d, err := l.Check(ctx, r)
				if err == nil && d.WithoutOwner {
					t.Fatalf("%v: decided without Redis: %+v", a, d)
				}
				return d.Decision, err
			}
			if d, err := check(old, time.Second, 6, 0); err != nil || !d.Allowed {
				t.Fatalf("%v: the old script's charge: %+v %v", a, d, err)
			}
			if d, err := check(cur, 2*time.Second, 4, 0); err != nil || !d.Allowed || d.Remaining != 0 {
				t.Errorf("%v (strictest %v): after the upgrade, a charge of 4 on the old script's 6: %+v %v, want remaining 0", a, strict, d, err)
			}
			if d, err := check(cur, 3*time.Second, 1, 0); err != nil || d.Allowed {
				t.Errorf("%v (strictest %v): after the upgrade, the key spent: %+v %v, want denied", a, strict, d, err)
			}
			// This script resets the live key and charges 2: format 3 or 4.
			if d, err := check(cur, 4*time.Second, 2, limiter.Reset); err != nil || !d.Allowed {
				t.Fatalf("%v: the reset: %+v %v", a, d, err)
			}
			if d, err := check(old, 5*time.Second, 1, 0); !errors.Is(err, ErrBadState) {
				t.Errorf("%v (strictest %v): the old script on a reset key: %+v %v, want ErrBadState", a, strict, d, err)
			}
			// Once the mark has lapsed (the cleared state's expiry, within
			// the hour), this script's next write drops it, and the old
			// script reads the key again.
			if _, err := check(cur, 2*time.Hour, 1, 0); err != nil {
				t.Fatal(err)
			}
			if d, err := check(old, 2*time.Hour+time.Second, 1, 0); err != nil || !d.Allowed {
				t.Errorf("%v (strictest %v): the old script after the mark lapsed: %+v %v, want allowed", a, strict, d, err)
			}
		}
	}
}

// TestRefundOfTheResettingChargeGivesItBackOnRedis is limiter's test of
// that name on Redis: a check that resets a live key and charges 3 is
// refunded naming its charge, which was made after the reset.
func TestRefundOfTheResettingChargeGivesItBackOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range limiter.Algorithms {
		clock := &testClock{now: t0}
		l := newTestLimiter(t, clock, srv.Addr())
		base := limiter.Request{Name: "reset-charge", Key: a.String(), Limit: 10, Period: time.Hour, Algorithm: a}
		check := func(at time.Duration, hits int64, b limiter.Behavior, charged limiter.Window) limiter.Decision {
			t.Helper()
			clock.now = t0.Add(at)
			r := base
			r.Hits, r.Behavior, r.Charged = hits, b, charged
			d, err := l.Check(ctx, r)
			if err != nil || d.WithoutOwner {
				t.Fatalf("%v: %+v %v", a, d, err)
			}
			return d.Decision
		}
		check(time.Second, 5, 0, limiter.Window{})
		mine := check(2*time.Second, 3, limiter.Reset, limiter.Window{})
		if !mine.Allowed || mine.Remaining != 7 {
			t.Fatalf("%v: the reset and charge: %+v", a, mine)
		}
		if d := check(3*time.Second, 3, limiter.Refund, mine.Window); d.Remaining != 10 {
			t.Errorf("%v: the refund of the charge made with the reset: remaining %d, want 10", a, d.Remaining)
		}
	}
}

// TestResetMarkAcrossAClockAheadChargeOnRedis is limiter's
// TestResetMarkAcrossAClockAheadCharge on Redis, with the callers' clock
// (the now the script is given) two hours ahead for one charge.
func TestResetMarkAcrossAClockAheadChargeOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range limiter.Algorithms {
		clock := &testClock{now: t0}
		l := newTestLimiter(t, clock, srv.Addr())
		base := limiter.Request{Name: "clock-ahead", Key: a.String(), Limit: 10, Period: time.Hour, Algorithm: a}
		check := func(at time.Duration, hits int64, b limiter.Behavior, charged limiter.Window) limiter.Decision {
			t.Helper()
			clock.now = t0.Add(at)
			r := base
			r.Hits, r.Behavior, r.Charged = hits, b, charged
			d, err := l.Check(ctx, r)
			if err != nil || d.WithoutOwner {
				t.Fatalf("%v: %+v %v", a, d, err)
			}
			return d.Decision
		}
		mine := check(time.Second, 3, 0, limiter.Window{})
		check(2*time.Second, 0, limiter.Reset, limiter.Window{})
		check(2*time.Hour, 1, 0, limiter.Window{})
		theirs := check(3*time.Second, 4, 0, limiter.Window{})
		if d := check(4*time.Second, 3, limiter.Refund, mine.Window); d.Remaining != theirs.Remaining {
			t.Errorf("%v: the refund of a charge the reset cleared, after a charge with the clock 2h ahead: remaining %d, want %d", a, d.Remaining, theirs.Remaining)
		}
	}
}

// TestKeepStrictestCalendarAndPeriodAlternatingOnRedis is limiter's
// TestKeepStrictestCalendarAndPeriodAlternating on Redis: a fixed window
// key checked every 15 minutes for three days, alternately at 5 per
// calendar day in Pacific/Kiritimati (UTC+14) and 5 per 24h.
func TestKeepStrictestCalendarAndPeriodAlternatingOnRedis(t *testing.T) {
	kiri, err := time.LoadLocation("Pacific/Kiritimati")
	if err != nil {
		t.Skip(err)
	}
	srv := testredis.Start(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	clock := &testClock{now: t0}
	l := newTestLimiter(t, clock, srv.Addr())
	l.cfg.KeepStrictest = true
	cal := limiter.Request{Name: "alt", Key: "k", Hits: 1, Limit: 5, Algorithm: limiter.FixedWindow, Calendar: limiter.Day, Location: kiri}
	per := limiter.Request{Name: "alt", Key: "k", Hits: 1, Limit: 5, Algorithm: limiter.FixedWindow, Period: 24 * time.Hour}
	total := 0
	for i := 0; i < 72*4; i++ {
		clock.now = t0.Add(time.Duration(i) * 15 * time.Minute)
		r := per
		if i%2 == 1 {
			r = cal
		}
		d, err := l.Check(ctx, r)
		if err != nil || d.WithoutOwner {
			t.Fatalf("%+v %v", d, err)
		}
		if d.Allowed {
			total++
		}
	}
	if total < 10 {
		t.Errorf("admitted %d in three days, want at least 10 (5 a day at either rate alone)", total)
	}
}

// TestPeekWithAnotherRateLeavesASpentKeySpentOnRedis is limiter's test of
// that name on Redis: a key spent at 3 per hour, reset by an admin and
// spent again (a mark on it), peeked with every algorithm at 1,000,000 a
// second and at 3,000,000 a calendar minute, stays spent, with and without
// KeepStrictest.
func TestPeekWithAnotherRateLeavesASpentKeySpentOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, strict := range []bool{false, true} {
		for _, a := range limiter.Algorithms {
			clock := &testClock{now: t0}
			l := newTestLimiter(t, clock, srv.Addr())
			l.cfg.KeepStrictest = strict
			check := func(at time.Duration, r limiter.Request) limiter.Decision {
				t.Helper()
				clock.now = t0.Add(at)
				d, err := l.Check(ctx, r)
				if err != nil || d.WithoutOwner {
					t.Fatalf("%v: %+v %v", a, d, err)
				}
				return d.Decision
			}
			own := limiter.Request{Name: "peek", Key: a.String(), Hits: 3, Limit: 3, Period: time.Hour, Algorithm: a}
			check(time.Second, own)
			reset := own
			reset.Behavior = limiter.Reset
			if d := check(2*time.Second, reset); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("%v: the reset that spends the key again: %+v", a, d)
			}
			var peeks []limiter.Request
			for _, b := range limiter.Algorithms {
				// 1,000,000 a second: Redis's GCRA admits no more than a
				// hit a microsecond.
				peeks = append(peeks, limiter.Request{Name: "peek", Key: a.String(), Limit: 1_000_000, Burst: 1_000_000, Period: time.Second, Algorithm: b})
			}
			peeks = append(peeks, limiter.Request{Name: "peek", Key: a.String(), Limit: 3_000_000, Calendar: limiter.Minute, Algorithm: limiter.FixedWindow})
			for i, p := range peeks {
				check(3*time.Second+time.Duration(i)*time.Millisecond, p)
				spent := own
				spent.Hits = 1
				if d := check(4*time.Second+time.Duration(i)*time.Millisecond, spent); d.Allowed {
					t.Errorf("%v (strictest %v): after a peek as %v %v, the spent key admitted: %+v", a, strict, p.Algorithm, p.Calendar, d)
				}
			}
		}
	}
}

// TestKeepStrictestAlternatingRatesDifferential sends checks alternating
// between two rates whose windows never end together (5 per calendar day
// in Pacific/Kiritimati and 5 per 24h, every 15 minutes for three days),
// and between 5 per 10s and 5 per 7s (every 1.5s for 140s), through Redis
// and limiter.Store under KeepStrictest: every decision is the same,
// those that leave a count where it is, being denied a move to a window
// begun after its last charge, included.
func TestKeepStrictestAlternatingRatesDifferential(t *testing.T) {
	kiri, err := time.LoadLocation("Pacific/Kiritimati")
	if err != nil {
		t.Skip(err)
	}
	t.Run("day+14", func(t *testing.T) {
		cal := limiter.Request{Name: "alt", Key: "k", Hits: 1, Limit: 5, Algorithm: limiter.FixedWindow, Calendar: limiter.Day, Location: kiri}
		per := limiter.Request{Name: "alt", Key: "k", Hits: 1, Limit: 5, Algorithm: limiter.FixedWindow, Period: 24 * time.Hour}
		var steps []atkStep
		for i := 0; i < 72*4; i++ {
			r := per
			if i%2 == 1 {
				r = cal
			}
			steps = append(steps, atkStep{time.Duration(i) * 15 * time.Minute, r})
		}
		atkDiff(t, true, steps)
	})
	for _, a := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) {
			ten := limiter.Request{Name: "alt", Key: a.String(), Hits: 1, Limit: 5, Period: 10 * time.Second, Algorithm: a}
			seven := limiter.Request{Name: "alt", Key: a.String(), Hits: 1, Limit: 5, Period: 7 * time.Second, Algorithm: a}
			var steps []atkStep
			for i := 0; i < 140*2/3; i++ {
				r := ten
				if i%2 == 1 {
					r = seven
				}
				steps = append(steps, atkStep{time.Duration(i) * 1500 * time.Millisecond, r})
			}
			atkDiff(t, true, steps)
		})
	}
}
