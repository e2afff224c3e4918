package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// TestLateLeaseReturnKeepsOthersHits: a lease return that comes after
// the lease expired (within grantReturnGrace, the ordinary case) refunds
// only what of the unused hits has not drained since they entered the
// bucket at the expiry, so it never takes back hits that other callers
// consumed after the expiry. A 10/s token bucket, burst 10: a lease of 10
// expires at T unused; at T+0.5 s another caller takes 5; after the
// return, at most burst 10 are admitted at that instant in all.
func TestLateLeaseReturnKeepsOthersHits(t *testing.T) {
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			clk := newClock()
			c := testcluster.New(t, 1, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
				cfg.Clock = cluster.ClockFunc(clk.Now)
			}))
			owner := c.Node(0)
			req := limiter.Request{Name: "late", Key: "return", Limit: 10, Period: time.Second, Algorithm: a}
			l, err := owner.Lease(context.Background(), "holder", req, 10, time.Second)
			if err != nil || l.Granted != 10 {
				t.Fatalf("lease: %+v, %v", l, err)
			}
			clk.Advance(time.Second) // expiry: the 10 unused hits enter the bucket
			probe := req
			probe.Hits = 1
			if d := checkOn(t, owner, probe); d.Allowed {
				t.Fatalf("at the expiry: %+v, want denied (the held hits entered)", d)
			}
			clk.Advance(500 * time.Millisecond)
			other := req
			other.Hits = 5
			if d := checkOn(t, owner, other); !d.Allowed {
				t.Fatalf("another caller's 5 at T+0.5s: %+v, want admitted", d)
			}
			if err := owner.ReturnLease(context.Background(), "holder", req, 10); err != nil {
				t.Fatalf("return: %v", err)
			}
			admitted := 0
			for range 10 {
				if d := checkOn(t, owner, probe); d.Allowed {
					admitted++
				}
			}
			// Without the lease: the other caller's 5 at T+0.5s leave 5.
			if admitted > 5 {
				t.Errorf("after a return of 10 unused hits 0.5 s after the lease expired: %d more admitted at T+0.5s, where a key that never leased admits 5: %d hits at one instant, burst 10 (the return erased %d hits the other caller took)", admitted, admitted+5, admitted-5)
			}
		})
	}
}

// TestLeaseReturnThenStepBackReleasesGCRA: a GCRA lease of 10 that
// expires unused and is returned leaves the owner's state at TAT = now
// with a lead of 0; when the owner's clock is then stepped back an hour,
// the 10/s key is released as a key spent at now would be.
func TestLeaseReturnThenStepBackReleasesGCRA(t *testing.T) {
	for _, ret := range []bool{false, true} {
		clk := newClock()
		clk.Advance(time.Hour)
		c := testcluster.New(t, 1, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
			cfg.Clock = cluster.ClockFunc(clk.Now)
		}))
		owner := c.Node(0)
		req := limiter.Request{Name: "late", Key: "gcra-step", Limit: 10, Period: time.Second, Algorithm: limiter.GCRA}
		l, err := owner.Lease(context.Background(), "holder", req, 10, time.Second)
		if err != nil || l.Granted != 10 {
			t.Fatalf("lease: %+v, %v", l, err)
		}
		clk.Advance(time.Second)
		if ret {
			if err := owner.ReturnLease(context.Background(), "holder", req, 10); err != nil {
				t.Fatalf("return: %v", err)
			}
		}
		clk.Advance(-time.Hour) // NTP steps the owner's clock back
		probe := req
		probe.Hits = 1
		if d := checkOn(t, owner, probe); !d.Allowed && d.RetryAfter > 2*time.Second {
			t.Errorf("returned %v: a 10/s GCRA key leased for 1 s, after the owner's clock stepped back 1 h: denied, RetryAfter %v", ret, d.RetryAfter)
		}
	}
}
