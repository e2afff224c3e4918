package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// waitReplicated waits until every key of reqs is held by each of its
// replicas, so that a state copied before a partition is on both sides.
func waitReplicated(t *testing.T, c *testcluster.Cluster, reqs []limiter.Request) {
	t.Helper()
	byName := map[string]int{}
	for i, nd := range c.Nodes() {
		byName[nd.Name()] = i
	}
	err := testcluster.WaitFor(20*time.Second, func() error {
		for _, r := range reqs {
			for _, m := range c.Node(0).Replicas(r.Name, r.Key) {
				if _, ok := c.Node(byName[m.Name]).Store().Snapshot(r.Name, r.Key, time.Now()); !ok {
					return fmt.Errorf("%s does not hold %s yet", m.Name, r.Key)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPartitionKeepsConsumption cuts a 3-node cluster into {0} and {1,2}
// after 300 hits of 1000 were consumed on 200 keys (and replicated, so the
// majority side holds every key's state). Each side keeps answering, as the
// owner of every key on its side: node 0 consumes 150 more on every key,
// the majority side 100. After healing, hand-off merges the sides' states,
// the more consumed winning, so that a key forgets at most what the side
// that consumed less consumed during the partition: every key has consumed
// at least 400, the keys node 0 held before the partition (as owner or
// replica) at least 450, and none more than the 550 really consumed.
func TestPartitionKeepsConsumption(t *testing.T) {
	c := testcluster.New(t, 3, withReplicas(2))
	reqs := handoffRequests(200, 300)
	consume(t, c.Node(1), reqs)
	waitReplicated(t, c, reqs)
	var minorityHeld []limiter.Request
	for _, r := range reqs {
		if _, ok := c.Node(0).Store().Snapshot(r.Name, r.Key, time.Now()); ok {
			minorityHeld = append(minorityHeld, r)
		}
	}
	if len(minorityHeld) == 0 || len(minorityHeld) == len(reqs) {
		t.Fatalf("node 0 holds %d of %d keys; want some, not all", len(minorityHeld), len(reqs))
	}

	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged() // each side's ring holds only its side
	for side, hits := range map[int]int64{0: 150, 1: 100} {
		more := slices.Clone(reqs)
		for i := range more {
			more[i].Hits = hits
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rs := c.Node(side).CheckMany(ctx, more)
		cancel()
		for i, r := range rs {
			if r.Err != nil || !r.Allowed || r.WithoutOwner {
				t.Fatalf("side of node %d, %s: allowed %v, without owner %v, err %v", side, more[i].Key, r.Allowed, r.WithoutOwner, r.Err)
			}
		}
	}

	c.Heal()
	err := testcluster.WaitFor(20*time.Second, func() error {
		if err := atMost(c, reqs, 600); err != nil {
			return err
		}
		return atMost(c, minorityHeld, 550)
	})
	if err != nil {
		t.Fatalf("after healing: %v", err)
	}
	peeks := slices.Clone(reqs)
	for i := range peeks {
		peeks[i].Hits = 0
	}
	for _, nd := range c.Nodes() {
		for i, r := range nd.CheckMany(context.Background(), peeks) {
			if r.Err != nil || r.Remaining < 450 {
				t.Errorf("%s peeks %s: %d remaining (%v), want at least 450: consumption counted twice", nd.Name(), peeks[i].Key, r.Remaining, r.Err)
			}
		}
	}
}
