package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// newClock returns a time every node of a test reads, moved only by the
// test.
func newClock() *fakeclock.Clock {
	return fakeclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
}

// admissions records when (on the test's clock) each admitted hit was
// admitted.
type admissions struct {
	mu sync.Mutex
	at []int64
}

func (a *admissions) add(t int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.at = append(a.at, t)
}

// worst returns the window [from, to] of admission times whose count most
// exceeds burst + rate*(to-from), and by how much (at most 0: none).
func (a *admissions) worst(burst int64, rate float64) (over float64, from, to int64, count int) {
	a.mu.Lock()
	at := slices.Clone(a.at)
	a.mu.Unlock()
	slices.Sort(at)
	over = -1e18
	for i := range at {
		for j := i; j < len(at); j++ {
			if j+1 < len(at) && at[j+1] == at[j] {
				continue // the window ends after every hit of its last instant
			}
			allowed := float64(burst) + rate*float64(at[j]-at[i])
			if e := float64(j-i+1) - allowed; e > over {
				over, from, to, count = e, at[i], at[j], j-i+1
			}
		}
	}
	return over, from, to, count
}

// burstUntilDenied checks req on every node at once, deny streaks of 5
// ending each caller, and records the admissions at the clock's time.
func burstUntilDenied(t *testing.T, nodes []*cluster.Node, req limiter.Request, clk *fakeclock.Clock, adm *admissions) int {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 4 * len(nodes) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nd := nodes[g%len(nodes)]
			for denied := 0; denied < 5; {
				now := clk.Now().UnixNano()
				d, err := nd.Check(context.Background(), req, sluice.OnUnreachable(sluice.PolicyDeny))
				switch {
				case err != nil:
					t.Error(err)
					return
				case d.Allowed:
					adm.add(now)
					admitted.Add(1)
					denied = 0
				default:
					denied++
				}
			}
		}()
	}
	wg.Wait()
	return int(admitted.Load())
}

// Leases keep the token bucket's and GCRA's bound: a key of burst 600
// refilled at 600 per 100 ms is leased by two nodes, drained on its owner,
// refilled while the leases are out, then checked in a burst from every
// node; in no interval of the test, of length T, are more than
// 600 + rate*T hits admitted. The leases' hits stay counted on the owner
// while the bucket refills, so the burst finds 600 hits in all, not 600
// plus the leases'.
func TestLeaseKeepsBurstBound(t *testing.T) {
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			clk := newClock()
			c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
				cfg.Clock = cluster.ClockFunc(clk.Now)
				cfg.Lease = cluster.LeaseConfig{Threshold: 100, TTL: time.Second, Share: 0.1}
			}))
			const burst, period = 600, 100 * time.Millisecond
			req := limiter.Request{Name: "bound", Key: a.String(), Hits: 1, Limit: burst, Period: period, Burst: burst, Algorithm: a}
			rate := float64(burst) / float64(period)
			owner := c.Owner(req.Name, req.Key)
			others := nonOwners(c, req.Name, req.Key)
			adm := &admissions{}
			// The two other nodes take leases of the hot key and keep
			// their hits unused.
			for _, nd := range others {
				if err := testcluster.WaitFor(10*time.Second, func() error {
					for range 20 {
						if d, err := nd.Check(context.Background(), req); err == nil && d.Allowed {
							adm.add(clk.Now().UnixNano())
						}
					}
					if s := nd.Stats().Leases; s.HitsLeased <= s.Local {
						return fmt.Errorf("%s holds no unused leased hit: %+v", nd.Name(), s)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			// Drained on the owner, refilled (twice over) while the leases
			// are out, then a burst from every node.
			drained := burstUntilDenied(t, []*cluster.Node{owner}, req, clk, adm)
			clk.Advance(2 * period)
			got := burstUntilDenied(t, c.Nodes(), req, clk, adm)
			var leased int64
			for _, nd := range others {
				leased += nd.Stats().Leases.HitsLeased
			}
			t.Logf("drained %d on the owner; after the refill the burst admitted %d (%d hits leased in all)", drained, got, leased)
			if got > burst {
				t.Errorf("the burst admitted %d at one instant, burst %d", got, burst)
			}
			if over, from, to, n := adm.worst(burst, rate); over > 0 {
				t.Errorf("%d admitted in [%v, %v] (%v), more than %d + rate*T by %.0f",
					n, time.Unix(0, from).UTC().Format("15:04:05.000"), time.Unix(0, to).UTC().Format("15:04:05.000"), time.Duration(to-from), burst, over)
			}
		})
	}
}

// Leased hits count for every request of the key, whatever its behavior:
// a DrainOverLimit or Reset check sees the capacity the leases leave.
func TestLeasedHitsCountForEveryBehavior(t *testing.T) {
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA} {
		for _, b := range []limiter.Behavior{0, limiter.DrainOverLimit, limiter.Reset} {
			t.Run(fmt.Sprintf("%s/%d", a, b), func(t *testing.T) {
				nd := startNode(t, cluster.TestConfig("lonely"))
				req := limiter.Request{Name: "held", Key: "k", Hits: 0, Limit: 10, Period: time.Hour, Burst: 10, Algorithm: a}
				l, err := nd.Lease(context.Background(), "holder", req, 5, time.Minute)
				if err != nil || l.Granted != 5 {
					t.Fatalf("lease of %d, %v; want 5", l.Granted, err)
				}
				req.Hits, req.Behavior = 1, b
				admitted := 0
				for range 20 {
					if d, err := nd.Check(context.Background(), req); err == nil && d.Allowed {
						admitted++
					}
				}
				if b == limiter.Reset {
					// Each check empties the bucket, not the leases, and
					// takes one hit: then 4 more fit beside the 5 leased.
					req.Behavior = 0
					after := 0
					for range 10 {
						if d, _ := nd.Check(context.Background(), req); d.Allowed {
							after++
						}
					}
					if admitted != 20 || after != 4 {
						t.Fatalf("%d of 20 resets admitted, then %d checks; want 20, then 4", admitted, after)
					}
					return
				}
				if admitted > 5 {
					t.Fatalf("admitted %d with 5 of 10 leased", admitted)
				}
			})
		}
	}
}

// An owner whose clock ran an hour ahead, then was set back, releases a
// 10/s key as its limit says, for every algorithm: a check forwarded to
// it over gRPC is denied for at most a period (and a hit's share of the
// next, for the sliding window counter), and admitted once RetryAfter has
// passed on the owner's clock.
func TestOwnerClockStepsBack(t *testing.T) {
	clk := newClock()
	clk.Advance(time.Hour)
	c := testcluster.New(t, 2, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
		cfg.Clock = cluster.ClockFunc(clk.Now)
	}))
	for _, a := range limiter.Algorithms {
		req := limiter.Request{Name: "clock", Key: a.String(), Limit: 10, Period: time.Second, Algorithm: a}
		from := nonOwners(c, req.Name, req.Key)[0]
		spend := req
		spend.Hits = 10
		if d := checkOn(t, from, spend); !d.Allowed || d.Owner == from.Name() {
			t.Fatalf("%v: spending on the owner: %+v", a, d)
		}
		clk.Advance(-time.Hour)
		req.Hits = 1
		d := checkOn(t, from, req)
		longest := time.Second + 100*time.Millisecond + 1
		if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > longest || d.Owner == from.Name() {
			t.Fatalf("%v: after the step back: %+v, want denied by the owner for at most %v", a, d, longest)
		}
		clk.Advance(d.RetryAfter)
		if d := checkOn(t, from, req); !d.Allowed {
			t.Fatalf("%v: at now+RetryAfter: %+v, want admitted", a, d)
		}
		clk.Advance(time.Hour) // ahead again for the next key
	}
}

// A lease granted while the owner's clock ran an hour ahead holds its
// hits for at most its TTL once the clock is set back: the key is denied
// for no longer than the TTL, then admits again once the hits have drained.
func TestLeaseOwnerClockStepsBack(t *testing.T) {
	const ttl = time.Second
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow} {
		t.Run(a.String(), func(t *testing.T) {
			clk := newClock()
			clk.Advance(time.Hour)
			c := testcluster.New(t, 1, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
				cfg.Clock = cluster.ClockFunc(clk.Now)
			}))
			owner := c.Node(0)
			req := limiter.Request{Name: "clock", Key: "leased", Limit: 10, Period: time.Second, Algorithm: a}
			l, err := owner.Lease(context.Background(), "holder", req, 10, ttl)
			if err != nil || l.Granted != 10 {
				t.Fatalf("lease: %+v, %v", l, err)
			}
			clk.Advance(-time.Hour)
			req.Hits = 1
			d := checkOn(t, owner, req)
			if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > ttl {
				t.Fatalf("after the step back: %+v, want denied for at most the TTL %v", d, ttl)
			}
			// The held hits enter the bucket at the lease's expiry and
			// drain within a period; a window's end within one.
			clk.Advance(ttl + req.Period)
			if d := checkOn(t, owner, req); !d.Allowed {
				t.Fatalf("a TTL and a period after the step back: %+v, want admitted", d)
			}
		})
	}
}

func checkOn(t *testing.T, n *cluster.Node, req limiter.Request) sluice.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := n.Check(ctx, req)
	if err != nil {
		t.Fatalf("check of %s/%s on %s: %v", req.Name, req.Key, n.Name(), err)
	}
	return d
}
