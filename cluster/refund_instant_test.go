package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// Through a node that does not own the key, a token bucket's, leaky
// bucket's, GCRA's or sliding window log's charge names the instant it
// was charged at, and a refund carrying it, forwarded to the owner, gives
// back nothing once the hits have drained (or left the log's window) and
// another request has charged the key: the other request's hit stays.
// Before the charge drained, the refund gives it back.
func TestRefundToItsChargedInstantThroughANonOwner(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	c := testcluster.New(t, 2, testcluster.WithConfig(func(_ int, cfg *cluster.Config) { cfg.Clock = cluster.ClockFunc(clk.Now) }))
	ctx := context.Background()
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.LeakyBucket, limiter.GCRA, limiter.SlidingWindowLog} {
		req := limiter.Request{Name: "refund", Key: a.String(), Hits: 1, Limit: 10, Period: 10 * time.Second, Algorithm: a}
		from := nonOwners(c, req.Name, req.Key)[0]
		check := func(step string, r limiter.Request) limiter.Decision {
			t.Helper()
			d, err := from.Check(ctx, r)
			if err != nil || d.WithoutOwner || d.Owner == from.Name() {
				t.Fatalf("%s %s: %+v, %v; want it forwarded to the owner", a, step, d, err)
			}
			return d.Decision
		}
		charge := check("charge", req)
		if charge.Window.IsZero() || charge.Window.Start != charge.Window.End {
			t.Fatalf("%s: the charge names no instant: %+v", a, charge)
		}
		back := req
		back.Behavior, back.Charged = limiter.Refund, charge.Window
		if d := check("refund before it drained", back); d.Window != charge.Window || d.Remaining != 10 {
			t.Fatalf("%s: a refund before the charge drained: %+v; want it given back, remaining 10", a, d)
		}
		charge = check("charge again", req)
		back.Charged = charge.Window
		clk.Advance(11 * time.Second) // drained, and out of the log's window
		check("another request", req)
		if d := check("refund after it drained", back); !d.Window.IsZero() || d.Remaining != 9 {
			t.Fatalf("%s: a refund after the charge drained and another request charged: %+v; want nothing given back, remaining 9", a, d)
		}
	}
}
