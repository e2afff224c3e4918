// Package ring maps a rate-limit key to the cluster member that owns it.
//
// Every node builds the same [Ring] from the same member list, so every node
// routes a given (name, key) pair to the same owner without asking anyone.
// The key space is cut into Config.PartitionCount partitions: a key's
// partition is [RouteHash](name, key) modulo the partition count, and each
// partition has one owner. The partition-to-owner assignment is computed by
// github.com/buraksezer/consistent (consistent hashing with bounded loads,
// hashed with xxhash), so no member owns more than about Config.Load times
// its fair share of partitions, and a membership change moves only a minority
// of partitions.
//
// [Ring.SetMembers] rebuilds the assignment from the full member list (the
// order of the list does not matter) into an immutable table and swaps it in
// atomically. Lookups ([Ring.Owner], [Ring.OwnerOfHash]) load that table with
// one atomic read and take no lock, allocate nothing, and are safe to call
// concurrently with SetMembers: a lookup sees either the old table or the new
// one, never a mix. [Ring.Owners] lists a key's owner followed by the members
// that would take its place, for replication.
//
// ring is a leaf package: it imports nothing else from sluice. It does not
// discover members; the cluster layer feeds it the current member list.
package ring
