package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// TestLeasedHitsEnterUnderCurrentLimit: held hits enter the bucket under
// the parameters the owner decides the key with when the lease ends, not
// the grant's, and none are dropped. One node; a lease of 10 at 100/h; a
// check at 250/h takes 240; after the TTL the 10 leased hits count, so a
// check at 250/h admits nothing more (250 in all). With the grant's
// smaller limit the 10 entered a bucket already past its capacity of 100
// and were dropped: 260 for 250. The same with the limits the other way
// round, and with a limit change after the expiry.
func TestLeasedHitsEnterUnderCurrentLimit(t *testing.T) {
	const ttl = time.Second
	type step struct {
		name        string
		advance     time.Duration // before the step
		lease       int64         // hits to lease (with leaseLimit), else a check
		limit       int64         // per hour, the check's or the lease's
		hits        int64
		wantGranted int64
		wantAllowed int64 // of hits, checked one at a time
	}
	tables := map[string][]step{
		"smaller lease, larger checks": {
			{name: "lease", lease: 10, limit: 100, wantGranted: 10},
			{name: "checks at 250/h", limit: 250, hits: 241, wantAllowed: 240},
			{name: "after the TTL", advance: ttl, limit: 250, hits: 10, wantAllowed: 0},
		},
		"larger lease, smaller checks": {
			{name: "lease", lease: 25, limit: 250, wantGranted: 25},
			{name: "checks at 100/h", limit: 100, hits: 80, wantAllowed: 75},
			{name: "after the TTL at 250/h", advance: ttl, limit: 250, hits: 160, wantAllowed: 150},
		},
		"limit raised after the expiry": {
			{name: "lease", lease: 10, limit: 100, wantGranted: 10},
			{name: "checks at 100/h", limit: 100, hits: 91, wantAllowed: 90},
			{name: "after the TTL at 1000/h", advance: ttl, limit: 1000, hits: 910, wantAllowed: 900},
		},
	}
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA} {
		for name, steps := range tables {
			t.Run(a.String()+"/"+name, func(t *testing.T) {
				clk := newClock()
				c := testcluster.New(t, 1, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
					cfg.Clock = cluster.ClockFunc(clk.Now)
				}))
				owner := c.Node(0)
				for i, s := range steps {
					clk.Advance(s.advance)
					req := limiter.Request{Name: "mix", Key: "k", Limit: s.limit, Period: time.Hour, Algorithm: a}
					if s.lease > 0 {
						l, err := owner.Lease(context.Background(), "holder", req, s.lease, ttl)
						if err != nil || l.Granted != s.wantGranted {
							t.Fatalf("step %d (%s): lease %+v, %v; want %d granted", i, s.name, l, err, s.wantGranted)
						}
						continue
					}
					req.Hits = 1
					var allowed int64
					for range s.hits {
						if checkOn(t, owner, req).Allowed {
							allowed++
						}
					}
					if allowed != s.wantAllowed {
						t.Fatalf("step %d (%s): %d of %d admitted, want %d", i, s.name, allowed, s.hits, s.wantAllowed)
					}
				}
			})
		}
	}
}

// TestLeaseMixedLimitsKeepBound: two nodes check one key at 100 and at 250
// per 500 ms, token bucket and GCRA, with leases on: the node that does
// not own the key leases its hits under its own smaller limit, the owner
// decides under the larger one. On a clock moved only by the test, in no
// interval T are more than 250 + 500/s*T hits admitted, the bound of the
// larger limit (each limit's own bound holds for its own checks too).
func TestLeaseMixedLimitsKeepBound(t *testing.T) {
	const period = 500 * time.Millisecond
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			clk := newClock()
			c := testcluster.New(t, 2, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
				cfg.Clock = cluster.ClockFunc(clk.Now)
				cfg.Lease = cluster.LeaseConfig{Threshold: 50, TTL: 100 * time.Millisecond, Share: 0.5}
			}))
			small := limiter.Request{Name: "mixed", Key: a.String(), Hits: 1, Limit: 100, Period: period, Algorithm: a}
			large := small
			large.Limit = 250
			owner := c.Owner(small.Name, small.Key)
			holder := nonOwners(c, small.Name, small.Key)[0]
			adm := &admissions{}
			// Rounds of 60 steps of 15 ms (7.5 hits' worth of the larger
			// rate): the holder checks until denied in the first 10 and
			// the last 10; after 39 idle steps, which drain the bucket, it
			// is granted a lease; in the last 10 the owner checks until
			// denied too, filling the bucket to the larger limit while
			// the leased hits are held, and the lease expires.
			for i := range 180 {
				if i%60 < 10 || i%60 >= 50 {
					var wg sync.WaitGroup
					wg.Add(1)
					go func() {
						defer wg.Done()
						burstUntilDenied(t, []*cluster.Node{holder}, small, clk, adm)
					}()
					wg.Wait()
				}
				if i%60 == 49 { // the holder is granted a lease
					before := holder.Stats().Leases.Granted
					if err := testcluster.WaitFor(10*time.Second, func() error {
						if d, err := holder.Check(context.Background(), small); err == nil && d.Allowed {
							adm.add(clk.Now().UnixNano())
						}
						if s := holder.Stats().Leases; s.Granted == before {
							clk.Advance(time.Millisecond) // a denial here lasts until then
							return fmt.Errorf("%s was granted no lease: %+v", holder.Name(), s)
						}
						return nil
					}); err != nil {
						t.Fatal(err)
					}
				}
				if i%60 >= 50 {
					burstUntilDenied(t, []*cluster.Node{owner}, large, clk, adm)
				}
				clk.Advance(15 * time.Millisecond)
			}
			s := holder.Stats().Leases
			t.Logf("%d admitted; holder: %+v", len(adm.at), s)
			if s.Local == 0 {
				t.Errorf("the holder admitted nothing from a lease: %+v", s)
			}
			if over, from, to, n := adm.worst(large.Limit, float64(large.Limit)/float64(period)); over > 1e-6 {
				t.Errorf("%d admitted in %v, more than %d + rate*T by %.2f", n, time.Duration(to-from), large.Limit, over)
			}
		})
	}
}
