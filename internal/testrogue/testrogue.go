// Package testrogue plays the attacker against a sluice cluster in tests:
// a stock serf agent that joins the gossip, and a gRPC server that its grpc
// tag names, serving the Peer service as the attacker likes. Both run for
// real on 127.0.0.1 and stop when the test ends (StartPeer, JoinSerf), or
// when a program that is no test stops them (ServePeer, Join), as
// cmd/sluice-attack does.
package testrogue

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/internal/transport"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Peer is a gRPC server that serves the Peer service as an attacker would:
// every check answered allowed (or denied, as Allow says), every state and
// lease taken, and a proof answered as whatever member it is asked to be,
// with a MAC it cannot compute unless ProofKey is set. It counts what reaches it.
type Peer struct {
	pb.UnimplementedPeerServer
	// Allow is the answer to every check.
	Allow bool
	// ProofKey, when set, is the peer key (transport.PeerKey) Prove
	// answers under, as an attacker that has it would; otherwise the
	// answer's MAC is random.
	ProofKey []byte
	// Addr is where it serves, host:port.
	Addr string
	// Checks, States and Leases count the checks, key states and lease
	// requests it received.
	Checks, States, Leases atomic.Int64
}

// StartPeer serves a Peer on 127.0.0.1, under TLS with tlsCfg when it is
// not nil, until the test ends.
func StartPeer(t testing.TB, allow bool, tlsCfg *tls.Config) *Peer {
	t.Helper()
	p := &Peer{Allow: allow}
	stop, err := ServePeer(p, tlsCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return p
}

// ServePeer serves p on 127.0.0.1, under TLS with tlsCfg when it is not
// nil, until stop is called; it sets p.Addr, and stop returns once the
// server has stopped. It is StartPeer for a program that is no test.
func ServePeer(p *Peer, tlsCfg *tls.Config) (stop func(), err error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	opts := transport.ServerOptions()
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	s := grpc.NewServer(opts...)
	p.Addr = lis.Addr().String()
	pb.RegisterPeerServer(s, p)
	served := make(chan struct{})
	go func() {
		defer close(served)
		s.Serve(lis)
	}()
	return func() { s.Stop(); <-served }, nil
}

func (p *Peer) answer(items []*pb.RateLimitRequest) []*pb.RateLimitResponse {
	p.Checks.Add(int64(len(items)))
	out := make([]*pb.RateLimitResponse, len(items))
	for i, it := range items {
		out[i] = &pb.RateLimitResponse{Allowed: p.Allow, Limit: it.Limit, Remaining: it.Limit, Owner: "rogue"}
	}
	return out
}

func (p *Peer) CheckBatch(_ context.Context, in *pb.PeerCheckRequest) (*pb.PeerCheckResponse, error) {
	return &pb.PeerCheckResponse{Items: p.answer(in.Items)}, nil
}

func (p *Peer) CheckStream(s pb.Peer_CheckStreamServer) error {
	for {
		in, err := s.Recv()
		if err != nil {
			return nil
		}
		if err := s.Send(&pb.PeerCheckResponse{Seq: in.Seq, Owner: "rogue", Items: p.answer(in.Items)}); err != nil {
			return err
		}
	}
}

func (p *Peer) Transfer(_ context.Context, in *pb.TransferRequest) (*pb.TransferResponse, error) {
	p.States.Add(int64(len(in.States)))
	return &pb.TransferResponse{Merged: int32(len(in.States))}, nil
}

func (p *Peer) Lease(_ context.Context, in *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	p.Leases.Add(1)
	return &pb.LeaseResponse{Granted: in.Want, ExpiresAtUnixNano: time.Now().Add(time.Hour).UnixNano()}, nil
}

func (p *Peer) Prove(_ context.Context, in *pb.ProveRequest) (*pb.ProveResponse, error) {
	mac := make([]byte, 32)
	rand.Read(mac)
	if p.ProofKey != nil {
		mac = transport.ProveMAC(p.ProofKey, in.From, in.To, in.Nonce)
	}
	return &pb.ProveResponse{Version: in.Version, Name: in.To, Mac: mac}, nil
}

// Tags returns the serf tags of a member whose gRPC address is grpcAddr:
// the grpc tag and the protocol range sluice speaks (pmin and pmax,
// cluster.ProtocolVersionMin and Max), so that the agent is refused for
// what it cannot prove, not for its version.
func Tags(grpcAddr string) map[string]string {
	return map[string]string{"grpc": grpcAddr, "pmin": "1", "pmax": "1"}
}

// JoinSerf starts a stock serf agent named name, whose tags are
// Tags(grpcAddr), with gossipKey when not nil and serf's name conflict
// resolution off (an attacker's agent does not yield), joins it to seeds
// in order and returns it with the join's error. The agent shuts down
// when the test ends.
func JoinSerf(t testing.TB, name, grpcAddr string, gossipKey []byte, seeds ...string) (*serf.Serf, error) {
	t.Helper()
	s, err := Join(name, grpcAddr, gossipKey, seeds...)
	if s == nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown() })
	return s, err
}

// Join is JoinSerf for a program that is no test: it returns a nil agent
// when the agent could not start, and the agent with the join's error
// otherwise. The caller shuts the agent down.
func Join(name, grpcAddr string, gossipKey []byte, seeds ...string) (*serf.Serf, error) {
	sc := serf.DefaultConfig()
	sc.NodeName = name
	sc.Tags = Tags(grpcAddr)
	sc.LogOutput = io.Discard
	sc.EnableNameConflictResolution = false
	sc.MemberlistConfig = memberlist.DefaultLocalConfig()
	ml := sc.MemberlistConfig
	ml.Name = name
	ml.BindAddr = "127.0.0.1"
	ml.BindPort = 0
	ml.LogOutput = io.Discard
	// Fast enough to converge in tests (DefaultLocalConfig alone may take
	// seconds), slow enough to hold under -race.
	ml.ProbeInterval, ml.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
	ml.GossipInterval, ml.RetransmitMult = 20*time.Millisecond, 4
	ml.PushPullInterval = 500 * time.Millisecond
	if gossipKey != nil {
		kr, err := memberlist.NewKeyring(nil, gossipKey)
		if err != nil {
			return nil, err
		}
		ml.Keyring = kr
		ml.GossipVerifyIncoming, ml.GossipVerifyOutgoing = true, true
	}
	s, err := serf.Create(sc)
	if err != nil {
		return nil, err
	}
	_, err = s.Join(seeds, true)
	return s, err
}
