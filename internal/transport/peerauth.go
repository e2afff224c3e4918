package transport

import (
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Who may call the Peer service. Peers and API callers are separate
// principals: the Sluice service answers any caller the server's transport
// admits, while Peer calls can move key states, grant leases and decide
// keys as their owner, so a server given a PeerAuth serves them only to
// callers that prove they are cluster members, in one or both ways:
//
//   - PeerAuth.Identities: under mutual TLS, the caller's verified client
//     certificate names one of them as a URI or DNS subject alternative
//     name. Give nodes certificates with a peer identity (a SPIFFE ID such
//     as spiffe://example.org/sluice/peer, or a DNS name of their own) that
//     API clients' certificates do not carry.
//   - PeerAuth.Secrets: every call carries, in its metadata, an HMAC-SHA256
//     of its method and the time under a key derived from the cluster
//     secret (PeerCredentials sends it). A proof is accepted within
//     MaxPeerAuthSkew of the receiver's clock. Without TLS the proof travels
//     in clear: it keeps out callers that cannot read peer traffic, not an
//     eavesdropper on the peers' network, who could replay a proof for the
//     same method within the skew.
//
// Both, when both are set. A PeerAuth with neither admits every caller.

// MaxPeerAuthSkew is how far the time in a peer's proof may be from the
// receiver's clock, either way.
const MaxPeerAuthSkew = 5 * time.Minute

// MinClusterSecretLen is the shortest cluster secret accepted, in bytes.
const MinClusterSecretLen = 16

// peerAuthHeader is the metadata key of a peer's proof:
// "v1 <unix seconds> <hex HMAC>".
const peerAuthHeader = "sluice-peer-auth"

// ErrInvalidSecret is a cluster secret too short to be one.
var ErrInvalidSecret = errors.New("transport: invalid cluster secret")

// PeerKey derives the key that proves membership from a cluster secret
// (or a gossip encryption key, which every member holds). It fails for a
// secret shorter than MinClusterSecretLen.
func PeerKey(secret []byte) ([]byte, error) {
	if len(secret) < MinClusterSecretLen {
		return nil, fmt.Errorf("%w: %d bytes, want at least %d", ErrInvalidSecret, len(secret), MinClusterSecretLen)
	}
	return hkdf.Key(sha256.New, secret, nil, "sluice peer authentication v1", sha256.Size)
}

// PeerAuth says who may call the Peer service (see above). Build it once;
// it is not modified after use and safe for concurrent use.
type PeerAuth struct {
	// Identities are URI or DNS SANs of peer certificates, compared
	// exactly.
	Identities []string
	// Keys are keys from PeerKey: a proof under any of them is accepted,
	// so that a secret can be rotated by adding the new one everywhere
	// before any node sends it.
	Keys [][]byte
	// Now is the clock proofs are checked against; nil is time.Now.
	Now func() time.Time
}

// Open reports whether a admits every caller.
func (a *PeerAuth) Open() bool { return a == nil || len(a.Identities) == 0 && len(a.Keys) == 0 }

// WithPeerAuth makes RegisterPeer serve the Peer service only to callers
// that a admits; the others get PermissionDenied (Unauthenticated when
// they bring no proof or certificate at all).
func WithPeerAuth(a *PeerAuth) ServerOption {
	return func(s *serverConfig) { s.auth = a }
}

// authorize checks the caller of method against a.
func (a *PeerAuth) authorize(ctx context.Context, method string) error {
	if a.Open() {
		return nil
	}
	if len(a.Identities) > 0 {
		if err := a.checkIdentity(ctx); err != nil {
			return err
		}
	}
	if len(a.Keys) > 0 {
		if err := a.checkProof(ctx, method); err != nil {
			return err
		}
	}
	return nil
}

func (a *PeerAuth) checkIdentity(ctx context.Context) error {
	leaf := CallerCertificate(ctx)
	if leaf == nil {
		return status.Error(codes.Unauthenticated, "transport: peer call without a verified TLS client certificate")
	}
	if HasIdentity(leaf, a.Identities) {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "transport: certificate %q names no peer identity: peer calls are for cluster members", cleanText(leaf.Subject.CommonName, 64))
}

func (a *PeerAuth) checkProof(ctx context.Context, method string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(peerAuthHeader)
	if len(vals) == 0 {
		return status.Error(codes.Unauthenticated, "transport: peer call without the cluster secret's proof")
	}
	if len(vals) > 1 {
		return status.Error(codes.PermissionDenied, "transport: peer call with more than one proof")
	}
	f := strings.Fields(vals[0])
	if len(f) != 3 || f[0] != "v1" || len(f[2]) != 2*sha256.Size {
		return status.Error(codes.PermissionDenied, "transport: malformed peer proof")
	}
	sec, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return status.Error(codes.PermissionDenied, "transport: malformed peer proof time")
	}
	mac, err := hex.DecodeString(f[2])
	if err != nil {
		return status.Error(codes.PermissionDenied, "transport: malformed peer proof")
	}
	now := time.Now
	if a.Now != nil {
		now = a.Now
	}
	if d := now().Sub(time.Unix(sec, 0)); d > MaxPeerAuthSkew || d < -MaxPeerAuthSkew {
		return status.Errorf(codes.PermissionDenied, "transport: peer proof time is %v from this node's clock, more than %v", d.Round(time.Second), MaxPeerAuthSkew)
	}
	for _, k := range a.Keys {
		if hmac.Equal(mac, proofMAC(k, method, sec)) {
			return nil
		}
	}
	return status.Error(codes.PermissionDenied, "transport: peer proof does not match the cluster secret")
}

// CallerCertificate returns the verified client certificate of the gRPC
// call of ctx, or nil when the call is not over TLS or its client
// presented none that verified.
func CallerCertificate(ctx context.Context) *x509.Certificate {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			return VerifiedLeaf(info.State.VerifiedChains)
		}
	}
	return nil
}

// VerifiedLeaf returns the leaf certificate of the first of chains, as
// tls.ConnectionState.VerifiedChains holds them, or nil when there is none.
func VerifiedLeaf(chains [][]*x509.Certificate) *x509.Certificate {
	if len(chains) == 0 || len(chains[0]) == 0 {
		return nil
	}
	return chains[0][0]
}

// HasIdentity reports whether cert names one of ids as a URI or DNS
// subject alternative name, compared exactly.
func HasIdentity(cert *x509.Certificate, ids []string) bool {
	for _, u := range cert.URIs {
		if slices.Contains(ids, u.String()) {
			return true
		}
	}
	for _, d := range cert.DNSNames {
		if slices.Contains(ids, d) {
			return true
		}
	}
	return false
}

// proofMAC is the HMAC of a proof for method at sec.
func proofMAC(key []byte, method string, sec int64) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("sluice-peer-auth v1\x00"))
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write(strconv.AppendInt(nil, sec, 10))
	return h.Sum(nil)
}

// PeerCredentials returns per-call credentials that prove the cluster
// secret whose PeerKey is key on every call (a grpc.WithPerRPCCredentials
// dial option of peer clients). now is the clock; nil is time.Now.
func PeerCredentials(key []byte, now func() time.Time) credentials.PerRPCCredentials {
	if now == nil {
		now = time.Now
	}
	return peerCreds{key: key, now: now}
}

type peerCreds struct {
	key []byte
	now func() time.Time
}

func (c peerCreds) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	ri, ok := credentials.RequestInfoFromContext(ctx)
	if !ok {
		return nil, errors.New("transport: no request info for the peer proof")
	}
	sec := c.now().Unix()
	return map[string]string{peerAuthHeader: "v1 " + strconv.FormatInt(sec, 10) + " " + hex.EncodeToString(proofMAC(c.key, ri.Method, sec))}, nil
}

// RequireTransportSecurity is false: the proof is also what a cluster
// without TLS has.
func (peerCreds) RequireTransportSecurity() bool { return false }
