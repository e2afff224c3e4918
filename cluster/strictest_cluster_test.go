package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// TestNoLaxerRateAcrossTheCluster spends keys of every algorithm (10 an
// hour) on their owners in a cluster whose stores keep the strictest rate
// (the daemon's under destructive_behaviors deny), then checks them at a
// million a millisecond from every node: forwarded from non-owners, after
// a node joins and takes keys over, after the owners leave and hand their
// keys off, after a node is killed hard and its replicas take its keys
// over. No check is admitted, of calendar hours' keys either, whose unit
// travels with their state.
func TestNoLaxerRateAcrossTheCluster(t *testing.T) {
	waitBound(t)
	var reqs []limiter.Request
	for _, a := range limiter.Algorithms {
		reqs = append(reqs, limiter.Request{Name: "strict", Key: "k-" + a.String(), Hits: 10, Limit: 10, Period: time.Hour, Algorithm: a})
	}
	kolkata, err := limiter.LoadZone("Asia/Kolkata") // a half-hour offset: its hours are not UTC's
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		r := limiter.Request{Name: "strict", Key: fmt.Sprintf("k-calendar-%d", i), Hits: 10, Limit: 10, Calendar: limiter.Hour, Algorithm: limiter.FixedWindow}
		if i%2 == 1 {
			r.Location = kolkata
		}
		reqs = append(reqs, r)
	}
	clk := fakeclock.New(time.Date(2026, 3, 4, 5, 6, 30, 0, time.UTC))
	c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
		cfg.Store.KeepStrictest, cfg.Replicas, cfg.Clock = true, 2, cluster.ClockFunc(clk.Now)
	}))
	spendAll(t, c, reqs)
	check := func(step string) {
		t.Helper()
		for _, nd := range c.Nodes() {
			for _, r := range reqs {
				lax := limiter.Request{Name: r.Name, Key: r.Key, Hits: 1, Limit: 1_000_000, Period: time.Millisecond, Algorithm: r.Algorithm}
				// Twice, so that a lax window charged by the first has
				// ended by the second.
				for range 2 {
					d, err := nd.Check(context.Background(), lax)
					if err != nil {
						t.Fatalf("%s: %s checks %s: %v", step, nd.Name(), r.Key, err)
					}
					if d.Allowed {
						t.Errorf("%s: %s admitted %s at a million a millisecond (owner %s)", step, nd.Name(), r.Key, d.Owner)
					}
					clk.Advance(2 * time.Millisecond)
				}
			}
		}
	}
	check("spent")
	c.Add()
	c.WaitConverged()
	check("after a join")
	c.Leave(0)
	c.WaitConverged()
	check("after a leave")

	// Every key of one node on its replica, with its rate, then that
	// node killed hard: the replicas take its keys over.
	victim := c.Nodes()[0]
	err = testcluster.WaitFor(10*time.Second, func() error {
		for _, r := range reqs {
			ms := victim.Replicas(r.Name, r.Key)
			if ms[0].Name != victim.Name() {
				continue
			}
			replica := c.Node(victimIndex(t, c, ms[1].Name))
			sn, ok := replica.Store().Snapshot(r.Name, r.Key, clk.Now())
			if !ok || sn.RateLimit == 0 || sn.RateCalendar != r.Calendar || sn.RateLocation != r.Location {
				return fmt.Errorf("%s holds no copy of %s with its rate (%v)", replica.Name(), r.Key, ok)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c.StopHard(victimIndex(t, c, victim.Name()))
	c.WaitConverged()
	check("after the owner's hard kill")
}
