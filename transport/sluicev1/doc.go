// Package sluicev1 is the code generated from
// transport/proto/sluice/v1/sluice.proto: the messages and the Peer and
// Sluice gRPC services of sluice's wire protocol. Do not edit the .pb.go
// files; regenerate them with transport/gen.sh. Package transport converts
// these messages to and from limiter values and serves the services.
package sluicev1
