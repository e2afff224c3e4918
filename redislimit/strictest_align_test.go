package redislimit

import (
	"context"
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
