package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/testcluster"
)

// Leases that end otherwise than by running out on a holder and an owner
// that both stay: the holder killed, the owner killed, a partition that
// heals before the TTL, clocks apart, a limit lowered. Each test counts
// what the callers were admitted against the limit.

// leaseEndCluster starts n nodes with leases as leaseCluster does, replicas
// copies of every key and the clock offsets given.
func leaseEndCluster(t *testing.T, n int, ttl time.Duration, share float64, replicas int, offsets ...time.Duration) *testcluster.Cluster {
	t.Helper()
	return testcluster.New(t, n, testcluster.WithClockOffsets(offsets...), testcluster.WithConfig(func(_ int, c *cluster.Config) {
		c.Lease = cluster.LeaseConfig{Threshold: 100, TTL: ttl, Share: share}
		c.Unreachable = sluice.PolicyDeny
		c.Replicas = replicas
	}))
}

// leaseKeyOwnedBy returns a request of one hit of a key of limit a day
// that node owner of c owns.
func leaseKeyOwnedBy(t *testing.T, c *testcluster.Cluster, name string, a limiter.Algorithm, limit int64, owner int) limiter.Request {
	t.Helper()
	for i := range 10_000 {
		req := limiter.Request{Name: name, Key: fmt.Sprintf("%s-%d", a, i), Hits: 1, Limit: limit, Period: 24 * time.Hour, Algorithm: a}
		if c.OwnerIndex(req.Name, req.Key) == owner {
			return req
		}
	}
	t.Fatalf("no key of %s owned by node %d", name, owner)
	return limiter.Request{}
}

// checkN checks req n times on nd and returns how many were admitted.
func checkN(nd *cluster.Node, req limiter.Request, n int) int64 {
	var admitted int64
	for range n {
		if d, err := nd.Check(context.Background(), req); err == nil && d.Allowed {
			admitted++
		}
	}
	return admitted
}

// unusedLeased is what nd holds of its leases: hits granted and neither
// used nor given back yet.
func unusedLeased(nd *cluster.Node) int64 {
	s := nd.Stats().Leases
	return s.HitsLeased - s.Local - s.HitsReturned
}

var leaseEndAlgorithms = []limiter.Algorithm{limiter.TokenBucket, limiter.FixedWindow}

// A holder killed hard while it holds a lease never gives its unused hits
// back; the owner does not keep them apart past the lease's TTL (they
// enter the bucket then), and counts no more than the lease: it admits the
// rest of the limit less at most the hits the holder held.
func TestLeaseHolderKilled(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, a := range leaseEndAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			noLeaksAfter(t)
			c := leaseEndCluster(t, 3, 2*time.Second, 0.5, 1)
			req := leaseKeyOwnedBy(t, c, "holderkilled", a, 1000, 1)
			start := time.Now() // a bucket refills from here: mostAdmitted
			admitted := checkUntilLeased(t, c.Node(0), req)
			admitted += checkN(c.Node(0), req, 20)
			unused := unusedLeased(c.Node(0))
			// Killed: cut off first, so that closing it sends nothing.
			c.Partition([]int{0}, []int{1, 2})
			c.StopHard(0)
			c.WaitConverged()
			owner := c.Owner(req.Name, req.Key)
			if err := testcluster.WaitFor(10*time.Second, func() error {
				if held := owner.HeldHits(req.Name, req.Key); held != 0 {
					return fmt.Errorf("the owner holds %d hits apart", held)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			more := int64(admitUntilDenied(t, owner, req, int(req.Limit)))
			t.Logf("callers admitted %d, the dead holder held %d unused; the owner admits %d more", admitted, unused, more)
			if admitted+more > mostAdmitted(req, start) || admitted+more < req.Limit-unused {
				t.Errorf("callers admitted %d and then %d of %d, want between %d and %d", admitted, more, req.Limit, req.Limit-unused, req.Limit)
			}
		})
	}
}

// A partition that heals before the lease's TTL ends: the holder, cut off
// with the owner on the other side, decides the key as its stand-in, not
// from the lease, and gives the unused hits back once it reaches the owner
// again (the lease dropped when its sweep saw the ring give the key to
// itself) or once it has not used the lease for a quarter of the TTL; the
// owner frees them, still held (token bucket) or in the window (fixed
// window), and admits the rest of the limit.
func TestLeasePartitionHealsBeforeTTL(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, a := range leaseEndAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			noLeaksAfter(t)
			c := leaseEndCluster(t, 3, 10*time.Second, 0.5, 1)
			req := leaseKeyOwnedBy(t, c, "healsoon", a, 1000, 1)
			admitted := checkUntilLeased(t, c.Node(0), req)
			c.Partition([]int{0}, []int{1, 2})
			c.WaitConverged()
			admitted += checkN(c.Node(0), req, 30)
			admitted += checkN(c.Node(1), req, 20)
			c.Heal()
			c.WaitConverged()
			leaseSettled(t, c, req, admitted)
		})
	}
}

// An owner killed hard while another node holds a lease of its key: its
// replica takes over from its copy, which counts the lease's hits (a
// token bucket's held apart from the bucket too). The holder drops the
// lease; its unused hits cannot go back, the grant gone with the owner.
// The callers are admitted no more than the limit in all, and no fewer
// than the limit less the hits leased.
func TestLeaseOwnerKilled(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, a := range leaseEndAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			noLeaksAfter(t)
			c := leaseEndCluster(t, 3, 5*time.Second, 0.5, 2)
			req := leaseKeyOwnedBy(t, c, "ownerkilled", a, 1000, 1)
			holder := 0
			if c.Node(1).Replicas(req.Name, req.Key)[1].Name == c.Node(0).Name() {
				holder = 2
			}
			start := time.Now() // a bucket refills from here: mostAdmitted
			admitted := checkUntilLeased(t, c.Node(holder), req)
			admitted += checkN(c.Node(holder), req, 20)
			admitted += checkN(c.Node(1), req, 10)
			admitted += replicated(t, c.Node(1), req)
			c.StopHard(1)
			c.WaitConverged()
			admitted += checkN(c.Node(holder), req, 10)
			more := int64(admitUntilDenied(t, c.Owner(req.Name, req.Key), req, int(req.Limit)))
			t.Logf("callers admitted %d, then %d from the new owner; %+v", admitted, more, c.Node(holder).Stats().Leases)
			if leased := c.Node(holder).Stats().Leases.HitsLeased; admitted+more > mostAdmitted(req, start) || admitted+more < req.Limit-leased {
				t.Errorf("callers admitted %d and then %d of %d, want between %d and %d", admitted, more, req.Limit, req.Limit-leased, req.Limit)
			}
		})
	}
}

// replicated checks req on owner and waits until owner replicated a state
// since, three times, so that its replicas have a copy of what it decided:
// it returns the checks admitted.
func replicated(t *testing.T, owner *cluster.Node, req limiter.Request) int64 {
	t.Helper()
	var admitted int64
	for range 3 {
		since := owner.Stats().Transfers.Replicated
		admitted += checkN(owner, req, 1)
		if err := testcluster.WaitFor(10*time.Second, func() error {
			if owner.Stats().Transfers.Replicated == since {
				return fmt.Errorf("%s replicated nothing", owner.Name())
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return admitted
}

// A holder whose clock is 2 s ahead of or behind its owner's, with leases
// of 1 s: a lease ended by a partition gives its unused hits back once the
// partition heals, and the owner admits the rest of the limit.
func TestLeaseEndsAcrossClocks(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, off := range []time.Duration{2 * time.Second, -2 * time.Second} {
		for _, a := range leaseEndAlgorithms {
			t.Run(fmt.Sprintf("%v/%s", off, a), func(t *testing.T) {
				waitBound(t)
				noLeaksAfter(t)
				c := leaseEndCluster(t, 3, time.Second, 0.5, 1, off, 0, 0)
				req := leaseKeyOwnedBy(t, c, "skewed", a, 1000, 1)
				admitted := checkUntilLeased(t, c.Node(0), req)
				admitted += checkN(c.Node(0), req, 20)
				c.Partition([]int{0}, []int{1, 2})
				c.WaitConverged()
				admitted += checkN(c.Node(0), req, 30)
				admitted += checkN(c.Node(1), req, 20)
				c.Heal()
				c.WaitConverged()
				leaseSettled(t, c, req, admitted)
			})
		}
	}
}

// leaseSettled waits until node 0 of c holds no leased hits and waits for
// no lease, then checks that the owner of req's key admits the rest of
// its limit after the callers were admitted admitted.
func leaseSettled(t *testing.T, c *testcluster.Cluster, req limiter.Request, admitted int64) {
	t.Helper()
	if err := testcluster.WaitFor(30*time.Second, func() error {
		if k := c.Node(0).LeaseRequestsInFlight(); k != 0 {
			return fmt.Errorf("node 0 waits for %d leases", k)
		}
		if u := unusedLeased(c.Node(0)); u != 0 {
			return fmt.Errorf("node 0 holds %d leased hits, %+v", u, c.Node(0).Stats().Leases)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := max(req.Limit-admitted, 0)
	if err := testcluster.WaitFor(20*time.Second, func() error { return atMost(c, []limiter.Request{req}, want) }); err != nil {
		t.Error(err)
	}
	// A lease node 0 asked for meanwhile goes back unused too.
	peek := req
	peek.Hits = 0
	remaining := want
	if err := testcluster.WaitFor(20*time.Second, func() error {
		d, err := c.Owner(req.Name, req.Key).Check(context.Background(), peek)
		if err == nil {
			remaining = d.Remaining
		}
		if err == nil && d.Remaining != want {
			err = fmt.Errorf("the owner has %d remaining, want %d; %+v", d.Remaining, want, c.Node(0).Stats().Leases)
		}
		return err
	}); err != nil {
		if remaining < want {
			leaseHitsLost(t, "%v", err)
		} else {
			t.Error(err)
		}
	}
	more := int64(admitUntilDenied(t, c.Owner(req.Name, req.Key), req, int(req.Limit)))
	switch {
	case more > want:
		t.Errorf("the owner admits %d more after %d admitted of %d, want %d; %+v", more, admitted, req.Limit, want, c.Node(0).Stats().Leases)
	case more < want:
		leaseHitsLost(t, "the owner admits %d more after %d admitted of %d, want %d; %+v", more, admitted, req.Limit, want, c.Node(0).Stats().Leases)
	}
}

// leaseHitsLost reports returned lease hits the owner does not admit
// again: an open gap, never more than the limit, seen in 1 of 2 runs of
// the whole suite under -race beside another run
// (TestAttackLeaseAcrossPartition/fixed_window admitted 440 where 900
// were due; docs/design.md, Hot keys and leases).
func leaseHitsLost(t *testing.T, format string, args ...any) {
	t.Helper()
	openGap(t, "under-admission: "+format, args...)
}

// The limit of a leased key is lowered from 1000 to 200 while the lease
// lasts: the holder drops the lease at its first check under the new
// limit and gives its unused hits back (and, once unused, those of the
// lease it takes under the new one); the owner admits what the new limit
// leaves after every hit the callers were admitted.
func TestLeaseLimitLowered(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, a := range leaseEndAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			noLeaksAfter(t)
			c := leaseEndCluster(t, 3, 5*time.Second, 0.5, 1)
			req := leaseKeyOwnedBy(t, c, "lowered", a, 1000, 1)
			admitted := checkUntilLeased(t, c.Node(0), req)
			admitted += checkN(c.Node(0), req, 20)
			lower := req
			lower.Limit = 200
			admitted += checkN(c.Node(0), lower, 1)
			leaseSettled(t, c, lower, admitted)
		})
	}
}

// An owner takes back the unused hits of a holder that was away from its
// ring far longer than a lease's TTL (here a holder that is no member):
// 100 hits checked, then a lease of 500 of 1000 of which 200 are used
// comes back a minute after it expired. Returns free at most what the
// holder's grant holds, the hits it used included (the holder never sends
// a return twice): a second return of 300 frees the 200 left, a third
// nothing.
func TestLeaseReturnAfterAbsence(t *testing.T) {
	for _, a := range leaseEndAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			clk := newClock()
			c := testcluster.New(t, 1, testcluster.WithConfig(func(_ int, cfg *cluster.Config) {
				cfg.Clock = cluster.ClockFunc(clk.Now)
			}))
			owner := c.Node(0)
			req := limiter.Request{Name: "absent", Key: "holder", Limit: 1000, Period: 24 * time.Hour, Algorithm: a}
			spend := req
			spend.Hits = 100
			if d := checkOn(t, owner, spend); !d.Allowed {
				t.Fatalf("100 hits: %+v", d)
			}
			l, err := owner.Lease(context.Background(), "holder", req, 500, time.Second)
			if err != nil || l.Granted != 500 {
				t.Fatalf("lease: %+v, %v", l, err)
			}
			clk.Advance(time.Minute)
			if d := checkOn(t, owner, req); d.Remaining != 400 {
				t.Fatalf("a minute after the expiry: %d remaining, want 400", d.Remaining)
			}
			for i, want := range []int64{700, 900, 900} {
				if err := owner.ReturnLease(context.Background(), "holder", req, 300); err != nil {
					t.Fatalf("return: %v", err)
				}
				if d := checkOn(t, owner, req); d.Remaining != want {
					t.Errorf("after return %d of 300 hits: %d remaining, want %d", i+1, d.Remaining, want)
				}
			}
		})
	}
}

// A holder that is also its key's replica, cut off from the owner: it
// stands in from its copy of the owner's state, which counts the lease's
// hits, and once healed hands that state to the owner, where it merges by
// the larger. Its unused hits go back only after that state is delivered:
// a return the owner took first would be taken back by the merge. Node
// 0's hand-off passes are held from the partition on until, after the
// heal, the lease's expiry entered its hits on the owner and node 0 has
// sent its return, or held it back for the hand-off. A return taken
// first leaves the returned hits spent: the owner admits about 440 more
// where 877 are due.
func TestLeaseReturnAfterHandoff(t *testing.T) {
	waitBound(t)
	skipNearDayEnd(t)
	for _, a := range leaseEndAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			noLeaksAfter(t)
			var (
				hold    atomic.Bool
				release = make(chan struct{})
				once    sync.Once
			)
			open := func() { once.Do(func() { close(release) }) }
			c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
				// A lease unused for a quarter of its TTL goes back: the
				// TTL outlasts the set-up (a replica copy, a partition
				// converged) on a loaded machine, so that node 0 is cut off
				// holding leased hits.
				cfg.Lease = cluster.LeaseConfig{Threshold: 100, TTL: 10 * time.Second, Share: 0.5}
				cfg.Unreachable = sluice.PolicyDeny
				cfg.Replicas = 2
				if i == 0 {
					cluster.SetBeforeHandoffPass(cfg, func() {
						if hold.Load() {
							<-release
						}
					})
				}
			}))
			t.Cleanup(open) // before the cluster closes: the loop must not stay held
			req := keyCutOffFrom(t, c, "returnafter", a, 1000, 2, 0)
			holder, owner := c.Node(0), c.Node(2)
			admitted := checkUntilLeased(t, holder, req)
			admitted += replicated(t, owner, req) // node 0's copy counts the lease
			admitted += checkN(holder, req, 20)

			hold.Store(true)
			c.Partition([]int{0}, []int{1, 2})
			c.WaitConverged()
			admitted += checkN(holder, req, 30)
			admitted += checkN(owner, req, 20)
			returned := holder.Stats().Leases.HitsReturned
			if unusedLeased(holder) == 0 {
				t.Fatalf("node 0 holds no leased hits when cut off: %+v", holder.Stats().Leases)
			}
			healed := make(chan error, 1)
			go func() {
				defer open()
				healed <- testcluster.WaitFor(time.Minute, func() error {
					if held := owner.HeldHits(req.Name, req.Key); held != 0 {
						return fmt.Errorf("the owner holds %d hits apart", held)
					}
					if holder.Stats().Leases.HitsReturned == returned && holder.ReturnsAfterHandoff() == 0 {
						return fmt.Errorf("node 0 has not tried its return: %+v", holder.Stats().Leases)
					}
					return nil
				})
			}()
			c.Heal()
			if err := <-healed; err != nil {
				t.Fatal(err)
			}
			c.WaitConverged()
			leaseSettled(t, c, req, admitted)
		})
	}
}

// keyCutOffFrom returns a request of one hit of a key of limit a day, of
// algorithm a, that node owner of c owns with node replica as its
// replica, and that owner still owns on the ring without replica: a
// partition that cuts replica off leaves the key where it was.
func keyCutOffFrom(t *testing.T, c *testcluster.Cluster, name string, a limiter.Algorithm, limit int64, owner, replica int) limiter.Request {
	t.Helper()
	rest := slices.DeleteFunc(c.Node(0).RingMembers(), func(m ring.Member) bool { return m.Name == c.Node(replica).Name() })
	without, err := ring.New(cluster.TestConfig("x").Ring)
	if err == nil {
		err = without.SetMembers(rest)
	}
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10_000 {
		req := limiter.Request{Name: name, Key: fmt.Sprintf("%s-%d", a, i), Hits: 1, Limit: limit, Period: 24 * time.Hour, Algorithm: a}
		rs := c.Node(0).Replicas(req.Name, req.Key)
		o, _ := without.Owner(req.Name, req.Key)
		if len(rs) == 2 && rs[0].Name == c.Node(owner).Name() && rs[1].Name == c.Node(replica).Name() && o.Name == rs[0].Name {
			return req
		}
	}
	t.Fatalf("no key of nodes %d and %d that stays with node %d without node %d", owner, replica, owner, replica)
	return limiter.Request{}
}
