package transport_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// allowAll is a Checker that admits every request.
type allowAll struct{ node string }

func (a allowAll) CheckMany(_ context.Context, reqs []limiter.Request) []transport.Result {
	out := make([]transport.Result, len(reqs))
	for i, r := range reqs {
		out[i] = transport.Result{Decision: sluice.Decision{Owner: a.node, Decision: limiter.Decision{Allowed: true, Limit: r.Limit, Remaining: r.Limit - r.Hits}}}
	}
	return out
}

// A node serves the Peer service; another node sends it a batch in which
// one item is invalid. That item gets its own error, which still matches
// the limiter's sentinel on this side of the wire.
func ExampleRegisterPeer() {
	lis, err := transport.DefaultServerLimits().Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	s := grpc.NewServer(transport.ServerOptions()...)
	transport.RegisterPeer(s, allowAll{node: "node-b"})
	go s.Serve(lis)
	defer s.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	good := limiter.Request{Name: "api", Key: "user:42", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.TokenBucket}
	bad := good
	bad.Limit = 0
	resp, err := pb.NewPeerClient(conn).CheckBatch(context.Background(), &pb.PeerCheckRequest{
		From:  "node-a",
		Items: []*pb.RateLimitRequest{transport.RequestToProto(good), transport.RequestToProto(bad)},
	})
	if err != nil {
		panic(err)
	}
	for _, m := range resp.Items {
		r := transport.ResultFromProto(m)
		if r.Err != nil {
			fmt.Println("error:", r.Err, errors.Is(r.Err, limiter.ErrInvalidLimit))
			continue
		}
		fmt.Printf("allowed=%v remaining=%d owner=%s\n", r.Decision.Allowed, r.Decision.Remaining, r.Owner)
	}
	// Output:
	// allowed=true remaining=9 owner=node-b
	// error: transport: remote: limiter: invalid Limit: Limit 0 is outside [1, 1000000000000] true
}

func ExampleErrorFromProto() {
	err := fmt.Errorf("%w: Burst -1 is outside [0, 1000000000000]", limiter.ErrInvalidBurst)
	code, msg := transport.ErrorToProto(err)
	back := transport.ErrorFromProto(code, msg)
	fmt.Println(code)
	fmt.Println(back)
	fmt.Println(errors.Is(back, limiter.ErrInvalidBurst))
	// Output:
	// ERROR_CODE_INVALID_BURST
	// transport: remote: limiter: invalid Burst: Burst -1 is outside [0, 1000000000000]
	// true
}
