package cluster

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/ring"
)

// The heal of a partition whose sides' rings are not the ring that comes
// back, step by step on one node's stand-in record and hand-over: a key
// the node decided standing in for a member that is back in the new ring
// was decided meanwhile by that member too, as its plain owner on its
// side. Where the new ring leaves the key to the node, the node must wait
// for that member's hand-over (its confirmation of the new ring, sent
// once it stopped deciding the key and delivered its state), as for a key
// that moved to it; a key it decided as its plain owner, or for a member
// still cut off, stays settled.
func TestStandinHealWaitsForTheMemberBack(t *testing.T) {
	cfg := ring.DefaultConfig()
	now := time.Unix(0, 0)
	addr, rm := healAddr, healMembers
	ringOf := func(names ...string) *ring.Ring { return healRing(t, cfg, names...) }
	serfOf := func(alive []string, failed ...string) []serf.Member {
		var ms []serf.Member
		for _, n := range alive {
			ms = append(ms, serf.Member{Name: n, Status: serf.StatusAlive, Tags: map[string]string{grpcTag: addr(n)}})
		}
		for _, n := range failed {
			ms = append(ms, serf.Member{Name: n, Status: serf.StatusFailed, Tags: map[string]string{grpcTag: addr(n)}})
		}
		return ms
	}
	// node is one node's stand-in record and hand-over, over ring r.
	type node struct {
		s *standins
		h *handover
		r *ring.Ring
	}
	newNode := func(self string) *node {
		s := newStandins(self, now)
		s.learnedHold = time.Minute
		r, err := ring.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		h := newHandover(self, r, time.Minute, slog.New(slog.DiscardHandler))
		return &node{s: s, h: h, r: r}
	}
	// rebuild is Node.rebuild's part: update, adopt, publish.
	rebuild := func(nd *node, ms []serf.Member, members []ring.Member) {
		t.Helper()
		prev := nd.r.Members()
		unkeep := nd.s.view().stoodInForBack(prev, members)
		nd.s.update(ms, prev, members, cfg, now, handoverUnder)
		if err := nd.h.adopt(members, now, unkeep); err != nil {
			t.Fatal(err)
		}
		nd.s.publish(members, cfg)
	}
	confirmAll := func(nd *node, self string) {
		fp := ring.Fingerprint(nd.r.Members())
		for _, m := range nd.r.Members() {
			if m.Name != self {
				nd.h.confirm(m.Name, fp)
			}
		}
	}
	// check counts, over every partition the node owns in its ring and
	// owned, settled, in the ring before (before), those it decides now and
	// those that wait, failing on a partition where waits(owner at the
	// cut) says otherwise.
	check := func(step string, nd *node, self string, before, cut *ring.Ring, waits func(owner string) bool, mustWait bool) {
		t.Helper()
		waited, decided := 0, 0
		for p := range cfg.PartitionCount {
			h := uint64(p)
			if m, _ := nd.r.OwnerOfHash(h); m.Name != self {
				continue
			}
			if m, _ := before.OwnerOfHash(h); m.Name != self {
				continue // moved here: waits in any case
			}
			o, _ := cut.OwnerOfHash(h)
			st, _ := nd.h.stateOf(h)
			if w := waits(o.Name); (st == pending) != w {
				t.Fatalf("%s: partition %d (owner %s at the cut): pending %v, want %v", step, p, o.Name, st == pending, w)
			}
			if st == pending {
				waited++
			} else {
				decided++
			}
		}
		t.Logf("%s: %d partitions kept wait for the member back, %d decided", step, waited, decided)
		if (mustWait && waited == 0) || decided == 0 {
			t.Fatalf("%s: %d wait and %d decided: the step tells nothing", step, waited, decided)
		}
	}
	abc := ringOf("node-0", "node-1", "node-2")

	// node-3 joins side {node-1, node-2} of {node-0}|{node-1, node-2} and
	// learns node-0 cut off from node-1's confirmation: it stands in for
	// the keys the ring at the cut gives node-0.
	d := newNode("node-3")
	side := serfOf([]string{"node-1", "node-2", "node-3"})
	rebuild(d, side, rm("node-1", "node-2", "node-3"))
	d.h.setReady(true, now)
	d.s.learn("node-1", transport.CutOff{Members: []transport.CutOffMember{{Name: "node-0", GRPCAddr: addr("node-0")}}, Newcomers: []string{"node-3"}})
	rebuild(d, side, rm("node-1", "node-2", "node-3"))
	confirmAll(d, "node-3")
	if !d.h.ownsAllSettled() {
		t.Fatal("node-3 does not decide its keys once every member confirmed")
	}
	// The heal: node-0 back in node-3's ring, which is not the ring at the
	// cut (node-3 is in it).
	before := ringOf("node-1", "node-2", "node-3")
	rebuild(d, serfOf([]string{"node-0", "node-1", "node-2", "node-3"}), rm("node-0", "node-1", "node-2", "node-3"))
	check("node-3 healed", d, "node-3", before, abc, func(o string) bool { return o == "node-0" }, true)
	confirmAll(d, "node-3")
	if !d.h.ownsAllSettled() {
		t.Fatal("node-3 does not decide its keys once every member confirmed the healed ring")
	}

	// node-0, cut off alone, stands in for the keys of node-1 and node-2;
	// node-1 comes back first: the keys node-0 keeps that the ring at the
	// cut gives node-1 wait for node-1, those of node-2 (still cut off,
	// still stood in for) do not.
	a := newNode("node-0")
	rebuild(a, serfOf([]string{"node-0", "node-1", "node-2"}), rm("node-0", "node-1", "node-2"))
	a.h.setReady(true, now)
	confirmAll(a, "node-0")
	rebuild(a, serfOf([]string{"node-0"}, "node-1", "node-2"), rm("node-0"))
	before = ringOf("node-0")
	rebuild(a, serfOf([]string{"node-0", "node-1"}, "node-2"), rm("node-0", "node-1"))
	check("node-0 with node-1 back", a, "node-0", before, abc, func(o string) bool { return o == "node-1" }, false)
}

// A member that leaves while members are cut off, step by step on the
// stand-in record of a member of its side: {node-0}|{node-1, node-2},
// node-2 leaves. node-0 does not know it left and decides by the ring
// with it, so node-1 holds it too (as a member that left while cut off),
// even once serf forgot node-2: on the consistent-hash ring with bounded
// loads, the ring without node-2 gives node-1 keys that the ring with it
// gives node-0, which node-0 decides as their plain owner. As node-0 may
// have learnt the leave before the cut, node-1 decides a key as its plain
// owner only where both rings give it the key. A newcomer on node-1's
// side, node-3, learns node-2 from node-1's report though serf tells it
// node-2 left. Once healed, node-2 is let go when the hand-over is over.
func TestStandinLeaverHeldWhileMembersAreCutOff(t *testing.T) {
	cfg := ring.DefaultConfig()
	now := time.Unix(0, 0)
	addr, rm := healAddr, healMembers
	ringOf := func(names ...string) *ring.Ring { return healRing(t, cfg, names...) }
	ms := func(status map[string]serf.MemberStatus) []serf.Member {
		var out []serf.Member
		for n, st := range status {
			out = append(out, serf.Member{Name: n, Status: st, Tags: map[string]string{grpcTag: addr(n)}})
		}
		return out
	}
	rebuild := func(s *standins, serfMs []serf.Member, prev, members []ring.Member, ho handoverPhase) {
		s.update(serfMs, prev, members, cfg, now, ho)
		s.publish(members, cfg)
	}
	abc, ab := ringOf("node-0", "node-1", "node-2"), ringOf("node-0", "node-1")
	// want checks standingIn on every partition against the owners on
	// the ring at the cut and on the ring without node-2; moved counts
	// those the ring without node-2 gives node-1 and the ring at the cut
	// node-0.
	want := func(step string, s *standins, standsIn func(owner, without string) bool) {
		t.Helper()
		moved := 0
		for p := range cfg.PartitionCount {
			h := uint64(p)
			o, _ := abc.OwnerOfHash(h)
			b, _ := ab.OwnerOfHash(h)
			if got, w := s.standingIn(h), standsIn(o.Name, b.Name); got != w {
				t.Fatalf("%s: partition %d (owner %s at the cut, %s without node-2): standing in %v, want %v", step, p, o.Name, b.Name, got, w)
			}
			if o.Name == "node-0" && b.Name == "node-1" {
				moved++
			}
		}
		if moved == 0 {
			t.Fatalf("%s: no partition of node-0 at the cut goes to node-1 without node-2: the step tells nothing", step)
		}
	}
	alive, failed, left := serf.StatusAlive, serf.StatusFailed, serf.StatusLeft
	// node-0 may have learnt that node-2 left before the cut, or not:
	// node-1 decides a key without a part where both rings give it the
	// key.
	notSelf := func(o, without string) bool { return o != "node-1" || without != "node-1" }

	b := newStandins("node-1", now)
	b.learnedHold = time.Minute
	rebuild(b, ms(map[string]serf.MemberStatus{"node-0": alive, "node-1": alive, "node-2": alive}), nil, rm("node-0", "node-1", "node-2"), handoverUnder)
	rebuild(b, ms(map[string]serf.MemberStatus{"node-0": failed, "node-1": alive, "node-2": alive}), rm("node-0", "node-1", "node-2"), rm("node-1", "node-2"), handoverUnder)
	rebuild(b, ms(map[string]serf.MemberStatus{"node-0": failed, "node-1": alive, "node-2": left}), rm("node-1", "node-2"), rm("node-1"), handoverUnder)
	want("node-2 left node-1's side", b, notSelf)
	rep := b.cutReport()
	if fmt.Sprint(rep.Members) != "[{node-0 127.0.0.1:7000 false} {node-2 127.0.0.1:7002 false}]" {
		t.Fatalf("node-1 reports %v cut off, want node-0 and node-2", rep.Members)
	}
	if got := b.cutOff(rm("node-1")); fmt.Sprint(got) != "[node-0]" {
		t.Fatalf("node-1 holds %v cut off for its leave, want node-0 (node-2 will not be back)", got)
	}
	forgot := ms(map[string]serf.MemberStatus{"node-0": failed, "node-1": alive})
	rebuild(b, forgot, rm("node-1"), rm("node-1"), handoverUnder)
	want("serf forgot node-2", b, notSelf)

	// node-3 joins node-1's side: serf tells it node-2 left.
	d := newStandins("node-3", now)
	d.learnedHold = time.Minute
	dMs := ms(map[string]serf.MemberStatus{"node-1": alive, "node-2": left, "node-3": alive})
	rebuild(d, dMs, rm("node-3"), rm("node-1", "node-3"), handoverUnder)
	d.learn("node-1", rep)
	rebuild(d, dMs, rm("node-1", "node-3"), rm("node-1", "node-3"), handoverUnder)
	want("node-3 told by node-1", d, func(o, _ string) bool { return o != "node-1" })

	// The heal: node-0 back; node-2 is held until the hand-over is over.
	healed := ms(map[string]serf.MemberStatus{"node-0": alive, "node-1": alive})
	rebuild(b, healed, rm("node-1"), rm("node-0", "node-1"), handoverUnder)
	for p := range cfg.PartitionCount {
		if o, _ := abc.OwnerOfHash(uint64(p)); o.Name == "node-2" && !b.standingIn(uint64(p)) {
			t.Fatalf("healed: partition %d of node-2 at the cut not stood in for before the hand-over is over", p)
		}
	}
	rebuild(b, healed, rm("node-0", "node-1"), rm("node-0", "node-1"), handoverSettled)
	if b.full.Load() != nil {
		t.Fatalf("node-2 still held once the heal's hand-over is over: %v", b.full.Load().Members())
	}
}

// healAddr is the gRPC address of member name ("node-N") in the heal step
// tests.
func healAddr(name string) string {
	return "127.0.0.1:" + fmt.Sprint(7000+int(name[len(name)-1]-'0'))
}

// healMembers returns ring members of names, at healAddr.
func healMembers(names ...string) []ring.Member {
	out := make([]ring.Member, len(names))
	for i, n := range names {
		out[i] = ring.Member{Name: n, Addr: healAddr(n)}
	}
	return out
}

// healRing returns a ring of cfg over healMembers(names...).
func healRing(t *testing.T, cfg ring.Config, names ...string) *ring.Ring {
	t.Helper()
	r, err := ring.New(cfg)
	if err == nil {
		err = r.SetMembers(healMembers(names...))
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}
