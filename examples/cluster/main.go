// Command cluster starts a three-node sluice cluster in this process on the
// embedded defaults (loopback addresses, free ports), sends traffic at every
// node for a few limits, prints what each node allowed and limited, and
// shows that each limit held across the whole cluster.
//
//	go run ./examples/cluster
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
)

func main() {
	// Ctrl-C and SIGTERM end ctx: run returns and the nodes leave.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	nodes, err := startCluster(ctx, 3)
	if err != nil {
		return err
	}
	defer func() {
		for _, n := range nodes {
			n.Leave() // hands its counters to the others, then leaves
		}
	}()

	limits := []limiter.Request{
		{Name: "api_per_user", Key: "user:42", Limit: 100, Period: time.Minute, Algorithm: limiter.TokenBucket},
		{Name: "login_per_ip", Key: "203.0.113.7", Limit: 5, Period: time.Minute, Algorithm: limiter.FixedWindow},
		{Name: "export_per_org", Key: "org:acme", Limit: 20, Period: time.Hour, Algorithm: limiter.SlidingWindowLog},
		{Name: "search_per_user", Key: "user:7", Limit: 50, Period: time.Minute, Algorithm: limiter.GCRA},
	}
	const perNode = 60 // checks each node sends for each limit
	fmt.Printf("3 nodes, %d checks per node per limit, sent concurrently\n\n", perNode)
	fmt.Printf("%-16s %-22s %6s  %-26s %s\n", "limit", "algorithm", "limit", "allowed/limited per node", "total allowed")
	ok := true
	for _, base := range limits {
		base.Hits = 1
		allowed := make([]int, len(nodes))
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		for i, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perNode {
					d, err := n.Check(ctx, base)
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					if err == nil && d.Allowed {
						allowed[i]++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if firstErr != nil {
			return firstErr
		}
		total, cells := 0, ""
		for _, a := range allowed {
			total += a
			cells += fmt.Sprintf("%d/%d ", a, perNode-a)
		}
		owner, _ := nodes[0].Owner(base.Name, base.Key)
		fmt.Printf("%-16s %-22s %6d  %-26s %d (owner %s)\n", base.Name, base.Algorithm, base.Limit, cells, total, owner.Name)
		if int64(total) != min(base.Limit, int64(perNode*len(nodes))) {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("a limit did not hold across the cluster")
	}
	fmt.Println("\nEvery limit admitted exactly its limit across the three nodes.")
	return nil
}

// startCluster starts n nodes on loopback with the default config and waits
// until each routes over all of them and has settled the hand-over of its
// keys with each.
func startCluster(ctx context.Context, n int) ([]*cluster.Node, error) {
	var nodes []*cluster.Node
	for i := range n {
		cfg := cluster.DefaultConfig()
		cfg.NodeName = fmt.Sprintf("node-%d", i)
		cfg.GossipAddr = "127.0.0.1:0"
		cfg.GRPCAddr = "127.0.0.1:0"
		cfg.BootstrapExpect = n // ready once all n see each other
		if i > 0 {
			cfg.Seeds = []string{nodes[0].GossipAddr()}
		}
		nd, err := cluster.New(cfg)
		if err == nil {
			// New returns once the node joined its seeds, when they
			// answer; WaitReady waits for that otherwise.
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = nd.WaitReady(ctx)
			cancel()
			if err != nil {
				nd.Close()
			}
		}
		if err != nil {
			for _, o := range nodes {
				o.Close()
			}
			return nil, err
		}
		nodes = append(nodes, nd)
	}
	for _, nd := range nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := nd.WaitReady(ctx)
		cancel()
		if err != nil {
			for _, o := range nodes {
				o.Close()
			}
			return nil, err
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		all := true
		for _, nd := range nodes {
			if len(nd.RingMembers()) != n || len(nd.Unconfirmed()) > 0 {
				all = false
			}
		}
		if all {
			return nodes, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			for _, nd := range nodes {
				nd.Close()
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("cluster did not converge in 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
