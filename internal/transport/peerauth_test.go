package transport

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/testpki"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// authSink and authLeaser count what reaches them past the PeerAuth.
type authSink struct{ took chan int }

func (s authSink) TakeStates(_ context.Context, _ string, _ TransferReason, states []limiter.Snapshot) (int, int, error) {
	s.took <- len(states)
	return len(states), 0, nil
}

type authLeaser struct{}

func (authLeaser) Lease(context.Context, string, limiter.Request, int64, time.Duration) (Lease, error) {
	return Lease{Granted: 1, ExpiresAt: time.Now().Add(time.Second)}, nil
}

// peerCalls makes one call of every method of the Peer service on conn
// and returns the status code of each.
func peerCalls(t *testing.T, conn *grpc.ClientConn) map[string]codes.Code {
	t.Helper()
	ctx := ctxT(t)
	c := pb.NewPeerClient(conn)
	req := RequestToProto(limiter.Request{Name: "api", Key: "user:42", Hits: 1, Limit: 5, Period: time.Minute, Algorithm: limiter.GCRA})
	out := map[string]codes.Code{}
	_, err := c.CheckBatch(ctx, &pb.PeerCheckRequest{From: "x", Items: []*pb.RateLimitRequest{req}}, CallOptions()...)
	out["CheckBatch"] = status.Code(err)
	if st, err := c.CheckStream(ctx, CallOptions()...); err != nil {
		out["CheckStream"] = status.Code(err)
	} else {
		if err := st.Send(&pb.PeerCheckRequest{From: "x", Seq: 1, Items: []*pb.RateLimitRequest{req}}); err == nil {
			_, err = st.Recv()
			out["CheckStream"] = status.Code(err)
		} else {
			_, err = st.Recv()
			out["CheckStream"] = status.Code(err)
		}
	}
	state := SnapshotToProto(&limiter.Snapshot{Name: "api", Key: "user:42", Algorithm: limiter.GCRA,
		ExpireAt: time.Now().Add(time.Minute).UnixNano(), Words: [3]int64{time.Now().Add(time.Minute).UnixNano(), int64(12 * time.Second)}})
	_, err = c.Transfer(ctx, &pb.TransferRequest{From: "x", Reason: pb.TransferReason_TRANSFER_REASON_HANDOFF, States: []*pb.KeyState{state}})
	out["Transfer"] = status.Code(err)
	_, err = c.Lease(ctx, &pb.LeaseRequest{From: "x", Request: req, Want: 1, TtlNanos: int64(time.Second)})
	out["Lease"] = status.Code(err)
	_, err = c.Prove(ctx, &pb.ProveRequest{Version: ProofVersion, From: "x", To: "owner", Nonce: make([]byte, ProofNonceLen)})
	out["Prove"] = status.Code(err)
	return out
}

// startAuthServer serves the Peer service with auth on 127.0.0.1, with
// creds when not nil, and returns its address.
func startAuthServer(t *testing.T, auth *PeerAuth, creds credentials.TransportCredentials) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := ServerOptions()
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	s := grpc.NewServer(opts...)
	RegisterPeer(s, &echoChecker{owner: "owner"}, WithStateSink(authSink{took: make(chan int, 10)}), WithLeaser(authLeaser{}), WithPeerAuth(auth), WithProver("owner"))
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func wantCodes(t *testing.T, what string, got map[string]codes.Code, want codes.Code) {
	t.Helper()
	for _, m := range []string{"CheckBatch", "CheckStream", "Transfer", "Lease", "Prove"} {
		if got[m] != want {
			t.Errorf("%s: %s answered %v, want %v", what, m, got[m], want)
		}
	}
}

// TestPeerAuthSecret calls every Peer method on a real server that wants
// the cluster secret: only a caller proving it, at about the server's
// time, is served.
func TestPeerAuthSecret(t *testing.T) {
	key, err := PeerKey([]byte("correct horse battery staple"))
	if err != nil {
		t.Fatal(err)
	}
	other, _ := PeerKey([]byte("another cluster's secret"))
	rotated, _ := PeerKey([]byte("the next secret of this cluster"))
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	addr := startAuthServer(t, &PeerAuth{Keys: [][]byte{key, rotated}, Now: clock}, nil)
	plain := grpc.WithTransportCredentials(insecure.NewCredentials())
	with := func(k []byte, at time.Time) grpc.DialOption {
		return grpc.WithPerRPCCredentials(PeerCredentials(k, func() time.Time { return at }))
	}
	wantCodes(t, "no proof", peerCalls(t, dial(t, addr, plain)), codes.Unauthenticated)
	wantCodes(t, "another secret", peerCalls(t, dial(t, addr, plain, with(other, now))), codes.PermissionDenied)
	wantCodes(t, "a proof from the past", peerCalls(t, dial(t, addr, plain, with(key, now.Add(-MaxPeerAuthSkew-time.Second)))), codes.PermissionDenied)
	wantCodes(t, "a proof from the future", peerCalls(t, dial(t, addr, plain, with(key, now.Add(MaxPeerAuthSkew+time.Second)))), codes.PermissionDenied)
	wantCodes(t, "the secret", peerCalls(t, dial(t, addr, plain, with(key, now.Add(-MaxPeerAuthSkew+time.Second)))), codes.OK)
	wantCodes(t, "the rotated secret", peerCalls(t, dial(t, addr, plain, with(rotated, now))), codes.OK)

	// A proof is for its method: one for Lease does not open Transfer.
	leaseProof := peerCreds{key: key, now: clock}
	md, err := leaseProof.GetRequestMetadata(credentials.NewContextWithRequestInfo(context.Background(), credentials.RequestInfo{Method: "/sluice.v1.Peer/Lease"}))
	if err != nil {
		t.Fatal(err)
	}
	replay := dial(t, addr, plain, grpc.WithPerRPCCredentials(fixedCreds(md)))
	got := peerCalls(t, replay)
	if got["Lease"] != codes.OK || got["Transfer"] != codes.PermissionDenied || got["CheckBatch"] != codes.PermissionDenied {
		t.Errorf("a Lease proof replayed on every method: %v, want only Lease served", got)
	}
}

type fixedCreds map[string]string

func (f fixedCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return f, nil
}
func (fixedCreds) RequireTransportSecurity() bool { return false }

// TestPeerAuthIdentity calls every Peer method under mutual TLS: a
// certificate of the cluster's CA without a peer identity, an API
// client's, is refused; one naming the identity is served.
func TestPeerAuthIdentity(t *testing.T) {
	const id = "spiffe://sluice.test/peer"
	ca := testpki.NewCA(t, "cluster")
	server := ca.Config(ca.IssueWith(t, "node-a", id))
	server.ClientAuth = tls.RequireAndVerifyClientCert
	addr := startAuthServer(t, &PeerAuth{Identities: []string{id}}, credentials.NewTLS(server))
	as := func(cert tls.Certificate) grpc.DialOption {
		return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool}))
	}
	wantCodes(t, "an API client's certificate", peerCalls(t, dial(t, addr, as(ca.Issue(t, "client")))), codes.PermissionDenied)
	wantCodes(t, "another identity", peerCalls(t, dial(t, addr, as(ca.IssueWith(t, "client", "spiffe://sluice.test/client")))), codes.PermissionDenied)
	wantCodes(t, "a peer's certificate", peerCalls(t, dial(t, addr, as(ca.IssueWith(t, "node-b", id)))), codes.OK)
}

func TestPeerKeyTooShort(t *testing.T) {
	if _, err := PeerKey([]byte("short")); err == nil {
		t.Fatal("PeerKey accepted a 5-byte secret")
	}
}
