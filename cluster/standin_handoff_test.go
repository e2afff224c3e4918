package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// A hand-off pass reads its states, and a state with more of a key's
// parts is merged before the pass attaches them: {0,1}|{2}, keys of
// every heal algorithm owned by node 2 (node 0 its replica) and stood in
// for by node 0 (node 1 its replica there), no hit before the cut; 30
// through node 0, copied to node 1, and 40 through node 2. Then 10 more
// through node 0, whose records are held back (so that no copy carries
// them) until node 1's heal pass has read its states; node 1 is then
// sent node 0's copy with them, as node 0's changes loop would, before
// the pass attaches the parts. Node 0's hand-off goes once node 1's
// reached node 2, and node 2's heal pass (its copies to node 0) once node
// 0's did. Node 1's state read counted 30 where the parts attached later
// named 40: node 2 was charged 30, held the part as counted, and kept its
// own 70 over node 0's 40 (every key counted 70 of the 80 admitted, 5 of
// 5 runs). Read again with its parts, every key counts 80.
//
// Each hook waits up to orderWait for the step it follows: a hook that
// gives up lets its pass run out of order (node 2's copies for a replica
// could reach node 1 before node 1's pass reads its states), so the wait
// is long enough for a loaded -race run to take the step before it. Node
// 2's copies to its replica, node 0, are sent by its changes loop too,
// which no hook holds: on a loaded machine they may reach node 0, and node
// 0's copies node 1, before node 1's pass reads its states. The order is
// then not the one under test, and the scenario runs again on new nodes,
// at most three times.
func TestStandinHandoffReadBeforeAMerge(t *testing.T) {
	skipNearDayEnd(t)
	for attempt := 1; attempt <= 3; attempt++ {
		ordered := false
		t.Run(fmt.Sprintf("attempt %d", attempt), func(t *testing.T) {
			standinHandoffReadBeforeAMerge(t)
			ordered = true
		})
		if ordered || t.Failed() {
			return
		}
	}
	t.Fatal("the passes did not run in the order under test in 3 attempts")
}

// standinHandoffReadBeforeAMerge is one attempt of
// TestStandinHandoffReadBeforeAMerge; it skips when the passes did not
// run in the order under test.
func standinHandoffReadBeforeAMerge(t *testing.T) {
	const orderWait = time.Minute
	noLeaksAfter(t)
	var (
		nodes    [3]atomic.Pointer[cluster.Node]
		holding  atomic.Bool
		release  = make(chan struct{})
		released sync.Once
		armed1   atomic.Bool
		armed0   atomic.Bool
		armed2   atomic.Bool
		handed1  atomic.Int64 // node 1's HandedOff when armed
		handed0  atomic.Int64 // node 0's
		reqsSeen atomic.Pointer[[]limiter.Request]
		merged   atomic.Int64 // keys node 1 was sent node 0's copy of in its pass
		lagging  atomic.Int64 // keys node 1's state counted 30 of in its pass
		seen     atomic.Value // what node 1's pass read of the last key
	)
	// healed reports whether node i's ring holds node 2 again (the ring
	// of a pass after the heal, which may not hold every node yet).
	healed := func(i int) bool {
		nd, n2 := nodes[i].Load(), nodes[2].Load()
		if nd == nil || n2 == nil {
			return false
		}
		ms := nd.RingMembers()
		if i == 2 {
			return len(ms) > 1
		}
		for _, m := range ms {
			if m.Name == n2.Name() {
				return true
			}
		}
		return false
	}
	c := testcluster.New(t, 3, withReplicas(2), testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		switch i {
		case 0:
			cluster.SetBeforeStandinRecord(cfg, func() {
				if holding.Load() {
					<-release
				}
			})
			cluster.SetBeforeHandoffPass(cfg, func() {
				if !armed0.Load() || !healed(0) || !armed0.CompareAndSwap(true, false) {
					return
				}
				reqs := *reqsSeen.Load()
				_ = testcluster.WaitFor(orderWait, func() error {
					if got := nodes[1].Load().Stats().Transfers.HandedOff - handed1.Load(); got < int64(len(reqs)) {
						return fmt.Errorf("node 1 handed off %d states", got)
					}
					return nil
				})
			})
		case 2:
			// Node 2's copies for its replica, node 0, wait for node 0's
			// hand-off: node 0's state then counts its own history
			// alone, as the states of a stand-in that held no copy.
			cluster.SetBeforeHandoffPass(cfg, func() {
				if !armed2.Load() || !healed(2) {
					return
				}
				reqs := *reqsSeen.Load()
				_ = testcluster.WaitFor(orderWait, func() error {
					if got := nodes[0].Load().Stats().Transfers.HandedOff - handed0.Load(); got < int64(len(reqs)) {
						return fmt.Errorf("node 0 handed off %d states", got)
					}
					return nil
				})
				armed2.Store(false)
			})
		case 1:
			cluster.SetAfterHandoffRead(cfg, func() {
				if !armed1.Load() || !healed(1) || !armed1.CompareAndSwap(true, false) {
					return
				}
				n0, n1 := nodes[0].Load(), nodes[1].Load()
				for _, r := range withHits(*reqsSeen.Load(), 0) {
					d, err := n1.Store().CheckAt(r, time.Now())
					if err == nil && d.Remaining == 70 {
						lagging.Add(1) // the pass read node 0's 30 alone
					}
					parts, _ := n1.StandinParts(r.Name, r.Key)
					seen.Store(fmt.Sprintf("%s %s: %d remaining (%v), parts %v, ring %v", r.Algorithm, r.Key, d.Remaining, err, parts, n1.RingMembers()))
				}
				released.Do(func() { close(release) })
				for _, r := range *reqsSeen.Load() {
					_ = testcluster.WaitFor(orderWait, func() error {
						parts, _ := n0.StandinParts(r.Name, r.Key)
						for _, p := range parts {
							if p.Origin == n0.Name() && p.Hits >= 40 {
								return nil
							}
						}
						return fmt.Errorf("node 0's parts of %s: %v", r.Key, parts)
					})
					if n0.CopyTo(n1, r.Name, r.Key) {
						merged.Add(1)
					}
				}
			})
		}
	}))
	t.Cleanup(func() { released.Do(func() { close(release) }) })
	for i := range nodes {
		nodes[i].Store(c.Node(i))
	}
	// Keys of node 2 with node 0 its replica, stood in for by node 0 while
	// {0,1}|{2}, node 1 holding its copies: no copy of node 2's reaches
	// node 1.
	reqs := keysStoodIn(t, c, "read-", 0, 2, 0)
	reqsSeen.Store(&reqs)
	c.Partition([]int{0, 1}, []int{2})
	c.WaitConverged()
	consume(t, c.Node(0), withHits(reqs, 30))
	// Node 1's copies count node 0's 30.
	if err := testcluster.WaitFor(20*time.Second, func() error { return storesHold(c, []int{1}, reqs, 70) }); err != nil {
		t.Fatal(err)
	}
	consume(t, c.Node(2), withHits(reqs, 40))
	// 10 more through node 0, each held between its store's count and
	// its record's: no copy of the key goes out meanwhile.
	holding.Store(true)
	var wg sync.WaitGroup
	for _, r := range withHits(reqs, 10) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d, err := c.Node(0).Check(context.Background(), r); err != nil || !d.Allowed || d.WithoutOwner {
				t.Errorf("%s: allowed %v, without owner %v, err %v", r.Key, d.Allowed, d.WithoutOwner, err)
			}
		}()
	}
	if err := testcluster.WaitFor(20*time.Second, func() error { return storesHold(c, []int{0}, reqs, 60) }); err != nil {
		t.Fatal(err)
	}
	handed1.Store(c.Node(1).Stats().Transfers.HandedOff)
	handed0.Store(c.Node(0).Stats().Transfers.HandedOff)
	armed2.Store(true)
	armed0.Store(true)
	armed1.Store(true)
	c.Heal()
	c.WaitConverged()
	wg.Wait()
	if armed1.Load() || merged.Load() != int64(len(reqs)) || lagging.Load() != int64(len(reqs)) {
		t.Skipf("not the order under test: node 1's heal pass read %d of %d keys at node 0's 30 (%v) and was sent %d copies (hook armed still: %v)",
			lagging.Load(), len(reqs), seen.Load(), merged.Load(), armed1.Load())
	}
	defer func() {
		if t.Failed() {
			for _, l := range standinRecords(c, reqs) {
				t.Log(l)
			}
		}
	}()
	exactly(t, c, reqs, 20)
	remainingAfter(t, c, reqs, 20)
}
