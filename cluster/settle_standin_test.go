package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// Hits a replica admits under PolicyLocal as a partition begins (its
// owner cut off, not declared failed yet), settled once the key's first
// replica stands in for the owner, count once. Four nodes, three replicas:
// keys of every heal algorithm owned by node 0, with a first replica X
// and a second A, 50 before; node 0 cut off from the others; 10 through
// A at once, decided on its store without the owner; once A's ring routes
// the keys to X and A's settlement has run, A's hand-off pass (held back
// until then) hands X its state, which counts the 10; healed. Every key
// counts 60 and its owner admits 40 more. Settled as a charge, the 10
// became X's own stand-in part while A's state counted them with no
// part: X charged that part to A's state, which counted them already,
// and the keys counted 70.
func TestLocalHitsSettledWithAStandinCountOnce(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	var (
		mu      sync.Mutex
		holding bool
		holdIn  = -1 // the node whose hand-off passes are held
	)
	release := make(chan struct{})
	var once sync.Once
	releasePasses := func() { once.Do(func() { close(release) }) }
	t.Cleanup(releasePasses)
	c := testcluster.New(t, 4, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.Replicas = 3
		cluster.SetBeforeHandoffPass(cfg, func() {
			mu.Lock()
			hold := holding && holdIn == i
			mu.Unlock()
			if hold {
				<-release
			}
		})
	}))
	index := map[string]int{}
	for i, nd := range c.Nodes() {
		index[nd.Name()] = i
	}
	var reqs []limiter.Request
	x, a := -1, -1
	for _, alg := range healAlgorithms {
		found := 0
		for i := 0; i < 10_000 && found < 3; i++ {
			req := limiter.Request{Name: "local-standin-" + alg.String(), Key: fmt.Sprintf("k%d", i), Hits: 1, Limit: 100, Period: 24 * time.Hour, Algorithm: alg}
			rs := c.Node(0).Replicas(req.Name, req.Key)
			if len(rs) != 3 || rs[0].Name != c.Node(0).Name() {
				continue
			}
			if x < 0 {
				x, a = index[rs[1].Name], index[rs[2].Name]
			}
			if rs[1].Name == c.Node(x).Name() && rs[2].Name == c.Node(a).Name() {
				reqs = append(reqs, req)
				found++
			}
		}
		if found == 0 {
			t.Fatalf("no %s key of nodes 0, %d and %d", alg, x, a)
		}
	}
	var others []int
	for i := 1; i < 4; i++ {
		others = append(others, i)
	}
	consume(t, c.Node(0), withHits(reqs, 50))
	waitReplicated(t, c, reqs)
	mu.Lock()
	holding, holdIn = true, a
	mu.Unlock()
	c.Partition([]int{0}, others)
	for i, r := range c.Node(a).CheckMany(context.Background(), withHits(reqs, 10), sluice.OnUnreachable(sluice.PolicyLocal)) {
		if r.Err != nil || !r.Allowed || !r.WithoutOwner {
			t.Fatalf("%s: allowed %v, without owner %v, err %v; want admitted without the owner", reqs[i].Key, r.Allowed, r.WithoutOwner, r.Err)
		}
	}
	c.WaitConverged()
	standIn := 0
	for _, r := range reqs {
		if rs := c.Node(a).Replicas(r.Name, r.Key); len(rs) > 0 && rs[0].Name == c.Node(x).Name() {
			standIn++
		}
	}
	if standIn == 0 {
		t.Fatalf("no key goes to node %d on the ring without node 0", x)
	}
	want := int64(10 * len(reqs))
	if err := testcluster.WaitFor(20*time.Second, func() error {
		if s := c.Node(a).Stats().Settle; s.Settled < want {
			return fmt.Errorf("node %d settled %d of the %d hits it admitted without the owner", a, s.Settled, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	holding = false
	mu.Unlock()
	releasePasses()
	c.Heal()
	c.WaitConverged()
	exactly(t, c, reqs, 40)
	remainingAfter(t, c, reqs, 40)
}

// Hits a replica admits under PolicyLocal while the owner is slowed past
// the peer timeout count once the owner has left and the replica decides
// the keys, though the owner's copies that came meanwhile counted more:
// two nodes, keys of every heal algorithm owned by node 1, 50 before;
// node 1 slowed; 10 through node 0 (its breaker to node 1 open), decided
// on its store; 30 more through node 1, whose copies reach node 0; node 1
// leaves. Every key counts 90 and node 0 admits 10 more. A copy merged
// by the larger lost the 10 from node 0's state, which settled them as
// counted there once it owned the keys: node 0 admitted 20 more.
func TestLocalHitsOutliveACopyUntilSettled(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 2, withReplicas(2))
	n0, n1 := c.Node(0), c.Node(1)
	var reqs []limiter.Request
	for _, a := range healAlgorithms {
		reqs = append(reqs, keyHeldBy(t, c, a, 1, 0))
	}
	consume(t, n1, withHits(reqs, 50))
	waitReplicated(t, c, reqs)
	c.Slow(1, time.Minute)
	waitBreakerOpen(t, n0, n1, reqs[0])
	for i, r := range n0.CheckMany(context.Background(), withHits(reqs, 10), sluice.OnUnreachable(sluice.PolicyLocal)) {
		if r.Err != nil || !r.Allowed || !r.WithoutOwner {
			t.Fatalf("%s: allowed %v, without owner %v, err %v; want admitted without the owner", reqs[i].Key, r.Allowed, r.WithoutOwner, r.Err)
		}
	}
	consume(t, n1, withHits(reqs, 30))
	// Node 1's copies of the 80 it counts reach node 0.
	if err := testcluster.WaitFor(20*time.Second, func() error {
		for _, r := range withHits(reqs, 0) {
			d0, err0 := n0.Store().CheckAt(r, time.Now())
			d1, err1 := n1.Store().CheckAt(r, time.Now())
			if err0 != nil || err1 != nil || d0.Remaining > d1.Remaining {
				return fmt.Errorf("%s: node 0 has %d remaining (%v), node 1 %d (%v)", r.Key, d0.Remaining, err0, d1.Remaining, err1)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c.Leave(1)
	c.WaitConverged()
	exactly(t, c, reqs, 10)
	remainingAfter(t, c, reqs, 10)
}
