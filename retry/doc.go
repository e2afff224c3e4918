// Package retry retries calls that were throttled or failed for a moment,
// with capped exponential backoff and full jitter, and honours the wait a
// server asks for.
//
// [Do] calls a [Func] until it succeeds, returns a [Permanent] error, the
// [Policy]'s attempts run out or the context ends. Before retry n (n = 1 for
// the first retry) it waits a random delay in [0, min(Max, Base*Multiplier^(n-1))]
// ("full jitter": callers that were throttled together do not come back
// together), or the Retry-After the Func returned when that is longer: a
// server that says when to come back is never called earlier. When the
// context has a deadline that the wait would pass, Do gives up at once
// instead of sleeping into it.
//
// A Func reports the wait a server asked for as its first result. The
// helpers read it from where servers put it: [HTTPRetryAfter] from an HTTP
// response's Retry-After header (seconds or an HTTP date), [GRPCRetryAfter]
// from the RetryInfo detail of a gRPC status; a sluice Decision carries it as
// RetryAfter.
//
// Nothing here sleeps on its own clock in tests: the random source, the wait
// and the clock are options ([WithRand], [WithSleep], [WithClock]), so that a
// test can record the delays Do asks for and return at once.
package retry
