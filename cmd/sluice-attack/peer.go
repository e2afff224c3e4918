package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/transport"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// callTimeout bounds every call an attacker makes.
const callTimeout = 10 * time.Second

// y2116 is 2116-01-01 in Unix nanoseconds.
var y2116 = time.Date(2116, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

// peerTransfer: callers that are no cluster member call the Peer service
// of a daemon that has a cluster secret: Transfer of a GCRA state that
// denies the legitimate key until 2116, Lease of all its hits, and
// CheckBatch spending them. Half the attackers bring no proof, half a
// proof under a secret of their own. Every call must be refused
// (Unauthenticated or PermissionDenied) and the legitimate key stay
// admitted.
func peerTransfer(ctx context.Context, c *config) (*row, error) {
	secret := filepath.Join(c.tmp, "cluster-secret")
	if err := os.WriteFile(secret, []byte(rand.Text()+"\n"), 0o600); err != nil {
		return nil, err
	}
	forgedKey, err := transport.PeerKey([]byte(rand.Text()))
	if err != nil {
		return nil, err
	}
	r, err := onDaemon(ctx, c, "peer-transfer", []string{"--cluster-secret-file", secret}, overGRPC, func(t *target, r *row) error {
		forged, err := t.d.dial(grpc.WithPerRPCCredentials(transport.PeerCredentials(forgedKey, nil)))
		if err != nil {
			return err
		}
		defer forged.Close()

		legit := t.legit
		poison := &pb.TransferRequest{From: "sluice-attack", Reason: pb.TransferReason_TRANSFER_REASON_HANDOFF,
			States: []*pb.KeyState{{Name: legit.Name, Key: legit.Key, Algorithm: legit.Algorithm,
				ExpireAtUnixNano: y2116, Words: []int64{y2116, int64(time.Millisecond), 0}}}}
		lease := &pb.LeaseRequest{From: "sluice-attack", Request: legit, Want: legit.Limit, TtlNanos: int64(time.Hour)}
		spend := proto.Clone(legit).(*pb.RateLimitRequest)
		spend.Hits = proto.Int64(legit.Limit)
		batch := &pb.PeerCheckRequest{From: "sluice-attack", Items: []*pb.RateLimitRequest{spend, spend, spend}}

		var codes tally
		var merged, granted, decided atomic.Int64
		clients := []pb.PeerClient{pb.NewPeerClient(t.conn), pb.NewPeerClient(forged)}
		calls := c.rounds(ctx, c.count(400_000), c.hostile(), func(i, k int) {
			client := clients[i%2]
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			var err error
			switch k % 3 {
			case 0:
				var res *pb.TransferResponse
				if res, err = client.Transfer(cctx, poison); err == nil {
					merged.Add(int64(res.GetMerged()))
				}
			case 1:
				var res *pb.LeaseResponse
				if res, err = client.Lease(cctx, lease); err == nil {
					granted.Add(res.GetGranted())
				}
			case 2:
				var res *pb.PeerCheckResponse
				if res, err = client.CheckBatch(cctx, batch); err == nil {
					decided.Add(int64(len(res.GetItems())))
				}
			}
			codes.add(codeOf(err), 1)
		})
		r.did = fmt.Sprintf("%d non-members call Peer.Transfer (a state of the legitimate key expiring in 2116), Peer.Lease and Peer.CheckBatch of its hits, against --cluster-secret-file; half with no proof, half with a proof under their own secret",
			c.attackers)
		r.result = fmt.Sprintf("%s calls: %s", thousands(calls), codes.String())
		if n := codes.others("Unauthenticated", "PermissionDenied"); n > 0 {
			r.result += fmt.Sprintf("; %d states merged, %d hits leased, %d items decided", merged.Load(), granted.Load(), decided.Load())
			r.miss("%d peer calls not refused", n)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if l := r.legit; l.allowed < l.answered {
		r.miss("the legitimate key was denied %d times", l.answered-l.allowed)
	}
	return r, nil
}
