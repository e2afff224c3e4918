package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// attackKeys returns per keys of every heal algorithm, limit 300 a day.
func attackKeys(name string, per int) []limiter.Request {
	var reqs []limiter.Request
	for _, a := range healAlgorithms {
		for i := range per {
			reqs = append(reqs, limiter.Request{Name: name, Key: fmt.Sprintf("%s-%d", a, i), Hits: 1, Limit: 300, Period: 24 * time.Hour, Algorithm: a})
		}
	}
	return reqs
}

// remainingAfter checks that the owner of every key of reqs admits exactly
// want more hits, one at a time: what the callers were admitted is all the
// key counts, neither more nor less.
func remainingAfter(t *testing.T, c *testcluster.Cluster, reqs []limiter.Request, want int) {
	t.Helper()
	for _, r := range reqs {
		owner := c.Owner(r.Name, r.Key)
		if more := admitUntilDenied(t, owner, r, int(r.Limit)); more != want {
			t.Errorf("%s %s: its owner %s admits %d more, want %d", r.Algorithm, r.Key, owner.Name(), more, want)
		}
	}
}

// Five nodes cut into 2|3 and into 1|1|3, every side consuming every key
// (as the key's owner or its stand-in) after 100 hits were consumed and
// replicated: once healed each key counts the 100 plus every side's hits,
// from every node, and its owner admits the rest of the limit and no more.
func TestAttackPartitionFiveNodes(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, tc := range []struct {
		name   string
		groups [][]int
	}{
		{"2|3", [][]int{{0, 1}, {2, 3, 4}}},
		{"1|1|3", [][]int{{0}, {1}, {2, 3, 4}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noLeaksAfter(t)
			// Five nodes under -race beside other runs may take longer than
			// DefaultWait to declare a side failed.
			c := testcluster.New(t, 5, withReplicas(2), testcluster.WithWait(time.Minute))
			reqs := attackKeys("five", 4)
			consume(t, c.Node(0), withHits(reqs, 100))
			waitReplicated(t, c, reqs)

			c.Partition(tc.groups...)
			c.WaitConverged()
			total := int64(100)
			for side, g := range tc.groups {
				hits := int64(20 * (side + 1))
				consume(t, c.Node(g[len(g)-1]), withHits(reqs, hits))
				total += hits
			}
			c.Heal()
			c.WaitConverged()
			exactly(t, c, reqs, 300-total)
			remainingAfter(t, c, reqs, int(300-total))
		})
	}
}

// A rules rollout during a partition: a key of 100 a day takes 40 hits
// through its owner (node 1); then, cut into {0} | {1,2}, node 0 standing
// in and the owner's side check the key under limits of their own (or the
// stand-in under another algorithm). Once healed the stand-in's hits have
// entered the owner's state under the owner's rate, counted even past its
// limit: checked under each limit in turn, the key admits what that limit
// leaves of every hit admitted on both sides, and no more.
func TestAttackPartitionLimitChanges(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	type after struct {
		limit, more int64 // checked in turn
		// atMost: the key may admit fewer. A replica's copy of GCRA from
		// before the owner's limit changed may merge back into the owner
		// at the shorter interval, which counts more (never less).
		atMost bool
	}
	for _, tc := range []struct {
		name               string
		standInLimit       int64 // node 0's limit, cut off alone
		ownerLimit         int64 // nodes 1 and 2's
		standInHits, owner int64
		otherAlgorithm     bool // node 0 checks the key under another algorithm
		after              []after
	}{
		// 40+30 | 40+100: the owner's state counts 140, past the
		// stand-in's limit of 100; the stand-in's 30 count on top of it.
		{name: "owner raises", standInLimit: 100, ownerLimit: 200, standInHits: 30, owner: 100, after: []after{{200, 30, false}, {100, 0, false}}},
		{name: "stand-in raises", standInLimit: 200, ownerLimit: 100, standInHits: 90, owner: 60, after: []after{{200, 10, false}, {100, 0, false}}},
		// 40+30 | 40+10 under 50: the owner's state is at its limit; the
		// stand-in's 30 count past it, and under 100 again the key admits 20.
		{name: "owner lowers", standInLimit: 100, ownerLimit: 50, standInHits: 30, owner: 10, after: []after{{50, 0, false}, {100, 20, true}}},
		{name: "stand-in lowers", standInLimit: 50, ownerLimit: 100, standInHits: 10, owner: 30, after: []after{{100, 20, false}, {50, 0, false}}},
		// The stand-in's hits enter the owner's state in the owner's
		// algorithm: 40+30 | 40+20, and the key admits 10 more.
		{name: "stand-in changes algorithm", standInLimit: 100, ownerLimit: 100, standInHits: 30, owner: 20, otherAlgorithm: true, after: []after{{100, 10, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noLeaksAfter(t)
			c := testcluster.New(t, 3, withReplicas(2))
			var reqs []limiter.Request
			for _, a := range healAlgorithms {
				reqs = append(reqs, keyHeldBy(t, c, a, 1, 2))
			}
			consume(t, c.Node(1), withHits(reqs, 40))
			waitReplicated(t, c, reqs)

			c.Partition([]int{0}, []int{1, 2})
			c.WaitConverged()
			at := func(limit, hits int64) []limiter.Request {
				out := withHits(reqs, hits)
				for i := range out {
					out[i].Limit = limit
				}
				return out
			}
			standIn := at(tc.standInLimit, tc.standInHits)
			if tc.otherAlgorithm {
				for i := range standIn {
					standIn[i].Algorithm = limiter.TokenBucket
					if reqs[i].Algorithm == limiter.TokenBucket {
						standIn[i].Algorithm = limiter.FixedWindow
					}
				}
			}
			consume(t, c.Node(0), standIn)
			consume(t, c.Node(1), at(tc.ownerLimit, tc.owner))

			c.Heal()
			c.WaitConverged()
			// Peeks under every limit, as one under the owner's lowered
			// limit finds the key spent before the stand-in's hits arrive.
			if err := testcluster.WaitFor(20*time.Second, func() error {
				for _, a := range tc.after {
					if err := atMost(c, at(a.limit, 1), a.more); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
			for _, a := range tc.after {
				if !a.atMost {
					remainingAfter(t, c, at(a.limit, 1), int(a.more))
					continue
				}
				for _, r := range at(a.limit, 1) {
					owner := c.Owner(r.Name, r.Key)
					if more := admitUntilDenied(t, owner, r, int(r.Limit)); int64(more) > a.more || r.Algorithm != limiter.GCRA && int64(more) != a.more {
						t.Errorf("%s %s: its owner %s admits %d more, want %d", r.Algorithm, r.Key, owner.Name(), more, a.more)
					}
				}
			}
		})
	}
}

// A partition that heals and is cut again while the hand-off that follows
// the heal is still in flight (node 1, the keys' owner, receives every
// gRPC message 300 ms late), then heals for good: every hit admitted on
// either side, in both cuts, is counted once.
func TestAttackPartitionRecutDuringHandoff(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c, reqs := partitionedAfterFifty(t)

	c.Slow(1, 300*time.Millisecond)
	c.Slow(0, 300*time.Millisecond)
	c.Heal()
	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged()
	c.Slow(1, 0)
	c.Slow(0, 0)
	consume(t, c.Node(0), withHits(reqs, 5))
	consume(t, c.Node(1), withHits(reqs, 3))

	c.Heal()
	c.WaitConverged()
	exactly(t, c, reqs, 100-(50+30+10+5+3))
	remainingAfter(t, c, reqs, 100-(50+30+10+5+3))
}

// A graceful leave on each side of an open partition of five nodes
// {0,1} | {2,3,4}: node 1 leaves the minority side and node 3 the
// majority, after both sides consumed every key; then both sides consume
// again and the partition heals. Every key counts every hit once.
func TestAttackLeaveDuringPartition(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 5, withReplicas(2))
	reqs := attackKeys("leavecut", 4)
	consume(t, c.Node(0), withHits(reqs, 100))
	waitReplicated(t, c, reqs)

	c.Partition([]int{0, 1}, []int{2, 3, 4})
	c.WaitConverged()
	consume(t, c.Node(1), withHits(reqs, 20))
	consume(t, c.Node(3), withHits(reqs, 30))
	leaveTogether(c, 1, 3)
	c.WaitConverged()
	consume(t, c.Node(0), withHits(reqs, 10))
	consume(t, c.Node(4), withHits(reqs, 15))

	c.Heal()
	c.WaitConverged()
	total := int64(100 + 20 + 30 + 10 + 15)
	exactly(t, c, reqs, 300-total)
	remainingAfter(t, c, reqs, int(300-total))
}

// Two nodes join five, then two leave at once, under traffic (16 callers, 300 keys of
// 10, denying without the owner), twice, leases off and on: no key admits
// more than its limit, and no check waits out HandoverTimeout.
func TestAttackTwoLeaveAtOnce(t *testing.T) {
	for _, leases := range []bool{false, true} {
		t.Run(fmt.Sprintf("leases=%v", leases), func(t *testing.T) {
			// Seven nodes gossiping beside 16 callers, under -race beside
			// other runs, may take longer than DefaultWait to see two join.
			c := testcluster.New(t, 5, testcluster.WithWait(time.Minute), testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
				if leases {
					cfg.Lease.Threshold = 20
				}
				cfg.LeaveTimeout = busyLeaveTimeout
			}))
			reqs := transitionRequests("twoleave", limiter.TokenBucket, 300, 10)
			tr := startTraffic(t, c, reqs, 16, 1<<30, trafficBound)
			defer tr.finish()
			tr.admittedAtLeast(t, 300)
			nodes := c.Nodes()
			before := sumWaits(nodes)
			over := func(when string) {
				for i := range tr.allowed {
					if got := tr.allowed[i].Load(); got > tr.reqs[i].Capacity() {
						t.Logf("%s: %s admitted %d", when, tr.reqs[i].Key, got)
					}
				}
			}
			over("before")
			for _, pair := range [][2]int{{0, 1}, {2, 3}} {
				c.Add()
				c.Add()
				tr.checkedMore(t, 500)
				over(fmt.Sprintf("after joins, before %v leave", pair))
				nodes = c.Nodes()
				leaveTogether(c, pair[0], pair[1])
				c.WaitConverged()
				tr.checkedMore(t, 500)
				over(fmt.Sprintf("after %v leave", pair))
			}
			tr.finish()
			tr.overLimit(t)
			after := sumWaits(nodes)
			t.Logf("waited out %d, handover expired %d, without owner %d, late %d",
				after.WaitedOut-before.WaitedOut, after.HandoverExpired-before.HandoverExpired, after.WithoutOwner-before.WithoutOwner, tr.late.Load())
		})
	}
}

// Clocks 2 s apart (-2 s, 0, +2 s, well past MaxClockSkew) across a
// partition {0} | {1,2} and its heal: every key counts what both sides
// admitted, once, and its owner admits the rest and no more.
func TestAttackPartitionHealUnderSkew(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, skew := range []time.Duration{2 * time.Second, 250 * time.Millisecond} {
		t.Run(skew.String(), func(t *testing.T) {
			noLeaksAfter(t)
			c := testcluster.New(t, 3, withReplicas(2), testcluster.WithClockOffsets(-skew, 0, skew))
			var reqs []limiter.Request
			for _, a := range healAlgorithms {
				reqs = append(reqs, keyHeldBy(t, c, a, 1, 2), keyHeldBy(t, c, a, 0, 1), keyHeldBy(t, c, a, 2, 0))
			}
			consume(t, c.Node(1), withHits(reqs, 50))
			waitReplicated(t, c, reqs)
			c.Partition([]int{0}, []int{1, 2})
			c.WaitConverged()
			consume(t, c.Node(0), withHits(reqs, 30))
			consume(t, c.Node(2), withHits(reqs, 10))
			c.Heal()
			c.WaitConverged()
			exactly(t, c, reqs, 10)
			remainingAfter(t, c, reqs, 10)
		})
	}
}

// A forwarded batch whose context is cancelled at every moment of its
// flight: a caller told a hit was admitted always finds it counted at the
// owner (never more admitted than counted), and the owner counts no more
// than the checks sent.
func TestAttackCancelRacesForwardedBatch(t *testing.T) {
	noLeaksAfter(t)
	c := testcluster.New(t, 3)
	from := c.Node(0)
	var reqs []limiter.Request
	for i := 0; len(reqs) < 8; i++ {
		r := limiter.Request{Name: "cancelrace", Key: fmt.Sprintf("k%d", i), Hits: 1, Limit: 1000, Period: 24 * time.Hour, Algorithm: limiter.FixedWindow}
		if c.Owner(r.Name, r.Key) != from {
			reqs = append(reqs, r)
		}
	}
	var admitted, sent atomic.Int64
	perKey := make([]atomic.Int64, len(reqs))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				ctx, cancel := context.WithCancel(context.Background())
				delay := time.Duration((g*40+i)%25) * 100 * time.Microsecond
				stop := time.AfterFunc(delay, cancel)
				rs := from.CheckMany(ctx, reqs)
				stop.Stop()
				cancel()
				sent.Add(int64(len(reqs)))
				for k, r := range rs {
					if r.Err == nil && r.Allowed {
						admitted.Add(1)
						perKey[k].Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	var counted int64
	for k, r := range reqs {
		peek := r
		peek.Hits = 0
		d, err := c.Owner(r.Name, r.Key).Check(context.Background(), peek, sluice.OnUnreachable(sluice.PolicyDeny))
		if err != nil {
			t.Fatal(err)
		}
		used := r.Limit - d.Remaining
		counted += used
		if used < perKey[k].Load() {
			t.Errorf("%s: callers were admitted %d, the owner counts %d", r.Key, perKey[k].Load(), used)
		}
	}
	if counted > sent.Load() {
		t.Errorf("the owner counts %d of %d checks sent", counted, sent.Load())
	}
	t.Logf("%d checks sent, %d admitted to callers, %d counted", sent.Load(), admitted.Load(), counted)
}

// A stand-in's hits across its restart from DataDir: node 0, cut off
// alone and holding no copy, admits 30 of keys owned by node 1 (which
// admitted 50 before the cut), then stops gracefully while still cut
// off. The partition heals without it; node 0 starts again from its
// DataDir and gives its states to their owners. The keys count the 80
// admitted: node 1 admits 20 more of 100, not 50.
func TestAttackStandinRestartFromDataDir(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	c := testcluster.New(t, 3, withReplicas(2), testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.DataDir = dirs[i%len(dirs)]
	}))
	var reqs []limiter.Request
	for _, a := range healAlgorithms {
		reqs = append(reqs, keyHeldBy(t, c, a, 1, 2))
	}
	consume(t, c.Node(1), withHits(reqs, 50))
	waitReplicated(t, c, reqs)
	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged()
	consume(t, c.Node(0), withHits(reqs, 30))
	c.StopHard(0) // Close: every live key written to DataDir
	c.Heal()
	c.Restart(0)
	c.WaitConverged()
	if err := testcluster.WaitFor(20*time.Second, func() error { return atMost(c, reqs, 20) }); err != nil {
		t.Error(err)
	}
	remainingAfter(t, c, reqs, 20)
}

// A leaver stopped hard in the middle of its departure: node 0 begins a
// graceful Leave while 16 callers check 300 keys of 10 (denying without
// the owner), and is closed at once, after its first key state reached
// its new owner, or once its serf is leaving. The others see it fail:
// they may forget what it admitted since its last replication (the hard
// kill's bound); the test reports what went over. Close in the middle of
// the leave's serf departure made memberlist panic ("leave after
// shutdown").
func TestAttackLeaverKilledMidDeparture(t *testing.T) {
	for _, when := range []string{"at once", "after a hand-off", "in its departure"} {
		t.Run(when, func(t *testing.T) {
			c := testcluster.New(t, 4, withReplicas(2))
			reqs := transitionRequests("killleave", limiter.FixedWindow, 300, 10)
			tr := startTraffic(t, c, reqs, 16, 1<<30, trafficBound)
			defer tr.finish()
			tr.admittedAtLeast(t, 600)
			victim := c.Node(0)
			sent := victim.Stats().Transfers.HandedOff
			left := make(chan error, 1)
			go func() { left <- victim.Leave() }()
			err := testcluster.WaitFor(10*time.Second, func() error {
				switch when {
				case "after a hand-off":
					if victim.Stats().Transfers.HandedOff > sent {
						return nil
					}
				case "in its departure":
					// serf has told itself the node leaves, and
					// waits for that word to go out.
					if !memberAlive(victim, victim.Name()) {
						return nil
					}
				default:
					return nil
				}
				return fmt.Errorf("not yet %s", when)
			})
			if err != nil {
				t.Logf("%v; closing anyway", err)
			}
			c.StopHard(0)
			t.Logf("leave returned %v", <-left)
			c.WaitConverged()
			tr.checkedMore(t, 1000)
			tr.finish()
			// Over the limit is within the hard kill's bound: reported.
			var keys, over int64
			for i := range tr.allowed {
				if d := tr.allowed[i].Load() - tr.reqs[i].Capacity(); d > 0 {
					keys, over = keys+1, over+d
				}
			}
			t.Logf("%d checks, %d errors; %d keys over their limit by %d in all", tr.checks.Load(), tr.errs.Load(), keys, over)
		})
	}
}

// A node holding a lease on a key whose owner is cut off from it: node 0
// leases hits of a key owned by node 1, then the cluster is cut into
// {0} | {1,2}; node 0 admits 30 checks (from its lease, then as the key's
// stand-in) and node 1 admits 20. After the heal, and once node 0's
// lease has ended, the key counts every hit a caller was admitted: its
// owner admits the rest of the limit and no more.
func TestAttackLeaseAcrossPartition(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, a := range []limiter.Algorithm{limiter.TokenBucket, limiter.FixedWindow} {
		t.Run(a.String(), func(t *testing.T) {
			noLeaksAfter(t)
			c := leaseCluster(t, 3, 2*time.Second, 0.5)
			var req limiter.Request
			for i := range 10_000 {
				req = limiter.Request{Name: "leasecut", Key: fmt.Sprintf("k%d", i), Hits: 1, Limit: 1000, Period: 24 * time.Hour, Algorithm: a}
				if c.OwnerIndex(req.Name, req.Key) == 1 {
					break
				}
			}
			admitted := checkUntilLeased(t, c.Node(0), req)
			c.Partition([]int{0}, []int{1, 2})
			c.WaitConverged()
			for range 30 {
				if d, err := c.Node(0).Check(context.Background(), req); err == nil && d.Allowed {
					admitted++
				}
			}
			for range 20 {
				if d, err := c.Node(1).Check(context.Background(), req); err == nil && d.Allowed {
					admitted++
				}
			}
			c.Heal()
			c.WaitConverged()
			// Node 0's lease ends within its TTL: wait until it holds none.
			if err := testcluster.WaitFor(20*time.Second, func() error {
				if s := c.Node(0).Stats().Leases; s.HitsReturned+s.Local < s.HitsLeased {
					return fmt.Errorf("node 0 used %d and returned %d of %d leased hits", s.Local, s.HitsReturned, s.HitsLeased)
				}
				return nil
			}); err != nil {
				t.Log(err)
			}
			want := int(req.Limit - admitted)
			if err := testcluster.WaitFor(20*time.Second, func() error { return atMost(c, []limiter.Request{req}, int64(want)) }); err != nil {
				t.Error(err)
			}
			owner := c.Owner(req.Name, req.Key)
			more := admitUntilDenied(t, owner, req, int(req.Limit))
			t.Logf("callers admitted %d; the owner admits %d more; %+v", admitted, more, c.Node(0).Stats().Leases)
			switch {
			case more > want:
				t.Errorf("the owner admits %d more after %d admitted of %d, want %d", more, admitted, req.Limit, want)
			case more < want:
				leaseHitsLost(t, "the owner admits %d more after %d admitted of %d, want %d", more, admitted, req.Limit, want)
			}
		})
	}
}

// Two nodes of three leave at the same moment under traffic (16 callers,
// 300 token bucket keys of 10, denying without the owner), then two join:
// no key admits more than its limit.
func TestAttackTwoOfThreeLeaveAtOnce(t *testing.T) {
	c := testcluster.New(t, 3)
	reqs := transitionRequests("twoofthree", limiter.TokenBucket, 300, 10)
	tr := startTraffic(t, c, reqs, 16, 1<<30, trafficBound)
	defer tr.finish()
	tr.admittedAtLeast(t, 300)
	leaveTogether(c, 0, 1)
	c.WaitConverged()
	tr.checkedMore(t, 500)
	c.Add()
	c.Add()
	tr.checkedMore(t, 1000)
	tr.finish()
	tr.overLimit(t)
}

// leaveTogether makes nodes a and b of c leave gracefully at the same time.
func leaveTogether(c *testcluster.Cluster, a, b int) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.Leave(a) }()
	go func() { defer wg.Done(); c.Leave(b) }()
	wg.Wait()
}
