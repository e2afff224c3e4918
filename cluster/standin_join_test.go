package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"

	"github.com/sluicehq/sluice/ring"
)

// The stand-in ring of a node that joins one side of a partition, step by
// step: {a}|{b,c} seen from a, d joins a's side; a leaves d out of the
// ring it tells stand-in decisions by, d learns b and c from a's
// confirmation and stands in for the keys that ring gives them, and both
// drop them at the heal. A member learned stays cut off when the member
// that reported it leaves, for as long as serf holds a failed member; the
// member that left meanwhile is held until the hand-over is over.
func TestStandinJoinerSteps(t *testing.T) {
	cfg := ring.DefaultConfig()
	member := func(name string, st serf.MemberStatus) serf.Member {
		return serf.Member{Name: name, Status: st, Tags: map[string]string{grpcTag: "127.0.0.1:" + fmt.Sprint(1000+int(name[0]))}}
	}
	rm := func(names ...string) []ring.Member {
		out := make([]ring.Member, len(names))
		for i, n := range names {
			out[i] = ring.Member{Name: n, Addr: "127.0.0.1:" + fmt.Sprint(1000+int(n[0]))}
		}
		return out
	}
	ringOf := func(names ...string) *ring.Ring {
		r, err := ring.New(cfg)
		if err == nil {
			err = r.SetMembers(rm(names...))
		}
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// rebuild is Node.rebuild's part: update, then publish.
	now := time.Unix(0, 0)
	rebuild := func(s *standins, ms []serf.Member, prev, members []ring.Member) {
		s.update(ms, prev, members, cfg, now, handoverUnder)
		s.publish(members, cfg)
	}
	newRecord := func(name string) *standins {
		s := newStandins(name, now)
		s.learnedHold = time.Minute
		return s
	}
	// want checks standingIn over many keys against owner: the key's
	// owner on the ring at the cut, and whether s stands in for it; with
	// alts, the rings with the newcomers too, where s stands in as well.
	want := func(step string, s *standins, cut *ring.Ring, standsIn func(owner string) bool, alts ...*ring.Ring) {
		t.Helper()
		in, out := 0, 0
		for i := range 2000 {
			h := ring.RouteHash("join", fmt.Sprint(i))
			owner := ""
			if cut != nil {
				m, _ := cut.OwnerOfHash(h)
				owner = m.Name
			}
			w := cut != nil && standsIn(owner)
			for _, a := range alts {
				m, _ := a.OwnerOfHash(h)
				w = w || standsIn(m.Name)
			}
			if got := s.standingIn(h); got != w {
				t.Fatalf("%s: key %d (owner %q at the cut): standing in %v, want %v", step, i, owner, got, w)
			}
			if w {
				in++
			} else {
				out++
			}
		}
		t.Logf("%s: %d keys stood in for, %d not", step, in, out)
	}
	abc := ringOf("a", "b", "c")

	a := newRecord("a")
	rebuild(a, []serf.Member{member("a", serf.StatusAlive), member("b", serf.StatusAlive), member("c", serf.StatusAlive)}, nil, rm("a", "b", "c"))
	want("whole", a, nil, nil)
	cutMs := []serf.Member{member("a", serf.StatusAlive), member("b", serf.StatusFailed), member("c", serf.StatusFailed)}
	rebuild(a, cutMs, rm("a", "b", "c"), rm("a"))
	notA := func(o string) bool { return o != "a" }
	want("a cut off alone", a, abc, notA)
	withD := append(cutMs, member("d", serf.StatusAlive))
	rebuild(a, withD, rm("a"), rm("a", "d"))
	abcd := ringOf("a", "b", "c", "d")
	want("d joined a's side: a's view", a, abc, notA, abcd)
	rep := a.cutReport()
	if fmt.Sprint(rep) != "{[{b 127.0.0.1:1098 false} {c 127.0.0.1:1099 false}] [d]}" {
		t.Fatalf("a reports %v, want b and c cut off, d a newcomer", rep)
	}

	d := newRecord("d")
	dMs := []serf.Member{member("a", serf.StatusAlive), member("d", serf.StatusAlive)}
	rebuild(d, dMs, rm("d"), rm("a", "d"))
	want("d before a's confirmation", d, nil, nil)
	if !d.learn("a", rep) {
		t.Fatal("a's first report is not news to d")
	}
	rebuild(d, dMs, rm("a", "d"), rm("a", "d"))
	if d.learn("a", rep) {
		t.Fatal("a's report again is news to d")
	}
	cutOff := func(o string) bool { return o == "b" || o == "c" }
	want("d told by a", d, abc, cutOff, abcd)
	// d names what a told it as learned: it never saw b or c fail.
	if got := d.cutReport(); fmt.Sprint(got) != "{[{b 127.0.0.1:1098 true} {c 127.0.0.1:1099 true}] [d]}" {
		t.Fatalf("d reports %v, want b and c cut off as learned, d a newcomer", got)
	}

	// e joins through d, which tells it what a told d.
	e := newRecord("e")
	eMs := append(dMs, member("e", serf.StatusAlive))
	rebuild(e, eMs, rm("e"), rm("a", "d", "e"))
	e.learn("d", d.cutReport())
	rebuild(e, eMs, rm("a", "d", "e"), rm("a", "d", "e"))
	want("e told by d", e, abc, cutOff, ringOf("a", "b", "c", "d", "e"))

	// The heal: b and c back in the rings.
	healed := []serf.Member{member("a", serf.StatusAlive), member("b", serf.StatusAlive), member("c", serf.StatusAlive), member("d", serf.StatusAlive)}
	d.update(healed, rm("a", "d"), rm("a", "b", "c", "d"), cfg, now, handoverUnder)
	want("d as the heal's ring comes", d, abc, cutOff, abcd)
	d.publish(rm("a", "b", "c", "d"), cfg)
	want("d healed", d, nil, nil)
	rebuild(a, healed, rm("a", "d"), rm("a", "b", "c", "d"))
	want("a healed", a, nil, nil)

	// The member that reported them leaves (with its keys' states to f):
	// they stay cut off, for learnedHold.
	f := newRecord("f")
	fMs := []serf.Member{member("a", serf.StatusAlive), member("f", serf.StatusAlive)}
	f.learn("a", rep)
	rebuild(f, fMs, rm("f"), rm("a", "f"))
	want("f told by a", f, abc, cutOff, ringOf("a", "b", "c", "f"))
	aLeft := []serf.Member{member("a", serf.StatusLeft), member("f", serf.StatusAlive)}
	rebuild(f, aLeft, rm("a", "f"), rm("f"))
	// The ring at the cut less a, which left: b's and c's, every key.
	want("a left f", f, ringOf("b", "c"), func(string) bool { return true })
	// Past learnedHold, b and c are let go; a, which left while they
	// were cut off, once the hand-over is over.
	now = now.Add(time.Minute + time.Nanosecond)
	rebuild(f, aLeft[1:], rm("f"), rm("f"))
	want("f past learnedHold", f, ringOf("a"), func(string) bool { return true })
	f.update(aLeft[1:], rm("f"), rm("f"), cfg, now, handoverSettled)
	f.publish(rm("f"), cfg)
	want("f's hand-over over", f, nil, nil)
}
