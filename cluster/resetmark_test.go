package cluster_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/testcluster"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// A reset's mark travels with its key: on the node that decides the key
// after a join, a failover or a restart from the data directory, a refund
// naming a charge made before the reset gives nothing back of the hits
// charged since, and a refund of a charge made since gives its hits back.

// markCase is a key of 10 a day charged 3 (mine) on its owner, then reset
// there with resetHits (0: the state is left fresh, and the mark travels
// alone).
type markCase struct {
	req       limiter.Request
	resetHits int64
	mine      limiter.Window
}

// markCases returns a case of every algorithm and of both resets, each
// key chosen by pick (nil: any key) among keys named name.
func markCases(t *testing.T, name string, pick func(req limiter.Request) bool) []markCase {
	t.Helper()
	var out []markCase
	for _, a := range allAlgorithms {
		for _, hits := range []int64{0, 1} {
			found := false
			for i := range 10_000 {
				req := limiter.Request{Name: name, Key: fmt.Sprintf("%s-%d-%d", a, hits, i), Limit: 10, Period: 24 * time.Hour, Algorithm: a}
				if pick == nil || pick(req) {
					out = append(out, markCase{req: req, resetHits: hits})
					found = true
					break
				}
			}
			if !found {
				t.Fatalf("no key of %s for the test", a)
			}
		}
	}
	return out
}

// markCheck decides req with hits, behavior and charged on nd, which
// must decide it as the owner.
func markCheck(t *testing.T, nd *cluster.Node, req limiter.Request, hits int64, b limiter.Behavior, charged limiter.Window) limiter.Decision {
	t.Helper()
	req.Hits, req.Behavior, req.Charged = hits, b, charged
	d, err := nd.Check(context.Background(), req)
	if err != nil || d.WithoutOwner || d.Owner != nd.Name() {
		t.Fatalf("%s on %s (hits %d, behavior %v): %+v, %v", req.Key, nd.Name(), hits, b, d, err)
	}
	return d.Decision
}

// chargeAndReset charges each case's mine on its owner in c, then resets
// the key there.
func chargeAndReset(t *testing.T, c *testcluster.Cluster, cases []markCase) {
	t.Helper()
	for i := range cases {
		k := &cases[i]
		owner := c.Owner(k.req.Name, k.req.Key)
		d := markCheck(t, owner, k.req, 3, 0, limiter.Window{})
		if !d.Allowed || d.Window.IsZero() {
			t.Fatalf("%s: charging 3: %+v", k.req.Key, d)
		}
		k.mine = d.Window
		if d := markCheck(t, owner, k.req, k.resetHits, limiter.Reset, limiter.Window{}); d.Remaining != 10-k.resetHits {
			t.Fatalf("%s: the reset: %+v", k.req.Key, d)
		}
	}
}

// marked reports the first case whose key nd's store holds no reset mark
// of.
func marked(nd *cluster.Node, cases []markCase) error {
	held := map[string]bool{}
	nd.Store().Range(time.Now(), func(s limiter.Snapshot) bool {
		if s.HasResetMark() {
			held[s.Name+"/"+s.Key] = true
		}
		return true
	})
	for _, k := range cases {
		if !held[k.req.Name+"/"+k.req.Key] {
			return fmt.Errorf("%s holds no reset mark of %s", nd.Name(), k.req.Key)
		}
	}
	return nil
}

// refundsAfterReset checks each case on the node that owns its key in c:
// others charge 4, then a refund naming mine gives nothing back, and a
// refund of the others' 4 gives them back.
func refundsAfterReset(t *testing.T, c *testcluster.Cluster, cases []markCase) {
	t.Helper()
	for _, k := range cases {
		nd := c.Owner(k.req.Name, k.req.Key)
		want := 10 - k.resetHits - 4
		theirs := markCheck(t, nd, k.req, 4, 0, limiter.Window{})
		if !theirs.Allowed || theirs.Remaining != want {
			t.Errorf("%s (%s, reset with %d) on %s: the others' 4 after the reset: %+v, want remaining %d",
				k.req.Key, k.req.Algorithm, k.resetHits, nd.Name(), theirs, want)
			continue
		}
		if d := markCheck(t, nd, k.req, 3, limiter.Refund, k.mine); d.Remaining != want {
			t.Errorf("%s (%s, reset with %d) on %s: the refund of the 3 charged before the reset: remaining %d, want %d (nothing back)",
				k.req.Key, k.req.Algorithm, k.resetHits, nd.Name(), d.Remaining, want)
		}
		if d := markCheck(t, nd, k.req, 4, limiter.Refund, theirs.Window); d.Remaining != want+4 {
			t.Errorf("%s (%s, reset with %d) on %s: the refund of the 4 charged after the reset: remaining %d, want %d",
				k.req.Key, k.req.Algorithm, k.resetHits, nd.Name(), d.Remaining, want+4)
		}
	}
}

// ringWith returns the ring of members.
func ringWith(t *testing.T, members []ring.Member) *ring.Ring {
	t.Helper()
	r, err := ring.New(cluster.TestConfig("x").Ring)
	if err == nil {
		err = r.SetMembers(members)
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestResetMarkAcrossAJoin: keys reset on their owners in a cluster of
// two, which a third node joining takes over (no replicas: the hand-off
// alone carries them).
func TestResetMarkAcrossAJoin(t *testing.T) {
	skipNearDayEnd(t)
	c := testcluster.New(t, 2, withReplicas(1))
	after := ringWith(t, append(c.Node(0).RingMembers(), ring.Member{Name: "node-2"}))
	cases := markCases(t, "markjoin", func(req limiter.Request) bool {
		o, _ := after.Owner(req.Name, req.Key)
		return o.Name == "node-2"
	})
	chargeAndReset(t, c, cases)
	added := c.Add()
	for _, k := range cases {
		if o := c.Owner(k.req.Name, k.req.Key); o != added {
			t.Fatalf("%s is owned by %s, want the added %s", k.req.Key, o.Name(), added.Name())
		}
	}
	if err := testcluster.WaitFor(10*time.Second, func() error { return marked(added, cases) }); err != nil {
		t.Errorf("after the join: %v", err)
	}
	refundsAfterReset(t, c, cases)
}

// failoverCases returns the cases of markCases whose keys node 0 of c
// owns, node 1 holds the copy of, and node 1 owns without node 0.
func failoverCases(t *testing.T, c *testcluster.Cluster, name string) []markCase {
	t.Helper()
	rest := slices.DeleteFunc(c.Node(0).RingMembers(), func(m ring.Member) bool { return m.Name == c.Node(0).Name() })
	after := ringWith(t, rest)
	return markCases(t, name, func(req limiter.Request) bool {
		rs := c.Node(0).Replicas(req.Name, req.Key)
		o, _ := after.Owner(req.Name, req.Key)
		return len(rs) == 2 && rs[0].Name == c.Node(0).Name() && rs[1].Name == c.Node(1).Name() && o.Name == c.Node(1).Name()
	})
}

// TestResetMarkAcrossAFailover: keys reset on node 0, whose replica node
// 1 takes them over once node 0 is killed hard, after the copies of the
// reset states have reached it.
func TestResetMarkAcrossAFailover(t *testing.T) {
	skipNearDayEnd(t)
	c := testcluster.New(t, 3, withReplicas(2))
	cases := failoverCases(t, c, "markfail")
	chargeAndReset(t, c, cases)
	err := testcluster.WaitFor(10*time.Second, func() error {
		for _, k := range cases {
			if _, ok := c.Node(1).Store().Snapshot(k.req.Name, k.req.Key, time.Now()); k.resetHits > 0 && !ok {
				return fmt.Errorf("%s holds no copy of %s", c.Node(1).Name(), k.req.Key)
			}
		}
		return marked(c.Node(1), cases)
	})
	if err != nil {
		t.Errorf("before the kill: %v", err)
	}
	c.StopHard(0)
	c.WaitConverged()
	for _, k := range cases {
		if o := c.Owner(k.req.Name, k.req.Key); o != c.Node(1) {
			t.Fatalf("%s is owned by %s, want the replica %s", k.req.Key, o.Name(), c.Node(1).Name())
		}
	}
	refundsAfterReset(t, c, cases)
}

// TestResetMarkBeforeTheFirstCopy: keys reset with 0 hits on node 0,
// which replicates no copy in the test's time (ReplicateInterval an
// hour): the reset itself, sent to the replica at once, carries the mark,
// and node 1 keeps it once node 0 is killed hard.
func TestResetMarkBeforeTheFirstCopy(t *testing.T) {
	skipNearDayEnd(t)
	c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
		cfg.Replicas, cfg.ReplicateInterval = 2, time.Hour
	}))
	cases := slices.DeleteFunc(failoverCases(t, c, "markfirst"), func(k markCase) bool { return k.resetHits > 0 })
	chargeAndReset(t, c, cases)
	if err := testcluster.WaitFor(10*time.Second, func() error { return marked(c.Node(1), cases) }); err != nil {
		t.Errorf("before the kill: %v", err)
	}
	c.StopHard(0)
	c.WaitConverged()
	for _, k := range cases {
		if o := c.Owner(k.req.Name, k.req.Key); o != c.Node(1) {
			t.Fatalf("%s is owned by %s, want the replica %s", k.req.Key, o.Name(), c.Node(1).Name())
		}
	}
	refundsAfterReset(t, c, cases)
}

// TestResetMarkAcrossARestart: keys reset on their owners, then every
// node stopped gracefully, one after another, and a cluster started on
// their data directories; alone, the node's own state file carries them.
func TestResetMarkAcrossARestart(t *testing.T) {
	skipNearDayEnd(t)
	for _, nodes := range []int{1, 3} {
		t.Run(fmt.Sprintf("nodes=%d", nodes), func(t *testing.T) {
			dirs := make([]string, nodes)
			for i := range dirs {
				dirs[i] = t.TempDir()
			}
			withDirs := testcluster.WithConfig(func(i int, c *cluster.Config) { c.DataDir = dirs[i] })
			c := testcluster.New(t, nodes, withDirs)
			cases := markCases(t, "markrestart", nil)
			chargeAndReset(t, c, cases)
			for i := range nodes {
				c.Leave(i)
			}
			again := testcluster.New(t, nodes, withDirs)
			var restored int64
			for _, nd := range again.Nodes() {
				restored += nd.Stats().Persist.Restored
			}
			if restored < int64(len(cases)) {
				t.Errorf("%d states restored, want at least the %d keys reset", restored, len(cases))
			}
			refundsAfterReset(t, again, cases)
		})
	}
}

// TestForgedResetMarksFromAPeer: a peer hands off marks no node could
// have written (an instant far ahead, an end past any state's life,
// inverted, negative, the largest instant, a mark alone carrying a
// state): each is refused and counted, nothing panics, and the key's
// count stands. A mark within the bounds, however far ahead, is taken
// and lowers no count: it only keeps refunds from giving hits back.
func TestForgedResetMarksFromAPeer(t *testing.T) {
	c := testcluster.New(t, 1)
	nd := c.Node(0)
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			req := limiter.Request{Name: "forged", Key: a.String(), Limit: 10, Period: 24 * time.Hour, Algorithm: a}
			mine := markCheck(t, nd, req, 9, 0, limiter.Window{})
			now := time.Now().UnixNano()
			live, ok := nd.Store().Snapshot(req.Name, req.Key, time.Now())
			if !ok {
				t.Fatal("no state")
			}
			alone := limiter.Snapshot{Name: req.Name, Key: req.Key, Algorithm: a}
			var states []*pb.KeyState
			for _, f := range []struct {
				base      limiter.Snapshot
				at, until int64
			}{
				{live, time.Date(2116, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano(), time.Date(2116, 1, 2, 0, 0, 0, 0, time.UTC).UnixNano()},
				{alone, now, math.MaxInt64},
				{live, now, now - 1},
				{alone, -1, now},
				{alone, math.MaxInt64 - 1, math.MaxInt64},
				{live, 0, now + int64(time.Hour)},
			} {
				s := f.base
				s.ResetAt, s.ResetUntil = f.at, f.until
				states = append(states, transport.SnapshotToProto(&s))
			}
			withWords := transport.SnapshotToProto(&live)
			withWords.ExpireAtUnixNano, withWords.State = 0, nil
			withWords.ResetAtUnixNano, withWords.ResetUntilUnixNano = now, now+int64(time.Hour)
			states = append(states, withWords)
			resp := handOffTo(t, nd, states)
			if int(resp.Rejected) != len(states) || resp.Merged != 0 {
				t.Errorf("forged marks: merged %d, rejected %d, want all %d rejected", resp.Merged, resp.Rejected, len(states))
			}
			if d := markCheck(t, nd, req, 0, 0, limiter.Window{}); d.Remaining != 1 {
				t.Fatalf("after forged marks: remaining %d, want 1", d.Remaining)
			}
			// The furthest a mark may reach, alone: taken, no count lower.
			far := limiter.Snapshot{Name: req.Name, Key: req.Key, Algorithm: a,
				ResetAt: now + int64(limiter.MaxClockSkew) - int64(time.Second), ResetUntil: now + int64(limiter.MaxStateLife)}
			if resp := handOffTo(t, nd, []*pb.KeyState{transport.SnapshotToProto(&far)}); resp.Rejected != 0 {
				t.Errorf("a mark within the bounds was rejected: %+v", resp)
			}
			if d := markCheck(t, nd, req, 0, 0, limiter.Window{}); d.Remaining != 1 {
				t.Fatalf("after a mark ahead: remaining %d, want 1", d.Remaining)
			}
			if d := markCheck(t, nd, req, 9, limiter.Refund, mine.Window); d.Remaining != 1 {
				t.Errorf("a refund after a mark ahead: remaining %d, want 1 (nothing back)", d.Remaining)
			}
		})
	}
}

// handOffTo sends states to nd as a hand-off from a peer named mallory.
func handOffTo(t *testing.T, nd *cluster.Node, states []*pb.KeyState) *pb.TransferResponse {
	t.Helper()
	conn, err := grpc.NewClient(nd.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := pb.NewPeerClient(conn).Transfer(ctx, &pb.TransferRequest{From: "mallory", Reason: pb.TransferReason_TRANSFER_REASON_HANDOFF,
		SentUnixNano: time.Now().UnixNano(), States: states})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
