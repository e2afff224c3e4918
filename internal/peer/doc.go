// Package peer forwards rate-limit checks to the node that owns their keys.
//
// A [Client] talks to one remote node over one long-lived stream of the
// transport package's Peer service (CheckStream), opened at the first check
// and again after it fails, and batches the checks that callers make
// concurrently. A check is sent at once while fewer than [Config].MaxInFlight
// batches are in flight on the stream; otherwise it waits, and the next
// answer lets up to MaxBatch waiting checks go in one batch. At low load
// every check is a batch of its own and no fixed wait is ever added; under
// load batches grow by themselves, bounded by MaxBatch. Each batch carries an
// id, and answers are matched to batches by id.
//
// Sending costs no goroutine switch in the common cases: the caller of a
// check made while nothing is in flight sends it, and the stream's receiver,
// having delivered an answer, sends the next batch. A sender goroutine does
// the rest (opening streams, sending beside batches in flight); a receiver
// goroutine per stream reads answers; a watchdog enforces deadlines; and a
// watcher of the connection closes the stream gracefully when the peer's
// server stops (so that its graceful stop does not wait for the stream). All
// of them are started by the client and stopped by [Client.Close].
//
// A check waits at most [Config].Timeout from when it is queued, on every
// path: each check carries its deadline, and a batch's deadline is its
// earliest check's. A check still queued when its deadline passes fails
// without being sent, so that the caller's fallback decides it at once
// rather than after the batch ahead of it has timed out too. A batch not
// answered by its deadline fails, and so does its stream, which may be
// stuck: it is torn down, and the next batch opens a new one. Either way
// the error wraps [ErrUnavailable] and its gRPC status is
// DeadlineExceeded. Transfers and leases queue nothing: each call has
// Timeout from its start. A caller waits for its own check under its own
// context and gets ctx.Err() when that ends first.
//
// A stream that fails fails only the batches in flight on it, with an
// error wrapping [ErrUnavailable]; an error the owner returns for one item
// (an invalid limit, say) is that item's alone and still matches the
// limiter's sentinel with errors.Is. Answers are untrusted: an answer to no
// batch in flight, or garbage, fails the stream; an answer with the wrong
// number of items fails its batch with an error wrapping
// transport.ErrMalformedResponse.
//
// A [Pool] keeps one client per cluster member, following membership
// changes with [Pool.Update]; [Pool.Get] is lock-free for the hot path.
// [Client.Stats] counts batches, items, batch sizes and the checks that
// failed unsent, and [Config].Observer sees every batch, for metrics.
package peer
