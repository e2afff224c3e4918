package peer_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/peer"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// countingOwner admits Limit hits per key; a stand-in for the limiter.
type countingOwner struct{ used map[string]int64 }

func (o *countingOwner) CheckMany(_ context.Context, reqs []limiter.Request) []transport.Result {
	out := make([]transport.Result, len(reqs))
	for i, r := range reqs {
		d := limiter.Decision{Limit: r.Limit}
		if o.used[r.Key]+r.Hits <= r.Limit {
			o.used[r.Key] += r.Hits
			d.Allowed = true
		}
		d.Remaining = r.Limit - o.used[r.Key]
		out[i] = transport.Result{Decision: sluice.Decision{Owner: "node-b", Decision: d}}
	}
	return out
}

// Node A forwards checks of a key that node B owns.
func Example() {
	// Node B serves the Peer service. (One caller at a time below, so the
	// unsynchronized map is fine here.)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	s := grpc.NewServer(transport.ServerOptions()...)
	transport.RegisterPeer(s, &countingOwner{used: map[string]int64{}})
	go s.Serve(lis)
	defer s.Stop()

	// Node A keeps a client per member.
	cfg := peer.DefaultConfig()
	cfg.Self = "node-a"
	pool, err := peer.NewPool(cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pool.Update(map[string]string{"node-b": lis.Addr().String()}); err != nil {
		panic(err)
	}

	c, _ := pool.Get("node-b")
	req := limiter.Request{Name: "login", Key: "ip:10.0.0.1", Hits: 1, Limit: 2, Period: time.Minute, Algorithm: limiter.FixedWindow}
	for range 3 {
		d, err := c.Check(context.Background(), req)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d\n", d.Allowed, d.Remaining)
	}
	// Output:
	// allowed=true remaining=1
	// allowed=true remaining=0
	// allowed=false remaining=0
}
