package redislimit

import (
	"context"
	_ "embed"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// decideBeforeLastCharge is decide.lua as it was before a fixed window's
// state recorded its last charge (fa466c0): the script a rolling upgrade
// runs beside the current one, or a rollback returns to.
//
//go:embed testdata/decide_before_last_charge.lua
var decideBeforeLastCharge string

// TestAtk18cLastChargeAcrossARollingUpgrade: under KeepStrictest, a fixed
// window key alternates between 5 per 60 s (A) and 5 per 45 s (B), both
// aligned at t0. The current script charges 1 under A at 10 s (its last
// charge, 10 s); the previous script, during a rolling upgrade, charges 4
// under A at 50 s, which raises the count and leaves the last charge it
// does not know at 10 s; B's check at 55 s is denied. B's window
// [45 s, 90 s) has then counted the 4 hits of 50 s: whatever decides
// after, it admits at most 1 more until 90 s. The denied check moves the
// count to B's window, as both scripts do when each decides alone: the
// current script binds the last charge to the count it wrote it with, so
// the count the previous script raised leaves it unknown (before, B's
// window admitted 9: 4 at 50 s and 5 from 61 s).
func TestAtk18cLastChargeAcrossARollingUpgrade(t *testing.T) {
	for _, mixed := range []bool{true, false} {
		name := "all-current"
		if mixed {
			name = "previous-charges-in-B"
		}
		t.Run(name, func(t *testing.T) {
			srv := testredis.Start(t)
			ctx := context.Background()
			t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC) // a multiple of 180 s
			clock := &testClock{now: t0}
			cur := newTestLimiter(t, clock, srv.Addr())
			prev := newTestLimiter(t, clock, srv.Addr())
			prev.cfg.Prefix = cur.cfg.Prefix
			cur.cfg.KeepStrictest, prev.cfg.KeepStrictest = true, true
			if mixed {
				prev.script = redis.NewScript(decideBeforeLastCharge)
			}
			a := limiter.Request{Name: "up", Key: "k", Limit: 5, Period: 60 * time.Second, Algorithm: limiter.FixedWindow}
			b := a
			b.Period = 45 * time.Second
			check := func(l *Limiter, at time.Duration, r limiter.Request, hits int64) limiter.Decision {
				t.Helper()
				clock.now = t0.Add(at)
				r.Hits = hits
				d, err := l.Check(ctx, r)
				if err != nil || d.WithoutOwner {
					t.Fatalf("at %v: %+v %v", at, d, err)
				}
				return d.Decision
			}
			if d := check(cur, 10*time.Second, a, 1); !d.Allowed {
				t.Fatalf("A's first hit: %+v", d)
			}
			if d := check(prev, 50*time.Second, a, 4); !d.Allowed {
				t.Fatalf("A's 4 hits at 50s: %+v", d)
			}
			if d := check(cur, 55*time.Second, b, 1); d.Allowed {
				t.Fatalf("B's check at 55s on a spent key: %+v", d)
			}
			admitted := int64(4)
			for at := 61 * time.Second; at < 90*time.Second; at += 4 * time.Second {
				if d := check(cur, at, b, 1); d.Allowed {
					admitted++
				}
			}
			if admitted > 5 {
				t.Errorf("B's window [45s, 90s) admitted %d, want at most 5", admitted)
			}
		})
	}
}

// TestAtk18cLastChargePastExactOnRedis: TestAtk18cLastChargeAcrossARollingUpgrade's
// rates in 2256, past 2^53 microseconds, where Redis's numbers are whole to
// 2 µs and its last charge is unknown: 1 and 4 hits under A at 10 s and
// 20 s, B's check denied at 55 s, B's checks from 61 s. Both stores decide
// alike (limiter's last charge is unknown there too).
func TestAtk18cLastChargePastExactOnRedis(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 0, 30, 0, time.UTC) // atkDiff's
	base := time.Date(2256, 1, 1, 0, 0, 0, 0, time.UTC).Sub(t0)
	a := limiter.Request{Name: "past", Key: "k", Limit: 5, Period: 60 * time.Second, Algorithm: limiter.FixedWindow}
	b := a
	b.Period = 45 * time.Second
	hit := func(r limiter.Request, n int64) limiter.Request { r.Hits = n; return r }
	steps := []atkStep{
		{base + 10*time.Second, hit(a, 1)},
		{base + 20*time.Second, hit(a, 4)},
		{base + 55*time.Second, hit(b, 1)},
	}
	for at := 61 * time.Second; at < 90*time.Second; at += 4 * time.Second {
		steps = append(steps, atkStep{base + at, hit(b, 1)})
	}
	atkDiff(t, true, steps)
}

// TestAtk18cDifferentialStrictestNewSeeds runs the KeepStrictest traces
// with clock steps of a day ahead and back on two more streams: both
// stores decide alike. Stream 1801 seed 20 peeks at a sliding window log
// request of 7 per 3 s on a key kept as GCRA at 100 ms a hit, 2 hits
// outstanding: Redis reschedules them at limiter's interval (3 s/7
// rounded up to a nanosecond) and rounds up to a microsecond once.
func TestAtk18cDifferentialStrictestNewSeeds(t *testing.T) {
	for _, stream := range []uint64{1801, 1802} {
		d := newDifferential(t, true)
		d.bigSteps = 24 * time.Hour
		d.strictest, d.rl.cfg.KeepStrictest = true, true
		d.runAll(t, 24, stream)
	}
}
