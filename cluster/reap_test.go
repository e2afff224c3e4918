package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// A member killed hard and reaped (serf's ReconnectTimeout, 3 s here) is
// let go by every member: the two that saw it fail, whose hand-over
// reports named it cut off to each other, and a node that joined after
// the kill and knew it only from those reports. Once it is reaped, no
// check of the keys it owned is decided standing in for it anywhere.
// Then it comes back under its name, and owns its keys again.
func TestReapedMemberLetGoByEveryMember(t *testing.T) {
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2), testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
		cluster.SetReconnectTimeout(cfg, 3*time.Second)
	}))
	var reqs []limiter.Request
	for _, r := range dailyKeys("reaped", 200) {
		if c.Owner(r.Name, r.Key) == c.Node(1) {
			r.Limit = 1_000_000 // never spent: every check below is admitted
			reqs = append(reqs, r)
		}
	}
	if len(reqs) < 10 {
		t.Fatalf("node 1 owns %d of 200 keys", len(reqs))
	}
	dead := c.Node(1).Name()
	c.StopHard(1)
	c.WaitConverged()
	joiner := c.Add()
	c.WaitConverged()
	live := []*cluster.Node{c.Node(0), c.Node(2), joiner}
	standIn := func() (sum int64) {
		for _, nd := range live {
			sum += nd.Stats().Settle.StandIn
		}
		return sum
	}
	err := testcluster.WaitFor(time.Minute, func() error {
		for _, nd := range live {
			if slices.ContainsFunc(nd.Members(), func(m cluster.Member) bool { return m.Name == dead }) {
				return fmt.Errorf("%s still lists %s", nd.Name(), dead)
			}
		}
		before := standIn()
		for _, nd := range live {
			for i, r := range nd.CheckMany(context.Background(), reqs) {
				if r.Err != nil || !r.Allowed {
					return fmt.Errorf("%s: %s: allowed %v, err %v", nd.Name(), reqs[i].Key, r.Allowed, r.Err)
				}
			}
		}
		if after := standIn(); after != before {
			return fmt.Errorf("%d hits of the reaped member's keys admitted standing in for it", after-before)
		}
		return nil
	})
	if err != nil {
		for _, nd := range live {
			t.Logf("%s: %+v", nd.Name(), nd.Stats().Settle)
		}
		t.Fatal(err)
	}

	back := c.Restart(1)
	c.WaitConverged()
	var fresh []limiter.Request
	for _, r := range dailyKeys("reapedback", 200) {
		if c.Owner(r.Name, r.Key) == back {
			fresh = append(fresh, r)
		}
	}
	if len(fresh) == 0 {
		t.Fatalf("%s, back, owns none of 200 keys", back.Name())
	}
	before := standIn()
	consume(t, c.Node(0), withHits(fresh, 30))
	consume(t, joiner, withHits(fresh, 20))
	if after := standIn(); after != before {
		t.Errorf("%d hits of %s's keys admitted standing in for it once it was back", after-before, back.Name())
	}
	remainingAfter(t, c, fresh, 50)
}
