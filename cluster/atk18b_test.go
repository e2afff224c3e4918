package cluster_test

import (
	"context"
	"fmt"
	"math"
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

// transferTo sends states to nd as a Transfer of reason from the peer
// named from.
func transferTo(t *testing.T, nd interface{ GRPCAddr() string }, from string, reason pb.TransferReason, states []*pb.KeyState) *pb.TransferResponse {
	t.Helper()
	conn, err := grpc.NewClient(nd.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := pb.NewPeerClient(conn).Transfer(ctx, &pb.TransferRequest{From: from, Reason: reason,
		SentUnixNano: time.Now().UnixNano(), States: states})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestAtk18bResetFromANonOwner: a key its owner (node 0) holds at 9 of
// 10 is "reset" by a Transfer of reason RESET that the owner did not
// send: from a peer that is no member, and from the other member, which
// owns no part of the key, with a mark and without. A reset message only
// drops a replica's copy; the owner's count must stand.
func TestAtk18bResetFromANonOwner(t *testing.T) {
	skipNearDayEnd(t)
	c := testcluster.New(t, 2, withReplicas(1))
	owner := c.Node(0)
	for _, a := range allAlgorithms {
		for _, from := range []string{"mallory", c.Node(1).Name()} {
			for _, withMark := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/mark=%v", a, from, withMark), func(t *testing.T) {
					var req limiter.Request
					for i := range 10_000 {
						req = limiter.Request{Name: "atk18b", Key: fmt.Sprintf("%s-%s-%v-%d", a, from, withMark, i), Limit: 10, Period: 24 * time.Hour, Algorithm: a}
						if c.Owner(req.Name, req.Key) == owner {
							break
						}
					}
					markCheck(t, owner, req, 9, 0, limiter.Window{})
					sn := limiter.Snapshot{Name: req.Name, Key: req.Key, Algorithm: a}
					if withMark {
						now := time.Now().UnixNano()
						sn.ResetAt, sn.ResetUntil = now, now+int64(time.Hour)
					}
					resp := transferTo(t, owner, from, pb.TransferReason_TRANSFER_REASON_RESET, []*pb.KeyState{transport.SnapshotToProto(&sn)})
					if d := markCheck(t, owner, req, 0, 0, limiter.Window{}); d.Remaining != 1 {
						t.Errorf("after a reset message from %s (response %+v): remaining %d, want 1 (%d hits dropped)", from, resp, d.Remaining, d.Remaining-1)
					}
				})
			}
		}
	}
}

// TestAtk18bResetJoinResetRefunds: keys charged 3 (era 1) and reset on
// their owner in a cluster of two, charged 2 more (era 2), then taken
// over by a third node joining; the new owner charges 1 (era 2 too),
// resets the keys with 0 hits, and others charge 4 (era 3). Refunds of
// each earlier era's charge give nothing back of the others' 4; theirs
// gives their 4 back.
func TestAtk18bResetJoinResetRefunds(t *testing.T) {
	skipNearDayEnd(t)
	c := testcluster.New(t, 2, withReplicas(1))
	after := ringWith(t, append(c.Node(0).RingMembers(), ring.Member{Name: "node-2"}))
	cases := markCases(t, "atk18bjoin", func(req limiter.Request) bool {
		o, _ := after.Owner(req.Name, req.Key)
		return o.Name == "node-2"
	})
	chargeAndReset(t, c, cases)
	era2 := make([]limiter.Window, len(cases))
	for i, k := range cases {
		d := markCheck(t, c.Owner(k.req.Name, k.req.Key), k.req, 2, 0, limiter.Window{})
		if !d.Allowed {
			t.Fatalf("%s: era 2's charge: %+v", k.req.Key, d)
		}
		era2[i] = d.Window
	}
	added := c.Add()
	for _, k := range cases {
		if o := c.Owner(k.req.Name, k.req.Key); o != added {
			t.Fatalf("%s is owned by %s, want the added %s", k.req.Key, o.Name(), added.Name())
		}
	}
	if err := testcluster.WaitFor(10*time.Second, func() error { return marked(added, cases) }); err != nil {
		t.Fatalf("after the join: %v", err)
	}
	for i, k := range cases {
		era2b := markCheck(t, added, k.req, 1, 0, limiter.Window{})
		if want := 10 - k.resetHits - 3; !era2b.Allowed || era2b.Remaining != want {
			t.Errorf("%s (%s, reset with %d): era 2 on the new owner: %+v, want remaining %d (the hand-off lost or added hits)", k.req.Key, k.req.Algorithm, k.resetHits, era2b, want)
			continue
		}
		if d := markCheck(t, added, k.req, 0, limiter.Reset, limiter.Window{}); d.Remaining != 10 {
			t.Fatalf("%s: the second reset: %+v", k.req.Key, d)
		}
		theirs := markCheck(t, added, k.req, 4, 0, limiter.Window{})
		if !theirs.Allowed || theirs.Remaining != 6 {
			t.Errorf("%s: the others' 4 after the second reset: %+v", k.req.Key, theirs)
			continue
		}
		for _, r := range []struct {
			name string
			hits int64
			w    limiter.Window
		}{{"era 1 (on the old owner, before both resets)", 3, k.mine}, {"era 2 (on the old owner)", 2, era2[i]}, {"era 2 (on the new owner)", 1, era2b.Window}} {
			if d := markCheck(t, added, k.req, r.hits, limiter.Refund, r.w); d.Remaining != 6 {
				t.Errorf("%s (%s, reset with %d): refund of %s: remaining %d, want 6 (nothing back)", k.req.Key, k.req.Algorithm, k.resetHits, r.name, d.Remaining)
			}
		}
		if d := markCheck(t, added, k.req, 4, limiter.Refund, theirs.Window); d.Remaining != 10 {
			t.Errorf("%s (%s, reset with %d): refund of the others' 4: remaining %d, want 10", k.req.Key, k.req.Algorithm, k.resetHits, d.Remaining)
		}
	}
}

// TestAtk18bResetMarkAcrossARestartWithTheClockOff: keys charged 3 and
// reset on a node with a data directory, which is stopped and started
// again with its clock an hour behind, or an hour ahead. Others charge 4
// after the restart (counting at least those): a refund naming the 3 the
// reset cleared gives nothing back, and one of the others' 4 gives back
// at most 4.
func TestAtk18bResetMarkAcrossARestartWithTheClockOff(t *testing.T) {
	skipNearDayEnd(t)
	if day := time.Now().Truncate(24 * time.Hour); time.Until(day.Add(24*time.Hour)) < 70*time.Minute || time.Since(day) < 70*time.Minute {
		t.Skip("an hour's step would cross the day's window")
	}
	for _, off := range []time.Duration{-time.Hour, time.Hour} {
		t.Run(off.String(), func(t *testing.T) {
			dir := t.TempDir()
			withDir := testcluster.WithConfig(func(_ int, c *cluster.Config) { c.DataDir = dir })
			c := testcluster.New(t, 1, withDir)
			cases := markCases(t, "atk18brestart", nil)
			chargeAndReset(t, c, cases)
			c.Leave(0)
			again := testcluster.New(t, 1, withDir, testcluster.WithClockOffsets(off))
			nd := again.Node(0)
			if r := nd.Stats().Persist.Restored; r < int64(len(cases)) {
				t.Errorf("%d states restored, want at least %d", r, len(cases))
			}
			for _, k := range cases {
				exact := 10 - k.resetHits - 4
				theirs := markCheck(t, nd, k.req, 4, 0, limiter.Window{})
				if !theirs.Allowed || theirs.Remaining > exact {
					t.Errorf("%s (%s, reset with %d): the others' 4 after the restart: %+v, want remaining at most %d", k.req.Key, k.req.Algorithm, k.resetHits, theirs, exact)
					continue
				}
				want := theirs.Remaining
				if want != exact {
					// A GCRA arrival time written on the clock ahead reads
					// as hits spent: counting too much.
					t.Logf("%s (%s, reset with %d), clock %v: the others' 4 left %d, %d counted more than exact", k.req.Key, k.req.Algorithm, k.resetHits, off, want, exact-want)
				}
				if d := markCheck(t, nd, k.req, 3, limiter.Refund, k.mine); d.Remaining != want {
					t.Errorf("%s (%s, reset with %d): refund of the 3 the reset cleared, clock %v: remaining %d, want %d (nothing back)", k.req.Key, k.req.Algorithm, k.resetHits, off, d.Remaining, want)
				}
				d := markCheck(t, nd, k.req, 4, limiter.Refund, theirs.Window)
				if d.Remaining > want+4 {
					t.Errorf("%s: refund of the others' 4: remaining %d, more than %d", k.req.Key, d.Remaining, want+4)
				}
				if d.Remaining != want+4 {
					t.Logf("%s (%s, reset with %d), clock %v: refund of the others' 4 gave back %d (counting too much)", k.req.Key, k.req.Algorithm, k.resetHits, off, d.Remaining-want)
				}
			}
		})
	}
}

// TestAtk18bForgedMarksAsResetsAndCopies: the marks
// TestForgedResetMarksFromAPeer hands off, sent instead as a replica's
// copy and as a reset, from the key's owner's own name, to the node
// holding the key's copy (node 1) and to its owner (node 0): each is
// refused and counted, nothing panics, and neither node's count of the
// key changes.
func TestAtk18bForgedMarksAsResetsAndCopies(t *testing.T) {
	skipNearDayEnd(t)
	c := testcluster.New(t, 2, withReplicas(2))
	owner, replica := c.Node(0), c.Node(1)
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			var req limiter.Request
			for i := range 10_000 {
				req = limiter.Request{Name: "atk18bforged", Key: fmt.Sprintf("%s-%d", a, i), Limit: 10, Period: 24 * time.Hour, Algorithm: a}
				if c.Owner(req.Name, req.Key) == owner {
					break
				}
			}
			markCheck(t, owner, req, 9, 0, limiter.Window{})
			err := testcluster.WaitFor(10*time.Second, func() error {
				if _, ok := replica.Store().Snapshot(req.Name, req.Key, time.Now()); !ok {
					return fmt.Errorf("%s holds no copy of %s", replica.Name(), req.Key)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now().UnixNano()
			live, _ := owner.Store().Snapshot(req.Name, req.Key, time.Now())
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
			for _, reason := range []pb.TransferReason{pb.TransferReason_TRANSFER_REASON_REPLICA, pb.TransferReason_TRANSFER_REASON_RESET} {
				for _, to := range []*cluster.Node{owner, replica} {
					copyBefore, _ := replica.Store().Snapshot(req.Name, req.Key, time.Now())
					resp := transferTo(t, to, owner.Name(), reason, states)
					if int(resp.Rejected) < len(states)-1 {
						// A reset from the key's owner to its replica drops
						// the copy, whatever marks it carries; the rest must
						// be refused.
						t.Errorf("%v to %s: merged %d, rejected %d of %d forged marks", reason, to.Name(), resp.Merged, resp.Rejected, len(states))
					}
					if d := markCheck(t, owner, req, 0, 0, limiter.Window{}); d.Remaining != 1 {
						t.Fatalf("%v to %s: the owner's count: remaining %d, want 1", reason, to.Name(), d.Remaining)
					}
					if reason == pb.TransferReason_TRANSFER_REASON_REPLICA {
						after, ok := replica.Store().Snapshot(req.Name, req.Key, time.Now())
						if !ok || after.ExpireAt < copyBefore.ExpireAt {
							t.Errorf("%v to %s: the replica's copy %+v (held %v), was %+v", reason, to.Name(), after, ok, copyBefore)
						}
					}
				}
			}
		})
	}
}

// TestAtk18bStandInResetDuringAPartition: keys of limit 100 a day, owned
// by node 0 with a copy on node 1, charged 3 (mine) and replicated; the
// cluster is cut into {0} | {1,2}. The owner resets each key and charges
// 2; on the other side the stand-in charges 2, resets the key itself and
// charges 1. Healed and settled, the owner counts at least its own 2 and
// the stand-in's 1 since their resets; once others charge 4 there, a
// refund naming mine or the stand-in's charge before its reset gives
// nothing back, and one naming the owner's 2 or the stand-in's 1 since
// gives back at most those.
func TestAtk18bStandInResetDuringAPartition(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	c := testcluster.New(t, 3, withReplicas(2))
	var reqs []limiter.Request
	for _, a := range healAlgorithms {
		reqs = append(reqs, keyHeldBy(t, c, a, 0, 1))
	}
	type era struct{ mine, owner2, s1, s2 limiter.Decision }
	eras := make([]era, len(reqs))
	check := func(nd *cluster.Node, r limiter.Request, hits int64, b limiter.Behavior, charged limiter.Window) limiter.Decision {
		t.Helper()
		r.Hits, r.Behavior, r.Charged = hits, b, charged
		d, err := nd.Check(context.Background(), r)
		if err != nil || d.WithoutOwner {
			t.Fatalf("%s on %s (hits %d, behavior %v): %+v, %v", r.Key, nd.Name(), hits, b, d, err)
		}
		return d.Decision
	}
	for i, r := range reqs {
		eras[i].mine = check(c.Node(0), r, 3, 0, limiter.Window{})
	}
	waitReplicated(t, c, reqs)
	c.Partition([]int{0}, []int{1, 2})
	c.WaitConverged()
	for i, r := range reqs {
		check(c.Node(0), r, 0, limiter.Reset, limiter.Window{})
		eras[i].owner2 = check(c.Node(0), r, 2, 0, limiter.Window{})
		eras[i].s1 = check(c.Node(1), r, 2, 0, limiter.Window{})
		check(c.Node(1), r, 0, limiter.Reset, limiter.Window{})
		eras[i].s2 = check(c.Node(1), r, 1, 0, limiter.Window{})
		if eras[i].s2.Remaining != 99 {
			t.Errorf("%s (%s): the stand-in after its reset: %+v, want remaining 99", r.Key, r.Algorithm, eras[i].s2)
		}
	}
	c.Heal()
	c.WaitConverged()
	if err := testcluster.WaitFor(20*time.Second, func() error { return atMost(c, reqs, 97) }); err != nil {
		t.Errorf("after the heal: %v", err)
	}
	for i, r := range reqs {
		owner := c.Owner(r.Name, r.Key)
		peek := check(owner, r, 0, 0, limiter.Window{})
		if peek.Remaining > 97 {
			t.Errorf("%s (%s) on %s after the heal: remaining %d, want at most 97 (the owner's 2 and the stand-in's 1)", r.Key, r.Algorithm, owner.Name(), peek.Remaining)
		}
		theirs := check(owner, r, 4, 0, limiter.Window{})
		base := theirs.Remaining
		for _, x := range []struct {
			name string
			hits int64
			w    limiter.Window
		}{{"mine, before both resets", 3, eras[i].mine.Window}, {"the stand-in's before its reset", 2, eras[i].s1.Window}} {
			if d := check(owner, r, x.hits, limiter.Refund, x.w); d.Remaining != base {
				t.Errorf("%s (%s): refund of %s: remaining %d, want %d (nothing back)", r.Key, r.Algorithm, x.name, d.Remaining, base)
			}
		}
		for _, x := range []struct {
			name string
			hits int64
			w    limiter.Window
		}{{"the owner's 2 after its reset", 2, eras[i].owner2.Window}, {"the stand-in's 1 after its reset", 1, eras[i].s2.Window}} {
			d := check(owner, r, x.hits, limiter.Refund, x.w)
			if d.Remaining > base+x.hits {
				t.Errorf("%s (%s): refund of %s: remaining %d, more than %d", r.Key, r.Algorithm, x.name, d.Remaining, base+x.hits)
			}
			t.Logf("%s (%s): refund of %s gave back %d", r.Key, r.Algorithm, x.name, d.Remaining-base)
			base = d.Remaining
		}
	}
}
