package cluster_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/testcluster"
)

// Lease grants carried with the key's state to its next owner (carry.go):
// the holders' returns free the hits there, whatever moved the key.

// keyMovingOnJoin returns a request of one hit of a key of limit a day, of
// algorithm a, that node owner of c owns and that a node named joiner
// owns once it joins.
func keyMovingOnJoin(t *testing.T, c *testcluster.Cluster, name string, a limiter.Algorithm, limit int64, owner int, joiner string) limiter.Request {
	t.Helper()
	after, err := ring.New(cluster.TestConfig("x").Ring)
	if err == nil {
		err = after.SetMembers(append(c.Node(0).RingMembers(), ring.Member{Name: joiner}))
	}
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10_000 {
		req := limiter.Request{Name: name, Key: fmt.Sprintf("%s-%d", a, i), Hits: 1, Limit: limit, Period: 24 * time.Hour, Algorithm: a}
		if o, _ := after.Owner(req.Name, req.Key); c.OwnerIndex(req.Name, req.Key) == owner && o.Name == joiner {
			return req
		}
	}
	t.Fatalf("no key of node %d that moves to %s", owner, joiner)
	return limiter.Request{}
}

// admitAll checks req through each of nodes, then through the key's
// owner, until each denies, again until they admit the limit with the
// before admitted already, or wait ends (returns free hits some time
// after the change): the hits admitted, before included.
func admitAll(t *testing.T, c *testcluster.Cluster, req limiter.Request, before int64, wait time.Duration, nodes ...*cluster.Node) int64 {
	t.Helper()
	admitted := before
	_ = testcluster.WaitFor(wait, func() error {
		for _, nd := range nodes {
			admitted += int64(admitUntilDenied(t, nd, req, int(req.Limit)))
		}
		admitted += int64(admitUntilDenied(t, c.Owner(req.Name, req.Key), req, int(req.Limit)))
		if admitted < req.Limit {
			return fmt.Errorf("%d admitted", admitted)
		}
		return nil
	})
	return admitted
}

// A holder (node 0) leases hits of a key of 1000 owned by node 1; a
// fourth node joins and takes the key while node 0 holds unused hits. The
// grant goes to the joiner with the key's state, and node 0's return
// there: the key admits exactly its limit.
func TestLeaseReturnAfterJoin(t *testing.T) {
	skipNearDayEnd(t)
	for _, a := range leaseEndAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			noLeaksAfter(t)
			c := leaseEndCluster(t, 3, 3*time.Second, 0.5, 1)
			req := keyMovingOnJoin(t, c, "joinlease", a, 1000, 1, "node-3")
			start := time.Now() // a bucket refills from here: mostAdmitted
			admitted := checkUntilLeased(t, c.Node(0), req)
			admitted += checkN(c.Node(0), req, 10)
			if j := c.Add(); c.Owner(req.Name, req.Key) != j {
				t.Fatalf("the key's owner is %s, not the joiner %s", c.Owner(req.Name, req.Key).Name(), j.Name())
			}
			admitted = admitAll(t, c, req, admitted, 20*time.Second, c.Node(0))
			t.Logf("callers admitted %d of %d; %+v", admitted, req.Limit, c.Node(0).Stats().Leases)
			switch {
			case admitted > mostAdmitted(req, start):
				t.Errorf("admitted %d of %d, more than the limit", admitted, req.Limit)
			case admitted < req.Limit:
				leaseHitsLost(t, "admitted %d of %d, want exactly the limit", admitted, req.Limit)
			}
		})
	}
}

// Two holders (nodes 0 and 2) lease hits of a key of 1000 owned by node
// 1, which leaves while both hold unused hits; the key moves to node 3.
// Both grants go with the key's state, and each holder's return frees its
// own: the key admits exactly its limit.
func TestLeaseReturnsOfTwoHoldersAfterOwnerLeft(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, a := range leaseEndAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			waitBound(t)
			noLeaksAfter(t)
			c := leaseEndCluster(t, 4, 3*time.Second, 0.4, 1)
			req := keyMovingTo(t, c, "twoholders", a, 1000, 1, 3)
			start := time.Now() // a bucket refills from here: mostAdmitted
			admitted := checkUntilLeased(t, c.Node(0), req)
			admitted += checkUntilLeased(t, c.Node(2), req)
			admitted += checkN(c.Node(0), req, 10)
			admitted += checkN(c.Node(2), req, 10)
			c.Leave(1)
			c.WaitConverged()
			admitted = admitAll(t, c, req, admitted, 20*time.Second, c.Node(0), c.Node(2))
			t.Logf("callers admitted %d of %d; node 0 %+v, node 2 %+v", admitted, req.Limit, c.Node(0).Stats().Leases, c.Node(2).Stats().Leases)
			switch {
			case admitted > mostAdmitted(req, start):
				t.Errorf("admitted %d of %d, more than the limit", admitted, req.Limit)
			case admitted < req.Limit:
				leaseHitsLost(t, "admitted %d of %d, want exactly the limit", admitted, req.Limit)
			}
		})
	}
}

// A holder (node 0) leases hits of a key of 1000 owned by node 1, which
// is killed hard once its replica has a copy of the key that names the
// grant; the key moves to node 0 itself or to node 2. The key never
// admits more than its limit; the holder sends its unused hits to the key's
// owner on its ring with the members cut off, which holds the dead owner
// (TestLeaseReturnAfterOwnerKilledAndReaped), so within the test's wait
// the key admits the holder's unused hits less, and no fewer (the bound
// docs/design.md states).
func TestLeaseReturnAfterOwnerKilled(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, next := range []int{0, 2} {
		for _, a := range leaseEndAlgorithms {
			t.Run(fmt.Sprintf("to node %d/%s", next, a), func(t *testing.T) {
				waitBound(t)
				noLeaksAfter(t)
				c := leaseEndCluster(t, 3, 3*time.Second, 0.5, 2)
				req := keyMovingTo(t, c, "ownerkilled2", a, 1000, 1, next)
				start := time.Now() // a bucket refills from here: mostAdmitted
				admitted := checkUntilLeased(t, c.Node(0), req)
				admitted += checkN(c.Node(0), req, 10)
				admitted += replicated(t, c.Node(1), req)
				c.StopHard(1)
				c.WaitConverged()
				admitted = admitAll(t, c, req, admitted, 5*time.Second, c.Node(0))
				st := c.Node(0).Stats().Leases
				unused := st.HitsLeased - st.Local
				if admitted < req.Limit-unused {
					// The new owner had not taken the key over yet: under
					// -race beside another run, the survivors' hand-over
					// took longer than 5 s (169 of 1000 admitted by then).
					admitted = admitAll(t, c, req, admitted, 25*time.Second, c.Node(0))
					st = c.Node(0).Stats().Leases
					unused = st.HitsLeased - st.Local
					t.Logf("the key took more than 5 s to admit the limit less the unused hits")
				}
				t.Logf("callers admitted %d of %d, %d less, the holder's unused hits %d; %+v", admitted, req.Limit, req.Limit-admitted, unused, st)
				switch {
				case admitted > mostAdmitted(req, start):
					t.Errorf("admitted %d of %d: over the limit", admitted, req.Limit)
				case admitted < req.Limit-unused:
					t.Errorf("admitted %d of %d within 30 s of the kill: more than the holder's %d unused hits less", admitted, req.Limit, unused)
				}
			})
		}
	}
}

// As TestLeaseReturnAfterOwnerKilled, with failed members reaped 3 s after
// they fail and 30 s to wait: once node 1 is reaped, the holder should
// send its return to the key's new owner, whose replica copy named the
// grant, and the key admit exactly its limit. It failed so, 534 of 1000 (the
// unused hits less), while the two survivors' hand-over reports named node
// 1 cut off to each other after both had reaped it: each held it cut off
// for the other's report, and every return went to node 1.
func TestLeaseReturnAfterOwnerKilledAndReaped(t *testing.T) {
	skipNearDayEnd(t)
	for _, next := range []int{0, 2} {
		for _, a := range leaseEndAlgorithms {
			t.Run(fmt.Sprintf("to node %d/%s", next, a), func(t *testing.T) {
				noLeaksAfter(t)
				c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
					cfg.Lease = cluster.LeaseConfig{Threshold: 100, TTL: 3 * time.Second, Share: 0.5}
					cfg.Unreachable = sluice.PolicyDeny
					cfg.Replicas = 2
					cluster.SetReconnectTimeout(cfg, 3*time.Second)
				}))
				req := keyMovingTo(t, c, "ownerreaped", a, 1000, 1, next)
				start := time.Now() // a bucket refills from here: mostAdmitted
				admitted := checkUntilLeased(t, c.Node(0), req)
				admitted += checkN(c.Node(0), req, 10)
				admitted += replicated(t, c.Node(1), req)
				c.StopHard(1)
				c.WaitConverged()
				admitted = admitAll(t, c, req, admitted, 30*time.Second, c.Node(0))
				st := c.Node(0).Stats().Leases
				t.Logf("callers admitted %d of %d; %+v", admitted, req.Limit, st)
				switch {
				case admitted > mostAdmitted(req, start):
					t.Errorf("admitted %d of %d: over the limit", admitted, req.Limit)
				case st.HitsReturned == 0:
					t.Errorf("admitted %d of %d once the failed owner was reaped: the holder's return was never taken", admitted, req.Limit)
				case admitted < req.Limit:
					// A few hits short with the return taken (996 of
					// 1000 once, alone in CI, two grants out): the open
					// under-admission leaseHitsLost names.
					leaseHitsLost(t, "admitted %d of %d once the failed owner was reaped, the return taken", admitted, req.Limit)
				}
			})
		}
	}
}
