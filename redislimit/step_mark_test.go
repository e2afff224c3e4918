package redislimit

import (
	"context"
	_ "embed"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// limiter's step_mark_test.go on Redis: a decision that reads a state
// written after its now marks the key as a reset at now does, and a
// charge at a reset's own instant names that instant's epoch since it.

// markStep is one decision of a markTrace: at t0+at, hits with behavior
// b; refund names the charge of an earlier step (its index), or -1.
type markStep struct {
	at     time.Duration
	hits   int64
	b      limiter.Behavior
	refund int
}

const noRefund = -1

// markTrace runs steps on one key per algorithm (with and without
// KeepStrictest) at a limit of 10 per hour and calls check with the
// decisions.
func markTrace(t *testing.T, srv *testredis.Server, steps []markStep, check func(t *testing.T, d []limiter.Decision)) {
	t.Helper()
	ctx := context.Background()
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range limiter.Algorithms {
		for _, keep := range []bool{false, true} {
			t.Run(a.String()+"/strictest="+strconv.FormatBool(keep), func(t *testing.T) {
				clock := &testClock{now: t0}
				l := newTestLimiter(t, clock, srv.Addr())
				l.cfg.KeepStrictest = keep
				base := limiter.Request{Name: "mark", Key: a.String(), Limit: 10, Period: time.Hour, Algorithm: a}
				var ds []limiter.Decision
				for _, st := range steps {
					clock.now = t0.Add(st.at)
					r := base
					r.Hits, r.Behavior = st.hits, st.b
					if st.refund >= 0 {
						r.Charged = ds[st.refund].Window
					}
					d, err := l.Check(ctx, r)
					if err != nil || d.WithoutOwner {
						t.Fatalf("%+v: %+v %v", st, d, err)
					}
					ds = append(ds, d.Decision)
				}
				check(t, ds)
			})
		}
	}
}

// TestClockStepMarksOnRedis runs limiter's neighbours of
// TestResetMarkAcrossAClockAheadCharge on Redis.
func TestClockStepMarksOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	t.Run("clock ahead without a reset", func(t *testing.T) {
		markTrace(t, srv, []markStep{
			{time.Second, 3, 0, noRefund},
			{2 * time.Hour, 1, 0, noRefund},
			{3 * time.Second, 4, 0, noRefund},
			{4 * time.Second, 3, limiter.Refund, 0},
		}, func(t *testing.T, d []limiter.Decision) {
			if d[3].Remaining != d[2].Remaining {
				t.Errorf("the refund of the charge before the clock ran ahead: remaining %d, want %d", d[3].Remaining, d[2].Remaining)
			}
		})
	})
	t.Run("clock behind", func(t *testing.T) {
		markTrace(t, srv, []markStep{
			{time.Second, 3, 0, noRefund},
			{2 * time.Second, 0, limiter.Reset, noRefund},
			{-2 * time.Hour, 1, 0, noRefund},
			{3 * time.Second, 4, 0, noRefund},
			{4 * time.Second, 3, limiter.Refund, 0},
		}, func(t *testing.T, d []limiter.Decision) {
			if d[4].Remaining != d[3].Remaining {
				t.Errorf("the refund of a charge the reset cleared: remaining %d, want %d", d[4].Remaining, d[3].Remaining)
			}
		})
	})
	t.Run("refund first and a peek between", func(t *testing.T) {
		markTrace(t, srv, []markStep{
			{time.Second, 3, 0, noRefund},
			{2 * time.Second, 0, limiter.Reset, noRefund},
			{2 * time.Hour, 1, 0, noRefund},
			{3 * time.Second, 0, 0, noRefund},
			{3 * time.Second, 3, limiter.Refund, 0},
			{3 * time.Second, 4, 0, noRefund},
			{3 * time.Second, 0, 0, noRefund},
			{3 * time.Second, 3, limiter.Refund, 0},
			{3 * time.Second, 4, limiter.Refund, 5},
		}, func(t *testing.T, d []limiter.Decision) {
			if d[4].Remaining != d[3].Remaining {
				t.Errorf("the first refund after the clock was set right: remaining %d, want %d", d[4].Remaining, d[3].Remaining)
			}
			if !d[5].Allowed || d[5].Remaining != d[3].Remaining-4 {
				t.Fatalf("the others' charge: %+v, want remaining %d", d[5], d[3].Remaining-4)
			}
			if d[7].Remaining != d[5].Remaining {
				t.Errorf("the refund after the others' charge: remaining %d, want %d", d[7].Remaining, d[5].Remaining)
			}
			if d[8].Remaining != d[3].Remaining {
				t.Errorf("the others' refund (window %v): remaining %d, want %d", d[5].Window, d[8].Remaining, d[3].Remaining)
			}
		})
	})
	t.Run("reset after the step", func(t *testing.T) {
		markTrace(t, srv, []markStep{
			{time.Second, 3, 0, noRefund},
			{2 * time.Second, 0, limiter.Reset, noRefund},
			{2 * time.Hour, 1, 0, noRefund},
			{3 * time.Second, 4, 0, noRefund},
			{3500 * time.Millisecond, 0, limiter.Reset, noRefund},
			{4 * time.Second, 2, 0, noRefund},
			{4 * time.Second, 3, limiter.Refund, 0},
			{4 * time.Second, 4, limiter.Refund, 3},
			{4 * time.Second, 2, limiter.Refund, 5},
		}, func(t *testing.T, d []limiter.Decision) {
			if !d[5].Allowed || d[5].Remaining != 8 {
				t.Fatalf("the third's charge after the second reset: %+v", d[5])
			}
			if d[6].Remaining != 8 || d[7].Remaining != 8 {
				t.Errorf("the refunds of charges a reset cleared: remaining %d and %d, want 8", d[6].Remaining, d[7].Remaining)
			}
			if d[8].Remaining != 10 {
				t.Errorf("the third's refund (window %v): remaining %d, want 10", d[5].Window, d[8].Remaining)
			}
		})
	})
	t.Run("reset at the instant of a charge", func(t *testing.T) {
		markTrace(t, srv, []markStep{
			{time.Second, 5, 0, noRefund},
			{2 * time.Second, 3, 0, noRefund},
			{2 * time.Second, 0, limiter.Reset, noRefund},
			{3 * time.Second, 4, 0, noRefund},
			{3 * time.Second, 3, limiter.Refund, 1},
		}, func(t *testing.T, d []limiter.Decision) {
			if d[4].Remaining != 6 {
				t.Errorf("the refund of a charge at the reset's instant, before it (window %v): remaining %d, want 6", d[1].Window, d[4].Remaining)
			}
		})
	})
	t.Run("charges at a reset's instant", func(t *testing.T) {
		markTrace(t, srv, []markStep{
			{time.Second, 5, 0, noRefund},
			{2 * time.Second, 3, limiter.Reset, noRefund},
			{2 * time.Second, 2, 0, noRefund},
			{2 * time.Second, 2, limiter.Refund, 2},
			{2 * time.Second, 3, limiter.Refund, 1},
		}, func(t *testing.T, d []limiter.Decision) {
			if d[2].Remaining != 5 {
				t.Fatalf("after the two charges: %+v", d[2])
			}
			if d[3].Remaining != 7 || d[4].Remaining != 10 {
				t.Errorf("the refunds of 2 (%v) and 3 (%v): remaining %d and %d, want 7 and 10", d[2].Window, d[1].Window, d[3].Remaining, d[4].Remaining)
			}
		})
	})
	t.Run("a charge a microsecond after a reset", func(t *testing.T) {
		markTrace(t, srv, []markStep{
			{time.Second, 5, 0, noRefund},
			{2 * time.Second, 3, limiter.Reset, noRefund},
			{2*time.Second + time.Microsecond, 1, 0, noRefund},
			{2*time.Second + time.Microsecond, 1, limiter.Refund, 2},
			{2*time.Second + time.Microsecond, 3, limiter.Refund, 1},
		}, func(t *testing.T, d []limiter.Decision) {
			if d[2].Remaining != 6 {
				t.Fatalf("after the two charges: %+v", d[2])
			}
			if d[3].Remaining > 7 || d[4].Remaining > 10 || d[4].Remaining < d[3].Remaining {
				t.Errorf("the refunds of 1 (%v) and 3 (%v): remaining %d and %d, want at most 7 and 10", d[2].Window, d[1].Window, d[3].Remaining, d[4].Remaining)
			}
		})
	})
	for _, c := range []struct {
		first, reset time.Duration
		hits         int64
	}{{30 * time.Minute, 40 * time.Minute, 3}, {time.Second, 50 * time.Minute, 9}} {
		t.Run("a reset made ahead, charged at "+c.first.String(), func(t *testing.T) {
			markTrace(t, srv, []markStep{
				{c.first, c.hits, 0, noRefund},
				{c.reset, 0, limiter.Reset, noRefund},
				{3 * time.Second, 4, 0, noRefund},
				{4 * time.Second, c.hits, limiter.Refund, 0},
				{4 * time.Second, 4, limiter.Refund, 2},
			}, func(t *testing.T, d []limiter.Decision) {
				if !d[2].Allowed || d[2].Remaining != 6 {
					t.Fatalf("the others' charge: %+v", d[2])
				}
				if d[3].Remaining != 6 {
					t.Errorf("the refund of the charge the reset cleared (%v): remaining %d, want 6", d[0].Window, d[3].Remaining)
				}
				if d[4].Remaining != 10 {
					t.Errorf("the others' refund (%v): remaining %d, want 10", d[2].Window, d[4].Remaining)
				}
			})
		})
	}
}

// TestResetMarkAcrossAClockAheadResetOnRedis is limiter's
// TestResetMarkAcrossAClockAheadReset on Redis.
func TestResetMarkAcrossAClockAheadResetOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	markTrace(t, srv, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Second, 0, limiter.Reset, noRefund},
		{2 * time.Hour, 0, limiter.Reset, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, limiter.Refund, 0},
	}, func(t *testing.T, d []limiter.Decision) {
		if d[4].Remaining != d[3].Remaining {
			t.Errorf("the refund of a charge the first reset cleared: remaining %d, want %d", d[4].Remaining, d[3].Remaining)
		}
	})
}

// Neighbours of TestResetMarkAcrossAClockAheadResetOnRedis, limiter's on
// Redis: a write that finds the key's state gone fresh and its reset's
// mark lapsed, and leaves it so, keeps the key with a drop mark, which a
// write with the callers' clock set right turns into a reset's mark.

// TestResetMarkAcrossAClockAheadResetRefundFirstOnRedis is limiter's
// TestResetMarkAcrossAClockAheadResetRefundFirst on Redis.
func TestResetMarkAcrossAClockAheadResetRefundFirstOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	markTrace(t, srv, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Second, 0, limiter.Reset, noRefund},
		{2 * time.Hour, 0, limiter.Reset, noRefund},
		{3 * time.Second, 3, limiter.Refund, 0},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, limiter.Refund, 0},
		{4 * time.Second, 4, limiter.Refund, 4},
	}, func(t *testing.T, d []limiter.Decision) {
		if d[3].Remaining != 10 || !d[4].Allowed || d[4].Remaining != 6 {
			t.Fatalf("the first refund and the others' charge: %+v, %+v", d[3], d[4])
		}
		if d[5].Remaining != 6 {
			t.Errorf("the refund of a charge the first reset cleared: remaining %d, want 6", d[5].Remaining)
		}
		if d[6].Remaining != 10 {
			t.Errorf("the others' refund (%v): remaining %d, want 10", d[4].Window, d[6].Remaining)
		}
	})
}

// TestClockAheadRefundAfterAResetOnRedis is limiter's
// TestClockAheadRefundAfterAReset on Redis: a refund of 1 naming no charge
// is the write ahead that leaves the key fresh.
func TestClockAheadRefundAfterAResetOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	markTrace(t, srv, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Second, 0, limiter.Reset, noRefund},
		{2 * time.Hour, 1, limiter.Refund, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, limiter.Refund, 0},
	}, func(t *testing.T, d []limiter.Decision) {
		if d[4].Remaining != d[3].Remaining {
			t.Errorf("the refund of a charge the reset cleared: remaining %d, want %d", d[4].Remaining, d[3].Remaining)
		}
	})
}

// TestClockAheadResetOfAStateGoneFreshOnRedis is limiter's
// TestClockAheadResetOfAStateGoneFresh on Redis: the reset with the
// callers' clock two hours ahead finds the key's state fresh and no mark,
// and keeps the key with a drop mark rather than deleting it.
func TestClockAheadResetOfAStateGoneFreshOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	markTrace(t, srv, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Hour, 0, limiter.Reset, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, limiter.Refund, 0},
		{4 * time.Second, 4, limiter.Refund, 2},
	}, func(t *testing.T, d []limiter.Decision) {
		if !d[2].Allowed || d[2].Remaining != 6 {
			t.Fatalf("the others' charge: %+v", d[2])
		}
		if d[3].Remaining != 6 {
			t.Errorf("the refund of the charge before the reset ahead: remaining %d, want 6", d[3].Remaining)
		}
		if d[4].Remaining != 10 {
			t.Errorf("the others' refund (%v): remaining %d, want 10", d[2].Window, d[4].Remaining)
		}
	})
}

// TestRefundOfAChargeAheadAfterAChargeAheadOnRedis is limiter's
// TestRefundOfAChargeAheadAfterAChargeAhead on Redis.
func TestRefundOfAChargeAheadAfterAChargeAheadOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	markTrace(t, srv, []markStep{
		{30 * time.Minute, 3, 0, noRefund},
		{2 * time.Hour, 1, 0, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, limiter.Refund, 0},
	}, func(t *testing.T, d []limiter.Decision) {
		if d[3].Remaining != d[2].Remaining {
			t.Errorf("the refund of the charge made ahead (%v): remaining %d, want %d", d[0].Window, d[3].Remaining, d[2].Remaining)
		}
	})
}

// TestResetAfterAResetMadeAheadOnRedis is limiter's
// TestResetAfterAResetMadeAhead on Redis.
func TestResetAfterAResetMadeAheadOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	markTrace(t, srv, []markStep{
		{30 * time.Minute, 3, 0, noRefund},
		{40 * time.Minute, 0, limiter.Reset, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{3500 * time.Millisecond, 0, limiter.Reset, noRefund},
		{4 * time.Second, 2, 0, noRefund},
		{4 * time.Second, 3, limiter.Refund, 0},
		{4 * time.Second, 4, limiter.Refund, 2},
		{4 * time.Second, 2, limiter.Refund, 4},
	}, func(t *testing.T, d []limiter.Decision) {
		if !d[4].Allowed || d[4].Remaining != 8 {
			t.Fatalf("the third's charge after the second reset: %+v", d[4])
		}
		if d[5].Remaining != 8 || d[6].Remaining != 8 {
			t.Errorf("the refunds of charges a reset cleared (%v, %v): remaining %d and %d, want 8", d[0].Window, d[2].Window, d[5].Remaining, d[6].Remaining)
		}
		if d[7].Remaining != 10 {
			t.Errorf("the third's refund (window %v): remaining %d, want 10", d[4].Window, d[7].Remaining)
		}
	})
}

// TestClockBehindThenAheadResetOnRedis is limiter's
// TestClockBehindThenAheadReset on Redis.
func TestClockBehindThenAheadResetOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	markTrace(t, srv, []markStep{
		{time.Second, 3, 0, noRefund},
		{2 * time.Second, 0, limiter.Reset, noRefund},
		{-2 * time.Hour, 1, 0, noRefund},
		{3 * time.Hour, 0, limiter.Reset, noRefund},
		{3 * time.Second, 4, 0, noRefund},
		{4 * time.Second, 3, limiter.Refund, 0},
		{4 * time.Second, 4, limiter.Refund, 4},
	}, func(t *testing.T, d []limiter.Decision) {
		if !d[4].Allowed || d[4].Remaining != 6 {
			t.Fatalf("the others' charge: %+v", d[4])
		}
		if d[5].Remaining != 6 {
			t.Errorf("the refund of a charge the first reset cleared: remaining %d, want 6", d[5].Remaining)
		}
		if d[6].Remaining != 10 {
			t.Errorf("the others' refund (%v): remaining %d, want 10", d[4].Window, d[6].Remaining)
		}
	})
}

// decideBeforeDropMarks is decide.lua as it was before drop marks: the
// script a deployment upgrades from, or rolls back to.
//
//go:embed testdata/decide_before_drop_marks.lua
var decideBeforeDropMarks string

// TestDropMarkOnRedis: after a charge of 3, a reset, and a reset two hours
// later (the mark lapsed), the key holds a drop mark: a charge of 4 a
// second later names what it names on a key never charged, and its refund
// gives the 4 back; the script before drop marks reads such a key as
// fresh, as it reads the key it would have deleted.
func TestDropMarkOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range limiter.Algorithms {
		for _, old := range []bool{false, true} {
			clock := &testClock{now: t0}
			l := newTestLimiter(t, clock, srv.Addr())
			fresh := newTestLimiter(t, clock, srv.Addr())
			base := limiter.Request{Name: "drop", Key: a.String(), Limit: 10, Period: time.Hour, Algorithm: a}
			check := func(l *Limiter, at time.Duration, hits int64, b limiter.Behavior, charged limiter.Window) limiter.Decision {
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
			check(l, time.Second, 3, 0, limiter.Window{})
			check(l, 2*time.Second, 0, limiter.Reset, limiter.Window{})
			check(l, 2*time.Hour, 0, limiter.Reset, limiter.Window{})
			if n := l.client.Exists(ctx, Key(l.cfg.Prefix, base.Name, base.Key)).Val(); n != 1 {
				t.Fatalf("%v: the reset that found the mark lapsed left no key", a)
			}
			if old {
				l.script = redis.NewScript(decideBeforeDropMarks)
			}
			mine := check(l, 2*time.Hour+time.Second, 4, 0, limiter.Window{})
			want := check(fresh, 2*time.Hour+time.Second, 4, 0, limiter.Window{})
			if mine != want {
				t.Errorf("%v (old %v): the charge after the drop mark: %+v, on a key never charged %+v", a, old, mine, want)
			}
			if d := check(l, 2*time.Hour+2*time.Second, 4, limiter.Refund, mine.Window); d.Remaining != 10 {
				t.Errorf("%v (old %v): the refund after the drop mark: remaining %d, want 10", a, old, d.Remaining)
			}
		}
	}
}
