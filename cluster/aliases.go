package cluster

import (
	"github.com/sluicehq/sluice/internal/peer"
	"github.com/sluicehq/sluice/internal/transport"
)

// The types of a Config and of a Node's methods that sluice's internal
// packages define, under the names users write. Each is an alias: a value of
// one is a value of the other.

// PeerConfig configures the clients that forward checks to their keys'
// owners, one per member, batching the checks made concurrently
// (Config.Peer). Start from DefaultConfig's. Its fields:
//
//   - MaxBatch, the most checks in one batch, in [1, 1000]; default 500.
//   - MaxInFlight, the most batches in flight to one member at once, in
//     [1, 64]; default 1: a check goes out at once when nothing is in
//     flight, and gathers with others while a batch is.
//   - Timeout, how long a forwarded check waits at most, from when it is
//     queued to its answer; default 1s. A check that waits longer is
//     decided by its unreachable policy.
//   - DialOptions, added to the clients' own; New adds after them the
//     credentials of Config.TLS and of the cluster secret.
//   - Observer, Clock, SendClock and TracerProvider, for metrics, time and
//     tracing: when nil, New sets them from the node (its metrics, its
//     clock, Config.TracerProvider). Self is always the node's name.
type PeerConfig = peer.Config

// Permit decides whether the caller of ctx may make req, a request of the
// public API that has been validated; a non-nil error refuses the whole
// call with PermissionDenied and the error's text (Config.PublicPermit).
// It must be safe for concurrent use and should not block.
type Permit = transport.Permit

// InspectPermit decides whether the caller of ctx may inspect keys on the
// public API; a non-nil error refuses the call with PermissionDenied and
// the error's text (Config.PublicInspectPermit). It must be safe for
// concurrent use and should not block.
type InspectPermit = transport.InspectPermit

// ServerLimits bounds what clients may hold open on a node's gRPC server
// (Config.ServerLimits): MaxConnections open at once, HandshakeTimeout,
// MaxConnectionIdle, KeepaliveTime and KeepaliveTimeout, the
// MinPingInterval clients may ping at, MaxConcurrentStreams calls open on
// one connection, and the bytes of the messages on their way: MessageBytes
// for all connections together, ConnMessageBytes for one, MessageTimeout
// for a call's first message to arrive whole. Start from
// DefaultServerLimits; the zero value is invalid. Its Validate names the
// first invalid field.
type ServerLimits = transport.ServerLimits

// DefaultServerLimits returns the default ServerLimits.
func DefaultServerLimits() ServerLimits { return transport.DefaultServerLimits() }

// Lease is a share of a key's remaining hits that its owner granted
// (Node.Lease): Granted hits, already consumed on the owner; ExpiresAt, on
// the owner's clock, and ValidFor, from when the owner granted it; and the
// owner's Decision for the hits taken.
type Lease = transport.Lease

// MaxLeaseTTL, a minute, bounds LeaseConfig.TTL and the ttl of Node.Lease.
const MaxLeaseTTL = transport.MaxLeaseTTL

// MinClusterSecretLen is the shortest Config.ClusterSecret: 16 bytes.
const MinClusterSecretLen = transport.MinClusterSecretLen

// MaxPeerAuthSkew, 5 minutes, is how far a peer's clock may be from the
// receiver's for the proof of Config.ClusterSecret on its calls to pass.
const MaxPeerAuthSkew = transport.MaxPeerAuthSkew
