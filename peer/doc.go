// Package peer forwards rate-limit checks to the node that owns their keys.
//
// A [Client] talks to one remote node over the transport package's Peer
// service and batches the checks that callers make concurrently. A check is
// sent at once while fewer than [Config].MaxInFlight calls are in flight to
// that node; otherwise it waits, and the next call to return takes up to
// MaxBatch waiting checks in one batch. At low load every check is a call of
// its own and no fixed wait is ever added; under load batches grow by
// themselves, bounded by MaxBatch, and at most MaxInFlight calls are in
// flight per node.
//
// The client's goroutines are MaxInFlight workers, each with at most one
// call in flight, started by [NewClient] and stopped by [Client.Close]; a
// check itself starts none. Every call has the deadline [Config].Timeout. A
// caller waits for its own check under its own context and gets ctx.Err()
// when that ends first. A call that fails fails only its own checks, with an
// error wrapping [ErrUnavailable]; an error the owner returns for one item
// (an invalid limit, say) is that item's alone and still matches the
// limiter's sentinel with errors.Is.
//
// A [Pool] keeps one client per cluster member, following membership
// changes with [Pool.Update]; [Pool.Get] is lock-free for the hot path.
// [Client.Stats] counts calls, items and batch sizes for metrics.
package peer
