// Package transport implements sluice's wire protocol for sluice's own
// packages: the gRPC services, the conversions between limiter values and
// their protobuf form, and the servers that expose a node. The contract
// itself, the .proto and the generated code, is public, in the transport
// package and transport/sluicev1.
//
// Three services are defined in transport/proto/sluice/v1/sluice.proto; two are
// served by every node. Peer is spoken between nodes: a node forwards the
// checks of keys it does not own to their owner in batches (the peer
// package does the batching), and the receiver decides every item locally
// as owner, through a [Checker]. The batches
// travel on one long-lived bidirectional stream per pair of nodes
// (CheckStream), each with an id that its answer repeats, or one per call
// (CheckBatch). Sluice is the
// public API for clients of the daemon: each check is routed to its key's
// owner through a [Router], with a [sluice.Policy] for when that owner
// cannot be reached, and Health reports the node's state through [Health].
// Both services answer Inspect, a key's state read without changing it,
// through an [Inspector] ([WithInspector]): on Peer the owner reads its own
// store, on Sluice the node finds the owner; [WithInspectPermit] says who
// may call the public one.
// Peer also answers Prove ([WithProver]): a member's proof, to a node
// about to use it, that it holds the cluster secret, an HMAC of a fresh
// nonce and both names ([Prove]); [PeerAuth] checks the callers of every
// Peer method, and [VerifyPeerIdentity] the certificate of the member
// that answers.
// A third service, Rules, is the daemon's: a request described by its
// route, user and descriptors, checked against the daemon's rule file;
// [RegisterRules] puts it behind the same count guard ([MaxRulesEntries],
// [MaxRulesResults]).
// [RegisterPeer] and [RegisterPublic] put the services on a grpc.Server,
// which should be built with [ServerOptions]; clients of the Peer service
// call with [CallOptions]. Both give the codec that pads small Peer messages
// so that gRPC writes them at once (see wire.go), and which reads plain
// protobuf as well.
//
// Everything received is untrusted. [Codec.RequestFromProto] checks every
// field (enums, time zone, then [limiter.Request.Validate]) and returns an
// error, never a panic, for anything from a nil message to arbitrary bytes.
// Errors travel per item: a bad item gets its own error in its own response
// and never fails its batch; only a batch of more than [MaxBatchItems] fails
// as a whole. [ErrorToProto] and [ErrorFromProto] carry an error as a code
// and a message, so that on the far side errors.Is still matches the
// limiter's sentinel (limiter.ErrInvalidLimit and the others) and the text
// names the field.
//
// What a client may make a server hold is bounded before it is held. A
// message is at most [MaxMessageSize] bytes, the largest valid batch; a
// Transfer is split to fit ([TransferSplit]). Before decoding, the codec
// counts the entries of every repeated field on the wire, allocating
// nothing, and refuses a message over its limits ([MaxBatchItems],
// [MaxTransferStates], [MaxTransferLogEntries]) with InvalidArgument
// naming the field and the count: the registered services decode through
// a wrapper, because grpc-go turns any error of a server's codec into
// Internal. [ServerLimits] bounds connections: how many are open
// ([ServerLimits.Listen] closes the rest at once; [MessageBudget.Listen]
// gives the slot of the connection idle longest, with no call open, to
// the new one, so that connections that open no call hold the cap only
// until the next one arrives), how long a handshake
// and an idle connection last, how often clients may ping (peers ping as
// [PeerKeepalive] says), and how many calls one connection holds open;
// its [MessageBudget] bounds the bytes of the messages on their way, all
// connections together: each call reserves the largest message until its
// message is in (a stream until it ends), a call without room is refused
// with ResourceExhausted, and a call whose first message does not arrive
// whole within MessageTimeout is reset.
//
// Durations and instants are int64 nanoseconds on the wire; a hits field
// that is absent means 1. Time zones are IANA names, loaded once per [Codec]
// and cached there, never in a package-level registry.
//
// The generated code in transport/sluicev1 is committed; the public
// transport package says how to regenerate it.
package transport
