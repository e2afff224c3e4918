package testcluster_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/testcluster"
)

// checkTimeout bounds every check of these tests: far above what a check
// takes, far below the slowness that would hold one without a deadline.
const checkTimeout = 5 * time.Second

// shortPeerTimeout gives up on a slow owner well before checkTimeout, for
// the tests that hold a node slow and expect checks decided without it
// (TestConfig's peer timeout is long, for loaded machines).
var shortPeerTimeout = testcluster.WithConfig(func(_ int, cfg *cluster.Config) { cfg.Peer.Timeout = 500 * time.Millisecond })

func chaosRequest(key string, limit int64) limiter.Request {
	return limiter.Request{Name: "chaos", Key: key, Hits: 1, Limit: limit, Period: time.Hour, Algorithm: limiter.FixedWindow}
}

func check(t *testing.T, n *cluster.Node, req limiter.Request) sluice.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	d, err := n.Check(ctx, req)
	if err != nil {
		t.Fatalf("check of %q on %s: %v", req.Key, n.Name(), err)
	}
	return d
}

// keyOwnedBy returns a key of the "chaos" limit that every ring given
// routes to owner.
func keyOwnedBy(t *testing.T, owner string, rings ...interface {
	Owner(name, key string) (ring.Member, bool)
}) string {
	t.Helper()
	for k := range 10_000 {
		key := fmt.Sprint("k", k)
		ok := true
		for _, r := range rings {
			if m, _ := r.Owner("chaos", key); m.Name != owner {
				ok = false
			}
		}
		if ok {
			return key
		}
	}
	t.Fatalf("no key owned by %s in every ring", owner)
	return ""
}

// ringOf returns a ring over the named members of n's ring.
func ringOf(t *testing.T, n *cluster.Node, names ...string) *ring.Ring {
	t.Helper()
	r, err := ring.New(ring.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	var ms []ring.Member
	for _, m := range n.RingMembers() {
		for _, name := range names {
			if m.Name == name {
				ms = append(ms, m)
			}
		}
	}
	if err := r.SetMembers(ms); err != nil {
		t.Fatal(err)
	}
	return r
}

// A 3-node cluster cut into {0} and {1,2}: both sides keep answering, the
// owner deciding when it is on the caller's side and the local policy when
// it is across; each side's ring comes to hold only its side, and limits
// owned on one side stay exact throughout. Once healed, the three converge
// and route every key alike, and checks are forwarded across again.
func TestPartitionAndHeal(t *testing.T) {
	c := testcluster.New(t, 3)
	n0, n1, n2 := c.Node(0), c.Node(1), c.Node(2)
	right := ringOf(t, n1, n1.Name(), n2.Name()) // the {1,2} side's ring to come
	toZero := keyOwnedBy(t, n0.Name(), n1)
	toOne := keyOwnedBy(t, n1.Name(), n0)
	// Owned by node 2 before the partition and after: its count is exact.
	exact := keyOwnedBy(t, n2.Name(), n1, right)

	c.Partition([]int{0}, []int{1, 2})

	// Right away, before gossip has noticed anything.
	acrossAnswered := func(from *cluster.Node, key string, side ...*cluster.Node) {
		t.Helper()
		before, _ := from.Owner("chaos", key)
		d := check(t, from, chaosRequest(key, 1000))
		after, _ := from.Owner("chaos", key)
		if !has(side, d.Owner) || !d.Allowed {
			t.Fatalf("check of %q on %s during the partition: %+v, want allowed on its side", key, from.Name(), d)
		}
		// Routed across the cut: only the policy can have decided.
		if across := before.Name == after.Name && !has(side, before.Name); across && !d.WithoutOwner {
			t.Fatalf("check of %q on %s routed to %s across the cut: %+v, want WithoutOwner", key, from.Name(), before.Name, d)
		}
	}
	acrossAnswered(n0, toOne, n0)
	acrossAnswered(n1, toZero, n1, n2)
	for i, n := range []*cluster.Node{n1, n2} {
		if d := check(t, n, chaosRequest(exact, 4)); !d.Allowed || d.WithoutOwner || d.Owner != n2.Name() {
			t.Fatalf("check %d of the key node 2 owns, on %s: %+v, want allowed by %s", i, n.Name(), d, n2.Name())
		}
	}

	c.WaitConverged() // each side's ring holds only its side
	for n, want := range map[*cluster.Node][]string{n0: {n0.Name()}, n1: {n1.Name(), n2.Name()}, n2: {n1.Name(), n2.Name()}} {
		if got := names(n.RingMembers()); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s routes over %v during the partition, want %v", n.Name(), got, want)
		}
	}
	if d := check(t, n0, chaosRequest(toOne, 1000)); d.WithoutOwner || d.Owner != n0.Name() {
		t.Fatalf("node 0 alone: %+v, want decided by itself as owner", d)
	}
	if d := check(t, n1, chaosRequest(toZero, 1000)); d.WithoutOwner || (d.Owner != n1.Name() && d.Owner != n2.Name()) {
		t.Fatalf("side {1,2}: %+v, want decided by an owner on its side", d)
	}
	for i, want := range []bool{true, true, false} {
		if d := check(t, []*cluster.Node{n1, n2}[i%2], chaosRequest(exact, 4)); d.Allowed != want || d.WithoutOwner || d.Owner != n2.Name() {
			t.Fatalf("check %d of the key node 2 owns after convergence: %+v, want allowed=%v by %s", i+2, d, want, n2.Name())
		}
	}

	c.Heal()
	for k := range 300 {
		key := fmt.Sprint("k", k)
		want, _ := n0.Owner("chaos", key)
		for _, n := range []*cluster.Node{n1, n2} {
			if got, _ := n.Owner("chaos", key); got.Name != want.Name {
				t.Fatalf("after healing, %s routes %q to %s, node 0 to %s", n.Name(), key, got.Name, want.Name)
			}
		}
	}
	for _, tc := range []struct {
		from  *cluster.Node
		key   string
		owner *cluster.Node
	}{{n1, toZero, n0}, {n0, toOne, n1}} {
		err := testcluster.WaitFor(testcluster.DefaultWait, func() error {
			if d := check(t, tc.from, chaosRequest(tc.key, 1000)); d.WithoutOwner || d.Owner != tc.owner.Name() {
				return fmt.Errorf("check on %s: %+v, want forwarded to %s", tc.from.Name(), d, tc.owner.Name())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func names(ms []ring.Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	return out
}

// has reports whether one of nodes is named name.
func has(nodes []*cluster.Node, name string) bool {
	for _, n := range nodes {
		if n.Name() == name {
			return true
		}
	}
	return false
}

// A check forwarded to a slow owner gives up after the peer timeout and is
// decided by the unreachable policy; after BreakerThreshold such checks the
// breaker opens and checks no longer try the owner. Once the owner is fast
// again and the cooldown has passed, checks are forwarded again. The
// policy is deny: under local or allow, the hits admitted without the
// owner are settled with it in the background, and those calls to the
// slow owner fail and count towards its breaker too, so that fewer than
// BreakerThreshold checks may open it on a loaded machine.
func TestSlowOwnerOpensBreaker(t *testing.T) {
	const (
		timeout  = 100 * time.Millisecond // the peer timeout
		slowness = time.Minute            // held far beyond checkTimeout
	)
	// The nodes' clock runs with the system's, so that the peer timeout
	// passes, and skips ahead when the test lets a breaker's cooldown pass.
	var skipped atomic.Int64
	clock := cluster.ClockFunc(func() time.Time { return time.Now().Add(time.Duration(skipped.Load())) })
	c := testcluster.New(t, 2, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.Peer.Timeout = timeout
		cfg.Clock = clock
		cfg.Unreachable = sluice.PolicyDeny
	}))
	n0, n1 := c.Node(0), c.Node(1)
	cooldown := cluster.TestConfig("").BreakerCooldown
	threshold := cluster.TestConfig("").BreakerThreshold
	req := chaosRequest(keyOwnedBy(t, n1.Name(), n0), 1_000_000)
	// forwarded waits until a check is decided by node 1, letting every
	// cooldown pass so that an open breaker probes again.
	forwarded := func() {
		t.Helper()
		err := testcluster.WaitFor(testcluster.DefaultWait, func() error {
			skipped.Add(int64(cooldown))
			if d := check(t, n0, req); d.WithoutOwner || d.Owner != n1.Name() {
				return fmt.Errorf("check: %+v, want forwarded to %s", d, n1.Name())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	forwarded()

	c.Slow(1, slowness)
	before := n0.Stats()
	for i := range threshold + 10 {
		d := check(t, n0, req) // returns well within checkTimeout
		if !d.WithoutOwner || d.Owner != n0.Name() || d.Allowed {
			t.Fatalf("check %d with the owner slow: %+v, want denied by %s without the owner", i, d, n0.Name())
		}
	}
	after := n0.Stats()
	if got := after.Forwarded - before.Forwarded; got != int64(threshold) {
		t.Fatalf("%d checks were forwarded to the slow owner, want %d: then the breaker opens", got, threshold)
	}
	if got := after.WithoutOwner - before.WithoutOwner; got != int64(threshold+10) {
		t.Fatalf("%d checks were decided without the owner, want %d", got, threshold+10)
	}

	c.Slow(1, 0)
	forwarded()
}

// Partitions, slow nodes and checks held by them leave no goroutine behind
// once the cluster is closed.
func TestChaosLeavesNoGoroutines(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	defer func() {
		// memberlist's probe goroutine outlives Shutdown by up to a probe
		// interval, longer on a loaded machine: wait for it to end.
		if err := testcluster.WaitFor(testcluster.DefaultWait, func() error { return goleak.Find(ignore) }); err != nil {
			t.Error(err)
		}
	}()
	c := testcluster.New(t, 3, shortPeerTimeout)
	n0 := c.Node(0)
	toOne := keyOwnedBy(t, c.Node(1).Name(), n0)
	toTwo := keyOwnedBy(t, c.Node(2).Name(), n0)
	c.Slow(2, time.Minute)
	c.Partition([]int{0, 2}, []int{1})
	for _, key := range []string{toOne, toTwo} {
		if d := check(t, n0, chaosRequest(key, 10)); !d.WithoutOwner {
			t.Fatalf("check of %q: %+v, want decided without its owner", key, d)
		}
	}
	c.Close()
}

// fatalRecorder records a Fatalf and ends the goroutine, as testing.T does.
type fatalRecorder struct {
	testing.TB
	msg atomic.Pointer[string]
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	f.msg.Store(&msg)
	runtime.Goexit()
}

// Bad node indices and delays fail the test with a message naming them;
// nothing panics.
func TestChaosRejectsBadArguments(t *testing.T) {
	rec := &fatalRecorder{TB: t}
	c := testcluster.New(rec, 2)
	for _, tc := range []struct {
		call func()
		want string
	}{
		{func() { c.Partition([]int{0}, []int{2}) }, "Partition: no node 2 (nodes are 0 to 1)"},
		{func() { c.Partition([]int{-1}) }, "Partition: no node -1"},
		{func() { c.Partition([]int{0, 1}, []int{1}) }, "node 1 is in groups 0 and 1"},
		{func() { c.Slow(2, time.Second) }, "Slow(2): no such node"},
		{func() { c.Slow(0, -time.Second) }, "Slow(0, -1s): negative delay"},
		{func() { c.Node(5) }, "Node(5): no such node"},
		{func() { c.StopHard(-1) }, "StopHard(-1): no such node"},
		{func() { c.Restart(3) }, "Restart(3): no such node"},
		{func() { c.Index(nil) }, "not one of the cluster's"},
	} {
		rec.msg.Store(nil)
		done := make(chan struct{})
		go func() {
			defer close(done)
			tc.call()
		}()
		<-done
		got := rec.msg.Load()
		if got == nil {
			t.Errorf("no failure, want one containing %q", tc.want)
		} else if !strings.Contains(*got, tc.want) {
			t.Errorf("failure %q, want one containing %q", *got, tc.want)
		}
	}
	c.WaitConverged() // the bad calls changed nothing
}

// A partition and a slowness name nodes by index: a node restarted on new
// addresses stays on its side, and stays slow, until healed or cleared.
func TestRestartKeepsChaos(t *testing.T) {
	c := testcluster.New(t, 3, shortPeerTimeout)
	c.Partition([]int{0, 1}, []int{2})
	c.Slow(2, time.Minute)
	c.WaitConverged()
	c.StopHard(2)
	back := c.Restart(2) // its seed, node 0, is across: it starts alone
	if got := names(back.RingMembers()); len(got) != 1 || got[0] != back.Name() {
		t.Fatalf("restarted node 2 routes over %v during the partition, want itself only", got)
	}
	c.Heal()
	n0 := c.Node(0)
	req := chaosRequest(keyOwnedBy(t, back.Name(), n0), 10)
	if d := check(t, n0, req); !d.WithoutOwner || d.Owner != n0.Name() {
		t.Fatalf("check owned by the slow restarted node: %+v, want decided without it", d)
	}
	c.Slow(2, 0)
	err := testcluster.WaitFor(testcluster.DefaultWait, func() error {
		if d := check(t, n0, req); d.WithoutOwner || d.Owner != back.Name() {
			return fmt.Errorf("check: %+v, want forwarded to %s", d, back.Name())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
