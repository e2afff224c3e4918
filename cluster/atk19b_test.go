package cluster_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// More attacks on issue 19, on real nodes, counted from the callers'
// side: heals that come back a side at a time, flaps, the owner
// restarting or killed, a node joining or leaving around the heal,
// refunds and limits changed during the cut.

// wideLimit is a limit that the traffic of these tests never reaches, on
// a period so long (limiter.MaxPeriod) that a bucket refills less than a
// hit while a test runs: what a key has left is its limit less what its
// callers were admitted.
const wideLimit = 1_000_000

// wideKeys returns per keys of every algorithm owned by each of the
// nodes owners (any replica), of wideLimit per limiter.MaxPeriod.
func wideKeys(t *testing.T, c *testcluster.Cluster, name string, owners []int, per int) []limiter.Request {
	t.Helper()
	var reqs []limiter.Request
	for _, a := range allAlgorithms {
		for _, o := range owners {
			found := 0
			for i := 0; i < 100_000 && found < per; i++ {
				req := limiter.Request{Name: name, Key: fmt.Sprintf("%s-%d", a, i), Hits: 1, Limit: wideLimit, Period: limiter.MaxPeriod, Algorithm: a}
				if c.OwnerIndex(req.Name, req.Key) == o {
					reqs = append(reqs, req)
					found++
				}
			}
			if found < per {
				t.Fatalf("%d keys of node %d, want %d", found, o, per)
			}
		}
	}
	return reqs
}

// allTraffic is one caller per node of nodes, each checking random keys
// of reqs (one hit, under policy) as fast as it is answered, until stop:
// what every key admitted, counted whether the owner decided or not.
type allTraffic struct {
	reqs     []limiter.Request
	admitted []atomic.Int64
	without  atomic.Int64
	checks   atomic.Int64
	errs     atomic.Int64
	stop     chan struct{}
	once     sync.Once
	wg       sync.WaitGroup

	// stage is set by the test as it moves on; by counts what each key
	// admitted per stage, deciding node and caller (byIndex).
	stage atomic.Int32
	names map[string]int
	by    []atomic.Int64
}

// Dimensions of allTraffic.by: stages, deciders (nodes 0 to 2, and one
// for any other name), without the owner or not, callers (nodes 0 and 1,
// and one for the others).
const trStages, trDeciders, trCallers = 4, 4, 3

func (tr *allTraffic) byIndex(key, stage, decider int, without bool, caller int) int {
	w := 0
	if without {
		w = 1
	}
	return (((key*trStages+stage)*trDeciders+decider)*2+w)*trCallers + caller
}

// byKey describes what key i admitted per stage, decider and caller.
func (tr *allTraffic) byKey(i int) string {
	out := ""
	for st := 0; st < trStages; st++ {
		for dc := 0; dc < trDeciders; dc++ {
			for w := 0; w < 2; w++ {
				for cl := 0; cl < trCallers; cl++ {
					if n := tr.by[tr.byIndex(i, st, dc, w == 1, cl)].Load(); n > 0 {
						out += fmt.Sprintf(" [stage %d decided by %d without %v through %d: %d]", st, dc, w == 1, cl, n)
					}
				}
			}
		}
	}
	return out
}

func startAllTraffic(nodes []*cluster.Node, reqs []limiter.Request, policy sluice.Policy) *allTraffic {
	return startAllTrafficBatched(nodes, reqs, policy, 1)
}

// startAllTrafficBatched is startAllTraffic with each caller checking
// batch random keys at once (CheckMany), a batch of one with Check.
func startAllTrafficBatched(nodes []*cluster.Node, reqs []limiter.Request, policy sluice.Policy, batch int) *allTraffic {
	tr := &allTraffic{reqs: reqs, admitted: make([]atomic.Int64, len(reqs)), stop: make(chan struct{})}
	tr.names = map[string]int{}
	for i, nd := range nodes {
		tr.names[nd.Name()] = i
	}
	tr.by = make([]atomic.Int64, len(reqs)*trStages*trDeciders*2*trCallers)
	for g, nd := range nodes {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 20))
			ks := make([]int, batch)
			rs := make([]limiter.Request, batch)
			for {
				select {
				case <-tr.stop:
					return
				default:
				}
				for j := range ks {
					ks[j] = rng.IntN(len(reqs))
					rs[j] = reqs[ks[j]]
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				var results []sluice.Result
				if batch == 1 {
					d, err := nd.Check(ctx, rs[0], sluice.OnUnreachable(policy))
					results = []sluice.Result{{Decision: d, Err: err}}
				} else {
					results = nd.CheckMany(ctx, rs, sluice.OnUnreachable(policy))
				}
				cancel()
				for j, r := range results {
					tr.checks.Add(1)
					switch {
					case r.Err != nil:
						tr.errs.Add(1)
					case r.Allowed:
						tr.admitted[ks[j]].Add(1)
						if r.WithoutOwner {
							tr.without.Add(1)
						}
						dc, ok := tr.names[r.Owner]
						if !ok || dc >= trDeciders-1 {
							dc = trDeciders - 1
						}
						st := min(int(tr.stage.Load()), trStages-1)
						tr.by[tr.byIndex(ks[j], st, dc, r.WithoutOwner, min(g, trCallers-1))].Add(1)
					}
				}
			}
		}()
	}
	return tr
}

func (tr *allTraffic) finish() {
	tr.once.Do(func() { close(tr.stop) })
	tr.wg.Wait()
}

// checkedMore waits until the callers have made n more checks.
func (tr *allTraffic) checkedMore(t *testing.T, n int64) {
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

func (tr *allTraffic) counts() []int64 {
	out := make([]int64, len(tr.admitted))
	for i := range tr.admitted {
		out[i] = tr.admitted[i].Load()
	}
	return out
}

// waitCounted waits, up to 20 s a key, until every key of reqs has at
// most its limit less admitted[i] remaining at its owner.
func waitCounted(c *testcluster.Cluster, reqs []limiter.Request, admitted []int64) {
	for i, r := range reqs {
		want := r.Limit - admitted[i]
		_ = testcluster.WaitFor(20*time.Second, func() error { return atMost(c, []limiter.Request{r}, want) })
	}
}

// settledTo waits until every key of reqs has at most its limit less
// admitted[i] remaining at its owner, then checks, from the owner, that
// none has more (more is hits admitted that the key does not count: over
// admission), and that the owner admits the rest in one check and then
// nothing. That the keys together count at most slack hits beyond what
// was admitted (checks in flight at a cut, answered by the owner and
// decided again by the caller's policy) is an open gap under the policy
// local, checked with SLUICE_ATTACK=1 only. Returns the hits over and under.
func settledTo(t *testing.T, c *testcluster.Cluster, reqs []limiter.Request, admitted []int64, slack int64) (over, under int64) {
	t.Helper()
	waitCounted(c, reqs, admitted)
	for i, r := range reqs {
		want := r.Limit - admitted[i]
		owner := c.Owner(r.Name, r.Key)
		peek := r
		peek.Hits = 0
		d, err := owner.Check(context.Background(), peek)
		if err != nil {
			t.Fatalf("%s %s: peek: %v", r.Algorithm, r.Key, err)
		}
		switch {
		case d.Remaining > want:
			over += d.Remaining - want
			t.Errorf("%s %s: %d remaining at its owner %s after %d admitted of %d: %d admitted hits not counted", r.Algorithm, r.Key, d.Remaining, owner.Name(), admitted[i], r.Limit, d.Remaining-want)
		case d.Remaining < want:
			under += want - d.Remaining
			t.Logf("%s %s: %d remaining after %d admitted: counted %d more", r.Algorithm, r.Key, d.Remaining, admitted[i], want-d.Remaining)
		}
		rest := r
		rest.Hits = d.Remaining
		if rest.Hits > 0 {
			if d, err := owner.Check(context.Background(), rest); err != nil || !d.Allowed {
				t.Errorf("%s %s: the rest, %d, not admitted: %v %v", r.Algorithm, r.Key, rest.Hits, d.Allowed, err)
			}
		}
		if more := admitUntilDenied(t, owner, r, 3); more != 0 {
			t.Errorf("%s %s: %d admitted past the limit", r.Algorithm, r.Key, more)
		}
	}
	if under > slack {
		// Open: under the policy local, the keys sometimes count more
		// than the checks in flight (docs/design.md, known gaps).
		openGap(t, "the keys count %d hits more than the callers were admitted, more than the %d checks that may have been in flight at a cut", under, slack)
	}
	return over, under
}

// A partition that heals one side at a time, under live traffic through
// all three nodes on keys of every algorithm owned by each (policy local
// or allow, 1 to 3 replicas, callers checking one key at a time or 8 at
// once): {0}|{1}|{2}, then {0,1}|{2}, then whole. Each stand-in's
// part from the three-way cut must survive the first merge (where node 0
// or 1 meets the owner of what it stood in for) and still reach node 2's
// keys at the last. Counted from the callers' side, every key counts
// every hit admitted, at most one batch per caller per cut more.
func TestAtk19bStagedHealUnderTraffic(t *testing.T) {
	for _, tc := range []struct {
		policy          sluice.Policy
		replicas, batch int
	}{
		{sluice.PolicyLocal, 2, 1},
		{sluice.PolicyAllow, 2, 1},
		{sluice.PolicyLocal, 3, 1},
		{sluice.PolicyLocal, 1, 1},
		{sluice.PolicyLocal, 2, 8},
		{sluice.PolicyAllow, 3, 8},
	} {
		t.Run(fmt.Sprintf("%s/replicas=%d/batch=%d", tc.policy, tc.replicas, tc.batch), func(t *testing.T) {
			noLeaksAfter(t)
			c := testcluster.New(t, 3, withReplicas(tc.replicas))
			reqs := wideKeys(t, c, "staged", []int{0, 1, 2}, 2)
			tr := startAllTrafficBatched(c.Nodes(), reqs, tc.policy, tc.batch)
			defer tr.finish()
			tr.checkedMore(t, 100)
			tr.stage.Store(1)
			c.Partition([]int{0}, []int{1}, []int{2})
			c.WaitConverged()
			tr.checkedMore(t, 300)
			tr.stage.Store(2)
			c.Partition([]int{0, 1}, []int{2})
			c.WaitConverged()
			tr.checkedMore(t, 300)
			tr.stage.Store(3)
			c.Heal()
			tr.checkedMore(t, 300)
			tr.finish()
			admitted := tr.counts()
			// The records as settled, before settledTo's checks spend the keys.
			waitCounted(c, reqs, admitted)
			records := standinRecords(c, reqs)
			var sum int64
			for _, a := range admitted {
				sum += a
			}
			t.Logf("%d checks, %d errors, %d admitted (%d without the owner)", tr.checks.Load(), tr.errs.Load(), sum, tr.without.Load())
			// Three callers, two cuts (the three-way one, and the partial
			// heal, which cuts node 2 from node 0 again as far as checks
			// in flight go), a batch each.
			over, under := settledTo(t, c, reqs, admitted, int64(3*2*tc.batch))
			t.Logf("%d hits admitted and not counted, %d counted and not admitted", over, under)
			if over > 0 {
				for _, l := range records {
					t.Log(l)
				}
				for i, r := range reqs {
					t.Logf("%s %s (owner %s):%s", r.Algorithm, r.Key, c.Owner(r.Name, r.Key).Name(), tr.byKey(i))
				}
			}
		})
	}
}

// A flap that turns the partition around before the first heal settles:
// {0}|{1,2} (node 0 stands in for node 1's keys, node 1 for node 0's),
// healed, and at once cut into {1}|{0,2}, the owner of half the keys now
// alone, the stand-in of the first cut with the replica; healed again.
// Keys of every algorithm, 50 hits before, 30 and 10 in the first cut,
// 5 and 3 in the second: every key counts 98 once.
func TestAtk19bFlapTurnsAround(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c, reqs := partitionedAfterFifty(t)
	c.Heal()
	c.Partition([]int{1}, []int{0, 2})
	c.WaitConverged()
	consume(t, c.Node(0), withHits(reqs, 5))
	consume(t, c.Node(1), withHits(reqs, 3))
	c.Heal()
	c.WaitConverged()
	exactly(t, c, reqs, 100-98)
	remainingAfter(t, c, reqs, 100-98)
}

// A partition that flaps under live traffic through all three nodes on
// keys of every algorithm owned by each (policy local): each node in turn
// is cut off alone and healed, the next cut coming as soon as the heal
// has converged, while the previous heal's stand-in states may still be on
// their way. Every key counts every hit admitted, at most one check per
// caller per cut more (a batch: callers check one key at a time, or 8
// at once).
func TestAtk19bFlapsUnderTraffic(t *testing.T) {
	for _, batch := range []int{1, 8} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) { flapsUnderTraffic(t, batch) })
	}
}

func flapsUnderTraffic(t *testing.T, batch int) {
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2))
	reqs := wideKeys(t, c, "flaps", []int{0, 1, 2}, 2)
	tr := startAllTrafficBatched(c.Nodes(), reqs, sluice.PolicyLocal, batch)
	defer tr.finish()
	tr.checkedMore(t, 100)
	cuts := [][][]int{{{0}, {1, 2}}, {{1}, {0, 2}}, {{2}, {0, 1}}}
	for _, cut := range cuts {
		c.Partition(cut...)
		c.WaitConverged()
		tr.checkedMore(t, 300)
		c.Heal()
	}
	tr.checkedMore(t, 300)
	tr.finish()
	admitted := tr.counts()
	t.Logf("%d checks, %d errors, %d without the owner", tr.checks.Load(), tr.errs.Load(), tr.without.Load())
	over, under := settledTo(t, c, reqs, admitted, int64(3*len(cuts)*batch))
	t.Logf("%d hits admitted and not counted, %d counted and not admitted", over, under)
}

// The owner restarts from its DataDir while cut off: keys of every heal
// algorithm owned by node 0 (node 1 its replica), 50 hits before;
// {0}|{1,2}; node 0 admits 10 as owner, node 1 20 standing in; node 0
// stops hard and starts again from its DataDir, still cut off, and
// admits 5 more (as owner, or under the policy local while it is not
// ready); healed: every key counts 85 once.
func TestAtk19bOwnerRestartsWhileCutOff(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.Replicas, cfg.DataDir = 2, dirs[i]
	}))
	var reqs []limiter.Request
	for _, a := range healAlgorithms {
		reqs = append(reqs, keyHeldBy(t, c, a, 0, 1))
	}
	consume(t, c.Node(0), withHits(reqs, 50))
	waitReplicated(t, c, reqs)
	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged()
	consume(t, c.Node(0), withHits(reqs, 10))
	consume(t, c.Node(1), withHits(reqs, 20))
	c.StopHard(0)
	c.Restart(0)
	var without int
	for i, r := range c.Node(0).CheckMany(context.Background(), withHits(reqs, 5)) {
		if r.Err != nil || !r.Allowed {
			t.Fatalf("%s: allowed %v, err %v", reqs[i].Key, r.Allowed, r.Err)
		}
		if r.WithoutOwner {
			without++
		}
	}
	t.Logf("the restarted owner admitted 5 of each key, %d of %d keys without the owner", without, len(reqs))
	c.Heal()
	c.WaitConverged()
	exactly(t, c, reqs, 15)
	remainingAfter(t, c, reqs, 15)
}

// A partition {0}|{1,2,3} heals as node 2, which holds none of the keys,
// is killed: two keys of every heal algorithm held by nodes 1 and 3 (as
// owner and replica), 40 hits before, node 0 admits 20 of each standing in,
// node 1 10; the heal's hand-offs cross the failure of node 2 and the
// ring change it makes. Every key counts 70 once.
func TestAtk19bHealWhileANodeIsKilled(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 4, withReplicas(2))
	var reqs []limiter.Request
	for _, a := range healAlgorithms {
		n := 0
		for i := 0; i < 10_000 && n < 2; i++ {
			req := limiter.Request{Name: "healkill", Key: fmt.Sprintf("%s-%d", a, i), Hits: 1, Limit: 100, Period: 24 * time.Hour, Algorithm: a}
			var held []string
			for _, m := range c.Node(0).Replicas(req.Name, req.Key) {
				held = append(held, m.Name)
			}
			slices.Sort(held)
			if slices.Equal(held, []string{c.Node(1).Name(), c.Node(3).Name()}) {
				reqs = append(reqs, req)
				n++
			}
		}
		if n < 2 {
			t.Fatalf("%d keys of %s held by nodes 1 and 3", n, a)
		}
	}
	consume(t, c.Node(1), withHits(reqs, 40))
	waitReplicated(t, c, reqs)
	c.Partition([]int{0}, []int{1, 2, 3})
	c.WaitConverged()
	consume(t, c.Node(0), withHits(reqs, 20))
	consume(t, c.Node(1), withHits(reqs, 10))

	// Killed as the heal begins: the others see it fail while the sides
	// join and hand their states over.
	c.StopHard(2)
	c.Heal()
	c.WaitConverged()
	exactly(t, c, reqs, 30)
	remainingAfter(t, c, reqs, 30)
}

// Refunds during a partition of hits admitted during it: keys of every
// heal algorithm owned by node 1 (node 2 its replica), 50 hits before;
// {0}|{1,2}; node 0, standing in, admits 30 and gives 10 back; node 1
// admits 10, and gives 5 back or none; healed. Every key counts what its
// callers kept: its owner should admit 25 more (20 with no refund on
// the owner's side).
func TestAtk19bRefundsAcrossAPartition(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, ownerRefund := range []int64{0, 5} {
		t.Run(fmt.Sprintf("owner gives back %d", ownerRefund), func(t *testing.T) {
			refundsAcrossAPartition(t, ownerRefund)
		})
	}
}

func refundsAcrossAPartition(t *testing.T, ownerRefund int64) {
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2))
	var reqs []limiter.Request
	for _, a := range healAlgorithms {
		reqs = append(reqs, keyHeldBy(t, c, a, 1, 2))
	}
	consume(t, c.Node(1), withHits(reqs, 50))
	waitReplicated(t, c, reqs)
	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged()
	refund := func(nd *cluster.Node, hits int64) {
		t.Helper()
		rs := withHits(reqs, hits)
		for i := range rs {
			rs[i].Behavior = limiter.Refund
		}
		for i, r := range nd.CheckMany(context.Background(), rs) {
			if r.Err != nil || r.WithoutOwner {
				t.Fatalf("%s refund through %s: without owner %v, err %v", rs[i].Key, nd.Name(), r.WithoutOwner, r.Err)
			}
		}
	}
	consume(t, c.Node(0), withHits(reqs, 30))
	refund(c.Node(0), 10)
	consume(t, c.Node(1), withHits(reqs, 10))
	if ownerRefund > 0 {
		refund(c.Node(1), ownerRefund)
	}
	c.Heal()
	c.WaitConverged()
	// Every node that holds a key, its replica too, counts the 10 given
	// back through node 0 once, as its state does.
	want := 100 - (50 + 20 + 10 - ownerRefund)
	exactly(t, c, reqs, want)
	if err := testcluster.WaitFor(20*time.Second, func() error { return storesHold(c, []int{1, 2}, reqs, want) }); err != nil {
		t.Error(err)
	}
	if got := c.Node(0).Stats().Settle.StandInRefunded; got != 10*int64(len(reqs)) {
		t.Errorf("node 0 gave back %d hits off its parts, want %d", got, 10*len(reqs))
	}
	remainingAfter(t, c, reqs, int(want))
}

// storesHold reports the first key of reqs whose state in the store of a
// node of nodes (its owner or a replica) does not leave want remaining.
func storesHold(c *testcluster.Cluster, nodes []int, reqs []limiter.Request, want int64) error {
	for _, i := range nodes {
		for _, r := range withHits(reqs, 0) {
			d, err := c.Node(i).Store().CheckAt(r, time.Now())
			if err != nil || d.Remaining != want {
				return fmt.Errorf("%s's store holds %s (%s) with %d remaining (%v), want %d", c.Node(i).Name(), r.Key, r.Algorithm, d.Remaining, err, want)
			}
		}
	}
	return nil
}

// A refund of hits counted before the cut, on either side: keys of
// every heal algorithm owned by node 1 (node 2 its replica), 50 hits
// before; {1}|{0,2}; 20 of them given back through node 2 (standing in
// from its copy) or through node 1 (the owner); node 2 admits 5 and node
// 1 10; healed. Every key counts what its callers kept, 50-20+5+10: its
// owner should admit 55 more.
func TestAtk19bRefundOfHitsFromBeforeTheCut(t *testing.T) {
	skipNearDayEnd(t)
	for _, side := range []int{2, 1} {
		t.Run(fmt.Sprintf("through node %d", side), func(t *testing.T) {
			attackOpen(t, "under-admission: a refund during a partition of hits counted before it is lost at the heal when the other side's state, which still counts them, is the larger: the owner admits 35 of the 55 left (refunded through the stand-in) or 45 (through the owner), every heal algorithm")
			noLeaksAfter(t)
			c := testcluster.New(t, 3, withReplicas(2))
			var reqs []limiter.Request
			for _, a := range healAlgorithms {
				reqs = append(reqs, keyHeldBy(t, c, a, 1, 2))
			}
			consume(t, c.Node(1), withHits(reqs, 50))
			waitReplicated(t, c, reqs)
			c.Partition([]int{1}, []int{0, 2})
			c.WaitConverged()
			rs := withHits(reqs, 20)
			for i := range rs {
				rs[i].Behavior = limiter.Refund
			}
			for i, r := range c.Node(side).CheckMany(context.Background(), rs) {
				if r.Err != nil || r.WithoutOwner {
					t.Fatalf("%s refund: without owner %v, err %v", rs[i].Key, r.WithoutOwner, r.Err)
				}
			}
			consume(t, c.Node(2), withHits(reqs, 5))
			consume(t, c.Node(1), withHits(reqs, 10))
			c.Heal()
			c.WaitConverged()
			_ = testcluster.WaitFor(20*time.Second, func() error { return atMost(c, reqs, 55) })
			remainingAfter(t, c, reqs, 55)
		})
	}
}

// A stand-in that leaves gracefully while it is cut off alone: keys of
// every heal algorithm owned by node 1 (node 2 its replica), 50 hits
// before; {0}|{1,2}; node 0 admits 30 of each standing in, node 1 10;
// node 0 leaves, with no member on its side to hand its keys to, and the
// partition heals while it leaves. Its ring holds itself alone while
// members are cut off, so it is no last member: its leave waits for them
// (within LeaveTimeout) and hands them its states. The 30 it admitted were
// told to callers: every key counts 90, its owner admits 10 more.
func TestAtk19bStandinLeavesWhileCutOffAlone(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2), testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
		cfg.LeaveTimeout = testcluster.DefaultWait // Heal's wait: it ends once healed
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
	consume(t, c.Node(1), withHits(reqs, 10))
	leaver := c.Node(0)
	left := make(chan struct{})
	go func() {
		defer close(left)
		c.Leave(0) // reports its error
	}()
	if err := testcluster.WaitFor(10*time.Second, func() error {
		if slices.Contains(c.Nodes(), leaver) {
			return fmt.Errorf("node 0 has not begun to leave")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-left:
		t.Fatalf("node 0 left while cut off, with no member to hand its states to: %+v", leaver.Stats().Settle)
	default:
	}
	c.Heal()
	<-left
	t.Logf("node 0 left: %+v", leaver.Stats().Transfers)
	c.WaitConverged()
	exactly(t, c, reqs, 10)
	remainingAfter(t, c, reqs, 10)
}

// A node joins one side of an open partition: {0}|{1,2} after 50 hits
// (keys of every heal algorithm owned by node 1 or by node 0), 30 through
// node 0 and 10 through node 1; node 3 starts and joins one side only,
// node 0's or the owners', taking some of the keys a node of its side
// stands in for or owns (their stand-in parts travel with their states to
// it); 5 more through node 3 and 3 through node 1 (or node 0); healed:
// every key counts 98 once. Its neighbours: two joiners on one side (the
// second joined through the first, which learned the members cut off
// from node 0), one on each side, a joiner that leaves again before the
// heal (its states, with its parts, go back to its side's nodes), and
// node 0 leaving once the joiner learned from it (its states, with its
// parts, go to the joiner, which still stands in).
func TestAtk19bJoinOneSideOfAPartition(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	type joiner struct {
		seed  int // the node it joins through (3 and up: an earlier joiner)
		hits  int64
		leave bool // leaves gracefully before the heal
	}
	for _, tc := range []struct {
		name    string
		groups  [][]int
		joiners []joiner // nodes 3, 4, ...
		other   int      // the node of the other side that admits 3
		// seedLeaves: node 0, which the joiner learned the members cut
		// off from, leaves gracefully once the joiner joined.
		seedLeaves bool
	}{
		{"beside node 0", [][]int{{0, 3}, {1, 2}}, []joiner{{seed: 0, hits: 5}}, 1, false},
		{"beside nodes 1 and 2", [][]int{{0}, {1, 2, 3}}, []joiner{{seed: 1, hits: 5}}, 0, false},
		{"two beside node 0", [][]int{{0, 3, 4}, {1, 2}}, []joiner{{seed: 0, hits: 3}, {seed: 3, hits: 3}}, 1, false},
		{"two beside nodes 1 and 2", [][]int{{0}, {1, 2, 3, 4}}, []joiner{{seed: 2, hits: 3}, {seed: 3, hits: 3}}, 0, false},
		{"one on each side", [][]int{{0, 3}, {1, 2, 4}}, []joiner{{seed: 0, hits: 3}, {seed: 1, hits: 3}}, 1, false},
		{"beside node 0, gone before the heal", [][]int{{0, 3}, {1, 2}}, []joiner{{seed: 0, hits: 5, leave: true}}, 1, false},
		{"beside nodes 1 and 2, gone before the heal", [][]int{{0}, {1, 2, 3}}, []joiner{{seed: 1, hits: 5, leave: true}}, 0, false},
		{"beside node 0, which leaves", [][]int{{0, 3}, {1, 2}}, []joiner{{seed: 0, hits: 5}}, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			waitBound(t)
			noLeaksAfter(t)
			c, reqs := partitionedAfterFifty(t)
			for range tc.joiners {
				c.Add() // cut off from every node: in no group
			}
			c.Partition(tc.groups...)
			want := int64(100 - 90 - 3)
			for i, j := range tc.joiners {
				nd := c.Node(3 + i)
				if err := testcluster.WaitFor(time.Minute, func() error {
					_, err := nd.Join(c.Node(j.seed).GossipAddr())
					return err
				}); err != nil {
					t.Fatal(err)
				}
				want -= j.hits
			}
			c.WaitConverged()
			if tc.seedLeaves {
				c.Leave(0)
				c.WaitConverged()
			}
			for i, j := range tc.joiners {
				nd := c.Node(3 + i)
				owned := 0
				for _, r := range reqs {
					if m, ok := nd.Owner(r.Name, r.Key); ok && m.Name == nd.Name() {
						owned++
					}
				}
				t.Logf("%s owns %d of %d keys on its side", nd.Name(), owned, len(reqs))
				consume(t, nd, withHits(reqs, j.hits))
			}
			consume(t, c.Node(tc.other), withHits(reqs, 3))
			for i, j := range tc.joiners {
				if j.leave {
					c.Leave(3 + i)
					c.WaitConverged()
				}
			}
			c.Heal()
			c.WaitConverged()
			_ = testcluster.WaitFor(20*time.Second, func() error { return atMost(c, reqs, want) })
			for _, nd := range c.Nodes() {
				t.Logf("%s: %+v", nd.Name(), nd.Stats().Settle)
			}
			remainingAfter(t, c, reqs, int(want))
		})
	}
}

// A partition {0}|{1,2} heals under live traffic through nodes 0 and 1
// on keys of every algorithm owned by each of the three, while a fourth
// node joins or node 2 leaves gracefully: the stand-ins' states meet the
// ring change that follows the heal. Every key counts every hit admitted,
// at most one check per caller more (in flight at the cut). The heal's
// gossip may declare node 1 failed to the leaving node 2 for a moment,
// which leaves node 2 alone in its ring in the middle of its leave: it
// waits for node 1 rather than drop the states it holds.
func TestAtk19bHealWithARingChangeUnderTraffic(t *testing.T) {
	for _, change := range []string{"join", "leave"} {
		t.Run(change, func(t *testing.T) {
			noLeaksAfter(t)
			c := testcluster.New(t, 3, withReplicas(2))
			reqs := wideKeys(t, c, "healchange-"+change, []int{0, 1, 2}, 2)
			tr := startAllTraffic([]*cluster.Node{c.Node(0), c.Node(1)}, reqs, sluice.PolicyLocal)
			defer tr.finish()
			tr.checkedMore(t, 100)
			c.Partition([]int{0}, []int{1, 2})
			c.WaitConverged()
			tr.checkedMore(t, 300)
			var wg sync.WaitGroup
			wg.Add(1)
			leaver := c.Node(2)
			go func() {
				defer wg.Done()
				if change == "join" {
					c.Add()
				} else {
					c.Leave(2)
				}
			}()
			if change == "leave" {
				// Heal joins the live nodes: node 2 is not one once it
				// has begun to leave.
				if err := testcluster.WaitFor(10*time.Second, func() error {
					if slices.Contains(c.Nodes(), leaver) {
						return fmt.Errorf("node 2 has not begun to leave")
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			c.Heal()
			wg.Wait()
			c.WaitConverged()
			tr.checkedMore(t, 300)
			tr.finish()
			admitted := tr.counts()
			t.Logf("%d checks, %d errors, %d without the owner", tr.checks.Load(), tr.errs.Load(), tr.without.Load())
			over, under := settledTo(t, c, reqs, admitted, 2)
			t.Logf("%d hits admitted and not counted, %d counted and not admitted", over, under)
		})
	}
}

// Node 2 leaves gracefully as the partition {0}|{1,2} begins, under live
// traffic through nodes 0 and 1 on keys of every algorithm owned by each
// of the three: its passes go to owners on a ring that still holds node
// 0, cut off, until gossip declares node 0 failed; then healed. Node 0
// stands in for node 2's keys it takes, from its copies, while node 2's
// states go to node 1: it must go on standing in once it learns that
// node 2 left, or the heal's merge keeps the larger history, node 2's,
// without node 0's later decisions. Every key counts every hit admitted,
// at most one check per caller more (in flight at the cut).
func TestAtk19bLeaveAsThePartitionBegins(t *testing.T) {
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2))
	reqs := wideKeys(t, c, "leavecut", []int{0, 1, 2}, 2)
	tr := startAllTraffic([]*cluster.Node{c.Node(0), c.Node(1)}, reqs, sluice.PolicyLocal)
	defer tr.finish()
	tr.checkedMore(t, 300)
	c.Partition([]int{0}, []int{1, 2})
	c.Leave(2)
	c.WaitConverged()
	tr.checkedMore(t, 300)
	c.Heal()
	tr.checkedMore(t, 300)
	tr.finish()
	admitted := tr.counts()
	t.Logf("%d checks, %d errors, %d without the owner", tr.checks.Load(), tr.errs.Load(), tr.without.Load())
	over, under := settledTo(t, c, reqs, admitted, 2)
	t.Logf("%d hits admitted and not counted, %d counted and not admitted", over, under)
}

// The owner restarts from its DataDir while cut off, under live traffic:
// keys of every algorithm owned by each of three nodes, callers on every
// node; {0}|{1,2}; node 0 stops hard and starts again from its DataDir,
// still cut off, and callers check through it again; healed. Every key
// counts every hit admitted, at most one check per caller more (in
// flight at the cut), and node 0's callers' checks in flight when it
// stopped (answered to no caller) may count too.
func TestAtk19bOwnerRestartsWhileCutOffUnderTraffic(t *testing.T) {
	noLeaksAfter(t)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.Replicas, cfg.DataDir = 2, dirs[i]
	}))
	reqs := wideKeys(t, c, "ownerrestart", []int{0, 1, 2}, 2)
	tr := startAllTraffic([]*cluster.Node{c.Node(1), c.Node(2)}, reqs, sluice.PolicyLocal)
	defer tr.finish()
	tr0 := startAllTraffic([]*cluster.Node{c.Node(0)}, reqs, sluice.PolicyLocal)
	defer tr0.finish()
	tr.checkedMore(t, 100)
	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged()
	tr.checkedMore(t, 300)
	tr0.checkedMore(t, 300)
	c.StopHard(0)
	tr0.finish()
	c.Restart(0)
	tr0b := startAllTraffic([]*cluster.Node{c.Node(0)}, reqs, sluice.PolicyLocal)
	defer tr0b.finish()
	tr0b.checkedMore(t, 300)
	c.Heal()
	tr.checkedMore(t, 300)
	tr0b.checkedMore(t, 300)
	tr.finish()
	tr0b.finish()
	admitted := tr.counts()
	for i, n := range tr0.counts() {
		admitted[i] += n
	}
	for i, n := range tr0b.counts() {
		admitted[i] += n
	}
	t.Logf("%d checks (%d errors) through nodes 1 and 2, %d (%d errors) through node 0 before its restart, %d (%d errors) after",
		tr.checks.Load(), tr.errs.Load(), tr0.checks.Load(), tr0.errs.Load(), tr0b.checks.Load(), tr0b.errs.Load())
	records := standinRecords(c, reqs) // before settledTo spends the keys
	over, under := settledTo(t, c, reqs, admitted, 4)
	t.Logf("%d hits admitted and not counted, %d counted and not admitted", over, under)
	if over > 0 {
		for _, l := range records {
			t.Log(l)
		}
	}
}

// standinRecords describes, for a test that may find hits uncounted,
// each live node's settlement and transfer counters and, for every key of
// reqs, what its store counts and the stand-in parts and unsettled hits it
// holds: where the hits went.
func standinRecords(c *testcluster.Cluster, reqs []limiter.Request) []string {
	now := time.Now()
	var out []string
	for _, nd := range c.Nodes() {
		s := nd.Stats()
		out = append(out, fmt.Sprintf("%s: settle %+v; transfers %+v", nd.Name(), s.Settle, s.Transfers))
	}
	for _, r := range reqs {
		peek := r
		peek.Hits = 0
		for _, nd := range c.Nodes() {
			counted := int64(-1)
			if d, err := nd.Store().CheckAt(peek, now); err == nil {
				counted = r.Limit - d.Remaining
			}
			parts, gen := nd.StandinParts(r.Name, r.Key)
			owed, stored := nd.UnsettledHits(r.Name, r.Key)
			out = append(out, fmt.Sprintf("%s %s on %s: store counts %d; parts %v (open generation %d); unsettled %d (%d on its store)",
				r.Algorithm, r.Key, nd.Name(), counted, parts, gen, owed, stored))
		}
	}
	return out
}

// The owner is killed as the partition heals: keys of every heal
// algorithm owned by node 1 (node 2 its replica), 50 hits before;
// {0}|{1,2}; node 0 admits 30 standing in, node 1 10, which node 2's copy
// holds before node 1 is killed; healed at once, node 0's stand-in state
// meets node 2's copy, the key's new owner or replica. Every key counts
// 90 once.
func TestAtk19bOwnerKilledAsThePartitionHeals(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2))
	var reqs []limiter.Request
	for _, a := range healAlgorithms {
		reqs = append(reqs, keyHeldBy(t, c, a, 1, 2))
	}
	consume(t, c.Node(1), withHits(reqs, 50))
	waitReplicated(t, c, reqs)
	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged()
	consume(t, c.Node(0), withHits(reqs, 30))
	consume(t, c.Node(1), withHits(reqs, 10))
	// Node 2's copies hold the owner's 60: the kill forgets nothing.
	if err := testcluster.WaitFor(20*time.Second, func() error {
		for _, r := range withHits(reqs, 0) {
			d, err := c.Node(2).Store().CheckAt(r, time.Now())
			if err != nil || d.Remaining > 40 {
				return fmt.Errorf("node 2's copy of %s: %d remaining (%v)", r.Key, d.Remaining, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c.StopHard(1)
	c.Heal()
	c.WaitConverged()
	_ = testcluster.WaitFor(20*time.Second, func() error { return atMost(c, reqs, 10) })
	remainingAfter(t, c, reqs, 10)
}

// A limit raised on one side of a partition under live traffic (a rules
// rollout that reached node 0 first): keys of every algorithm owned by
// each of three nodes, callers on every node; {0}|{1,2}; node 0's
// callers check the keys under twice the limit, the others under the
// limit; healed, node 0's callers back on the limit. Counted under the
// limit, every key counts every hit admitted on both sides, at most one
// check per caller more (in flight at the cut).
func TestAtk19bLimitRaisedOnOneSideUnderTraffic(t *testing.T) {
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2))
	reqs := wideKeys(t, c, "limitside", []int{0, 1, 2}, 2)
	raised := slices.Clone(reqs)
	for i := range raised {
		raised[i].Limit *= 2
	}
	tr := startAllTraffic([]*cluster.Node{c.Node(1), c.Node(2)}, reqs, sluice.PolicyLocal)
	defer tr.finish()
	tr0 := startAllTraffic([]*cluster.Node{c.Node(0)}, reqs, sluice.PolicyLocal)
	defer tr0.finish()
	tr.checkedMore(t, 100)
	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged()
	tr0.finish()
	tr0r := startAllTraffic([]*cluster.Node{c.Node(0)}, raised, sluice.PolicyLocal)
	defer tr0r.finish()
	tr.checkedMore(t, 300)
	tr0r.checkedMore(t, 300)
	tr0r.finish()
	tr0b := startAllTraffic([]*cluster.Node{c.Node(0)}, reqs, sluice.PolicyLocal)
	defer tr0b.finish()
	c.Heal()
	tr.checkedMore(t, 300)
	tr0b.checkedMore(t, 300)
	tr.finish()
	tr0b.finish()
	admitted := tr.counts()
	for _, more := range [][]int64{tr0.counts(), tr0r.counts(), tr0b.counts()} {
		for i, n := range more {
			admitted[i] += n
		}
	}
	t.Logf("%d checks through nodes 1 and 2, %d through node 0 under twice the limit", tr.checks.Load(), tr0r.checks.Load())
	over, under := settledTo(t, c, reqs, admitted, 3)
	t.Logf("%d hits admitted and not counted, %d counted and not admitted", over, under)
}

// Five nodes healed a side at a time under live traffic through every
// node, on keys of every algorithm owned by each: {0}|{1}|{2,3,4}, then
// {0,1}|{2,3,4}, then {0,1,2}|{3,4}, then whole. Every key counts every hit
// admitted, and should count at most one check per caller per cut more:
// under the policy local (hits admitted without the owner and not
// settled yet travel as a part with every state of their key sent), in 2
// of 12 -race runs the keys counted 24 and 62 more (up to 27 on one
// key), which only SLUICE_ATTACK=1 fails on; under deny, 1 to 6 more.
func TestAtk19bFiveNodesHealedASideAtATime(t *testing.T) {
	for _, policy := range []sluice.Policy{sluice.PolicyLocal, sluice.PolicyDeny} {
		t.Run(policy.String(), func(t *testing.T) { fiveNodesHealedASideAtATime(t, policy) })
	}
}

func fiveNodesHealedASideAtATime(t *testing.T, policy sluice.Policy) {
	noLeaksAfter(t)
	c := testcluster.New(t, 5, withReplicas(2), testcluster.WithWait(time.Minute))
	reqs := wideKeys(t, c, "five-staged", []int{0, 1, 2, 3, 4}, 1)
	tr := startAllTraffic(c.Nodes(), reqs, policy)
	defer tr.finish()
	tr.checkedMore(t, 100)
	stages := [][][]int{
		{{0}, {1}, {2, 3, 4}},
		{{0, 1}, {2, 3, 4}},
		{{0, 1, 2}, {3, 4}},
	}
	for _, groups := range stages {
		c.Partition(groups...)
		c.WaitConverged()
		tr.checkedMore(t, 300)
	}
	c.Heal()
	tr.checkedMore(t, 300)
	tr.finish()
	admitted := tr.counts()
	t.Logf("%d checks, %d errors, %d without the owner", tr.checks.Load(), tr.errs.Load(), tr.without.Load())
	over, under := settledTo(t, c, reqs, admitted, int64(5*len(stages)))
	t.Logf("%d hits admitted and not counted, %d counted and not admitted", over, under)
}

// The stand-in leaves gracefully as soon as the partition has healed,
// while the heal's hand-offs may be on their way: keys of every heal
// algorithm owned by node 1 (node 2 its replica) or by node 0 (node 1
// its replica), 50 before, {0}|{1,2}, 30 through node 0 and 10 through
// node 1; healed; node 0 leaves. Every key counts 90 once.
func TestAtk19bStandinLeavesAsThePartitionHeals(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c, reqs := partitionedAfterFifty(t)
	c.Heal()
	c.Leave(0)
	c.WaitConverged()
	exactly(t, c, reqs, 10)
	remainingAfter(t, c, reqs, 10)
}
