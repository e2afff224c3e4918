package daemon

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testwait"
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

// TestRuleReloadToAMisalignedPeriodLowersNothing: a rules_file rule of 10
// per 2 hours (fixed windows) is spent by a user at 02:01; the file is
// edited to 15 per 3 hours, whose window holding now, [00:00, 03:00),
// ends before the spent [02:00, 04:00). Under destructive_behaviors deny
// the key keeps its window: a check at 02:02 is denied, and so is one at
// 03:01, within the spent window, though the new rule's own window began
// at 03:00 (the key's count then moves into the 3-hour window
// [03:00, 06:00), which ends later); at 06:01 the new rule applies.
func TestRuleReloadToAMisalignedPeriodLowersNothing(t *testing.T) {
	base6h := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC)
	clk := fakeclock.New(base6h.Add(2*time.Hour + time.Minute))
	rule := "rules:\n  - name: r\n    match: {descriptors: {alg: x}}\n    key: [user]\n    algorithm: fixed_window\n    limit: 10\n    period: 2h\n"
	cfg := rulesConfig(t, "align-reload", rule)
	cfg.Destructive = DestructiveDeny
	d := start(t, cfg, WithClock(clk.Now), WithRulesWatch(fastRulesPoll))
	base := "http://" + d.HTTPAddr()
	body := func(user string, hits int) string {
		return fmt.Sprintf(`{"user":%q,"descriptors":{"alg":"x"},"hits":%d}`, user, hits)
	}
	if v := mustPostRules(t, base, body("u1", 10)); !v.Allowed {
		t.Fatalf("spending: %+v", v)
	}
	writeRules(t, cfg.RulesFile, strings.Replace(strings.Replace(rule, "limit: 10", "limit: 15", 1), "period: 2h", "period: 3h", 1))
	testwait.For(t, "the rule to become 15 per 3 hours", func() bool {
		v := mustPostRules(t, base, body("fresh", 0))
		return len(v.Rules) == 1 && v.Rules[0].Limit == 15
	})
	for _, step := range []struct {
		at    time.Duration
		admit bool
	}{{2*time.Hour + 2*time.Minute, false}, {3*time.Hour + time.Minute, false}, {6*time.Hour + time.Minute, true}} {
		clk.Set(base6h.Add(step.at))
		if v := mustPostRules(t, base, body("u1", 1)); v.Allowed != step.admit {
			t.Errorf("at %v: allowed %v, want %v: %+v", clk.Now().UTC(), v.Allowed, step.admit, v)
		}
	}
}
