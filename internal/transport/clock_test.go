package transport

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// TestProbeClockOffset: a real server whose clock runs 3 s ahead of the
// caller's is estimated 3 s ahead, within half the round trip.
func TestProbeClockOffset(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(ServerOptions()...)
	RegisterPeer(s, &echoChecker{owner: "owner"}, WithProver("owner"), WithClock(func() time.Time { return time.Now().Add(3 * time.Second) }))
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn := dial(t, lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	got, err := ProbeClock(ctxT(t), conn, "caller", "owner", time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if d := got.Offset - 3*time.Second; d > got.RTT/2+time.Millisecond || -d > got.RTT/2+time.Millisecond {
		t.Fatalf("offset %v (rtt %v), want 3s within rtt/2", got.Offset, got.RTT)
	}
	if _, err := ProbeClock(ctxT(t), conn, "caller", "mallory", time.Now); err == nil {
		t.Fatal("a probe of another member's name answered")
	}
}

// clockAnswer answers Prove with fixed times.
type clockAnswer struct {
	pb.UnimplementedPeerServer
	received, sent int64
}

func (c *clockAnswer) Prove(ctx context.Context, in *pb.ProveRequest) (*pb.ProveResponse, error) {
	return &pb.ProveResponse{Version: ProofVersion, Name: in.To, ReceivedUnixNano: c.received, SentUnixNano: c.sent}, nil
}

// TestProbeClockRefusesBadTimes: answers without times (a member that
// predates them), with times out of order or that make the round trip
// longer than MaxClockRTT are refused, wrapping ErrMalformedResponse.
func TestProbeClockRefusesBadTimes(t *testing.T) {
	now := time.Now().UnixNano()
	for name, a := range map[string]*clockAnswer{
		"no times":               {},
		"sent before received":   {received: now, sent: now - 1},
		"answering took a while": {received: now, sent: now + int64(time.Hour)}, // rtt negative
	} {
		t.Run(name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			s := grpc.NewServer()
			pb.RegisterPeerServer(s, a)
			go s.Serve(lis)
			t.Cleanup(s.Stop)
			conn := dial(t, lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if _, err := ProbeClock(ctxT(t), conn, "caller", "owner", time.Now); !errors.Is(err, ErrMalformedResponse) {
				t.Fatalf("err %v, want ErrMalformedResponse", err)
			}
		})
	}
	// A caller whose clock makes the round trip longer than MaxClockRTT.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pb.RegisterPeerServer(s, &clockAnswer{received: now, sent: now})
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn := dial(t, lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	calls := 0
	slow := func() time.Time { calls++; return time.Now().Add(time.Duration(calls) * MaxClockRTT) }
	if _, err := ProbeClock(ctxT(t), conn, "caller", "owner", slow); !errors.Is(err, ErrMalformedResponse) {
		t.Fatalf("round trip over MaxClockRTT: err %v, want ErrMalformedResponse", err)
	}
}
