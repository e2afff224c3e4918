package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// Hits a node admits while the key's owner cannot be reached are charged
// to the owner once it can: a key of 100 per hour takes 50 hits through
// its owner; the owner is slowed past the peer timeout until the other
// node's breaker opens; 30 hits through the other node are admitted
// without the owner (PolicyLocal, and PolicyAllow); once the owner is fast
// again they are settled with it, and the owner admits 20 more, not 50.
func TestSettleWithoutOwner(t *testing.T) {
	waitBound(t)
	for _, policy := range []sluice.Policy{sluice.PolicyLocal, sluice.PolicyAllow} {
		t.Run(policy.String(), func(t *testing.T) {
			c := testcluster.New(t, 2)
			n0, n1 := c.Node(0), c.Node(1)
			req := limiter.Request{Name: "settle", Hits: 1, Limit: 100, Period: time.Hour, Algorithm: limiter.FixedWindow}
			for i := 0; ; i++ {
				req.Key = fmt.Sprintf("k%d", i)
				if c.Owner(req.Name, req.Key) == n1 {
					break
				}
			}
			if time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)) < 2*time.Minute {
				t.Skip("the hour's window ends within the test")
			}
			fifty := req
			fifty.Hits = 50
			consume(t, n1, []limiter.Request{fifty})

			c.Slow(1, time.Minute)
			waitBreakerOpen(t, n0, n1, req)
			for i := range 30 {
				d, err := n0.Check(context.Background(), req, sluice.OnUnreachable(policy))
				if err != nil || !d.Allowed || !d.WithoutOwner {
					t.Fatalf("check %d with the owner slow: %+v, %v; want admitted without the owner", i, d, err)
				}
			}
			c.Slow(1, 0)
			if err := testcluster.WaitFor(20*time.Second, func() error {
				if s := n0.Stats().Settle; s.Settled != 30 || s.Recorded != 30 {
					return fmt.Errorf("settle stats %+v, want 30 recorded and settled", s)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if more := admitUntilDenied(t, n1, req, 100); more != 20 {
				t.Fatalf("the owner admits %d more after settling, want 20 (50 + 30 of 100 consumed)", more)
			}
		})
	}
}

// Hits admitted without the owner beyond the key's capacity: a token
// bucket (or GCRA) key of 100 a day takes 50 hits through its owner; the
// owner is slowed past the peer timeout; another node admits 200 checks
// without it under PolicyAllow; once the owner is fast again they are
// settled with it. Every admitted hit counted once, the key is 150 past
// its capacity, which drains at 100 a day: the owner's next check waits
// for all of it. (PolicyLocal admits no more than the capacity: the other
// node decides from its replica's copy, or from a fresh state.)
func TestAtk19SettleBeyondCapacity(t *testing.T) {
	waitBound(t)
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA} {
		for _, policy := range []sluice.Policy{sluice.PolicyAllow} {
			t.Run(a.String()+"/"+policy.String(), func(t *testing.T) {
				c := testcluster.New(t, 2)
				n0, n1 := c.Node(0), c.Node(1)
				req := limiter.Request{Name: "beyond", Hits: 1, Limit: 100, Period: 24 * time.Hour, Algorithm: a}
				for i := 0; ; i++ {
					req.Key = fmt.Sprintf("k%d", i)
					if c.Owner(req.Name, req.Key) == n1 {
						break
					}
				}
				fifty := req
				fifty.Hits = 50
				consume(t, n1, []limiter.Request{fifty})

				c.Slow(1, time.Minute)
				waitBreakerOpen(t, n0, n1, req)
				var admitted int64
				for range 200 {
					d, err := n0.Check(context.Background(), req, sluice.OnUnreachable(policy))
					if err != nil || !d.WithoutOwner {
						t.Fatalf("check with the owner slow: %+v, %v; want decided without the owner", d, err)
					}
					if d.Allowed {
						admitted++
					}
				}
				c.Slow(1, 0)
				if err := testcluster.WaitFor(20*time.Second, func() error {
					if s := n0.Stats().Settle; s.Settled != admitted || s.Recorded != admitted {
						return fmt.Errorf("settle stats %+v, want %d recorded and settled", s, admitted)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				d, err := n1.Check(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				perHit := req.Period / time.Duration(req.Limit)
				over := 50 + admitted - req.Capacity()
				// Within one hit of all of it, for the time the test took.
				if d.Allowed || d.RetryAfter < time.Duration(over)*perHit {
					t.Errorf("after 50 + %d admitted of %d: allowed %v, retry after %v; want to wait %v, what %d hits past the capacity take to drain",
						admitted, req.Capacity(), d.Allowed, d.RetryAfter, time.Duration(over)*perHit, over)
				}
			})
		}
	}
}

// waitBreakerOpen waits until from decides req without asking to (its
// breaker to that owner open): a peek of req under PolicyDeny comes back
// decided without the owner, and from forwarded nothing for it.
func waitBreakerOpen(t *testing.T, from, to *cluster.Node, req limiter.Request) {
	t.Helper()
	peek := req
	peek.Hits = 0
	if err := testcluster.WaitFor(20*time.Second, func() error {
		before := from.Stats().Forwarded
		d, err := from.Check(context.Background(), peek, sluice.OnUnreachable(sluice.PolicyDeny))
		if err != nil {
			return err
		}
		if !d.WithoutOwner || from.Stats().Forwarded != before {
			return fmt.Errorf("the breaker to %s is not open yet", to.Name())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
