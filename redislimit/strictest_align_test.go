package redislimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// TestKeepStrictestLongerPeriodKeepsTheWindow is limiter's test of that
// name on Redis: a check at a longer Period (or calendar unit) whose
// window holding now ends before the key's spent window does must not let
// the key go fresh at that earlier end, for a fixed window or a sliding
// window counter.
func TestKeepStrictestLongerPeriodKeepsTheWindow(t *testing.T) {
	srv := testredis.Start(t)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	base6h := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name             string
		own, bad         limiter.Request
		spend, at, after time.Time
	}{{
		name: "2h_then_3h", own: limiter.Request{Limit: 10, Period: 2 * time.Hour}, bad: limiter.Request{Limit: 10, Period: 3 * time.Hour},
		spend: base6h.Add(2*time.Hour + time.Minute), at: base6h.Add(2*time.Hour + 2*time.Minute), after: base6h.Add(3*time.Hour + time.Minute),
	}, {
		name: "counter_2h_then_3h", own: limiter.Request{Limit: 10, Period: 2 * time.Hour, Algorithm: limiter.SlidingWindowCounter},
		bad:   limiter.Request{Limit: 10, Period: 3 * time.Hour, Algorithm: limiter.SlidingWindowCounter},
		spend: base6h.Add(2*time.Hour + time.Minute), at: base6h.Add(2*time.Hour + 2*time.Minute), after: base6h.Add(3*time.Hour + 21*time.Minute),
	}, {
		name: "week_then_month", own: limiter.Request{Limit: 10, Calendar: limiter.Week}, bad: limiter.Request{Limit: 10, Calendar: limiter.Month},
		spend: time.Date(2026, 3, 30, 12, 0, 0, 0, time.UTC), at: time.Date(2026, 3, 31, 12, 0, 0, 0, time.UTC), after: time.Date(2026, 4, 1, 12, 0, 0, 0, time.UTC),
	}, {
		name: "dst_day_then_24h", own: limiter.Request{Limit: 10, Calendar: limiter.Day, Location: ny}, bad: limiter.Request{Limit: 10, Period: 24 * time.Hour},
		spend: time.Date(2026, 3, 8, 12, 0, 0, 0, ny), at: time.Date(2026, 3, 8, 13, 0, 0, 0, ny), after: time.Date(2026, 3, 8, 21, 0, 0, 0, ny),
	}, {
		name: "day_then_25h", own: limiter.Request{Limit: 10, Calendar: limiter.Day, Location: ny}, bad: limiter.Request{Limit: 10, Period: 25 * time.Hour},
		spend: time.Date(2026, 3, 4, 1, 0, 0, 0, ny), at: time.Date(2026, 3, 4, 2, 0, 0, 0, ny), after: time.Date(2026, 3, 4, 11, 1, 0, 0, ny),
	}}
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := &testClock{now: c.spend}
			l := newTestLimiter(t, clock, srv.Addr())
			l.cfg.KeepStrictest = true
			own, bad := c.own, c.bad
			for _, r := range []*limiter.Request{&own, &bad} {
				r.Name, r.Key, r.Hits = "align", "k", 1
				if r.Algorithm == 0 {
					r.Algorithm = limiter.FixedWindow
				}
			}
			spend := own
			spend.Hits = own.Limit
			if d, err := l.Check(ctx, spend); err != nil || !d.Allowed {
				t.Fatalf("spending: %+v %v", d, err)
			}
			clock.now = c.at
			if d, err := l.Check(ctx, bad); err != nil || d.Allowed {
				t.Fatalf("the attacker's check on a spent key: %+v %v", d, err)
			}
			if _, end := own.Window(c.spend); !c.after.Before(end) {
				t.Fatalf("after (%v) is not within the caller's window (to %v)", c.after, end)
			}
			clock.now = c.after
			if d, err := l.Check(ctx, own); err != nil || d.Allowed {
				t.Errorf("at %v, within the caller's spent window, a check admitted after one at %v/%v: %+v %v",
					c.after.UTC(), bad.Period, bad.Calendar, d, err)
			}
		})
	}
}

// TestKeepStrictestClaimedByAWindowEndingFirst is limiter's test of that
// name on Redis: a key claimed at 7 per 25 hours (a window ending at
// 15:00 UTC), then spent by its caller at 14 per UTC day in the morning
// and after 15:00, must admit no more than 14 in that day, for a fixed
// window and a sliding window counter.
func TestKeepStrictestClaimedByAWindowEndingFirst(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	for i, own := range []limiter.Request{
		{Hits: 1, Limit: 14, Period: 24 * time.Hour, Algorithm: limiter.FixedWindow},
		{Hits: 1, Limit: 14, Calendar: limiter.Day, Algorithm: limiter.FixedWindow},
		{Hits: 1, Limit: 14, Period: 24 * time.Hour, Algorithm: limiter.SlidingWindowCounter},
	} {
		own.Name, own.Key = "claimed", fmt.Sprint(i)
		clock := &testClock{now: time.Date(2026, 5, 16, 23, 0, 0, 0, time.UTC)}
		l := newTestLimiter(t, clock, srv.Addr())
		l.cfg.KeepStrictest = true
		claim := limiter.Request{Name: own.Name, Key: own.Key, Hits: 1, Limit: 7, Period: 25 * time.Hour, Algorithm: own.Algorithm}
		if d, err := l.Check(ctx, claim); err != nil || !d.Allowed {
			t.Fatalf("claiming: %+v %v", d, err)
		}
		admitted := int64(0)
		for _, at := range []time.Time{time.Date(2026, 5, 17, 1, 0, 0, 0, time.UTC), time.Date(2026, 5, 17, 16, 0, 0, 0, time.UTC)} {
			clock.now = at
			for range 20 {
				if d, err := l.Check(ctx, own); err != nil {
					t.Fatal(err)
				} else if d.Allowed {
					admitted++
				}
			}
		}
		if admitted > own.Limit {
			t.Errorf("%v/%v: the caller's day admitted %d, more than its limit %d", own.Period, own.Calendar, admitted, own.Limit)
		}
	}
}

// TestKeepStrictestMeetAdmittingNone is limiter's test of that name on
// Redis: a key claimed at 2 per 25 hours, checked at 14 per 10 hours in a
// 10-hour window that ends after the 25-hour one, denies the checks until
// the key is fresh, so that window admits no more than 14.
func TestKeepStrictestMeetAdmittingNone(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	for _, a := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
		t0 := time.Date(2026, 5, 17, 1, 0, 0, 0, time.UTC)
		clock := &testClock{now: t0}
		l := newTestLimiter(t, clock, srv.Addr())
		l.cfg.KeepStrictest = true
		claim := limiter.Request{Name: "none", Key: a.String(), Hits: 1, Limit: 2, Period: 25 * time.Hour, Algorithm: a}
		own := claim
		own.Limit, own.Period = 14, 10*time.Hour
		if d, err := l.Check(ctx, claim); err != nil || !d.Allowed {
			t.Fatalf("%v: claiming: %+v %v", a, d, err)
		}
		_, claimEnd := claim.Window(t0)
		at := claimEnd.Add(-time.Hour)
		if _, end := own.Window(at); !end.After(claimEnd) {
			t.Fatalf("the 10-hour window ends at %v, not after the 25-hour one (%v)", end, claimEnd)
		}
		admitted := int64(0)
		for _, when := range []time.Time{at, claimEnd.Add(time.Minute)} {
			clock.now = when
			for range 20 {
				if d, err := l.Check(ctx, own); err != nil {
					t.Fatal(err)
				} else if d.Allowed {
					admitted++
				}
			}
		}
		if admitted > own.Limit {
			t.Errorf("%v: the caller's 10-hour window admitted %d, more than its limit %d", a, admitted, own.Limit)
		}
	}
}
