// Package testcluster starts N real sluice nodes in one process for tests:
// serf and gRPC on free ports of 127.0.0.1 with the fast gossip profile,
// joined into one cluster and closed when the test ends. Use it in your own
// tests to exercise code that embeds a cluster.Node against a real cluster.
//
//	c := testcluster.New(t, 3)
//	d, err := c.Node(0).Check(ctx, req)
//
// Helpers find the owner of a key, stop a node hard, add one, and wait for
// every live node to agree on membership. Nothing in it sleeps to let time
// pass: waits poll a condition until a deadline.
//
// Faults are injected in process (chaos.go): the nodes share a network
// object, keyed by their gossip and gRPC addresses, that every node's gossip
// transport (cluster.Config.GossipTransport), gRPC dialer
// (Peer.DialOptions) and gRPC server interceptors (ServerOptions,
// UnaryInterceptors) consult.
// Partition cuts traffic between groups of nodes, Heal restores it, Slow
// delays the gRPC messages a node receives.
package testcluster
