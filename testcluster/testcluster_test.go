package testcluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// A node stopped hard and restarted with the same name rejoins, and every
// node routes over the three again.
func TestRestartWithSameName(t *testing.T) {
	c := testcluster.New(t, 3)
	name := c.Node(1).Name()
	c.StopHard(1)
	c.WaitConverged() // the others see it gone
	if got := len(c.Node(0).RingMembers()); got != 2 {
		t.Fatalf("ring has %d members after the stop, want 2", got)
	}
	back := c.Restart(1)
	if back.Name() != name {
		t.Fatalf("restarted as %q, want %q", back.Name(), name)
	}
	for _, n := range c.Nodes() {
		if got := len(n.RingMembers()); got != 3 {
			t.Fatalf("%s routes over %d members, want 3", n.Name(), got)
		}
	}
	req := limiter.Request{Name: "r", Key: "k", Hits: 1, Limit: 1, Period: time.Hour, Algorithm: limiter.GCRA}
	owner := c.Owner("r", "k")
	for i, n := range c.Nodes() {
		d, err := n.Check(context.Background(), req)
		if err != nil || d.Owner != owner.Name() || d.WithoutOwner || d.Allowed != (i == 0) {
			t.Fatalf("check %d on %s: %+v, %v (owner %s)", i, n.Name(), d, err, owner.Name())
		}
	}
}

// Owner, OwnerIndex and Index agree, and the index OwnerIndex returns is
// the one StopHard takes: the owner after the stop is another live node.
func TestOwnerIndex(t *testing.T) {
	c := testcluster.New(t, 3)
	i := c.OwnerIndex("r", "k")
	if c.Node(i) != c.Owner("r", "k") || c.Index(c.Owner("r", "k")) != i {
		t.Fatalf("OwnerIndex %d, Owner %s, Index %d disagree", i, c.Owner("r", "k").Name(), c.Index(c.Owner("r", "k")))
	}
	for j := range 3 {
		if got := c.Index(c.Node(j)); got != j {
			t.Fatalf("Index(Node(%d)) = %d", j, got)
		}
	}
	c.StopHard(i)
	c.WaitConverged()
	if c.Index(c.Node(i)) != i {
		t.Fatalf("a stopped node lost its index")
	}
	if j := c.OwnerIndex("r", "k"); j == i || c.Owner("r", "k") != c.Node(j) {
		t.Fatalf("owner after stopping node %d: index %d, node %s", i, j, c.Owner("r", "k").Name())
	}
}
