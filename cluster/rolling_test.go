package cluster_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// A rolling replacement under traffic: every node of three in turn is
// replaced by a new one that joins as the old one leaves gracefully, while
// 16 callers check 300 keys of limit 10 on every live node (denying when
// the owner cannot be reached). No key admits more than its limit, for
// every algorithm, leases on or off.
func TestRollingReplacement(t *testing.T) {
	for _, leases := range []bool{false, true} {
		for _, a := range allAlgorithms {
			t.Run(fmt.Sprintf("%s/leases=%v", a, leases), func(t *testing.T) {
				c := leasingCluster(t, leases)
				reqs := transitionRequests("rolling", a, 300, 10)
				tr := startTraffic(t, c, reqs, 16, 1<<30, 2*time.Minute)
				defer tr.finish()
				tr.admittedAtLeast(t, 300)
				for old := range 3 {
					var wg sync.WaitGroup
					wg.Add(2)
					go func() { defer wg.Done(); c.Leave(old) }()
					go func() { defer wg.Done(); c.Add() }()
					wg.Wait()
					c.WaitConverged()
				}
				tr.checkedMore(t, 500)
				tr.finish()
				tr.overLimit(t)
				// Checks decided without their owner (the unreachable
				// policy's denials) are reported, not failed: a few
				// callers still find a leaver gone before gossip told
				// their node it left.
				t.Logf("%d checks decided without their owner", tr.unowned.Load())
			})
		}
	}
}

// A graceful leave waits for no one: a node leaves three nodes that keep
// serving 16 callers on 300 keys, three times, either after a new node
// joined, with its gossip lost from the moment it begins to leave (as
// gossip under load may be: the others learn of its departure over gRPC
// only), or while a new node joins (rolling, a step of a rolling
// replacement). Across each leave (with the join, when rolling) no check
// waits out HandoverTimeout (Stats.WaitedOut, or the caller's own
// deadline), no node begins to decide moved keys because HandoverTimeout
// passed (Stats.HandoverExpired), and no check is decided by the
// unreachable policy (Stats.WithoutOwner), on any node.
func TestLeaveWaitsForNoOne(t *testing.T) {
	for _, rolling := range []bool{false, true} {
		t.Run(fmt.Sprintf("rolling=%v", rolling), func(t *testing.T) {
			c := testcluster.New(t, 3)
			reqs := transitionRequests("waitless", limiter.FixedWindow, 300, 1_000_000)
			tr := startTraffic(t, c, reqs, 16, 1<<30, 2*time.Minute)
			defer tr.finish()
			tr.admittedAtLeast(t, 300)
			nodes := c.Nodes()
			var waits cluster.Stats // over the leaves
			for old := range 3 {
				var before cluster.Stats
				if rolling {
					before = sumWaits(nodes)
					var wg sync.WaitGroup
					wg.Add(2)
					go func() { defer wg.Done(); c.Leave(old) }()
					go func() { defer wg.Done(); nodes = append(nodes, c.Add()) }()
					wg.Wait()
				} else {
					nodes = append(nodes, c.Add())
					before = sumWaits(nodes)
					c.MuteGossip(old, true)
					c.Leave(old)
				}
				c.WaitConverged()
				tr.checkedMore(t, 300)
				after := sumWaits(nodes)
				waits.WaitedOut += after.WaitedOut - before.WaitedOut
				waits.HandoverExpired += after.HandoverExpired - before.HandoverExpired
				waits.WithoutOwner += after.WithoutOwner - before.WithoutOwner
			}
			tr.finish()
			t.Logf("%d checks, %d errors", tr.checks.Load(), tr.errs.Load())
			if waits != (cluster.Stats{}) || tr.late.Load() != 0 {
				t.Fatalf("across the leaves: %d checks waited out HandoverTimeout, %d outlived their caller, %d memberships settled by the timeout, %d checks decided by policy",
					waits.WaitedOut, tr.late.Load(), waits.HandoverExpired, waits.WithoutOwner)
			}
		})
	}
}

// sumWaits adds up the counters of nodes that say a check waited for an
// owner or was decided without one.
func sumWaits(nodes []*cluster.Node) cluster.Stats {
	var s cluster.Stats
	for _, nd := range nodes {
		st := nd.Stats()
		s.WaitedOut += st.WaitedOut
		s.HandoverExpired += st.HandoverExpired
		s.WithoutOwner += st.WithoutOwner
	}
	return s
}
