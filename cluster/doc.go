// Package cluster is sluice's embedded entry point: a [Node] composes the
// limiter store, serf membership, the consistent-hash ring, the gRPC servers
// and the per-peer batching clients.
//
// Every service instance runs a Node. Nodes find each other with serf gossip
// and advertise their gRPC address in a serf tag. Each node rebuilds its
// ring from the alive members on every membership event, so once gossip has
// converged all nodes route a key to the same owner. With peer
// authentication on, only members that have proved the peer credential
// enter the ring ([Node.RefusedMembers] lists the others; proof.go). [Node.Check] decides a
// key it owns on its own store, and forwards any other key to its owner,
// where concurrent checks to one peer share a gRPC call. When the owner
// cannot be reached, the node applies the [Policy] of the request or of its
// config: decide on its own store (the default), allow, or deny; the
// [Decision] says it was made without the owner.
//
// A node is ready ([Node.Ready], [Node.WaitReady]) only inside a cluster
// that has formed: it has joined its seeds, and sees
// Config.BootstrapExpect members or a member that is ready already; never
// as a cluster of its own unless configured to (BootstrapExpect 1). Until
// then every check it is asked gets the unreachable policy. Nodes retry
// their seeds and the members they remember (Config.DataDir) that are not
// members, so that a restarted node, or two halves that formed apart,
// find each other (bootstrap.go). Members advertise the protocol versions
// they speak; one whose range does not overlap this node's stays out of
// the ring (protocol.go).
//
// A node decides a key as its owner only when its ring gives it the key
// and the key is settled on it: the node is ready and either it owned the key
// before the last membership change, or every other member has confirmed
// the new membership after handing it the states of the keys it gained
// (handover.go). Until then the key's previous owner decides, or the check
// waits, within Config.HandoverTimeout. When the ring changes, a node hands
// the state of the keys that moved to their new owner, which merges it
// (the more consumed state wins); with Config.Replicas > 1 each owner
// copies the keys it changed to the next nodes of the ring every
// Config.ReplicateInterval, so that a key's next owner continues from a
// copy when the owner dies hard (handoff.go, replicate.go).
//
// With [LeaseConfig.Threshold] set, a node that checks a key it does not own
// more often than the threshold leases a share of the key's hits from the
// owner and decides on them locally until the lease runs out or expires,
// returning what it did not use (lease.go says which algorithms lease and
// why; grants.go how the owner keeps each algorithm's bound with leases
// out).
//
// The package is in parts, each with its own file and unit tests on an
// injected clock:
//   - handover.go: which keys this node decides as owner (settled
//     partitions, confirmations, readiness) and the decide locks;
//   - router.go: where a check goes (here, the owner, the previous owner,
//     wait, or the unreachable policy), for single checks, batches and
//     lease requests; it owns the breakers;
//   - lease.go: the holder's side of leases, its table and loop; grants.go:
//     the owner's side;
//   - outbox.go: one queue and worker per peer, one retry policy, for
//     hand-off states, copies and hand-over confirmations;
//   - proof.go: which gossip members have proved they belong to the
//     cluster, challenged with a backoff, and may enter the ring;
//     clockskew.go: the members' clock offsets, sampled over the same
//     Prove exchange, and the warning beyond Config.MaxClockSkew;
//   - seeds.go: the one join path, which resolves seeds' host names to
//     every address but this node's at each attempt;
//   - bootstrap.go: when the node is ready (BootstrapExpect, the boot
//     tag), and the loop that joins seeds and remembered members again;
//     memberfile.go: the members remembered in DataDir;
//   - protocol.go: the protocol versions advertised, and the members
//     refused for theirs;
//   - check.go, handoff.go, replicate.go: the check path and what moves on
//     membership changes, built on those; node.go: lifecycle and wiring;
//   - persist.go, datadir.go: with Config.DataDir, the key states this
//     node holds written to disk every Config.PersistInterval and at
//     Close, restored at start and given to their owners; the state
//     files, their checks and the directory's lock;
//   - inspect.go: [Node.Inspect], a key's state read where a check would
//     be decided, and the reset of a key's replicas when its owner resets
//     it.
//
// A Node with no peers is a complete single-node limiter. [Node.Leave] leaves
// the cluster gracefully; [Node.Close] stops at once. Either stops every
// goroutine the node started.
package cluster
