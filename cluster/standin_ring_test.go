package cluster

import (
	"fmt"
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
