package redislimit

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// peekChanges are the peeks TestPeekKeepsState sends at a key: every
// algorithm, and the key's own with another Limit, Period, Burst,
// calendar or behavior. GCRA's emission intervals stay whole
// microseconds, so that its decisions match limiter's exactly.
var peekChanges = []struct {
	name   string
	change func(*limiter.Request)
}{
	{"token_bucket", func(r *limiter.Request) { r.Algorithm = limiter.TokenBucket }},
	{"leaky_bucket", func(r *limiter.Request) { r.Algorithm = limiter.LeakyBucket }},
	{"fixed_window", func(r *limiter.Request) { r.Algorithm = limiter.FixedWindow }},
	{"sliding_window_log", func(r *limiter.Request) { r.Algorithm = limiter.SlidingWindowLog }},
	{"sliding_window_counter", func(r *limiter.Request) { r.Algorithm = limiter.SlidingWindowCounter }},
	{"gcra", func(r *limiter.Request) { r.Algorithm = limiter.GCRA }},
	{"gcra, limit 5", func(r *limiter.Request) { r.Algorithm, r.Limit = limiter.GCRA, 5 }},
	{"limit 5", func(r *limiter.Request) { r.Limit = 5 }},
	{"limit 20", func(r *limiter.Request) { r.Limit = 20 }},
	{"period 5s", func(r *limiter.Request) { r.Period = 5 * time.Second }},
	{"period 20s", func(r *limiter.Request) { r.Period = 20 * time.Second }},
	{"burst 15", func(r *limiter.Request) { r.Burst = 15 }},
	{"calendar minute", func(r *limiter.Request) {
		r.Algorithm, r.Calendar, r.Location, r.Period = limiter.FixedWindow, limiter.Minute, time.UTC, 0
	}},
	{"refund of 0", func(r *limiter.Request) { r.Behavior = limiter.Refund }},
	{"drain of 0", func(r *limiter.Request) { r.Behavior = limiter.DrainOverLimit }},
}

// TestPeekKeepsState: a peek (0 hits, no Reset) of a key decides as
// limiter's peek does and leaves the key's bytes in Redis as they were,
// and its TTL not set again, for every algorithm the key holds, whatever
// algorithm, Limit, Period, Burst or behavior the peek carries; also where the clock stepped back
// behind the state's times and where the state has expired. A Reset of 0
// hits is no peek: it clears the key.
func TestPeekKeepsState(t *testing.T) {
	srv := testredis.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	clock := &testClock{now: time.Unix(1_800_000_000, 0)}
	rl := newTestLimiter(t, clock, srv.Addr())
	store, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	mem := sluice.NewLocal(store, clock.read)
	ctx := context.Background()

	// check decides req on both and requires the same decision.
	check := func(what string, req limiter.Request) limiter.Decision {
		t.Helper()
		want, werr := mem.Check(ctx, req)
		got, gerr := rl.Check(ctx, req)
		if werr != nil || gerr != nil || got.WithoutOwner {
			t.Fatalf("%s %+v: limiter %v, redis %+v, %v", what, req, werr, got, gerr)
		}
		if msg := compareDecisions(want.Decision, got.Decision); msg != "" {
			t.Fatalf("%s %+v: %s\nlimiter %+v\nredis   %+v", what, req, msg, want.Decision, got.Decision)
		}
		return got.Decision
	}
	get := func(key string) []byte {
		t.Helper()
		b, err := rdb.Get(ctx, key).Bytes()
		if err != nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		return b
	}

	for _, algo := range limiter.Algorithms {
		base := limiter.Request{Name: "peek", Key: algo.String(), Limit: 10, Period: 10 * time.Second, Algorithm: algo}
		key := Key(rl.cfg.Prefix, base.Name, base.Key)
		// Two instants of hits, the first at a window's start (so that
		// the step back below lands in the window before): a log of two
		// entries, a bucket partly drained, a counter and a window part
		// spent.
		clock.now = clock.now.Truncate(10 * time.Second).Add(10 * time.Second)
		write := base
		write.Hits = 4
		check("write", write)
		clock.now = clock.now.Add(1500 * time.Millisecond)
		write.Hits = 3
		check("write", write)
		before := get(key)
		ttl := rdb.PTTL(ctx, key).Val()

		peekAll := func(when string) {
			t.Helper()
			for _, pc := range peekChanges {
				req := base
				pc.change(&req)
				check(algo.String()+" "+when+" peek "+pc.name, req)
				if after := get(key); !bytes.Equal(after, before) {
					t.Fatalf("%s: a peek %s with %s changed the key:\nbefore %x\nafter  %x", algo, when, pc.name, before, after)
				}
				// A write sets the TTL afresh; real time only lowers it.
				if now := rdb.PTTL(ctx, key).Val(); now <= 0 || now > ttl {
					t.Fatalf("%s: after a peek %s with %s the key's TTL is %v, was %v", algo, when, pc.name, now, ttl)
				}
			}
		}
		clock.now = clock.now.Add(700 * time.Millisecond)
		peekAll("live")
		// Behind the state's times: limiter bounds them by now on its
		// copy; Redis neither.
		clock.now = clock.now.Add(-3 * time.Second)
		peekAll("after a step back")
		// Long after the state is fresh again: the key stays as it is
		// (its TTL removes it).
		clock.now = clock.now.Add(time.Hour)
		peekAll("expired")

		// A Reset of 0 hits writes. The callers' clock is an hour past
		// the state's expiry, which the key's TTL on the server's clock
		// has not reached: as on a clock ahead, the fresh state leaves
		// a drop mark at now alone (limiter's dropMarkAtLocked), which a
		// clock set back finds, and which decides as a key never
		// charged at and after its instant.
		reset := base
		reset.Behavior = limiter.Reset
		if d := check("reset", reset); !d.Allowed || d.Remaining != 10 {
			t.Fatalf("%s: reset %+v", algo, d)
		}
		if b := get(key); b[0] != 3 && b[0] != 4 { // format versions 3 and 4 carry a mark
			t.Errorf("%s: a Reset of 0 hits of a state fresh at now left no drop mark: %x", algo, b)
		}
		charge := base
		charge.Hits = 1
		if d := check("charge after the reset", charge); !d.Allowed || d.Remaining != 9 {
			t.Errorf("%s: a charge after the drop mark: %+v", algo, d)
		}
	}
}
