package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/retry"
)

func Example() {
	// A daemon runs a cluster.Node that serves the public API; here, one
	// in this process.
	cfg := cluster.TestConfig("example")
	cfg.ServePublicAPI = true
	node, err := cluster.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer node.Close()

	c, err := client.New(node.GRPCAddr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	req := limiter.Request{Name: "login_per_ip", Key: "203.0.113.7", Hits: 1, Limit: 2, Period: time.Minute, Algorithm: limiter.FixedWindow}
	for range 3 {
		d, err := c.Check(context.Background(), req, sluice.OnUnreachable(sluice.PolicyDeny))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("allowed=%v remaining=%d owner=%s\n", d.Allowed, d.Remaining, d.Owner)
	}

	_, err = c.Check(context.Background(), limiter.Request{Name: "x", Key: "k", Limit: 0, Period: time.Second, Algorithm: limiter.GCRA})
	fmt.Println("invalid limit:", errors.Is(err, limiter.ErrInvalidLimit))
	// Output:
	// allowed=true remaining=1 owner=example
	// allowed=true remaining=0 owner=example
	// allowed=false remaining=0 owner=example
	// invalid limit: true
}

// A caller that waits for its turn: retry.Do checks again once the
// decision's RetryAfter has passed. (Not run: it waits for real.)
func Example_retry() {
	c, err := client.New("127.0.0.1:7947")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	req := limiter.Request{Name: "export", Key: "org:1", Hits: 1, Limit: 10, Period: time.Minute, Algorithm: limiter.GCRA}
	errLimited := errors.New("limited")
	err = retry.Do(context.Background(), retry.DefaultPolicy(), func(ctx context.Context) (time.Duration, error) {
		d, err := c.Check(ctx, req)
		if err != nil {
			return 0, retry.Permanent(err) // or retry: the daemon may be restarting
		}
		if !d.Allowed {
			return d.RetryAfter, errLimited
		}
		return 0, nil
	})
	if err != nil {
		log.Print(err)
	}
}
