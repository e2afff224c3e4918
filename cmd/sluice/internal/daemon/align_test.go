package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
)

// TestLongerWindowEndingFirstLowersNothing attacks a daemon with
// destructive_behaviors deny through its gRPC API: a caller spends a key
// at 10 per 2 hours, or 10 per calendar day in New York; another checks
// the key once (denied) at a longer period whose window holding now ends
// first: 3 hours, 25 hours, and 24 hours on the 23-hour DST day. After
// that window's end, within the spent one, the key is still spent.
func TestLongerWindowEndingFirstLowersNothing(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	base6h := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name            string
		own, bad        limiter.Request
		spend, at, then time.Time
	}{
		{"fixed_2h_then_3h", limiter.Request{Algorithm: limiter.FixedWindow, Period: 2 * time.Hour}, limiter.Request{Algorithm: limiter.FixedWindow, Period: 3 * time.Hour},
			base6h.Add(2*time.Hour + time.Minute), base6h.Add(2*time.Hour + 2*time.Minute), base6h.Add(3*time.Hour + time.Minute)},
		{"counter_2h_then_3h", limiter.Request{Algorithm: limiter.SlidingWindowCounter, Period: 2 * time.Hour}, limiter.Request{Algorithm: limiter.SlidingWindowCounter, Period: 3 * time.Hour},
			base6h.Add(2*time.Hour + time.Minute), base6h.Add(2*time.Hour + 2*time.Minute), base6h.Add(3*time.Hour + 21*time.Minute)},
		{"ny_day_then_25h", limiter.Request{Algorithm: limiter.FixedWindow, Calendar: limiter.Day, Location: ny}, limiter.Request{Algorithm: limiter.FixedWindow, Period: 25 * time.Hour},
			time.Date(2026, 3, 4, 1, 0, 0, 0, ny), time.Date(2026, 3, 4, 2, 0, 0, 0, ny), time.Date(2026, 3, 4, 11, 1, 0, 0, ny)},
		{"ny_dst_day_then_24h", limiter.Request{Algorithm: limiter.FixedWindow, Calendar: limiter.Day, Location: ny}, limiter.Request{Algorithm: limiter.FixedWindow, Period: 24 * time.Hour},
			time.Date(2026, 3, 8, 12, 0, 0, 0, ny), time.Date(2026, 3, 8, 13, 0, 0, 0, ny), time.Date(2026, 3, 8, 21, 0, 0, 0, ny)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := fakeclock.New(tc.spend)
			cfg := testConfig("align")
			cfg.Destructive = DestructiveDeny
			d := start(t, cfg, WithClock(clk.Now))
			c, err := client.New(d.GRPCAddr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			own, bad := tc.own, tc.bad
			for _, r := range []*limiter.Request{&own, &bad} {
				r.Name, r.Key, r.Limit, r.Hits = "align", "k", 10, 1
			}
			spend := own
			spend.Hits = 10
			if dec, err := c.Check(ctx, spend); err != nil || !dec.Allowed {
				t.Fatalf("spending: %+v %v", dec, err)
			}
			clk.Set(tc.at)
			if dec, err := c.Check(ctx, bad); err != nil || dec.Allowed {
				t.Fatalf("the other check on the spent key: %+v %v", dec, err)
			}
			clk.Set(tc.then)
			if dec, err := c.Check(ctx, own); err != nil || dec.Allowed {
				t.Errorf("at %v, within the spent window, a check admitted: %+v %v", tc.then.UTC(), dec, err)
			}
		})
	}
}
