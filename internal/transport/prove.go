package transport

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// Who may answer the Peer service. PeerAuth makes the callers of a node's
// Peer service prove they are members; the member a node calls proves it
// too, before the node routes a key to it, hands keys off to it,
// replicates to it or takes a lease from it:
//
//   - with peer keys (a cluster secret), the caller challenges the member
//     with Prove: a fresh 32-byte nonce, answered with an HMAC under the
//     member's peer key of the nonce, both names and the direction;
//   - under mutual TLS with peer identities, the caller's dial credentials
//     refuse a server whose verified certificate names no peer identity
//     (VerifyPeerIdentity), on every connection.

// ProofVersion is the version of the Prove exchange this package speaks.
const ProofVersion = 1

// ProofNonceLen is the length of a Prove challenge's nonce, in bytes.
const ProofNonceLen = 32

// MaxProofName bounds the names in a Prove exchange, in bytes.
const MaxProofName = 256

// ErrUnproven wraps every reason a member failed to prove itself.
var ErrUnproven = errors.New("transport: member did not prove it belongs to the cluster")

// WithProver makes RegisterPeer answer Prove challenges as the node name,
// with an HMAC under the first key of the server's PeerAuth (none without
// keys). Without it, Prove is Unimplemented.
func WithProver(name string) ServerOption {
	return func(s *serverConfig) { s.self = name }
}

// WithProverGossip makes Prove report gossip(), the node's gossip address
// as it advertises it, or none while it returns "".
func WithProverGossip(gossip func() string) ServerOption {
	return func(s *serverConfig) { s.gossip = gossip }
}

// ProveMAC is the MAC that answers the challenge nonce that from sent to
// to, under the peer key key (PeerKey): what a member's ProveResponse
// carries. It is exported for programs that play a member, such as
// internal/testrogue; a node's server answers with it through WithProver.
func ProveMAC(key []byte, from, to string, nonce []byte) []byte {
	h := hmac.New(sha256.New, key)
	for _, part := range [][]byte{[]byte("sluice-peer-prove v1"), []byte("answer"), []byte(from), []byte(to), nonce} {
		h.Write(part)
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}

// WithClock makes Prove report now's time to the caller (time.Now
// without it), so that members estimate this node's clock offset as the
// node itself reads its clock.
func WithClock(now func() time.Time) ServerOption {
	return func(s *serverConfig) { s.now = now }
}

func (p *peerServer) clock() time.Time {
	if p.cfg.now != nil {
		return p.cfg.now()
	}
	return time.Now()
}

func (p *peerServer) Prove(ctx context.Context, in *pb.ProveRequest) (*pb.ProveResponse, error) {
	received := p.clock()
	if err := p.authorize(ctx); err != nil {
		return nil, err
	}
	switch {
	case p.cfg.self == "":
		return nil, status.Error(codes.Unimplemented, "transport: this server answers no proof")
	case in == nil:
		return nil, status.Error(codes.InvalidArgument, "transport: nil ProveRequest")
	case in.Version != ProofVersion:
		return nil, status.Errorf(codes.FailedPrecondition, "transport: proof version %d, this node speaks %d", in.Version, ProofVersion)
	case len(in.Nonce) != ProofNonceLen:
		return nil, status.Errorf(codes.InvalidArgument, "transport: proof nonce of %d bytes, want %d", len(in.Nonce), ProofNonceLen)
	case len(in.From) > MaxProofName || len(in.To) > MaxProofName:
		return nil, status.Errorf(codes.InvalidArgument, "transport: proof name longer than %d bytes", MaxProofName)
	case in.To != p.cfg.self:
		return nil, status.Errorf(codes.FailedPrecondition, "transport: proof asked of %q, this node is %q", cleanText(in.To, 64), p.cfg.self)
	}
	out := &pb.ProveResponse{Version: ProofVersion, Name: p.cfg.self, ReceivedUnixNano: received.UnixNano()}
	if a := p.cfg.auth; a != nil && len(a.Keys) > 0 {
		out.Mac = ProveMAC(a.Keys[0], in.From, in.To, in.Nonce)
	}
	if p.cfg.gossip != nil {
		out.GossipAddr = p.cfg.gossip()
	}
	out.SentUnixNano = p.clock().UnixNano()
	return out, nil
}

// ClockSample is one estimate of a member's clock against this node's,
// from one Prove round trip: Offset is how far the member's clock is ahead
// (negative: behind), within RTT/2 of the truth whatever the network's
// asymmetry.
type ClockSample struct {
	Offset time.Duration
	RTT    time.Duration // the round trip less the member's time answering
	At     time.Time     // when the answer came, on this node's clock
}

// MaxClockRTT bounds the round trip of a clock sample worth keeping: the
// error of an estimate is up to half of it.
const MaxClockRTT = time.Second

// ProbeClock challenges the member named to over conn, as Prove does
// without checking the proof, and estimates its clock's offset from now,
// this node's clock, NTP style: ((t1-t0)+(t2-t3))/2 with t0 and t3 when
// the challenge left and the answer came here, t1 and t2 when it arrived
// and left there. It fails, wrapping ErrMalformedResponse, for an answer
// without times (a member that predates them), times that are not in
// order, or a round trip longer than MaxClockRTT.
func ProbeClock(ctx context.Context, conn grpc.ClientConnInterface, from, to string, now func() time.Time) (ClockSample, error) {
	nonce := make([]byte, ProofNonceLen)
	rand.Read(nonce) // never fails (crypto/rand)
	t0 := now()
	resp, err := pb.NewPeerClient(conn).Prove(ctx, &pb.ProveRequest{Version: ProofVersion, From: from, To: to, Nonce: nonce})
	t3 := now()
	if err != nil {
		return ClockSample{}, err
	}
	t1, t2 := resp.ReceivedUnixNano, resp.SentUnixNano
	rtt := t3.Sub(t0) - time.Duration(t2-t1)
	switch {
	case resp.Name != to:
		return ClockSample{}, fmt.Errorf("%w: clock answer names %q, want %q", ErrMalformedResponse, cleanText(resp.Name, 64), to)
	case t1 <= 0 || t2 < t1:
		return ClockSample{}, fmt.Errorf("%w: clock answer without times in order (%d, %d)", ErrMalformedResponse, t1, t2)
	case t3.Before(t0) || rtt < 0 || rtt > MaxClockRTT:
		return ClockSample{}, fmt.Errorf("%w: clock round trip %v is outside [0, %v]", ErrMalformedResponse, rtt, MaxClockRTT)
	}
	// Halves first: the sums of four Unix times could overflow.
	offset := time.Duration((t1-t0.UnixNano())/2 + (t2-t3.UnixNano())/2)
	return ClockSample{Offset: offset, RTT: rtt, At: t3}, nil
}

// Prove challenges the member named to, over conn, on behalf of the node
// named from, and returns nil when its answer proves one of keys (from
// PeerKey), or, without keys, when it answers as to at all: under mutual
// TLS, conn's credentials verify the member's certificate
// (VerifyPeerIdentity). Every failure wraps ErrUnproven.
func Prove(ctx context.Context, conn grpc.ClientConnInterface, from, to string, keys [][]byte) error {
	_, err := ProveGossip(ctx, conn, from, to, keys)
	return err
}

// ProveGossip is Prove, returning too the gossip address the member
// reports (WithProverGossip) when it proves itself: an IP:port, or ""
// when it reports none or one that is not.
func ProveGossip(ctx context.Context, conn grpc.ClientConnInterface, from, to string, keys [][]byte) (gossip string, err error) {
	nonce := make([]byte, ProofNonceLen)
	rand.Read(nonce) // never fails (crypto/rand)
	resp, err := pb.NewPeerClient(conn).Prove(ctx, &pb.ProveRequest{Version: ProofVersion, From: from, To: to, Nonce: nonce})
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrUnproven, err)
	}
	switch {
	case resp.Version != ProofVersion:
		return "", fmt.Errorf("%w: answer of version %d, want %d", ErrUnproven, resp.Version, ProofVersion)
	case resp.Name != to:
		return "", fmt.Errorf("%w: answer names %q, want %q", ErrUnproven, cleanText(resp.Name, 64), to)
	}
	if ap, err := netip.ParseAddrPort(resp.GossipAddr); err == nil && ap.Port() != 0 && !ap.Addr().IsUnspecified() {
		gossip = ap.String()
	}
	if len(keys) == 0 {
		return gossip, nil
	}
	for _, k := range keys {
		if hmac.Equal(resp.Mac, ProveMAC(k, from, to, nonce)) {
			return gossip, nil
		}
	}
	return "", fmt.Errorf("%w: answer does not prove the cluster secret", ErrUnproven)
}

// VerifyPeerIdentity returns a tls.Config.VerifyConnection function, for
// the client side, that refuses a server whose verified certificate names
// none of ids (HasIdentity), then runs next when it is not nil. It runs on
// every connection, resumed ones included.
func VerifyPeerIdentity(ids []string, next func(tls.ConnectionState) error) func(tls.ConnectionState) error {
	ids = append([]string(nil), ids...)
	return func(cs tls.ConnectionState) error {
		leaf := VerifiedLeaf(cs.VerifiedChains)
		if leaf == nil {
			return fmt.Errorf("%w: server presented no verified certificate", ErrUnproven)
		}
		if !HasIdentity(leaf, ids) {
			return fmt.Errorf("%w: server certificate %q names no peer identity", ErrUnproven, cleanText(leaf.Subject.CommonName, 64))
		}
		if next != nil {
			return next(cs)
		}
		return nil
	}
}
