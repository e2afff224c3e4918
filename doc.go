// Package sluice is the vocabulary every sluice backend speaks: a
// [Limiter] decides [limiter.Request]s and answers each with a [Decision],
// or a [Result] in a batch; a [Policy] says what to do when a key's owner
// cannot be reached.
//
// Three backends implement Limiter:
//
//   - [Local], over one process's [limiter.Store];
//   - cluster.Node, a member of a cluster that decides each key on the one
//     node that owns it;
//   - client.Client, which asks a sluice daemon.
//
// The adapters (httplimit, grpclimit) and the rules engine (rules) depend
// only on this package and on limiter, so that any of the three can back
// them, and importing them pulls in no cluster, gossip or gRPC code.
package sluice
