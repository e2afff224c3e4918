package cluster_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// keysHeldBy returns n requests of 300 a day of algorithm a on keys whose
// owner and replica in c's ring are nodes owner and replica.
func keysHeldBy(t *testing.T, c *testcluster.Cluster, a limiter.Algorithm, owner, replica, n int) []limiter.Request {
	t.Helper()
	var out []limiter.Request
	for i := 0; i < 100_000 && len(out) < n; i++ {
		req := limiter.Request{Name: "healwin-" + a.String(), Key: fmt.Sprintf("k%d", i), Hits: 1, Limit: 300, Period: 24 * time.Hour, Algorithm: a}
		rs := c.Node(0).Replicas(req.Name, req.Key)
		if len(rs) == 2 && rs[0].Name == c.Node(owner).Name() && rs[1].Name == c.Node(replica).Name() {
			out = append(out, req)
		}
	}
	if len(out) < n {
		t.Fatalf("%d keys of nodes %d and %d, want %d", len(out), owner, replica, n)
	}
	return out
}

// sideTraffic is callers each checking random keys of reqs (one hit,
// denying without the owner) on one node, paced by a ticker, until stop:
// what every key admitted, and what node standIn admitted deciding a key
// itself (standing in for its owner).
type sideTraffic struct {
	reqs     []limiter.Request
	admitted []atomic.Int64
	standIn  []atomic.Int64
	checks   atomic.Int64
	errs     atomic.Int64
	stop     chan struct{}
	once     sync.Once
	wg       sync.WaitGroup
}

func startSideTraffic(c *testcluster.Cluster, reqs []limiter.Request, nodes []int, standIn int, every time.Duration) *sideTraffic {
	tr := &sideTraffic{reqs: reqs, admitted: make([]atomic.Int64, len(reqs)), standIn: make([]atomic.Int64, len(reqs)), stop: make(chan struct{})}
	for g, i := range nodes {
		nd := c.Node(i)
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 19))
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-tr.stop:
					return
				case <-tick.C:
				}
				k := rng.IntN(len(reqs))
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				d, err := nd.Check(ctx, reqs[k], sluice.OnUnreachable(sluice.PolicyDeny))
				cancel()
				tr.checks.Add(1)
				switch {
				case err != nil:
					tr.errs.Add(1)
				case d.Allowed && !d.WithoutOwner:
					tr.admitted[k].Add(1)
					if i == standIn && d.Owner == nd.Name() {
						tr.standIn[k].Add(1)
					}
				}
			}
		}()
	}
	return tr
}

func (tr *sideTraffic) finish() {
	tr.once.Do(func() { close(tr.stop) })
	tr.wg.Wait()
}

// checkedMore waits until the callers have made n more checks than they
// had when it was called.
func (tr *sideTraffic) checkedMore(t *testing.T, n int64) {
	t.Helper()
	from := tr.checks.Load()
	if err := testcluster.WaitFor(time.Minute, func() error {
		if got := tr.checks.Load() - from; got < n {
			return fmt.Errorf("%d checks of %d", got, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// waitAdmitted waits until the callers have admitted n hits in all.
func (tr *sideTraffic) waitAdmitted(t *testing.T, n int64) {
	t.Helper()
	if err := testcluster.WaitFor(time.Minute, func() error {
		var sum int64
		for i := range tr.admitted {
			sum += tr.admitted[i].Load()
		}
		if sum < n {
			return fmt.Errorf("%d admitted, waiting for %d", sum, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A partition {0} | {1,2} healed while callers check the keys on both
// sides, through the heal and the convergence that follows: node 0 stands
// in for the keys' owner, node 1, until its ring has node 1 again, and
// node 1 decides them all along, from a state that lacks the stand-in's
// hits until node 0's state reaches it (node 1 receives every gRPC message
// 100 ms late from the heal on, which widens that window). The heal comes
// when the keys are half spent, or spent on both sides. Counted from the
// callers' side, no key admits more than its limit plus what its stand-in
// admitted (each side decides alone while cut off, and the owner's side,
// in the heal window, from its own history); once the traffic stops, the
// key's owner admits what the limit leaves of every hit admitted, and no
// more.
func TestPartitionHealUnderTraffic(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, tc := range []struct {
		name   string
		healAt int64 // hits admitted per key, on average, before the heal
	}{
		{"half spent", 150},
		{"spent on both sides", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noLeaksAfter(t)
			c := testcluster.New(t, 3, withReplicas(2))
			var reqs []limiter.Request
			for _, a := range allAlgorithms {
				reqs = append(reqs, keysHeldBy(t, c, a, 1, 2, 2)...)
			}
			const before = 20
			consume(t, c.Node(1), withHits(reqs, before))
			waitReplicated(t, c, reqs)

			c.Partition([]int{0}, []int{1, 2})
			c.WaitConverged()
			tr := startSideTraffic(c, reqs, []int{0, 0, 1, 1, 2}, 0, 2*time.Millisecond)
			defer tr.finish()
			tr.waitAdmitted(t, int64(len(reqs))*tc.healAt)
			atHeal := tr.checks.Load()
			c.Slow(1, 100*time.Millisecond)
			c.Heal() // and converged
			healed := tr.checks.Load()
			tr.checkedMore(t, 1500)
			c.Slow(1, 0)
			tr.checkedMore(t, 500)
			tr.finish()
			t.Logf("%d checks (%d from the heal to convergence), %d errors; node 0 recorded %d stand-in hits",
				tr.checks.Load(), healed-atHeal, tr.errs.Load(), c.Node(0).Stats().Settle.StandIn)

			var over, standIns int64
			for i, r := range reqs {
				got, standIn := tr.admitted[i].Load(), tr.standIn[i].Load()
				bound := r.Capacity() - before + standIn
				if got > bound {
					t.Errorf("%s %s: callers were admitted %d, more than %d (the limit %d less the %d before, plus the %d its stand-in admitted)",
						r.Algorithm, r.Key, got, bound, r.Capacity(), before, standIn)
				}
				over += max(got-(r.Capacity()-before), 0)
				standIns += standIn
			}
			t.Logf("admitted past the limits: %d in all; stand-in hits %d", over, standIns)

			// Every hit admitted is counted once: the owner admits the rest.
			want := make([]int64, len(reqs))
			for i, r := range reqs {
				want[i] = max(r.Capacity()-before-tr.admitted[i].Load(), 0)
			}
			if err := testcluster.WaitFor(20*time.Second, func() error {
				for i, r := range reqs {
					if err := atMost(c, []limiter.Request{r}, want[i]); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
			for i, r := range reqs {
				owner := c.Owner(r.Name, r.Key)
				more := int64(admitUntilDenied(t, owner, r, int(r.Capacity())))
				switch {
				case more > want[i]:
					t.Errorf("%s %s: its owner admits %d more after %d admitted, want %d", r.Algorithm, r.Key, more, before+tr.admitted[i].Load(), want[i])
				case more < want[i] && tr.errs.Load() == 0:
					t.Errorf("%s %s: its owner admits %d more after %d admitted, want %d: counted twice", r.Algorithm, r.Key, more, before+tr.admitted[i].Load(), want[i])
				}
			}
		})
	}
}
