package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// nodeNamed returns the node of c named name.
func nodeNamed(t *testing.T, c *testcluster.Cluster, name string) *cluster.Node {
	t.Helper()
	for _, nd := range c.Nodes() {
		if nd.Name() == name {
			return nd
		}
	}
	t.Fatalf("no node named %s", name)
	return nil
}

// On 3 nodes with 2 replicas: a key consumed through a node that does not
// own it is inspected from there as its owner holds it, twice without
// change; reset from there, it is fresh on its owner and its replica drops
// its copy, so that the replica, owner once the owner is killed hard,
// decides the key as fresh.
func TestInspectAndReset(t *testing.T) {
	c := testcluster.New(t, 3, withReplicas(2))
	ctx := context.Background()
	owner := c.Node(2)
	key, err := testcluster.FailoverKey(owner, "admin", cluster.TestConfig("x").Ring)
	if err != nil {
		t.Fatal(err)
	}
	req := limiter.Request{Name: "admin", Key: key, Hits: 7, Limit: 10, Period: time.Hour, Algorithm: limiter.FixedWindow}
	ms := owner.Replicas(req.Name, req.Key)
	if len(ms) != 2 || ms[0].Name != owner.Name() {
		t.Fatalf("owner and replicas %v, want %s and one more", ms, owner.Name())
	}
	replica := nodeNamed(t, c, ms[1].Name)
	asker := c.Node(0)
	if asker == replica {
		asker = c.Node(1)
	}

	if ins, err := asker.Inspect(ctx, req.Name, req.Key); err != nil || ins.Found || ins.Owner != owner.Name() {
		t.Fatalf("a fresh key: %+v, %v; want none found on %s", ins, err, owner.Name())
	}
	if d, err := asker.Check(ctx, req); err != nil || !d.Allowed || d.Owner != owner.Name() {
		t.Fatalf("consume: %+v, %v", d, err)
	}
	ins, err := asker.Inspect(ctx, req.Name, req.Key)
	if err != nil {
		t.Fatal(err)
	}
	v := ins.State.View()
	if !ins.Found || ins.Owner != owner.Name() || ins.WithoutOwner || !reflect.DeepEqual(ins.Replicas, []string{replica.Name()}) ||
		v.Algorithm != limiter.FixedWindow || v.WindowHits != 7 {
		t.Fatalf("inspect: %+v (view %+v); want 7 hits on %s, replica %s", ins, v, owner.Name(), replica.Name())
	}
	again, err := asker.Inspect(ctx, req.Name, req.Key)
	if err != nil || !reflect.DeepEqual(again.State, ins.State) {
		t.Fatalf("inspecting again: %+v, %v; want the state unchanged, %+v", again.State, err, ins.State)
	}
	if own, ok := owner.Store().Snapshot(req.Name, req.Key, time.Now()); !ok || !reflect.DeepEqual(own, ins.State) {
		t.Fatalf("the owner holds %+v, inspect said %+v", own, ins.State)
	}
	waitCopy := func(want func(limiter.Snapshot, bool) error) {
		t.Helper()
		if err := testcluster.WaitFor(10*time.Second, func() error {
			s, ok := replica.Store().Snapshot(req.Name, req.Key, time.Now())
			return want(s, ok)
		}); err != nil {
			t.Fatal(err)
		}
	}
	waitCopy(func(s limiter.Snapshot, ok bool) error {
		if !ok || s.View().WindowHits != 7 {
			return fmt.Errorf("the replica holds %+v (%v), want 7 hits", s, ok)
		}
		return nil
	})

	d, err := asker.Check(ctx, limiter.ResetRequest(req.Name, req.Key))
	if err != nil || d.Owner != owner.Name() || d.WithoutOwner {
		t.Fatalf("reset: %+v, %v", d, err)
	}
	if ins, err := asker.Inspect(ctx, req.Name, req.Key); err != nil || ins.Found {
		t.Fatalf("after the reset: %+v, %v; want the key fresh", ins, err)
	}
	waitCopy(func(s limiter.Snapshot, ok bool) error {
		if ok {
			return fmt.Errorf("the replica still holds %+v", s)
		}
		return nil
	})

	c.StopHard(2)
	c.WaitConverged()
	if o, _ := replica.Owner(req.Name, req.Key); o.Name != replica.Name() {
		t.Fatalf("the key moved to %s, not to its replica %s", o.Name, replica.Name())
	}
	peek := req
	peek.Hits = 0
	d, err = replica.Check(ctx, peek)
	if err != nil || d.Remaining != 10 || d.Owner != replica.Name() {
		t.Fatalf("on the new owner: %+v, %v; want 10 remaining: the reset held", d, err)
	}
}

// Inspect refuses an invalid name or key, a nil context and a closed node.
func TestInspectRejects(t *testing.T) {
	c := testcluster.New(t, 1)
	nd := c.Node(0)
	//lint:ignore SA1012 the nil context is the point
	if _, err := nd.Inspect(nil, "n", "k"); !errors.Is(err, cluster.ErrNilContext) { //nolint:staticcheck
		t.Errorf("nil context: %v", err)
	}
	if _, err := nd.Inspect(context.Background(), "", "k"); !errors.Is(err, limiter.ErrInvalidName) {
		t.Errorf("empty name: %v", err)
	}
	if _, err := nd.Inspect(context.Background(), "n", ""); !errors.Is(err, limiter.ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
	c.StopHard(0)
	if _, err := nd.Inspect(context.Background(), "n", "k"); !errors.Is(err, cluster.ErrClosed) {
		t.Errorf("closed: %v", err)
	}
}

// A reset clears a key's state on its owner while a lease of the key
// holds every hit left: the leased hits are the holder's until the lease
// ends, the state on the owner is fresh.
func TestResetWithLeaseOut(t *testing.T) {
	c := leaseCluster(t, 3, 10*time.Second, 1)
	req := limiter.Request{Name: "hot", Key: "reset", Hits: 1, Limit: 1000, Period: 1000 * time.Hour, Algorithm: limiter.TokenBucket}
	nd := nonOwners(c, req.Name, req.Key)[0]
	checkUntilLeased(t, nd, req)
	owner := c.Owner(req.Name, req.Key)
	if ins, err := nd.Inspect(context.Background(), req.Name, req.Key); err != nil || !ins.Found || ins.Owner != owner.Name() {
		t.Fatalf("before the reset: %+v, %v; want the owner's state", ins, err)
	}
	if d, err := nd.Check(context.Background(), limiter.ResetRequest(req.Name, req.Key)); err != nil || d.Owner != owner.Name() {
		t.Fatalf("reset: %+v, %v", d, err)
	}
	if ins, err := nd.Inspect(context.Background(), req.Name, req.Key); err != nil || ins.Found {
		t.Fatalf("after the reset: %+v, %v; want the key fresh on its owner", ins, err)
	}
}
