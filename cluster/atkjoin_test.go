package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Attacks on the members a node learns cut off from hand-over
// confirmations (a joiner on one side of a partition), counted from the
// callers' side.

// confirmTo sends nd a hand-over confirmation that claims to come from
// the member named from and to hold cut off the members cut (name to gRPC
// address) and the newcomers.
func confirmTo(t *testing.T, nd *cluster.Node, from string, cut map[string]string, newcomers []string) {
	t.Helper()
	if err := tryConfirmTo(t, nd, from, cut, newcomers); err != nil {
		t.Fatal(err)
	}
}

// tryConfirmTo is confirmTo, returning the call's error.
func tryConfirmTo(t *testing.T, nd *cluster.Node, from string, cut map[string]string, newcomers []string) error {
	t.Helper()
	conn, err := grpc.NewClient(nd.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	in := &pb.TransferRequest{From: from, Reason: pb.TransferReason_TRANSFER_REASON_HANDOFF_DONE, SentUnixNano: time.Now().UnixNano(), Newcomers: newcomers}
	for name, addr := range cut {
		in.CutOff = append(in.CutOff, &pb.CutOffMember{Name: name, GrpcAddr: addr})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pb.NewPeerClient(conn).Transfer(ctx, in)
	return err
}

// A peer that claims to be node 1 tells node 0, in a healthy cluster, that
// a member "ghost" that never was is cut off and that nodes 1 and 2
// joined while it was: node 0 then takes itself for a newcomer and the
// ghost's share of the ring for keys it stands in for. Its callers must
// still be admitted the limit exactly, on keys of every owner through
// nodes 0 and 1.
func TestAtkJoinForgedCutOffReportAdmitsTheLimit(t *testing.T) {
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2))
	n0, n1, n2 := c.Node(0), c.Node(1), c.Node(2)
	forge := func() {
		confirmTo(t, n0, n1.Name(), map[string]string{"ghost": "127.0.0.1:9", n2.Name(): n2.GRPCAddr()}, []string{n1.Name(), n2.Name()})
	}
	forge()
	reqs := dailyKeys("forged", 30)
	consume(t, n0, withHits(reqs, 40))
	forge()
	consume(t, n1, withHits(reqs, 40))
	consume(t, n0, withHits(reqs, 5))
	for _, nd := range c.Nodes() {
		t.Logf("%s: %+v", nd.Name(), nd.Stats().Settle)
	}
	remainingAfter(t, c, reqs, 15)
}

// The same forged confirmation, sent again as often as the forger likes,
// holds node 0 standing in for a ghost's keys: each new key of the
// ghost's share takes an entry of the stand-in record, and once the
// record's bound (1 MiB) is reached node 0 refuses checks of keys whose
// owner, itself, is alive and reachable. Counted: the checks refused out
// of fresh keys node 0 owns, one hit each.
func TestAtkJoinForgedCutOffReportFillsTheStandInRecord(t *testing.T) {
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2))
	n0, n1 := c.Node(0), c.Node(1)
	forge := func() {
		confirmTo(t, n0, n1.Name(), map[string]string{"ghost": "127.0.0.1:9"}, []string{n1.Name(), c.Node(2).Name()})
	}
	const batch, keys = 500, 20_000
	checked, denied := 0, 0
	for b := 0; b < keys/batch; b++ {
		forge()
		var reqs []limiter.Request
		for i := 0; len(reqs) < batch; i++ {
			r := limiter.Request{Name: "fill", Key: fmt.Sprintf("b%d-%d", b, i), Hits: 1, Limit: 100, Period: 24 * time.Hour, Algorithm: limiter.TokenBucket}
			if m, ok := n0.Owner(r.Name, r.Key); ok && m.Name == n0.Name() {
				reqs = append(reqs, r)
			}
		}
		for _, r := range n0.CheckMany(context.Background(), reqs) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			checked++
			if !r.Allowed {
				denied++
			}
		}
	}
	st := n0.Stats().Settle
	t.Logf("node 0: %d of %d fresh keys of its own denied; %+v", denied, checked, st)
	if denied > 0 {
		attackOpen(t, fmt.Sprintf("a forged confirmation naming a ghost cut off: node 0 denies %d of %d checks of fresh keys it owns (record full)", denied, checked))
		t.Errorf("%d of %d fresh keys denied", denied, checked)
	}
}

// A node joins node 0's side of {0}|{1,2} and the partition heals at once,
// before the joiner learned anything from a confirmation; the joiner then
// consumes every key. Every key counts every hit admitted on each side
// and through the joiner.
func TestAtkJoinHealBeforeTheJoinerLearns(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c, reqs := partitionedAfterFifty(t)
	j := c.Add()
	c.Partition([]int{0, 3}, []int{1, 2})
	if err := testcluster.WaitFor(time.Minute, func() error {
		_, err := j.Join(c.Node(0).GossipAddr())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.Heal()
	consume(t, j, withHits(reqs, 5))
	consume(t, c.Node(1), withHits(reqs, 3))
	c.WaitConverged()
	want := int64(100 - 90 - 5 - 3)
	_ = testcluster.WaitFor(20*time.Second, func() error { return atMost(c, reqs, want) })
	for _, nd := range c.Nodes() {
		t.Logf("%s: %+v", nd.Name(), nd.Stats().Settle)
	}
	remainingAfter(t, c, reqs, int(want))
}

// With ClusterSecret, the forged confirmation of the attacks above is
// refused: a caller that proves no membership tells a node nothing cut
// off, and node 0 stands in for no key.
func TestAtkJoinForgedCutOffReportNeedsClusterSecret(t *testing.T) {
	noLeaksAfter(t)
	c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
		cfg.ClusterSecret = []byte("a secret the members share")
	}))
	n0, n1 := c.Node(0), c.Node(1)
	if err := tryConfirmTo(t, n0, n1.Name(), map[string]string{"ghost": "127.0.0.1:9"}, []string{n1.Name(), c.Node(2).Name()}); err == nil {
		t.Fatal("a forged confirmation was taken")
	}
	reqs := dailyKeys("secret", 30)
	consume(t, n0, withHits(reqs, 10))
	if st := n0.Stats().Settle; st.StandIn != 0 {
		t.Errorf("node 0 stood in for %d hits: %+v", st.StandIn, st)
	}
}

// Node 2 leaves as {0}|{1,2} begins, under traffic through nodes 0 and 1
// on keys of every algorithm owned by each node, and starts again under
// its name, empty, on its side (node 0 still holds it cut off: it left
// while cut off, and gossip has not forgotten it on node 0's side), then
// the partition heals. Every key counts every hit admitted, at most one
// check per caller more.
func TestAtkJoinLeaverRejoinsUnderItsNameWhileCutOff(t *testing.T) {
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2))
	reqs := wideKeys(t, c, "rejoincut", []int{0, 1, 2}, 2)
	tr := startAllTraffic([]*cluster.Node{c.Node(0), c.Node(1)}, reqs, sluice.PolicyLocal)
	defer tr.finish()
	tr.checkedMore(t, 300)
	c.Partition([]int{0}, []int{1, 2})
	c.Leave(2)
	c.WaitConverged()
	tr.checkedMore(t, 300)
	c.Partition([]int{0}, []int{1}) // node 2 starts cut off from every node
	nd := c.Restart(2)
	c.Partition([]int{0}, []int{1, 2})
	if err := testcluster.WaitFor(time.Minute, func() error {
		_, err := nd.Join(c.Node(1).GossipAddr())
		return err
	}); err != nil {
		t.Fatal(err)
	}
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

// During {0}|{1,2}, under traffic through nodes 0 and 1 on keys of every
// algorithm owned by each node, node 2 leaves gracefully while a new node
// joins side {1,2} at the same time; then the partition heals. Every key
// counts every hit admitted, at most one check per caller more.
func TestAtkJoinLeaveAndJoinAtOnceDuringAPartition(t *testing.T) {
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2))
	reqs := wideKeys(t, c, "leavejoin", []int{0, 1, 2}, 2)
	tr := startAllTraffic([]*cluster.Node{c.Node(0), c.Node(1)}, reqs, sluice.PolicyLocal)
	defer tr.finish()
	tr.checkedMore(t, 300)
	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged()
	tr.checkedMore(t, 300)
	j := c.Add() // node 3, cut off from every node
	c.Partition([]int{0}, []int{1, 2, 3})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.Leave(2)
	}()
	if err := testcluster.WaitFor(time.Minute, func() error {
		_, err := j.Join(c.Node(1).GossipAddr())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
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

// Node 2 leaves as {0}|{1,2} begins, and the partition heals: node 0,
// which learnt that node 2 left while cut off, holds it cut off until the
// heal's hand-over is over (its states delivered both ways), then lets it
// go. When node 1 forgot node 2 before the heal (serf's TombstoneTimeout:
// 2 s in the test profile), node 0 never learns the leave and holds node 2
// failed until gossip forgets it (ReconnectTimeout: 2 s here, 24 h by
// default), standing in meanwhile for the keys the ring with node 2 gives
// it. Node 0 is checked on fresh keys it owns, one hit each, as fast as it
// answers: counted, the checks refused once its stand-in record is full
// although no member is cut off from it but node 2.
func TestAtkJoinGoneLeaverFillsTheStandInRecordAfterTheHeal(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	noLeaksAfter(t)
	c := testcluster.New(t, 3, withReplicas(2))
	c.Partition([]int{0}, []int{1, 2})
	c.Leave(2)
	c.WaitConverged()
	c.Heal()
	n0 := c.Node(0)
	const batch, keys = 500, 20_000
	checked, denied := 0, 0
	for b := 0; b < keys/batch; b++ {
		var reqs []limiter.Request
		for i := 0; len(reqs) < batch; i++ {
			r := limiter.Request{Name: "gone", Key: fmt.Sprintf("b%d-%d", b, i), Hits: 1, Limit: 100, Period: 24 * time.Hour, Algorithm: limiter.TokenBucket}
			if m, ok := n0.Owner(r.Name, r.Key); ok && m.Name == n0.Name() {
				reqs = append(reqs, r)
			}
		}
		for _, r := range n0.CheckMany(context.Background(), reqs) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			checked++
			if !r.Allowed {
				denied++
			}
		}
	}
	st := n0.Stats().Settle
	t.Logf("node 0: %d of %d fresh keys of its own denied after the heal; %+v", denied, checked, st)
	if denied > 0 {
		attackOpen(t, fmt.Sprintf("node 2 left while cut off and node 1 forgot it before the heal: node 0 holds it failed and denies %d of %d checks of fresh keys it owns (record full)", denied, checked))
		t.Errorf("%d of %d fresh keys denied", denied, checked)
	}
}

// Node 2 leaves a cluster of three and every node forgets it (serf's
// TombstoneTimeout); then a leave intent of its name goes round again, as
// a push/pull with a node that had not forgotten it yet, or a
// rebroadcast, brings it to a node that had, and node 2 starts again under
// its name. serf lists it leaving on the nodes that hold the intent, then
// alive, with no event, once its join intent comes: every node must take
// it into its ring (the restart waits for it a minute).
func TestJoinUnderANameWithARecentLeaveIntent(t *testing.T) {
	noLeaksAfter(t)
	c := testcluster.New(t, 3)
	name := c.Node(2).Name()
	c.Leave(2)
	c.WaitConverged()
	if err := testcluster.WaitFor(time.Minute, func() error {
		for _, nd := range c.Nodes() {
			for _, m := range nd.Members() {
				if m.Name == name {
					return fmt.Errorf("%s lists %s %s", nd.Name(), name, m.Status)
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Node(0).ForceLeave(name); err != nil {
		t.Fatal(err)
	}
	c.Restart(2)
}

// Node 3 leaves a cluster of four; {0}|{1,2} begins under traffic through
// nodes 0 and 1 on keys of every algorithm owned by each node; node 3
// starts again under its old name, empty, and joins node 0's side; then
// the partition heals. Every key counts every hit admitted, at most one
// check per caller more.
func TestAtkJoinUnderTheNameOfAMemberThatLeft(t *testing.T) {
	attackOpen(t, "node 3 rejoining under its old name on one side of a partition under traffic: 554 and 632 admitted hits uncounted on two keys node 1 owns (node 0's at the cut) in 1 of 7 plain runs, about 20,600 counted too many on each of three keys in another; 0 uncounted in 3 of 3 -race runs that finished (a fourth: the callers made 96 checks in the minute after the heal)")
	noLeaksAfter(t)
	c := testcluster.New(t, 4, withReplicas(2))
	reqs := wideKeys(t, c, "oldname", []int{0, 1, 2, 3}, 2)
	c.Leave(3)
	c.WaitConverged()
	tr := startAllTraffic([]*cluster.Node{c.Node(0), c.Node(1)}, reqs, sluice.PolicyLocal)
	defer tr.finish()
	tr.checkedMore(t, 300)
	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged()
	tr.checkedMore(t, 300)
	c.Partition([]int{0, 3}, []int{1, 2})
	c.Restart(3)
	tr.checkedMore(t, 300)
	c.Heal()
	tr.checkedMore(t, 300)
	tr.finish()
	admitted := tr.counts()
	t.Logf("%d checks, %d errors, %d without the owner", tr.checks.Load(), tr.errs.Load(), tr.without.Load())
	over, under := settledTo(t, c, reqs, admitted, 2)
	t.Logf("%d hits admitted and not counted, %d counted and not admitted", over, under)
}
