package cluster_test

import (
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/testcluster"
)

// Attacks on lease grants carried with key states, on real nodes, counted
// from the callers' side.

// Two holders (nodes 0 and 2) lease hits of a key of 1000 owned by node 1,
// whose leave moves it to node 3; node 3 leaves as well, at once
// (together) or right after node 1's leave ends (in turn): the grants go
// A->B->C with the key's state, or the holders' returns reach node 3 while
// it leaves (refused, sent again to the key's owner then). No return frees
// hits twice: the key admits at most its limit, and exactly it once the
// returns are in (fewer is the open under-admission leaseHitsLost names).
func TestAtkLeaseTwoLeavesInARow(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, together := range []bool{false, true} {
		name := "in turn"
		if together {
			name = "together"
		}
		for _, a := range leaseEndAlgorithms {
			t.Run(name+"/"+a.String(), func(t *testing.T) {
				waitBound(t)
				noLeaksAfter(t)
				c := leaseEndCluster(t, 5, 10*time.Second, 0.4, 1)
				req := keyMovingTo(t, c, "atkleaves", a, 1000, 1, 3)
				start := time.Now() // a bucket refills from here: mostAdmitted
				admitted := checkUntilLeased(t, c.Node(0), req)
				admitted += checkUntilLeased(t, c.Node(2), req)
				admitted += checkN(c.Node(0), req, 10)
				admitted += checkN(c.Node(2), req, 10)
				if together {
					var wg sync.WaitGroup
					wg.Go(func() { c.Leave(1) })
					c.Leave(3)
					wg.Wait()
				} else {
					c.Leave(1)
					c.Leave(3)
				}
				c.WaitConverged()
				admitted = admitAll(t, c, req, admitted, 30*time.Second, c.Node(0), c.Node(2), c.Node(4))
				t.Logf("callers admitted %d of %d; node 0 %+v, node 2 %+v", admitted, req.Limit, c.Node(0).Stats().Leases, c.Node(2).Stats().Leases)
				switch {
				case admitted > mostAdmitted(req, start):
					t.Errorf("admitted %d of %d: more than the limit", admitted, req.Limit)
				case admitted < req.Limit:
					leaseHitsLost(t, "admitted %d of %d after two leaves", admitted, req.Limit)
				}
			})
		}
	}
}

// Clocks 2 s apart (MaxClockSkew 5 s): holders and the key's next owner
// ahead of or behind the owner that leaves, two holders of a key of 1000
// with unused hits. The grants travel as durations, read on the new
// owner's clock: each return frees its holder's hits once, the key admits
// at most its limit, and exactly it once the returns are in.
func TestAtkLeaseOwnerLeavesUnderSkew(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, skew := range []time.Duration{2 * time.Second, -2 * time.Second} {
		for _, a := range leaseEndAlgorithms {
			t.Run(skew.String()+"/"+a.String(), func(t *testing.T) {
				waitBound(t)
				noLeaksAfter(t)
				// holder 0 at +skew, owner 1 at 0, holder 2 and the next
				// owner 3 at -skew.
				c := testcluster.New(t, 4, testcluster.WithClockOffsets(skew, 0, -skew, -skew), testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
					cfg.Lease = cluster.LeaseConfig{Threshold: 100, TTL: 3 * time.Second, Share: 0.4}
					cfg.Unreachable = sluice.PolicyDeny
					cfg.Replicas = 1
					cfg.MaxClockSkew = 5 * time.Second
				}))
				req := keyMovingTo(t, c, "atkskew", a, 1000, 1, 3)
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
					t.Errorf("admitted %d of %d: more than the limit", admitted, req.Limit)
				case admitted < req.Limit:
					leaseHitsLost(t, "admitted %d of %d after the owner left under skew", admitted, req.Limit)
				}
			})
		}
	}
}

// A holder (node 0) cut off from the rest ({0} | {1,2,3}) keeps unused
// hits of a key of 1000 owned by node 1; node 1 leaves, and the key, its
// state and the grant go to node 3, which stops hard and restarts from
// its DataDir, which holds the grant with the key's state; then the
// partition heals and node 0 sends its return. The key admits at most its
// limit; fewer is the open under-admission leaseHitsLost names: node 0
// sends its return to node 1, which it holds cut off, not to node 3
// (docs/design.md).
func TestAtkLeaseCarriedThenRestartFromDataDir(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, a := range leaseEndAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			waitBound(t)
			noLeaksAfter(t)
			dirs := []string{t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()}
			c := testcluster.New(t, 4, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
				cfg.Lease = cluster.LeaseConfig{Threshold: 100, TTL: 10 * time.Second, Share: 0.4}
				cfg.Unreachable = sluice.PolicyDeny
				cfg.Replicas, cfg.DataDir = 1, dirs[i]
			}))
			req := keyMovingTo(t, c, "atkrestart", a, 1000, 1, 3)
			start := time.Now() // a bucket refills from here: mostAdmitted
			admitted := checkUntilLeased(t, c.Node(0), req)
			admitted += checkN(c.Node(0), req, 10)
			c.Partition([]int{0}, []int{1, 2, 3})
			c.WaitConverged()
			admitted += checkN(c.Node(0), req, 10)
			c.Leave(1)
			c.WaitConverged()
			admitted += checkN(c.Node(3), req, 100)
			c.StopHard(3)
			c.WaitConverged()
			c.Restart(3)
			c.Heal()
			c.WaitConverged()
			admitted = admitAll(t, c, req, admitted, 20*time.Second, c.Node(0), c.Node(2))
			t.Logf("callers admitted %d of %d; node 0 %+v", admitted, req.Limit, c.Node(0).Stats().Leases)
			switch {
			case admitted > mostAdmitted(req, start):
				t.Errorf("admitted %d of %d: more than the limit", admitted, req.Limit)
			case admitted < req.Limit:
				leaseHitsLost(t, "admitted %d of %d after the key's new owner restarted from its DataDir", admitted, req.Limit)
			}
		})
	}
}

// A holder (node 0) leases hits of a key of 1000 owned by node 1, and
// uses 100 of them; node 1 stops hard and restarts from its DataDir while
// the lease is open (no replica: Replicas 1). The key admits at most its
// limit: a token bucket's or GCRA's leased hits, held apart from the
// bucket until the lease expires, must count in what node 1 restores.
func TestAtkLeaseOwnerRestartsFromDataDirWhileLeased(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, a := range leaseEndAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			noLeaksAfter(t)
			dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
			c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
				cfg.Lease = cluster.LeaseConfig{Threshold: 100, TTL: 10 * time.Second, Share: 0.4}
				cfg.Unreachable = sluice.PolicyDeny
				cfg.Replicas, cfg.DataDir = 1, dirs[i]
			}))
			req := leaseKeyOwnedBy(t, c, "atkownerrestart", a, 1000, 1)
			start := time.Now() // a bucket refills from here: mostAdmitted
			admitted := checkUntilLeased(t, c.Node(0), req)
			admitted += checkN(c.Node(0), req, 100)
			c.StopHard(1)
			c.WaitConverged()
			c.Restart(1)
			admitted = admitAll(t, c, req, admitted, 20*time.Second, c.Node(0), c.Node(2))
			t.Logf("callers admitted %d of %d; node 0 %+v", admitted, req.Limit, c.Node(0).Stats().Leases)
			switch {
			case admitted > mostAdmitted(req, start):
				t.Errorf("admitted %d of %d: more than the limit", admitted, req.Limit)
			case admitted < req.Limit:
				leaseHitsLost(t, "admitted %d of %d after the key's owner restarted from its DataDir", admitted, req.Limit)
			}
		})
	}
}
