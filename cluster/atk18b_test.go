package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/testcluster"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// transferTo sends states to nd as a Transfer of reason from the peer
// named from.
func transferTo(t *testing.T, nd interface{ GRPCAddr() string }, from string, reason pb.TransferReason, states []*pb.KeyState) *pb.TransferResponse {
	t.Helper()
	conn, err := grpc.NewClient(nd.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := pb.NewPeerClient(conn).Transfer(ctx, &pb.TransferRequest{From: from, Reason: reason,
		SentUnixNano: time.Now().UnixNano(), States: states})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestAtk18bResetFromANonOwner: a key its owner (node 0) holds at 9 of
// 10 is "reset" by a Transfer of reason RESET that the owner did not
// send: from a peer that is no member, and from the other member, which
// owns no part of the key, with a mark and without. A reset message only
// drops a replica's copy; the owner's count must stand.
func TestAtk18bResetFromANonOwner(t *testing.T) {
	skipNearDayEnd(t)
	c := testcluster.New(t, 2, withReplicas(1))
	owner := c.Node(0)
	for _, a := range allAlgorithms {
		for _, from := range []string{"mallory", c.Node(1).Name()} {
			for _, withMark := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/mark=%v", a, from, withMark), func(t *testing.T) {
					var req limiter.Request
					for i := range 10_000 {
						req = limiter.Request{Name: "atk18b", Key: fmt.Sprintf("%s-%s-%v-%d", a, from, withMark, i), Limit: 10, Period: 24 * time.Hour, Algorithm: a}
						if c.Owner(req.Name, req.Key) == owner {
							break
						}
					}
					markCheck(t, owner, req, 9, 0, limiter.Window{})
					sn := limiter.Snapshot{Name: req.Name, Key: req.Key, Algorithm: a}
					if withMark {
						now := time.Now().UnixNano()
						sn.ResetAt, sn.ResetUntil = now, now+int64(time.Hour)
					}
					resp := transferTo(t, owner, from, pb.TransferReason_TRANSFER_REASON_RESET, []*pb.KeyState{transport.SnapshotToProto(&sn)})
					if d := markCheck(t, owner, req, 0, 0, limiter.Window{}); d.Remaining != 1 {
						t.Errorf("after a reset message from %s (response %+v): remaining %d, want 1 (%d hits dropped)", from, resp, d.Remaining, d.Remaining-1)
					}
				})
			}
		}
	}
}
