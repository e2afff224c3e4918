package redislimit

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testredis"
	"github.com/sluicehq/sluice/limiter"
)

// TestRefundAfterAResetTakesNoOnesHits is limiter's test of that name on
// Redis: a request charges 3 hits, the key is reset, others charge 4,
// and the first request's refund naming its charge gives nothing back,
// for every algorithm, with and without KeepStrictest; a refund of the
// others' charge still gives its 4 back.
func TestRefundAfterAResetTakesNoOnesHits(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	t0 := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	for _, a := range limiter.Algorithms {
		for _, strict := range []bool{false, true} {
			clock := &testClock{now: t0}
			l := newTestLimiter(t, clock, srv.Addr())
			l.cfg.KeepStrictest = strict
			base := limiter.Request{Name: "reset", Key: a.String(), Limit: 10, Period: time.Hour, Algorithm: a}
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
			if !mine.Allowed || mine.Window.IsZero() {
				t.Fatalf("%v: the charge: %+v", a, mine)
			}
			check(2*time.Second, 0, limiter.Reset, limiter.Window{})
			theirs := check(3*time.Second, 4, 0, limiter.Window{})
			if !theirs.Allowed || theirs.Remaining != 6 {
				t.Fatalf("%v: the others' charge after the reset: %+v", a, theirs)
			}
			if d := check(4*time.Second, 3, limiter.Refund, mine.Window); !d.Window.IsZero() || d.Remaining != 6 {
				t.Errorf("%v (strictest %v): the refund of a charge the reset cleared: %+v, want nothing given back (remaining 6)", a, strict, d)
			}
			if d := check(5*time.Second, 4, limiter.Refund, theirs.Window); d.Window != theirs.Window || d.Remaining != 10 {
				t.Errorf("%v (strictest %v): the refund of the charge made after the reset: %+v, want its 4 back (remaining 10)", a, strict, d)
			}
		}
	}
}
