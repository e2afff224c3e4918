package cluster_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// offsetClock is the system's time moved by offset, as a host's clock that
// is off by that much reads it.
func offsetClock(offset time.Duration) cluster.Clock {
	return cluster.ClockFunc(func() time.Time { return time.Now().Add(offset) })
}

// A node whose clock runs 10 s behind the others', more than its
// HandoverTimeout, joins three that have spent every key: its hand-over
// starts and times out on its one clock, so it decides the keys it gained
// only once their states are in (or the timeout has really passed), and
// the callers checking every key on every node meanwhile get nothing
// admitted.
func TestJoinerClockBehind(t *testing.T) {
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.FixedWindow, limiter.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
				cfg.Replicas = 1
				if i == 3 {
					cfg.Clock = offsetClock(-10 * time.Second)
				}
			}))
			reqs := transitionRequests("behind", a, 500, 10)
			spent := make([]limiter.Request, len(reqs))
			for i, r := range reqs {
				r.Hits = r.Limit
				spent[i] = r
			}
			consume(t, c.Node(0), spent)
			tr := startTraffic(t, c, reqs, 8, 1<<30, trafficBound)
			defer tr.finish()
			joiner := c.Add()
			// Callers keep checking on the joiner too, for a while after
			// the join converged.
			tr.checkedMore(t, 2000)
			tr.finish()
			var admitted int64
			for i := range tr.allowed {
				admitted += tr.allowed[i].Load()
			}
			owned := 0
			for _, r := range reqs {
				if o, _ := joiner.Owner(r.Name, r.Key); o.Name == joiner.Name() {
					owned++
				}
			}
			t.Logf("joiner owns %d of %d keys; %d checks, %d admitted, %d errors", owned, len(reqs), tr.checks.Load(), admitted, tr.errs.Load())
			if owned == 0 {
				t.Fatal("the joiner owns no key: nothing moved")
			}
			if admitted != 0 {
				t.Fatalf("%d hits admitted on keys spent before the join", admitted)
			}
		})
	}
}
