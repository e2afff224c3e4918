package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
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
			peek := req
			peek.Hits = 0
			if err := testcluster.WaitFor(20*time.Second, func() error {
				before := n0.Stats().Forwarded
				d, err := n0.Check(context.Background(), peek, sluice.OnUnreachable(sluice.PolicyDeny))
				if err != nil {
					return err
				}
				if !d.WithoutOwner || n0.Stats().Forwarded != before {
					return fmt.Errorf("the breaker to %s is not open yet", n1.Name())
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
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
