package cluster_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/testcluster"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// A cluster whose clock stands still, so that no hand-over ever times
// out, still forms when a hand-over confirmation is lost: node-1 answers
// node-0's confirmation of their membership without recording it (as a
// node does that sets it aside on adopting another membership before
// this one), and asks node-0 for it again, which sends it again.
func TestHandoverLostConfirmationFrozenClock(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	fp := ring.Fingerprint([]ring.Member{{Name: "node-0"}, {Name: "node-1"}})
	var dropped atomic.Int64
	drop := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if in, ok := req.(*pb.TransferRequest); ok && in.Reason == pb.TransferReason_TRANSFER_REASON_HANDOFF_DONE &&
			in.From == "node-0" && in.RingFingerprint == fp && dropped.CompareAndSwap(0, 1) {
			return &pb.TransferResponse{}, nil // lost: answered, never recorded
		}
		return handler(ctx, req)
	}
	c := testcluster.New(t, 2, testcluster.WithConfig(func(i int, cfg *cluster.Config) {
		cfg.Clock = cluster.ClockFunc(clk.Now)
		if i == 1 {
			cfg.UnaryInterceptors = append(cfg.UnaryInterceptors, drop)
		}
	}))
	if dropped.Load() != 1 {
		t.Fatal("node-0's confirmation of the membership was not dropped")
	}
	for _, nd := range c.Nodes() {
		if u := nd.Unconfirmed(); len(u) > 0 {
			t.Fatalf("%s waits for the hand-over of %v", nd.Name(), u)
		}
	}
}
