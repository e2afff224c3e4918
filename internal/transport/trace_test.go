package transport

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// traceChecker is an echoChecker that keeps the TraceParents of each
// batch it decides.
type traceChecker struct {
	echoChecker
	mu      sync.Mutex
	parents [][]string
}

func (c *traceChecker) CheckMany(ctx context.Context, reqs []limiter.Request) []Result {
	c.mu.Lock()
	c.parents = append(c.parents, slices.Clone(TraceParents(ctx)))
	c.mu.Unlock()
	return c.echoChecker.CheckMany(ctx, reqs)
}

// The Checker finds each request's traceparent with TraceParents, in the
// order of its requests, the invalid ones (answered without it) left out;
// a batch in which no item has one gives nil, on a stream whose earlier
// batch had some as on a call of its own.
func TestTraceParentsFollowTheRequests(t *testing.T) {
	chk := &traceChecker{echoChecker: echoChecker{owner: "node-b"}}
	conn := startServer(t, func(s *grpc.Server) { RegisterPeer(s, chk) })
	ok := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.TokenBucket}
	bad := ok
	bad.Limit = 0
	const (
		tp1 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		tp2 = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-00"
	)
	item := func(r limiter.Request, traceparent string) *pb.RateLimitRequest {
		m := RequestToProto(r)
		m.Traceparent = traceparent
		return m
	}
	batches := []struct {
		items []*pb.RateLimitRequest
		want  []string
	}{
		{[]*pb.RateLimitRequest{item(bad, tp1), item(ok, ""), item(ok, tp1), item(ok, tp2)}, []string{"", tp1, tp2}},
		{[]*pb.RateLimitRequest{item(ok, ""), item(ok, "")}, nil},
		{[]*pb.RateLimitRequest{item(ok, tp2)}, []string{tp2}},
	}

	stream, err := pb.NewPeerClient(conn).CheckStream(ctxT(t), CallOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range batches {
		if err := stream.Send(&pb.PeerCheckRequest{Seq: uint64(i), Items: b.items}); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	stream.CloseSend()
	for i, b := range batches {
		if _, err := pb.NewPeerClient(conn).CheckBatch(ctxT(t), &pb.PeerCheckRequest{Items: b.items}, CallOptions()...); err != nil {
			t.Fatalf("CheckBatch %d: %v", i, err)
		}
	}

	chk.mu.Lock()
	defer chk.mu.Unlock()
	if len(chk.parents) != 2*len(batches) {
		t.Fatalf("%d batches decided, want %d", len(chk.parents), 2*len(batches))
	}
	for i, got := range chk.parents {
		if want := batches[i%len(batches)].want; !slices.Equal(got, want) || (got == nil) != (want == nil) {
			t.Errorf("batch %d (stream %v): TraceParents %q, want %q", i%len(batches), i < len(batches), got, want)
		}
	}
}

// A TraceCarrier keeps the traceparent and nothing else.
func TestTraceCarrier(t *testing.T) {
	var c TraceCarrier
	c.Set("tracestate", "a=b")
	c.Set("traceparent", "x")
	if c.Get("traceparent") != "x" || c.Get("tracestate") != "" || !slices.Equal(c.Keys(), []string{"traceparent"}) {
		t.Fatalf("carrier %+v: Get %q %q, Keys %q", c, c.Get("traceparent"), c.Get("tracestate"), c.Keys())
	}
}
