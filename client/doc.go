// Package client is the Go client of the sluice daemon's gRPC API, the
// public Sluice service that every node serves on its gRPC address.
//
// A [Client] holds one gRPC connection to one daemon; that daemon routes
// each check to the owner of its key, so any node of the cluster may be
// dialled. [Client.Check] asks for one decision, [Client.CheckMany] for many
// in as few calls as the server's batch limit allows, [Client.Health] for the
// node's state. A [Decision] is the limiter's decision with the node that
// made it (Owner) and whether that node had to decide without the key's owner
// (WithoutOwner, under the request's [sluice.Policy]).
//
// Errors come in two kinds. A request the limiter rejects (a Limit of 0, an
// unknown time zone) is that request's own error, checked before sending when
// the client can and otherwise returned by the daemon; either way it wraps
// the limiter's sentinel, so errors.Is(err, limiter.ErrInvalidLimit) holds.
// A call that fails as a whole (daemon down, deadline passed) returns an
// error that wraps the gRPC status (status.Code works on it) and, when the
// context ended, the context's error. Every call has a deadline: the
// context's, or the client's default timeout ([WithTimeout]) when the
// context has none.
//
// The connection is insecure unless [WithTLS] or [WithDialOptions] says
// otherwise. A Client is safe for concurrent use; Close it when done.
package client
