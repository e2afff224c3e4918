// Package transport holds sluice's wire contract: the protobuf definition
// of its gRPC services, proto/sluice/v1/sluice.proto, and the Go code
// generated from it, package sluicev1. Clients in any language generate
// their code from the .proto; Go clients of the daemon use the client
// package, which speaks it.
//
// Three services are defined. Sluice is the public API of every node and
// of the daemon: checks routed to their key's owner, Inspect, and Health.
// Rules is the daemon's: a request described by its route, user and
// descriptors, checked against its rule file. Peer is spoken between the
// members of a cluster only; it admits only members once the cluster has
// credentials (cluster.Config's TLS with PeerIdentities, ClusterSecret or
// GossipKeys).
//
// Durations and instants are int64 nanoseconds on the wire; a hits field
// that is absent means 1. Time zones are IANA names. A batch carries at
// most client.MaxBatchItems items: a server refuses a larger one with
// InvalidArgument naming the field, and a message larger than the largest
// valid batch with ResourceExhausted. Errors travel per item, as an
// ErrorCode and a message naming the field; only a batch over its limit
// fails as a whole.
//
// The generated code in sluicev1 is committed. To regenerate it after
// editing the .proto, with protoc, protoc-gen-go v1.36.10 and
// protoc-gen-go-grpc v1.5.1 installed, run transport/gen.sh or:
//
//	go generate ./transport
//
//go:generate sh gen.sh
package transport
