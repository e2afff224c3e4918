package cluster

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"

	"github.com/sluicehq/sluice/ring"
)

// A rebuild publishes the ring with the cut-off members (update), adopts
// the new ring, then drops them (publish). At each of its steps, every
// key this node decides as owner under the ring in force, or the ring to
// come, whose owner over all the members is another, is told as a
// stand-in decision: on a partition of {node-0} from {node-1, node-2}, and
// on the heal, whose members come back in the new ring itself.
func TestStandingInThroughEveryStepOfARebuild(t *testing.T) {
	cfg := ring.DefaultConfig()
	member := func(name string, i int) ring.Member {
		return ring.Member{Name: name, Addr: fmt.Sprintf("127.0.0.1:%d", 7000+i)}
	}
	all := []ring.Member{member("node-0", 0), member("node-1", 1), member("node-2", 2)}
	alone := all[:1]
	serfOf := func(status serf.MemberStatus) []serf.Member {
		ms := make([]serf.Member, len(all))
		for i, m := range all {
			ms[i] = serf.Member{Name: m.Name, Status: serf.StatusAlive, Tags: map[string]string{grpcTag: m.Addr}}
			if i > 0 {
				ms[i].Status = status
			}
		}
		return ms
	}
	full, err := ring.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := full.SetMembers(all); err != nil {
		t.Fatal(err)
	}
	// Keys node-0 owns alone and another member owns over all three.
	var hashes []uint64
	for i := 0; len(hashes) < 50; i++ {
		h := ring.RouteHash("n", fmt.Sprintf("k%d", i))
		if m, _ := full.OwnerOfHash(h); m.Name != "node-0" {
			hashes = append(hashes, h)
		}
	}
	rec := newStandins("node-0", time.Unix(1_700_000_000, 0))
	check := func(step string) {
		t.Helper()
		for _, h := range hashes {
			if !rec.standingIn(h) {
				t.Fatalf("%s: a key node-0 decides alone, owned by another member, is not told as a stand-in decision", step)
			}
		}
	}
	// The cut: node-1 and node-2 fail.
	rec.update(serfOf(serf.StatusFailed), all, alone, cfg, time.Unix(1_700_000_000, 0), handoverUnder)
	check("cut, before the ring {node-0} is adopted")
	rec.publish(alone, cfg)
	check("cut, ring {node-0} adopted")
	// The heal: both are back, admitted to the ring again at once.
	rec.update(serfOf(serf.StatusAlive), alone, all, cfg, time.Unix(1_700_000_000, 0), handoverUnder)
	check("heal, ring {node-0} still in force")
	rec.publish(all, cfg)
	if rec.full.Load() != nil {
		t.Fatal("the ring with cut-off members is kept once none is cut off")
	}
}

// A member that left while cut off (node-2, on {node-0}|{node-1, node-2})
// is held cut off while node-1 is, and after the heal until the hand-over
// of the healed ring is over; then it is let go for good. It is reported
// cut off only while another member is.
func TestStandinGoneLeaverSteps(t *testing.T) {
	cfg := ring.DefaultConfig()
	now := time.Unix(1_700_000_000, 0)
	member := func(name string, i int) ring.Member {
		return ring.Member{Name: name, Addr: fmt.Sprintf("127.0.0.1:%d", 7000+i)}
	}
	all := []ring.Member{member("node-0", 0), member("node-1", 1), member("node-2", 2)}
	healed, alone := all[:2], all[:1]
	serfOf := func(s1, s2 serf.MemberStatus) []serf.Member {
		ms := make([]serf.Member, len(all))
		for i, m := range all {
			ms[i] = serf.Member{Name: m.Name, Status: []serf.MemberStatus{serf.StatusAlive, s1, s2}[i], Tags: map[string]string{grpcTag: m.Addr}}
		}
		return ms
	}
	rec := newStandins("node-0", now)
	steps := []struct {
		step          string
		ms            []serf.Member
		prev, members []ring.Member
		ho            handoverPhase
		wantHeld      bool     // node-2 alone held cut off
		wantCut       []string // full's members besides node-0 and members
		wantReported  []string
	}{
		{"the cut", serfOf(serf.StatusFailed, serf.StatusFailed), all, alone, handoverUnder, false, []string{"node-1", "node-2"}, []string{"node-1", "node-2"}},
		{"node-2 left while cut off", serfOf(serf.StatusFailed, serf.StatusLeft), alone, alone, handoverSettled, false, []string{"node-1", "node-2"}, []string{"node-1", "node-2"}},
		{"the heal, its hand-over under way", serfOf(serf.StatusAlive, serf.StatusLeft), alone, healed, handoverUnder, true, []string{"node-2"}, nil},
		{"the healed ring, its hand-over under way", serfOf(serf.StatusAlive, serf.StatusLeft), healed, healed, handoverUnder, true, []string{"node-2"}, nil},
		{"the hand-over over", serfOf(serf.StatusAlive, serf.StatusLeft), healed, healed, handoverSettled, false, nil, nil},
		{"after", serfOf(serf.StatusAlive, serf.StatusLeft), healed, healed, handoverUnder, false, nil, nil},
	}
	for _, s := range steps {
		rec.update(s.ms, s.prev, s.members, cfg, now, s.ho)
		rec.publish(s.members, cfg)
		if got := rec.holdsOnlyGone(); got != s.wantHeld {
			t.Errorf("%s: holdsOnlyGone %v, want %v", s.step, got, s.wantHeld)
		}
		var cut []string
		if r := rec.full.Load(); r != nil {
			for _, m := range r.Members() {
				if m.Name != "node-0" && !hasMember(s.members, m.Name) {
					cut = append(cut, m.Name)
				}
			}
		}
		slices.Sort(cut)
		if !slices.Equal(cut, s.wantCut) {
			t.Errorf("%s: cut off %v, want %v", s.step, cut, s.wantCut)
		}
		var reported []string
		for _, m := range rec.cutReport().Members {
			reported = append(reported, m.Name)
		}
		if !slices.Equal(reported, s.wantReported) {
			t.Errorf("%s: reported %v, want %v", s.step, reported, s.wantReported)
		}
	}
}
