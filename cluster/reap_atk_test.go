package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/testcluster"
)

// Attacks on the reap rules (standins.noteReaped and letGo, reports that
// name a member as learned, learn's rebuild on a report that stops naming
// a member, the reconfirm on a changed report, the learned-hold timer).

const longReap = 10 * time.Minute

// waitReaped waits until nd's serf lists none of names.
func waitReaped(t *testing.T, nd *cluster.Node, names ...string) {
	t.Helper()
	err := testcluster.WaitFor(time.Minute, func() error {
		for _, m := range nd.Members() {
			if slices.Contains(names, m.Name) {
				return fmt.Errorf("%s still lists %s (%v)", nd.Name(), m.Name, m.Status)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// listsAll reports an error unless nd's serf lists every one of names.
func listsAll(nd *cluster.Node, names ...string) error {
	for _, name := range names {
		if !slices.ContainsFunc(nd.Members(), func(m cluster.Member) bool { return m.Name == name }) {
			return fmt.Errorf("%s does not list %s", nd.Name(), name)
		}
	}
	return nil
}

// remainingAtMost waits up to 20 s until no node peeks more than want
// remaining of a key of reqs, then checks every key through its owner,
// one hit at a time, until denied: more than want is over-admission (an error), fewer
// is logged (tolerated). It returns how many keys admitted more.
func remainingAtMost(t *testing.T, c *testcluster.Cluster, reqs []limiter.Request, want int) (over int) {
	t.Helper()
	// Wait, a while, for the states to meet: what is still over after it
	// is counted below.
	if err := testcluster.WaitFor(20*time.Second, func() error { return atMost(c, reqs, int64(want)) }); err != nil {
		t.Logf("after 20 s: %v", err)
	}
	for _, r := range reqs {
		owner := c.Owner(r.Name, r.Key)
		more := admitUntilDenied(t, owner, r, int(r.Limit))
		switch {
		case more > want:
			over++
			t.Errorf("OVER: %s %s: its owner %s admits %d more, want %d (%d over the limit in all)", r.Algorithm, r.Key, owner.Name(), more, want, more-want)
		case more < want:
			t.Logf("under: %s %s: its owner %s admits %d more, want %d", r.Algorithm, r.Key, owner.Name(), more, want)
		}
	}
	return over
}

// reapKeys returns, per heal algorithm, keys of 100 a day owned by node
// 1 (replica 2), node 0 (replica 1) and node 2 (replica 0).
func reapKeys(t *testing.T, c *testcluster.Cluster) []limiter.Request {
	t.Helper()
	var reqs []limiter.Request
	for _, a := range healAlgorithms {
		reqs = append(reqs, keyHeldBy(t, c, a, 1, 2), keyHeldBy(t, c, a, 0, 1), keyHeldBy(t, c, a, 2, 0))
	}
	return reqs
}

// A partition {0}|{1,2} that outlasts ReconnectTimeout on one side, the
// other or both: 20 hits before it (replicated), 10 on each side while the
// other is failed, 10 more on each side once the reaps (where short) are
// done, then the heal. Every key was admitted 60 of 100 by the callers:
// its owner must admit at most 40 more. leave makes node 2 leave
// gracefully after the first round (a member that left while cut off),
// its second round going through node 1.
func TestAtkReapPartitionOutlastsReconnectTimeout(t *testing.T) {
	skipNearDayEnd(t)
	attackOpen(t, "a partition that outlasts ReconnectTimeout: a side's hits after its reap are its own owners' decisions, and the heal keeps the larger state: 10 over on 4 to 15 of 15 keys, every case (the case where only nodes 1 and 2 reap passed while they held node 0 for each other's reports for good)")
	for _, tc := range []struct {
		name  string
		rt    [3]time.Duration
		leave bool
	}{
		{"both sides reap", [3]time.Duration{3 * time.Second, 3 * time.Second, 3 * time.Second}, false},
		{"only node 0 reaps", [3]time.Duration{3 * time.Second, longReap, longReap}, false},
		{"only nodes 1 and 2 reap", [3]time.Duration{longReap, 3 * time.Second, 3 * time.Second}, false},
		{"node 2 leaves, node 0 reaps", [3]time.Duration{3 * time.Second, longReap, longReap}, true},
		{"node 2 leaves, all reap", [3]time.Duration{3 * time.Second, 3 * time.Second, 3 * time.Second}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noLeaksAfter(t)
			c := testcluster.New(t, 3, testcluster.WithWait(time.Minute), testcluster.WithConfig(func(i int, cfg *cluster.Config) {
				cfg.Replicas = 2
				cfg.LeaveTimeout = 2 * time.Second
				cluster.SetReconnectTimeout(cfg, tc.rt[i])
			}))
			n0, n1, n2 := c.Node(0), c.Node(1), c.Node(2)
			reqs := reapKeys(t, c)
			consume(t, n1, withHits(reqs, 20))
			waitReplicated(t, c, reqs)
			c.Partition([]int{0}, []int{1, 2})
			c.WaitConverged()
			consume(t, n0, withHits(reqs, 10))
			consume(t, n1, withHits(reqs, 10))
			second := n2
			if tc.leave {
				err := n2.Leave()
				c.StopHard(2)
				t.Logf("node 2 leaves while cut off from node 0: %v", err)
				second = n1
			}
			if tc.rt[0] < longReap {
				waitReaped(t, n0, n1.Name(), n2.Name())
			}
			if tc.rt[1] < longReap {
				waitReaped(t, n1, n0.Name())
				if !tc.leave {
					waitReaped(t, n2, n0.Name())
				}
			}
			for _, nd := range c.Nodes() {
				t.Logf("before the second round, %s: ring %v, members %d, %+v", nd.Name(), nd.RingMembers(), len(nd.Members()), nd.Stats().Settle)
			}
			consume(t, n0, withHits(reqs, 10))
			consume(t, second, withHits(reqs, 10))
			c.Heal()
			c.WaitConverged()
			for _, nd := range c.Nodes() {
				t.Logf("healed, %s: ring %v, %+v", nd.Name(), nd.RingMembers(), nd.Stats().Settle)
			}
			// Let the heal's hand-offs settle, then count.
			if over := remainingAtMost(t, c, reqs, 40); over > 0 {
				t.Errorf("%d of %d keys over their limit", over, len(reqs))
			}
		})
	}
}

// {0,1}|{2} and node 1 killed at once: node 2, with a ReconnectTimeout of
// 3 s, reaps node 1 (and node 0); node 0, with 20 s, still holds node 1
// failed when the partition heals, and names it cut off in its reports to
// node 2, which ignores them (reaped there). 20 hits before the cut; 10
// through node 0 and 10 through node 2 while node 1 is reaped on node 2
// only, 10 and 10 more once node 0 reaped it too: each key must admit at
// most 40 more.
func TestAtkReapedHereFailedThere(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	rt := [3]time.Duration{20 * time.Second, 20 * time.Second, 3 * time.Second}
	c := testcluster.New(t, 3, testcluster.WithWait(time.Minute), testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.Replicas = 2
		cluster.SetReconnectTimeout(cfg, rt[i])
	}))
	n0, n1, n2 := c.Node(0), c.Node(1), c.Node(2)
	reqs := reapKeys(t, c)
	dead := n1.Name()
	consume(t, n1, withHits(reqs, 20))
	waitReplicated(t, c, reqs)
	// node 2 sees node 0 and node 1 fail; node 2 reaps both after 3 s, so
	// heal it before that for node 0: cut node 2 off from node 1 alone is
	// not possible with groups, so cut {0,1}|{2} and kill node 1 at once.
	c.Partition([]int{0, 1}, []int{2})
	c.StopHard(1)
	c.WaitConverged()
	// node 2 reaps node 1 (and node 0) after 3 s; node 0 holds node 1
	// failed for 20 s from the kill.
	waitReaped(t, n2, dead)
	if err := listsAll(n0, dead); err != nil {
		t.Fatalf("node 0 reaped node 1 already: %v", err)
	}
	c.Heal()
	c.WaitConverged()
	if err := listsAll(n0, dead); err != nil {
		t.Logf("node 0 reaped node 1 before the checks: %v", err)
	}
	for _, nd := range c.Nodes() {
		t.Logf("healed, %s: ring %v, %+v", nd.Name(), nd.RingMembers(), nd.Stats().Settle)
	}
	consume(t, n0, withHits(reqs, 10))
	consume(t, n2, withHits(reqs, 10))
	waitReaped(t, n0, dead)
	consume(t, n0, withHits(reqs, 10))
	consume(t, n2, withHits(reqs, 10))
	for _, nd := range c.Nodes() {
		t.Logf("node 1 reaped everywhere, %s: ring %v, %+v", nd.Name(), nd.RingMembers(), nd.Stats().Settle)
	}
	remainingAtMost(t, c, reqs, 40)
}

// A forged hand-over confirmation, claiming to come from node 2, names
// node 1 cut off after node 0 reaped it: within twice ReconnectTimeout it
// is ignored; past it, node 0 holds node 1 cut off again (learned) for
// ReconnectTimeout. Keys through both live nodes admit their limit,
// neither more nor (logged) fewer, and node 0's ring gets node 1 back
// when it restarts.
func TestAtkForgedReportNamesReapedMember(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 3, testcluster.WithWait(time.Minute), testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
		cfg.Replicas = 2
		cluster.SetReconnectTimeout(cfg, 3*time.Second)
	}))
	n0, n1, n2 := c.Node(0), c.Node(1), c.Node(2)
	reqs := reapKeys(t, c)
	dead, deadAddr := n1.Name(), n1.GRPCAddr()
	consume(t, n1, withHits(reqs, 20))
	waitReplicated(t, c, reqs)
	c.StopHard(1)
	c.WaitConverged()
	waitReaped(t, n0, dead)
	waitReaped(t, n2, dead)
	forge := func() {
		confirmTo(t, n0, n2.Name(), map[string]string{dead: deadAddr}, nil)
	}
	forge()
	consume(t, n0, withHits(reqs, 10))
	consume(t, n2, withHits(reqs, 10))
	standIn0 := n0.Stats().Settle.StandIn
	// Past twice ReconnectTimeout from the reap: the record is gone.
	time.Sleep(7 * time.Second)
	for range 3 {
		forge()
		consume(t, n0, withHits(reqs, 5))
		consume(t, n2, withHits(reqs, 5))
	}
	t.Logf("node 0 stood in for %d hits after the late forgeries (%d before)", n0.Stats().Settle.StandIn-standIn0, standIn0)
	for _, nd := range c.Nodes() {
		t.Logf("%s: ring %v, %+v", nd.Name(), nd.RingMembers(), nd.Stats().Settle)
	}
	remainingAtMost(t, c, reqs, 30) // 20 + 10 + 10 + 3×(5+5) admitted
	back := c.Restart(1)
	c.WaitConverged()
	forge()
	if err := testcluster.WaitFor(30*time.Second, func() error {
		if !slices.ContainsFunc(n0.RingMembers(), func(m ring.Member) bool { return m.Name == back.Name() }) {
			return fmt.Errorf("node 0 routes over %v", n0.RingMembers())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// The forged report is sent again and again (every 100 ms) from the name
// of a live member, naming the member reaped: node 0 keeps rebuilding its
// ring for it? Count the rebuild-driven stand-in decisions, and check the
// keys still admit at most their limit and that Close leaks nothing while
// the forger runs.
func TestAtkForgedReportFloodAfterReap(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 3, testcluster.WithWait(time.Minute), testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
		cfg.Replicas = 2
		cluster.SetReconnectTimeout(cfg, 2*time.Second)
	}))
	n0, n1, n2 := c.Node(0), c.Node(1), c.Node(2)
	reqs := reapKeys(t, c)
	dead, deadAddr := n1.Name(), n1.GRPCAddr()
	consume(t, n1, withHits(reqs, 20))
	waitReplicated(t, c, reqs)
	c.StopHard(1)
	c.WaitConverged()
	waitReaped(t, n0, dead)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		i := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			// Alternate: naming it, then naming nothing, so that learn
			// reports a change each time.
			cut := map[string]string{dead: deadAddr}
			if i%2 == 1 {
				cut = nil
			}
			i++
			_ = tryConfirmTo(t, n0, n2.Name(), cut, nil)
		}
	}()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	hits := 0
	for time.Now().Before(deadline) && hits < 40 {
		consume(t, n0, withHits(reqs, 2))
		consume(t, n2, withHits(reqs, 2))
		hits += 4
		time.Sleep(500 * time.Millisecond)
	}
	cancel()
	<-done
	t.Logf("consumed %d of each key after the 20; node 0 %+v", hits, n0.Stats().Settle)
	remainingAtMost(t, c, reqs, 80-hits)
}

// A lease holder (node 0) of a key owned by node 1; node 3 joins after
// node 1 is killed (it knows node 1 only from the reports), and node 1 is
// reaped. The key admits at most its limit (plus what refilled), and the
// holder's return is not lost for good: exactly the limit is logged.
func TestAtkLeaseOwnerReapedWithJoiner(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, a := range leaseEndAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			noLeaksAfter(t)
			c := testcluster.New(t, 3, testcluster.WithWait(time.Minute), testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
				cfg.Lease = cluster.LeaseConfig{Threshold: 100, TTL: 3 * time.Second, Share: 0.5}
				cfg.Unreachable = sluice.PolicyDeny
				cfg.Replicas = 2
				cluster.SetReconnectTimeout(cfg, 4*time.Second)
			}))
			req := keyMovingTo(t, c, "reapjoin", a, 1000, 1, 2)
			start := time.Now()
			admitted := checkUntilLeased(t, c.Node(0), req)
			admitted += checkN(c.Node(0), req, 10)
			admitted += replicated(t, c.Node(1), req)
			dead := c.Node(1).Name()
			c.StopHard(1)
			c.WaitConverged()
			joiner := c.Add()
			c.WaitConverged()
			admitted += checkN(joiner, req, 20)
			waitReaped(t, c.Node(0), dead)
			waitReaped(t, c.Node(2), dead)
			admitted = admitAll(t, c, req, admitted, 30*time.Second, c.Node(0))
			t.Logf("callers admitted %d of %d; %+v", admitted, req.Limit, c.Node(0).Stats().Leases)
			switch {
			case admitted > mostAdmitted(req, start):
				t.Errorf("OVER: admitted %d of %d", admitted, req.Limit)
			case admitted < req.Limit:
				t.Logf("under: admitted %d of %d", admitted, req.Limit)
			}
		})
	}
}

// Node 1 is killed; a joiner (node 3) learns it from the survivors'
// reports; nodes 0 and 2 reap it (5 s) and let it go at once, while the
// joiner holds it cut off up to ReconnectTimeout after the last report
// named it. Checks of every key through every live node before the reap,
// within the joiner's hold after it, and after the hold: each key counts
// every hit admitted, no more admitted than its limit.
func TestAtkJoinerHoldOutlivesPeersReap(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 3, testcluster.WithWait(time.Minute), testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
		cfg.Replicas = 2
		cluster.SetReconnectTimeout(cfg, 5*time.Second)
	}))
	n0, n1, n2 := c.Node(0), c.Node(1), c.Node(2)
	reqs := reapKeys(t, c)
	dead := n1.Name()
	consume(t, n1, withHits(reqs, 20))
	waitReplicated(t, c, reqs)
	c.StopHard(1)
	c.WaitConverged()
	joiner := c.Add()
	c.WaitConverged()
	live := []*cluster.Node{n0, n2, joiner}
	round := func(hits int64) {
		for _, nd := range live {
			consume(t, nd, withHits(reqs, hits))
		}
	}
	round(5)
	waitReaped(t, n0, dead)
	waitReaped(t, n2, dead)
	round(5) // within the joiner's hold, if it holds node 1 still
	for _, nd := range live {
		t.Logf("after the reap, %s: ring %v, %+v", nd.Name(), nd.RingMembers(), nd.Stats().Settle)
	}
	time.Sleep(6 * time.Second)
	round(5)
	for _, nd := range live {
		t.Logf("after the joiner's hold, %s: ring %v, %+v", nd.Name(), nd.RingMembers(), nd.Stats().Settle)
	}
	// 20 + 3 rounds × 3 nodes × 5 = 65
	remainingAtMost(t, c, reqs, 35)
}

// {0}|{1,2,3}: node 3 alone has a short ReconnectTimeout (8 s; the others
// 10 minutes, as if node 3 saw node 0 fail long before them), so it
// reaps node 0 while nodes 1 and 2 still hold it failed and name it cut
// off in their reports, as seen failed: node 3 must go on standing in for
// it (it did not while it ignored every report naming a member it had
// reaped: 10 over on 5 of 5 keys at the heal). Keys owned by node 0
// whose owner without it is node 3: 20 hits before the cut (replicated),
// 10 through node 1 and 10 through node 0 before node 3's reap, 10
// through node 1 and 10 through node 0 after it, then the heal: each key
// was admitted 60 of 100, and must admit at most 40 more.
func TestAtkOneMemberReapsItsSideStillHolds(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, reap3 := range []bool{false, true} {
		t.Run(fmt.Sprintf("node 3 reaps %v", reap3), func(t *testing.T) { oneMemberReaps(t, reap3) })
	}
}

func oneMemberReaps(t *testing.T, reap3 bool) {
	noLeaksAfter(t)
	c := testcluster.New(t, 4, testcluster.WithWait(time.Minute), testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.Replicas = 2
		rt := longReap
		if i == 3 && reap3 {
			rt = 8 * time.Second
		}
		cluster.SetReconnectTimeout(cfg, rt)
	}))
	n0, n1, n3 := c.Node(0), c.Node(1), c.Node(3)
	var reqs []limiter.Request
	for _, a := range healAlgorithms {
		reqs = append(reqs, keyMovingTo(t, c, "onereaps", a, 100, 0, 3))
	}
	consume(t, n1, withHits(reqs, 20))
	waitReplicated(t, c, reqs)
	c.Partition([]int{0}, []int{1, 2, 3})
	c.WaitConverged()
	t.Logf("first round: node 3 lists node 0: %v", listsAll(n3, n0.Name()) == nil)
	consume(t, n1, withHits(reqs, 10))
	consume(t, n0, withHits(reqs, 10))
	t.Logf("after the first round, node 3: %+v", n3.Stats().Settle)
	if reap3 {
		waitReaped(t, n3, n0.Name())
	} else {
		time.Sleep(5 * time.Second)
	}
	if err := listsAll(n1, n0.Name()); err != nil {
		t.Fatal(err)
	}
	consume(t, n1, withHits(reqs, 10))
	consume(t, n0, withHits(reqs, 10))
	for _, nd := range c.Nodes() {
		t.Logf("before the heal, %s: ring %v, %+v", nd.Name(), nd.RingMembers(), nd.Stats().Settle)
	}
	c.Heal()
	c.WaitConverged()
	remainingAtMost(t, c, reqs, 40)
}

// As TestReapedMemberLetGoByEveryMember, with two nodes joining after the
// kill, before the reap: each knows node 1 only from reports (serf never
// listed it there, so neither ever reaps it), and each names it cut off
// in its reports to the other. Once nodes 0 and 2 reaped it, does every
// node, joiners included, stop standing in for node 1's keys within a
// minute, and stay so past twice ReconnectTimeout (when nodes 0 and 2
// forget the reap and would learn node 1 again from a joiner's report)?
func TestAtkTwoJoinersHoldReapedMemberForEachOther(t *testing.T) {
	skipNearDayEnd(t)
	waitBound(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2), testcluster.WithWait(time.Minute), testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
		cluster.SetReconnectTimeout(cfg, 12*time.Second)
	}))
	var reqs []limiter.Request
	for _, r := range dailyKeys("reaped2", 200) {
		if c.Owner(r.Name, r.Key) == c.Node(1) {
			r.Limit = 1_000_000
			reqs = append(reqs, r)
		}
	}
	dead := c.Node(1).Name()
	c.StopHard(1)
	c.WaitConverged()
	j1 := c.Add()
	j2 := c.Add()
	c.WaitConverged()
	live := []*cluster.Node{c.Node(0), c.Node(2), j1, j2}
	t.Logf("joined: node 0 still lists %s: %v", dead, listsAll(c.Node(0), dead) == nil)
	for _, nd := range live {
		consume(t, nd, withHits(reqs, 1))
	}
	for _, nd := range live {
		t.Logf("before the reap, %s: %+v", nd.Name(), nd.Stats().Settle)
	}
	standIn := func() (sum int64, per []int64) {
		for _, nd := range live {
			s := nd.Stats().Settle.StandIn
			sum += s
			per = append(per, s)
		}
		return sum, per
	}
	letGo := func() error {
		for _, nd := range live {
			if slices.ContainsFunc(nd.Members(), func(m cluster.Member) bool { return m.Name == dead }) {
				return fmt.Errorf("%s still lists %s", nd.Name(), dead)
			}
		}
		before, _ := standIn()
		for _, nd := range live {
			for i, r := range nd.CheckMany(context.Background(), reqs) {
				if r.Err != nil || !r.Allowed {
					return fmt.Errorf("%s: %s: allowed %v, err %v", nd.Name(), reqs[i].Key, r.Allowed, r.Err)
				}
			}
		}
		if after, per := standIn(); after != before {
			return fmt.Errorf("%d hits of the reaped member's keys admitted standing in for it (cumulative per node %v)", after-before, per)
		}
		return nil
	}
	if err := testcluster.WaitFor(time.Minute, letGo); err != nil {
		t.Fatalf("within a minute: %v", err)
	}
	t.Logf("let go at first")
	// Past twice ReconnectTimeout after the reap, and some holds more.
	time.Sleep(30 * time.Second)
	if err := letGo(); err != nil {
		t.Errorf("15 s later: %v", err)
	}
}
