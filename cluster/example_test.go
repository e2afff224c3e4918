package cluster_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
)

// A node with no seeds is a complete single-node limiter: it owns every
// key and decides on its own store.
func ExampleNew() {
	node, err := cluster.New(cluster.TestConfig("node-a"))
	if err != nil {
		panic(err)
	}
	defer node.Close()

	req := limiter.Request{Name: "api_per_user", Key: "user:42", Hits: 1,
		Limit: 2, Period: time.Hour, Algorithm: limiter.TokenBucket}
	for range 3 {
		d, err := node.Check(context.Background(), req)
		if err != nil {
			panic(err)
		}
		fmt.Println(d.Allowed, d.Remaining, d.Owner)
	}
	// Output:
	// true 1 node-a
	// true 0 node-a
	// false 0 node-a
}

// Two nodes on loopback: the second joins the first through its gossip
// address. Once both route over both, a key's limit holds across the
// cluster, whichever node is asked: the one that does not own the key
// forwards the check to the one that does.
func Example_twoNodes() {
	a, err := cluster.New(cluster.TestConfig("node-a"))
	if err != nil {
		panic(err)
	}
	defer a.Close()
	cfg := cluster.TestConfig("node-b")
	cfg.Seeds = []string{a.GossipAddr()}
	b, err := cluster.New(cfg) // joins a, or keeps retrying
	if err != nil {
		panic(err)
	}
	defer b.Close()

	// Wait, with a deadline, until each node is ready, routes over both and
	// has the other's hand-over confirmation.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for _, nd := range []*cluster.Node{a, b} {
		if err := nd.WaitReady(ctx); err != nil {
			panic(err)
		}
		for len(nd.RingMembers()) != 2 || len(nd.Unconfirmed()) > 0 {
			select {
			case <-ctx.Done():
				panic(fmt.Sprintf("%s did not converge: %v", nd.Name(), ctx.Err()))
			case <-tick.C:
			}
		}
	}

	req := limiter.Request{Name: "api_per_user", Key: "user:42", Hits: 1,
		Limit: 3, Period: time.Hour, Algorithm: limiter.TokenBucket}
	for i := range 5 {
		nd := []*cluster.Node{a, b}[i%2]
		d, err := nd.Check(ctx, req, sluice.OnUnreachable(sluice.PolicyDeny))
		if err != nil {
			panic(err)
		}
		fmt.Println(nd.Name(), d.Allowed, d.Remaining)
	}
	// Output:
	// node-a true 2
	// node-b true 1
	// node-a true 0
	// node-b false 0
	// node-a false 0
}

// A node whose seeds do not answer starts alone, not ready, and keeps
// trying to join. Until it joins it decides no key as owner: every check
// gets the unreachable policy, the node's (Config.Unreachable, here
// decide locally) or the call's own (sluice.OnUnreachable), and says so in
// WithoutOwner.
func ExampleNode_Check_unreachable() {
	// A loopback address that nothing listens on.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	gone := lis.Addr().String()
	lis.Close()

	cfg := cluster.TestConfig("node-a")
	cfg.Seeds = []string{gone}
	node, err := cluster.New(cfg)
	if err != nil {
		panic(err)
	}
	defer node.Close()
	fmt.Println("ready:", node.Ready())

	req := limiter.Request{Name: "api_per_user", Key: "user:42", Hits: 1,
		Limit: 2, Period: time.Hour, Algorithm: limiter.TokenBucket}
	for _, p := range []sluice.Policy{sluice.PolicyDefault, sluice.PolicyDeny, sluice.PolicyAllow} {
		d, err := node.Check(context.Background(), req, sluice.OnUnreachable(p))
		if err != nil {
			panic(err)
		}
		fmt.Println(p, d.Allowed, d.WithoutOwner)
	}
	// Output:
	// ready: false
	// default true true
	// deny false true
	// allow true true
}
