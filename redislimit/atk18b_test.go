package redislimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// TestAtk18bResetRefundDifferential runs the same reset-heavy traces
// through Redis and limiter.Store at the same instants: a reset in one
// step of six (with and without hits), refunds naming any charge made
// earlier in the trace (before or after any number of resets), and the
// clock stepping back by up to a period and ahead by up to two hours and
// back around the resets. Both must decide alike: Allowed, Remaining and
// Window exactly, times within timeTolerance.
func TestAtk18bResetRefundDifferential(t *testing.T) {
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strictest=%v", strict), func(t *testing.T) {
			d := newDifferential(t, true)
			d.strictest, d.rl.cfg.KeepStrictest = strict, strict
			runResetRefundTraces(t, d)
		})
	}
}

// runResetRefundTraces runs TestAtk18bResetRefundDifferential's traces
// through d.
func runResetRefundTraces(t *testing.T, d *differential) {
	ctx := context.Background()
	seeds, steps := 6, 300
	if testing.Short() {
		seeds, steps = 2, 100
	}
	resets, refunds, given := 0, 0, 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 1818))
		for _, algo := range limiter.Algorithms {
			d.mem = d.newMemory(t)
			p := traceMoves[rng.IntN(len(traceMoves))]
			if algo == limiter.GCRA {
				p = gcraTraceMoves[rng.IntN(len(gcraTraceMoves))]
			}
			key := fmt.Sprintf("atk18b-%d", seed)
			var charges []limiter.Window
			var chargeHits []int64
			var history []string
			for step := range steps {
				switch rng.IntN(12) {
				case 0:
					d.clock.now = d.clock.now.Add(time.Duration(1+rng.Int64N(int64(2*time.Hour)/1000)) * time.Microsecond)
				case 1:
					d.clock.now = d.clock.now.Add(-time.Duration(1+rng.Int64N(int64(2*time.Hour)/1000)) * time.Microsecond)
				case 2:
					d.clock.now = d.clock.now.Add(-100*time.Millisecond - time.Duration(1+rng.Int64N(int64(p.period)/1000))*time.Microsecond)
				case 3, 4:
				default:
					d.clock.now = d.clock.now.Add(time.Duration(rng.Int64N(int64(p.period/10)/1000+1)) * time.Microsecond)
				}
				req := limiter.Request{Name: algo.String(), Key: key, Limit: p.limit, Period: p.period, Burst: p.burst, Algorithm: algo}
				req.Hits = rng.Int64N(min(req.Capacity(), 4) + 1)
				switch {
				case rng.IntN(6) == 0:
					req.Behavior = limiter.Reset
					req.Hits = rng.Int64N(2)
					resets++
				case len(charges) > 0 && rng.IntN(3) == 0:
					i := rng.IntN(len(charges))
					req.Behavior, req.Charged, req.Hits = limiter.Refund, charges[i], chargeHits[i]
					refunds++
				}
				history = append(history, fmt.Sprintf("%v %+v", d.clock.now.Format(time.RFC3339Nano), req))
				if len(history) > 10 {
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
				if msg := compareDecisions(want.Decision, got.Decision); msg != "" {
					t.Fatalf("seed %d %s step %d at %v, %+v:\n%s\nlimiter %+v\nredis   %+v\nlast requests:\n%s",
						seed, algo, step, d.clock.now.Format(time.RFC3339Nano), req, msg, want.Decision, got.Decision, strings.Join(history, "\n"))
				}
				if req.Behavior&limiter.Refund != 0 && !want.Window.IsZero() {
					given++
				}
				if req.Behavior&limiter.Refund == 0 && req.Hits > 0 && want.Allowed && !want.Window.IsZero() {
					charges, chargeHits = append(charges, want.Window), append(chargeHits, req.Hits)
				}
			}
		}
	}
	t.Logf("%d resets, %d refunds naming earlier charges, %d of them gave back", resets, refunds, given)
}

// TestAtk18bResetFloodKeysExpire: resets of 1200 distinct live keys (200
// of every algorithm, charged 3 of 10 an hour) each leave a mark in
// Redis; every key so written carries a TTL no longer than the state it
// cleared would have lasted (an hour, two for the sliding window
// counter, whose window counts into the next), so Redis frees the marks on its
// own, and a reset of a key never charged writes nothing.
func TestAtk18bResetFloodKeysExpire(t *testing.T) {
	srv := testredis.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	clock := &testClock{now: t0}
	l := newTestLimiter(t, clock, srv.Addr())
	const perAlgo = 200
	for _, a := range limiter.Algorithms {
		for i := range perAlgo {
			r := limiter.Request{Name: "flood", Key: fmt.Sprintf("%s-%d", a, i), Hits: 3, Limit: 10, Period: time.Hour, Algorithm: a}
			clock.now = t0
			if _, err := l.Check(ctx, r); err != nil {
				t.Fatal(err)
			}
			clock.now = t0.Add(time.Second)
			r.Hits, r.Behavior = 0, limiter.Reset
			if _, err := l.Check(ctx, r); err != nil {
				t.Fatal(err)
			}
			fresh := r
			fresh.Key = "never-" + r.Key
			if _, err := l.Check(ctx, fresh); err != nil {
				t.Fatal(err)
			}
		}
	}
	keys, err := rdb.Keys(ctx, l.cfg.Prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != perAlgo*len(limiter.Algorithms) {
		t.Errorf("%d keys in Redis, want %d: one mark per reset of a live key, none for a key never charged", len(keys), perAlgo*len(limiter.Algorithms))
	}
	longest := time.Duration(0)
	for _, k := range keys {
		ttl := rdb.PTTL(ctx, k).Val()
		bound := time.Hour
		if strings.Contains(k, limiter.SlidingWindowCounter.String()) {
			bound = 2 * time.Hour // its window counts into the next
		}
		if ttl <= 0 || ttl > bound {
			t.Errorf("%s: TTL %v, want in (0, %v]", k, ttl, bound)
		}
		longest = max(longest, ttl)
	}
	t.Logf("%d marks, the longest TTL %v", len(keys), longest)
}
