package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/peer"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

// leaseCluster starts n nodes with leases on from 100 checks/s of a key.
// An owner that does not answer in time denies: 64 callers in tight loops
// on 2 cores can starve a peer stream past its deadline under -race.
func leaseCluster(t *testing.T, n int, ttl time.Duration, share float64) *testcluster.Cluster {
	t.Helper()
	return testcluster.New(t, n, testcluster.WithConfig(func(_ int, c *cluster.Config) {
		c.Lease = cluster.LeaseConfig{Threshold: 100, TTL: ttl, Share: share}
		c.Unreachable = sluice.PolicyDeny
	}))
}

// nonOwners returns the live nodes that do not own (name, key).
func nonOwners(c *testcluster.Cluster, name, key string) []*cluster.Node {
	owner := c.Owner(name, key)
	var out []*cluster.Node
	for _, nd := range c.Nodes() {
		if nd != owner {
			out = append(out, nd)
		}
	}
	return out
}

func leaseTotals(nodes []*cluster.Node) (s cluster.LeaseStats, forwarded int64) {
	for _, nd := range nodes {
		st := nd.Stats()
		forwarded += st.Forwarded
		s.Requested += st.Leases.Requested
		s.Granted += st.Leases.Granted
		s.HitsLeased += st.Leases.HitsLeased
		s.Local += st.Leases.Local
		s.Denied += st.Leases.Denied
		s.HitsReturned += st.Leases.HitsReturned
		s.Served += st.Leases.Served
	}
	return s, forwarded
}

// hammer runs callers goroutines, each checking req on nodes[g%len(nodes)]
// until until passes, it has made perCaller checks, or seen returned true
// for some decision, and calls seen with every decision. It fails the test
// on an error or a decision made without the owner.
func hammer(t *testing.T, nodes []*cluster.Node, req limiter.Request, callers, perCaller int, until time.Time, seen func(sluice.Decision) (enough bool)) {
	t.Helper()
	var wg sync.WaitGroup
	var stop atomic.Bool
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nd := nodes[g%len(nodes)]
			for i := 0; i < perCaller && !stop.Load() && time.Now().Before(until); i++ {
				d, err := nd.Check(context.Background(), req)
				if err == nil && d.WithoutOwner && d.Allowed {
					err = fmt.Errorf("admitted without owner on %s", nd.Name())
				}
				if err != nil {
					errs <- err
					return
				}
				if seen(d) {
					stop.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// With 64 callers on one hot key over 3 nodes, leases never admit more than
// the limit: per fixed window (told apart by Decision.ResetAt, the window's
// end), and over the run for the token bucket and GCRA (burst plus the rate
// times the elapsed time). The callers are on the two nodes that do not own
// the key: callers in tight loops on the owner take every hit the moment it
// is available, and leases would win none (TestClusterExactAcrossNodes
// covers callers everywhere).
func TestLeaseHotKeyExact(t *testing.T) {
	waitBound(t)
	c := leaseCluster(t, 3, 100*time.Millisecond, 0.1)
	const limit, period = 500, 200 * time.Millisecond
	for _, a := range []limiter.Algorithm{limiter.FixedWindow, limiter.TokenBucket, limiter.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			req := limiter.Request{Name: "hot", Key: "exact-" + a.String(), Hits: 1, Limit: limit, Period: period, Algorithm: a}
			before, _ := leaseTotals(c.Nodes())
			var mu sync.Mutex
			perWindow := map[int64]int64{} // window end, Unix ns
			var allowed, denied, fromLease atomic.Int64
			others := nonOwners(c, req.Name, req.Key)
			start := time.Now()
			// The callers run for 1.5s at least, and on until what the
			// test asserts has happened: the limit reached (in two fixed
			// windows) and a check decided from a lease. A loaded machine
			// makes fewer checks a second; it is given longer, not failed.
			var full atomic.Int64 // fixed windows that reached the limit
			var checked atomic.Int64
			enough := func() bool {
				if time.Since(start) < 1500*time.Millisecond || denied.Load() == 0 || a == limiter.FixedWindow && full.Load() < 2 {
					return false
				}
				s, _ := leaseTotals(c.Nodes())
				return s.Local > before.Local
			}
			hammer(t, others, req, 64, 1_000_000, start.Add(time.Minute), func(d sluice.Decision) bool {
				check := checked.Add(1)%256 == 0 // enough reads every node's stats: not on every check
				if !d.Allowed {
					denied.Add(1)
					return check && enough()
				}
				allowed.Add(1)
				for _, o := range others {
					if d.Owner == o.Name() {
						t.Errorf("decision owned by %s, which does not own the key", o.Name())
					}
				}
				if a == limiter.FixedWindow {
					mu.Lock()
					perWindow[d.ResetAt.UnixNano()]++
					if perWindow[d.ResetAt.UnixNano()] == limit {
						full.Add(1)
					}
					mu.Unlock()
				}
				return check && enough()
			})
			elapsed := time.Since(start)
			after, _ := leaseTotals(c.Nodes())
			fromLease.Store(after.Local - before.Local)
			t.Logf("%s: %d admitted, %d denied, %d admitted and %d denied from leases in %v; %d leases granted", a, allowed.Load(), denied.Load(), fromLease.Load(), after.Denied-before.Denied, elapsed, after.Granted-before.Granted)
			if fromLease.Load() == 0 {
				t.Fatal("no check was decided from a lease")
			}
			if denied.Load() == 0 {
				t.Fatal("the limit was never reached")
			}
			switch a {
			case limiter.FixedWindow:
				full := 0
				for end, n := range perWindow {
					if n > limit {
						t.Errorf("window ending %v admitted %d, limit %d", time.Unix(0, end).Format("15:04:05.000"), n, limit)
					}
					if n == limit {
						full++
					}
				}
				if full < 2 {
					t.Errorf("only %d of %d windows reached the limit", full, len(perWindow))
				}
			case limiter.TokenBucket:
				bound := int64(limit + float64(limit)*float64(elapsed)/float64(period))
				if allowed.Load() > bound {
					t.Errorf("admitted %d in %v, at most %d allowed", allowed.Load(), elapsed, bound)
				}
			case limiter.GCRA:
				emission := (int64(period) + limit - 1) / limit
				bound := limit + int64(elapsed)/emission
				if allowed.Load() > bound {
					t.Errorf("admitted %d in %v, at most %d allowed", allowed.Load(), elapsed, bound)
				}
			}
		})
	}
}

// For the same checks on a hot key, leases cut the calls to its owner
// (forwarded checks, lease requests and returns together) by 10x or more,
// counted without timing: every node reads one clock that stands still,
// so no lease expires or goes unused mid-test, and each of the two nodes
// that do not own the key makes its checks one at a time; after a check
// not decided from a lease once the key is hot, it waits until it holds
// leased hits again (a lease in flight when the checks outran it). Without
// leases every check is a call. With them, the first checks up to the
// threshold of one rate interval are forwarded, then each forwarded check
// is one a lease request was in flight for, and the requests are few:
// each asks for ten times the checks seen so far (the checks of a TTL at
// the rate of a frozen interval's first tenth), so the leases grow
// geometrically. How far the cut goes under concurrent callers on a moving
// clock depends on how soon each lease request is answered:
// BenchmarkLeaseCutsForwarded measures it (docs/performance.md).
func TestLeaseCutsForwarded(t *testing.T) {
	const threshold, perNode = 100, 8000
	hotAfter := int64(math.Ceil(threshold * cluster.LeaseInterval.Seconds()))
	calls := func(t *testing.T, threshold int64) (calls int64, s cluster.LeaseStats) {
		clk := newClock()
		c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, c *cluster.Config) {
			c.Clock = cluster.ClockFunc(clk.Now)
			c.Lease = cluster.LeaseConfig{Threshold: threshold, TTL: 100 * time.Millisecond, Share: 0.1}
		}))
		req := limiter.Request{Name: "hot", Key: "forwarded", Hits: 1, Limit: 1_000_000_000, Period: time.Second, Algorithm: limiter.TokenBucket}
		for _, nd := range nonOwners(c, req.Name, req.Key) {
			for i := range int64(perNode) {
				local := nd.Stats().Leases.Local
				d, err := nd.Check(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					t.Fatalf("%s: check %d denied under a limit that is never reached", nd.Name(), i)
				}
				if threshold == 0 || i+1 < hotAfter || nd.Stats().Leases.Local > local {
					continue
				}
				err = testcluster.WaitFor(10*time.Second, func() error {
					if s := nd.Stats().Leases; s.HitsLeased <= s.Local {
						return fmt.Errorf("%s holds no leased hit after check %d: %+v", nd.Name(), i, s)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			st := nd.Stats()
			ls := st.Leases
			t.Logf("%s: %d forwarded, %+v", nd.Name(), st.Forwarded, ls)
			switch {
			case threshold == 0 && (st.Forwarded != perNode || ls.Requested != 0):
				t.Errorf("%s without leases: %d forwarded and %d lease requests for %d checks", nd.Name(), st.Forwarded, ls.Requested, perNode)
			case threshold == 0:
			case st.Forwarded < hotAfter || st.Forwarded > hotAfter+ls.Requested:
				t.Errorf("%s: %d forwarded, want %d (the checks of the threshold) to %d (and one per lease request)", nd.Name(), st.Forwarded, hotAfter, hotAfter+ls.Requested)
			case ls.HitsReturned != 0 || st.Forwarded+ls.Local != perNode:
				t.Errorf("%s: %d forwarded and %d from leases for %d checks, %d hits returned on a clock that stands still", nd.Name(), st.Forwarded, ls.Local, perNode, ls.HitsReturned)
			}
			calls += st.Forwarded + ls.Requested
			s.Requested += ls.Requested
			s.Granted += ls.Granted
			s.HitsLeased += ls.HitsLeased
			s.Local += ls.Local
		}
		return calls, s
	}
	var off, on int64
	var s cluster.LeaseStats
	t.Run("off", func(t *testing.T) { off, _ = calls(t, 0) })
	t.Run("on", func(t *testing.T) { on, s = calls(t, threshold) })
	t.Logf("calls to the owner for %d checks: %d without leases, %d with (%+v)", 2*perNode, off, on, s)
	if off != 2*perNode {
		t.Fatalf("%d calls without leases for %d checks", off, 2*perNode)
	}
	if on*10 > off {
		t.Fatalf("leases cut calls from %d to %d, less than 10x", off, on)
	}
	if s.Local == 0 {
		t.Fatal("no check was decided from a lease")
	}
}

// BenchmarkLeaseCutsForwarded is TestLeaseCutsForwarded under load: 32
// callers at once check one hot key on the two nodes that do not own it,
// on the system clock, without and with leases (threshold 100/s, TTL
// 100 ms, share 0.1). It reports the calls to the owner per check: the
// forwarded checks, the lease requests and, at most one per lease
// granted, the returns of unused hits. How many checks are forwarded
// while a lease request is in flight, and how many leases expire or go
// unused, depend on the scheduling: this ratio is measured, not asserted.
func BenchmarkLeaseCutsForwarded(b *testing.B) {
	for _, threshold := range []int64{0, 100} {
		name := "off"
		if threshold > 0 {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			c := testcluster.New(b, 3, testcluster.WithConfig(func(_ int, c *cluster.Config) {
				c.Lease = cluster.LeaseConfig{Threshold: threshold, TTL: 100 * time.Millisecond, Share: 0.1}
			}))
			req := limiter.Request{Name: "hot", Key: "forwarded", Hits: 1, Limit: 1_000_000_000, Period: time.Second, Algorithm: limiter.TokenBucket}
			others := nonOwners(c, req.Name, req.Key)
			const callers = 32
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for g := range callers {
				wg.Go(func() {
					nd := others[g%len(others)]
					for next.Add(1) <= int64(b.N) {
						if d, err := nd.Check(context.Background(), req); err != nil || !d.Allowed {
							b.Errorf("%s: %v, %+v", nd.Name(), err, d)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			s, forwarded := leaseTotals(others)
			calls := forwarded + s.Requested + s.Granted
			b.ReportMetric(float64(calls)/float64(b.N), "calls/check")
			b.ReportMetric(float64(forwarded)/float64(b.N), "forwarded/check")
		})
	}
}

// checkUntilLeased checks req on nd until nd holds a lease, and returns the
// checks admitted. Each round's 50 checks are made by 25 callers at once,
// two each: the first 25 reach nd within one of its rate intervals
// however long a forwarded check takes, so that the key's rate passes
// the lease threshold on a starved machine too (five callers checking
// ten times each made fewer than 10 checks an interval once forwarded
// checks took over 50 ms, in a -race run beside two other test runs).
func checkUntilLeased(t *testing.T, nd *cluster.Node, req limiter.Request) int64 {
	t.Helper()
	const callers, each = 25, 2
	var admitted atomic.Int64
	// One check first, forwarded while the key is not hot: the owner
	// holds a state of the key, which hits leased after it, held apart
	// from its bucket, would not give it (TestResetWithLeaseOut inspects
	// it).
	if d, err := nd.Check(context.Background(), req); err != nil {
		t.Fatal(err)
	} else if d.Allowed {
		admitted.Add(1)
	}
	err := testcluster.WaitFor(30*time.Second, func() error {
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for range callers {
			wg.Go(func() {
				for range each {
					d, err := nd.Check(context.Background(), req)
					if err != nil {
						errs <- err
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
		if nd.Stats().Leases.Granted == 0 {
			return errors.New("no lease granted")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return admitted.Load()
}

// remainingIs waits until the owner reports want remaining for req.
func remainingIs(t *testing.T, owner *cluster.Node, req limiter.Request, want int64) {
	t.Helper()
	req.Hits = 0
	err := testcluster.WaitFor(10*time.Second, func() error {
		d, err := owner.Check(context.Background(), req)
		if err != nil {
			return err
		}
		if d.Remaining != want {
			return fmt.Errorf("owner has %d remaining, want %d", d.Remaining, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A lease that expires unused gives its hits back: the owner's bucket,
// which cannot refill in the test, has again all that was not admitted.
func TestLeaseUnusedHitsReturn(t *testing.T) {
	c := leaseCluster(t, 3, 100*time.Millisecond, 0.5)
	req := limiter.Request{Name: "hot", Key: "return", Hits: 1, Limit: 1000, Period: 1000 * time.Hour, Algorithm: limiter.TokenBucket}
	nd := nonOwners(c, req.Name, req.Key)[0]
	admitted := checkUntilLeased(t, nd, req)
	remainingIs(t, c.Owner(req.Name, req.Key), req, 1000-admitted)
	// The owner applies a refund before the node counts it returned, when
	// the answer arrives: wait for the count too.
	var s cluster.LeaseStats
	err := testcluster.WaitFor(10*time.Second, func() error {
		if s = nd.Stats().Leases; s.HitsReturned != s.HitsLeased-s.Local {
			return fmt.Errorf("returned %d hits of %d leased and %d used", s.HitsReturned, s.HitsLeased, s.Local)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d admitted; %+v", admitted, s)
}

// A node that leaves gives back the leases it holds, long before they
// expire.
func TestLeaseReturnedOnLeave(t *testing.T) {
	c := leaseCluster(t, 3, time.Minute, 0.5)
	req := limiter.Request{Name: "hot", Key: "leave", Hits: 1, Limit: 1000, Period: 1000 * time.Hour, Algorithm: limiter.TokenBucket}
	owner := c.Owner(req.Name, req.Key)
	nd := nonOwners(c, req.Name, req.Key)[0]
	admitted := checkUntilLeased(t, nd, req)
	idx := -1
	for i := range 3 {
		if c.Node(i) == nd {
			idx = i
		}
	}
	c.Leave(idx)
	if s := nd.Stats().Leases; s.HitsReturned != s.HitsLeased-s.Local {
		t.Fatalf("returned %d hits of %d leased and %d used", s.HitsReturned, s.HitsLeased, s.Local)
	}
	remainingIs(t, owner, req, 1000-admitted)
}

// Owners grant leases for the token bucket, fixed window and GCRA only; a
// fixed window lease ends with its window; a node that does not own the
// key refuses; checks of hot keys of the other algorithms ask for none.
func TestLeaseRefusal(t *testing.T) {
	c := leaseCluster(t, 3, 100*time.Millisecond, 0.1)
	ctx := context.Background()
	for _, a := range limiter.Algorithms {
		req := limiter.Request{Name: "refuse", Key: a.String(), Limit: 100, Period: time.Hour, Algorithm: a}
		owner := c.Owner(req.Name, req.Key)
		now := time.Now()
		l, err := owner.Lease(ctx, "test", req, 10, 100*time.Millisecond)
		switch a {
		case limiter.LeakyBucket, limiter.SlidingWindowLog, limiter.SlidingWindowCounter:
			if !errors.Is(err, cluster.ErrLeaseRefused) {
				t.Errorf("%s: lease err %v, want ErrLeaseRefused", a, err)
			}
			continue
		}
		if err != nil || l.Granted != 10 {
			t.Fatalf("%s: lease of %d, err %v; want 10", a, l.Granted, err)
		}
		if a == limiter.FixedWindow {
			// A lease longer than the rest of the window ends with it.
			short := req
			short.Key, short.Period = "short-window", 50*time.Millisecond
			l, err := c.Owner(short.Name, short.Key).Lease(ctx, "test", short, 10, time.Second)
			if err != nil || !l.ExpiresAt.Equal(l.Decision.ResetAt) || l.Granted != 10 {
				t.Errorf("fixed window lease of %d expires at %v, window ends %v, err %v", l.Granted, l.ExpiresAt, l.Decision.ResetAt, err)
			}
		}
		if max := now.Add(101 * time.Millisecond); l.ExpiresAt.After(max) {
			t.Errorf("%s: lease expires at %v, after now+ttl", a, l.ExpiresAt)
		}
		if _, err := nonOwners(c, req.Name, req.Key)[0].Lease(ctx, "test", req, 10, time.Second); !errors.Is(err, cluster.ErrLeaseRefused) {
			t.Errorf("%s: a non-owner leased: err %v", a, err)
		}
	}

	// Over the wire: the owner's refusal reaches the caller.
	req := limiter.Request{Name: "refuse", Key: "wire", Limit: 100, Period: time.Hour, Algorithm: limiter.LeakyBucket}
	owner := c.Owner(req.Name, req.Key)
	cl, err := peer.NewClient(owner.Name(), owner.GRPCAddr(), peer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Lease(ctx, req, 10, time.Second); err == nil || !strings.Contains(err.Error(), "leaky_bucket") {
		t.Errorf("leaky bucket lease over the wire: err %v", err)
	}

	// A hot key of an algorithm that cannot lease is forwarded as usual.
	req = limiter.Request{Name: "refuse", Key: "hot-log", Hits: 1, Limit: 1_000_000, Period: time.Second, Algorithm: limiter.SlidingWindowLog}
	others := nonOwners(c, req.Name, req.Key)
	before, _ := leaseTotals(others)
	hammer(t, others, req, 8, 200, time.Now().Add(time.Minute), func(sluice.Decision) bool { return false })
	if after, _ := leaseTotals(others); after.Requested != before.Requested {
		t.Fatalf("%d leases requested for a sliding window log", after.Requested-before.Requested)
	}
}

func TestLeaseConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		lease cluster.LeaseConfig
		want  string // in the error; "" for a valid config
	}{
		{cluster.LeaseConfig{}, ""},
		{cluster.DefaultLeaseConfig(), ""},
		{cluster.LeaseConfig{Threshold: 100, TTL: 100 * time.Millisecond, Share: 1}, ""},
		{cluster.LeaseConfig{Threshold: -1}, "Lease.Threshold"},
		{cluster.LeaseConfig{Threshold: 100, Share: 0.1}, "Lease.TTL"},
		{cluster.LeaseConfig{Threshold: 100, TTL: 2 * time.Minute, Share: 0.1}, "Lease.TTL"},
		{cluster.LeaseConfig{Threshold: 100, TTL: time.Second}, "Lease.Share"},
		{cluster.LeaseConfig{Threshold: 100, TTL: time.Second, Share: 1.5}, "Lease.Share"},
	} {
		cfg := cluster.TestConfig("v")
		cfg.Lease = tc.lease
		err := cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.lease, err)
		case tc.want != "" && (!errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: err %v, want ErrInvalidConfig naming %s", tc.lease, err, tc.want)
		}
	}
}

// Nodes that lease leave no goroutine behind once closed.
func TestLeaseCloseLeavesNoGoroutines(t *testing.T) {
	noLeaksAfter(t)
	c := leaseCluster(t, 3, 100*time.Millisecond, 0.1)
	req := limiter.Request{Name: "hot", Key: "leak", Hits: 1, Limit: 1_000_000, Period: time.Second, Algorithm: limiter.GCRA}
	checkUntilLeased(t, nonOwners(c, req.Name, req.Key)[0], req)
	c.Close()
}

// A lease is dropped when its key's owner changes: once the ring no longer
// routes to the old owner, no check is decided from its hits.
func TestLeaseDroppedOnOwnerChange(t *testing.T) {
	waitBound(t)
	c := leaseCluster(t, 3, time.Minute, 0.5)
	req := limiter.Request{Name: "hot", Key: "moved", Hits: 1, Limit: 1000, Period: 1000 * time.Hour, Algorithm: limiter.TokenBucket}
	old := c.Owner(req.Name, req.Key)
	nd := nonOwners(c, req.Name, req.Key)[0]
	checkUntilLeased(t, nd, req)
	for i := range 3 {
		if c.Node(i) == old {
			c.StopHard(i)
		}
	}
	c.WaitConverged()
	owner := c.Owner(req.Name, req.Key)
	d, err := nd.Check(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if d.Owner != owner.Name() || d.Owner == old.Name() {
		t.Fatalf("decided by %s after the key moved from %s to %s", d.Owner, old.Name(), owner.Name())
	}
}

// CheckMany, the daemon's path, decides from leases too.
func TestLeaseCheckMany(t *testing.T) {
	c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, c *cluster.Config) {
		c.Lease.Threshold = 100
	}))
	req := limiter.Request{Name: "hot", Key: "many", Hits: 1, Limit: 1_000_000_000, Period: time.Second, Algorithm: limiter.TokenBucket}
	nd := nonOwners(c, req.Name, req.Key)[0]
	err := testcluster.WaitFor(10*time.Second, func() error {
		for range 50 {
			for _, r := range nd.CheckMany(context.Background(), []limiter.Request{req, req}) {
				if r.Err != nil || !r.Allowed {
					return fmt.Errorf("CheckMany: allowed %v, err %v", r.Allowed, r.Err)
				}
			}
		}
		if nd.Stats().Leases.Local == 0 {
			return errors.New("no check decided from a lease yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
