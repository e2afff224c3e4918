package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
)

func request(a limiter.Algorithm, key string, limit int64) limiter.Request {
	return limiter.Request{Name: "test", Key: key, Hits: 1, Limit: limit, Period: time.Hour, Algorithm: a}
}

// On 3 nodes, 10,000 checks from 50 goroutines spread over every node admit
// exactly the limit of 1000, for every algorithm. The nodes decide at one
// instant (a clock that stands still), so that a run slowed down by a
// loaded machine refills nothing.
func TestClusterExactAcrossNodes(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *cluster.Config) { cfg.Clock = cluster.ClockFunc(clk.Now) }))
	nodes := c.Nodes()
	for _, a := range limiter.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			req := request(a, "exact-"+a.String(), 1000)
			var allowed, forwarded atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 50)
			for g := range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n := nodes[g%len(nodes)]
					for range 200 {
						d, err := n.Check(context.Background(), req)
						if err != nil {
							errs <- err
							return
						}
						if d.WithoutOwner {
							errs <- fmt.Errorf("decided without owner on %s", n.Name())
							return
						}
						if d.Owner != n.Name() {
							forwarded.Add(1)
						}
						if d.Allowed {
							allowed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := allowed.Load(); got != 1000 {
				t.Fatalf("admitted %d of 10000, want exactly 1000", got)
			}
			if forwarded.Load() == 0 {
				t.Fatal("no check was forwarded: the test did not exercise the cluster")
			}
		})
	}
}

// Once converged, every node routes every key to the same owner, and a check
// sent to any node is decided by that owner.
func TestClusterSameOwnerEverywhere(t *testing.T) {
	c := testcluster.New(t, 3)
	nodes := c.Nodes()
	owners := map[string]int{}
	for i := range 1000 {
		key := fmt.Sprintf("k%d", i)
		want, ok := nodes[0].Owner("route", key)
		if !ok {
			t.Fatal("no owner")
		}
		owners[want.Name]++
		for _, n := range nodes[1:] {
			if got, _ := n.Owner("route", key); got != want {
				t.Fatalf("key %s: %s routes to %v, %s to %v", key, nodes[0].Name(), want, n.Name(), got)
			}
		}
		if i%100 == 0 {
			req := request(limiter.GCRA, key, 10)
			req.Name = "route"
			d, err := nodes[i%3].Check(context.Background(), req)
			if err != nil || d.Owner != want.Name {
				t.Fatalf("key %s decided by %q (err %v), want owner %s", key, d.Owner, err, want.Name)
			}
		}
	}
	if len(owners) != 3 {
		t.Fatalf("keys are owned by %d nodes, want all 3: %v", len(owners), owners)
	}
}

// After an owner is stopped hard, checks keep answering within their
// deadline, and once the cluster sees it gone its keys have a new owner.
func TestClusterOwnerStoppedHard(t *testing.T) {
	c := testcluster.New(t, 3)
	idx := c.OwnerIndex("hard", "key")
	victim := c.Node(idx)
	c.StopHard(idx)
	survivor := c.Nodes()[0]
	req := request(limiter.TokenBucket, "key", 100)
	req.Name = "hard"
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d, err := survivor.Check(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("check after the owner stopped: %v", err)
		}
		if !d.Allowed {
			t.Fatalf("check after the owner stopped was denied: %+v", d)
		}
		if d.Owner == victim.Name() {
			t.Fatalf("decided by the stopped node %s", d.Owner)
		}
	}
	c.WaitConverged()
	for _, n := range c.Nodes() {
		if m, _ := n.Owner("hard", "key"); m.Name == victim.Name() {
			t.Fatalf("%s still routes to the stopped node", n.Name())
		}
	}
	d, err := survivor.Check(context.Background(), req)
	if err != nil || d.WithoutOwner {
		t.Fatalf("after convergence: %+v, %v; want a decision by the new owner", d, err)
	}
}

// The unreachable policies, per node and per request. The cluster uses the
// LAN profile so that a stopped node stays in the ring for seconds.
func TestClusterUnreachablePolicies(t *testing.T) {
	waitBound(t)
	c := testcluster.New(t, 2, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.Profile = cluster.ProfileLAN
	}))
	// Find a key owned by node 1, then stop node 1.
	var key string
	for i := 0; key == ""; i++ {
		if m, _ := c.Node(0).Owner("pol", fmt.Sprint(i)); m.Name == c.Node(1).Name() {
			key = fmt.Sprint(i)
		}
	}
	c.StopHard(1)
	n := c.Node(0)
	req := request(limiter.FixedWindow, key, 1)
	req.Name = "pol"
	check := func(opts ...sluice.CheckOption) sluice.Decision {
		t.Helper()
		d, err := n.Check(context.Background(), req, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if m, _ := n.Owner("pol", key); m.Name != c.Node(1).Name() {
			t.Skip("the stopped node left the ring before the checks ran")
		}
		if !d.WithoutOwner || d.Owner != n.Name() {
			t.Fatalf("decision %+v: want WithoutOwner by %s", d, n.Name())
		}
		return d
	}
	// Default policy: decide locally, so the limit of 1 holds on this node.
	if d := check(); !d.Allowed {
		t.Fatalf("first local decision denied: %+v", d)
	}
	if d := check(); d.Allowed {
		t.Fatalf("second local decision allowed past the limit of 1: %+v", d)
	}
	if d := check(sluice.OnUnreachable(sluice.PolicyAllow)); !d.Allowed {
		t.Fatalf("allow policy denied: %+v", d)
	}
	if d := check(sluice.OnUnreachable(sluice.PolicyDeny)); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("deny policy: %+v, want denied with RetryAfter 1s", d)
	}
	if got := n.Stats().WithoutOwner; got != 4 {
		t.Fatalf("Stats.WithoutOwner = %d, want 4", got)
	}
	// Three failed calls opened the owner's circuit breaker: the fourth
	// check was decided without trying the dead owner.
	if got := n.Stats().Forwarded; got != 3 {
		t.Fatalf("Stats.Forwarded = %d, want 3 (the breaker opens after 3 failures)", got)
	}
}

func TestNodeAloneIsALimiter(t *testing.T) {
	n, err := cluster.New(cluster.TestConfig("solo"))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	req := request(limiter.SlidingWindowLog, "k", 3)
	var allowed int
	for range 5 {
		d, err := n.Check(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if d.Owner != "solo" || d.WithoutOwner {
			t.Fatalf("decision %+v: want owner solo", d)
		}
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 3 {
		t.Fatalf("allowed %d, want 3", allowed)
	}
}

func TestCheckManyPerItem(t *testing.T) {
	c := testcluster.New(t, 3)
	var reqs []limiter.Request
	for i := range 30 {
		reqs = append(reqs, request(limiter.GCRA, fmt.Sprintf("many-%d", i), 1))
	}
	bad := request(limiter.GCRA, "", 1) // empty key
	reqs = append(reqs, bad)
	rs := c.Node(0).CheckMany(context.Background(), reqs)
	if len(rs) != len(reqs) {
		t.Fatalf("%d results for %d requests", len(rs), len(reqs))
	}
	owners := map[string]bool{}
	for i, r := range rs[:30] {
		if r.Err != nil || !r.Allowed {
			t.Fatalf("item %d: %+v", i, r)
		}
		if want := c.Owner("test", reqs[i].Key).Name(); r.Owner != want {
			t.Fatalf("item %d decided by %s, want %s", i, r.Owner, want)
		}
		owners[r.Owner] = true
	}
	if len(owners) < 2 {
		t.Fatalf("all 30 keys decided by %v: want several owners", owners)
	}
	if err := rs[30].Err; !errors.Is(err, limiter.ErrInvalidKey) {
		t.Fatalf("bad item: err %v, want ErrInvalidKey", err)
	}
	// A second round is denied everywhere: the limit of 1 held per key.
	for i, r := range c.Node(1).CheckMany(context.Background(), reqs[:30]) {
		if r.Err != nil || r.Allowed {
			t.Fatalf("second round item %d: %+v", i, r)
		}
	}
}

func TestCheckRejectsInvalidRequests(t *testing.T) {
	c := testcluster.New(t, 2)
	for _, tc := range []struct {
		mutate func(*limiter.Request)
		want   error
	}{
		{func(r *limiter.Request) { r.Name = "" }, limiter.ErrInvalidName},
		{func(r *limiter.Request) { r.Limit = 0 }, limiter.ErrInvalidLimit},
		{func(r *limiter.Request) { r.Hits = -1 }, limiter.ErrInvalidHits},
		{func(r *limiter.Request) { r.Algorithm = 99 }, limiter.ErrUnknownAlgorithm},
	} {
		req := request(limiter.TokenBucket, "k", 10)
		tc.mutate(&req)
		for _, n := range c.Nodes() {
			if _, err := n.Check(context.Background(), req); !errors.Is(err, tc.want) {
				t.Errorf("%s: err %v, want %v", n.Name(), err, tc.want)
			}
		}
	}
}

func TestMemberEvents(t *testing.T) {
	events := make(chan cluster.MemberEvent, 64)
	c := testcluster.New(t, 1, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		if i == 0 {
			cfg.Events = events
		}
	}))
	added := c.Add()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-events:
			for _, m := range ev.Members {
				if ev.Kind == cluster.MemberJoined && m.Name == added.Name() {
					if m.GRPCAddr != added.GRPCAddr() {
						t.Fatalf("joined member's gRPC address %q, want %q", m.GRPCAddr, added.GRPCAddr())
					}
					return
				}
			}
		case <-deadline:
			t.Fatal("no join event for the added node")
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for name, mutate := range map[string]func(*cluster.Config){
		"empty name":                 func(c *cluster.Config) { c.NodeName = "" },
		"bad gossip":                 func(c *cluster.Config) { c.GossipAddr = "nope" },
		"bad grpc port":              func(c *cluster.Config) { c.GRPCAddr = "127.0.0.1:xyz" },
		"unset policy":               func(c *cluster.Config) { c.Unreachable = sluice.PolicyDefault },
		"zero sweep":                 func(c *cluster.Config) { c.SweepInterval = 0 },
		"1ns replicate":              func(c *cluster.Config) { c.ReplicateInterval = time.Nanosecond },
		"1µs sweep":                  func(c *cluster.Config) { c.SweepInterval = time.Microsecond },
		"1ns retry join":             func(c *cluster.Config) { c.RetryJoinInterval = time.Nanosecond },
		"bad store":                  func(c *cluster.Config) { c.Store.Shards = 3 },
		"negative retry":             func(c *cluster.Config) { c.DenyRetryAfter = -1 },
		"nil server opt":             func(c *cluster.Config) { c.ServerOptions = []grpc.ServerOption{nil} },
		"no budget":                  func(c *cluster.Config) { c.ServerLimits.MessageBytes = 0 },
		"negative bootstrap expect":  func(c *cluster.Config) { c.BootstrapExpect = -1 },
		"bootstrap expect too large": func(c *cluster.Config) { c.BootstrapExpect = cluster.MaxBootstrapExpect + 1 },
		"NUL in DataDir":             func(c *cluster.Config) { c.DataDir = "/var/lib/\x00sluice" },
		"empty protocol range":       func(c *cluster.Config) { cluster.SetProtocol(c, 3, 2) },
		"1ns persist":                func(c *cluster.Config) { c.DataDir, c.PersistInterval = "x", time.Nanosecond },
		"damaged policy":             func(c *cluster.Config) { c.DamagedData = 9 },
	} {
		cfg := cluster.TestConfig("v")
		mutate(&cfg)
		if _, err := cluster.New(cfg); !errors.Is(err, cluster.ErrInvalidConfig) {
			t.Errorf("%s: err %v, want ErrInvalidConfig", name, err)
		}
	}
}

// Closing every node leaves no goroutine behind.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	noLeaksAfter(t)
	var nodes []*cluster.Node
	for i := range 3 {
		cfg := cluster.TestConfig(fmt.Sprintf("leak-%d", i))
		if i > 0 {
			cfg.Seeds = []string{nodes[0].GossipAddr()}
		}
		n, err := cluster.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	err := testcluster.WaitFor(10*time.Second, func() error {
		for _, n := range nodes {
			if len(n.RingMembers()) != 3 {
				return fmt.Errorf("%s sees %d", n.Name(), len(n.RingMembers()))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		if _, err := nodes[i%3].Check(context.Background(), request(limiter.TokenBucket, fmt.Sprint(i), 5)); err != nil {
			t.Fatal(err)
		}
	}
	nodes[2].Leave()
	nodes[1].Close()
	nodes[0].Close()
	nodes[0].Close() // twice is fine
}

// verifyNoLeaks fails t if goroutines other than those ignore names are
// left. memberlist's probe goroutine outlives Shutdown by up to a probe
// interval, longer on a loaded machine: it waits for such to end.
func verifyNoLeaks(t *testing.T, ignore goleak.Option) {
	t.Helper()
	if err := testcluster.WaitFor(testcluster.DefaultWait, func() error { return goleak.Find(ignore) }); err != nil {
		t.Error(err)
	}
}
