// Package redislimit is a sluice.Limiter whose state lives in Redis: a
// second backend beside the embedded cluster, for stateless instances that
// share a Redis server or a Redis Cluster a team already runs.
//
// Every decision is one Lua script (decide.lua) run atomically on the
// server that holds its key, so that concurrent callers on any number of
// instances admit exactly the limit. The script reads the server's clock
// (TIME), so that the instances' clocks do not matter. Decision.ResetAt
// is on the caller's clock (Config.Clock): the script answers with the
// server's now, and ResetAt is the caller's now plus the time the server
// counts until the reset, so that ResetAt less the caller's now is right
// however skewed the two clocks are; RetryAfter and Delay are durations.
// The script runs by EVALSHA
// and is sent with EVAL when a server does not have it (after a restart,
// a failover or SCRIPT FLUSH). It implements the six algorithms with the
// semantics of package limiter (validation, Decision fields, calendar
// windows, the rules of limit and period changes, Reset, DrainOverLimit
// and Refund), in microseconds, the resolution of Redis time:
//
//   - a Period must be a whole number of microseconds, and GCRA at most one
//     hit per microsecond (ErrUnsupported otherwise);
//   - a bucket's drain time is rounded up to a microsecond, so ResetAt,
//     RetryAfter and Delay are within a microsecond of limiter's, and
//     Allowed and Remaining are limiter's (TestDifferential);
//   - GCRA's emission interval is Period/Limit rounded up to a
//     microsecond, never faster than Limit per Period: where Period/Limit
//     is a whole number of microseconds GCRA decides as limiter's, and
//     otherwise its times are later by less than a microsecond per hit
//     outstanding, but for a peek (which writes nothing) on a state
//     written at another interval: that is decided at limiter's interval,
//     Period/Limit rounded up to a nanosecond, and its times rounded up
//     to a microsecond once;
//   - time saturates at limiter's horizon (2262-04-11), and from 2^53
//     microseconds (2255-06-05, past which Lua's numbers hold even
//     integers only) on it is whole to 2 microseconds;
//   - calendar windows are computed by the caller in the request's zone
//     around its clock and handed to the script, which uses the one that
//     holds the server's time, or answers with that time so that the
//     caller hands the windows around it; likewise the windows of another
//     calendar a state was charged under (KeepStrictest), which the
//     script names by unit and zone, and those around a refund's
//     charged window.
//
// The script decides in limiter's order. A request of another algorithm
// than the key's live state converts the state as limiter does: the hits
// the state still counts at now, read with the request's Limit and
// Period and limiter's rounding, are taken by the new algorithm from
// fresh, at most its capacity, so a spent key stays spent. With
// Config.KeepStrictest the state keeps the rate it was last charged
// under instead (format version 2, 32 bytes more), and a request at
// another rate is decided with the state's algorithm at the stricter of
// both rates, as limiter.StoreConfig.KeepStrictest decides it
// (TestDifferentialStrictest); a calendar window of another unit or zone
// than the request's is read as the state's own window. A peek (Hits
// 0 without Reset) decides on the state as read and writes nothing (no
// SET, PEXPIRE or DEL), whatever its algorithm, Limit, Period, Burst or
// calendar: the key's bytes and TTL stay as they were. The server's clock
// rarely steps back, but when it does the script bounds the state's times
// by now as limiter does, GCRA's arrival time by the lead the decision
// that wrote it recorded in the state. A decision that leaves a key fresh
// deletes it, where limiter's store keeps the fresh state; both then read
// the key as not spent after a step back.
//
// One key holds a decision's whole state: prefix + "{name:key}", name and
// key escaped, so that the hash tag is the limit key itself and Redis
// Cluster spreads limits over every shard (see Key). The value is a
// versioned binary string: a format version, the algorithm, the expiry
// and three numbers, 34 bytes, and for the sliding window log 16 bytes per
// entry. Versions 3 and 4 are 1 and 2 followed by a reset's mark (16
// bytes: the instant a Reset cleared the key's live state and when that
// state would have gone fresh), which keeps the key, even fresh, until it
// lapses: until then a refund naming a charge made before the reset
// gives nothing back, as limiter's store decides it (see
// limiter.Request.Charged). A decision that finds the state written after
// its now (a caller's clock stepped back) leaves such a mark at now, as
// limiter's store does. A key expires (PX) when its state is fresh again; a decision that
// leaves it fresh deletes it, and a peek leaves it as it is. The sliding window log holds at most
// limiter.MaxLogEntries entries: a log that would pass it merges its
// entries into coarser ones, each into the latest of its run of a
// quantum, a power of two microseconds less than Period/1023, so that
// hits count until at most a quantum later than exactly, never earlier.
//
// CheckMany sends its requests in one pipeline; a cluster client splits it
// by node and sends the parts in parallel.
//
// When Redis cannot decide (unreachable, slower than Config.Timeout,
// failing over, refusing), the Unreachable policy does: PolicyLocal on a
// store in this process, PolicyAllow or PolicyDeny; Decision.WithoutOwner
// says so. After Config.BreakerThreshold consecutive failures of one
// Redis node (a cluster's masters have one breaker each) its breaker
// sends checks of its keys straight to the policy for
// Config.BreakerCooldown, then lets one probe through, so that a Redis that is down costs no timeout
// per check and sees no storm of retries.
//
// Config.OverLimitCache (off by default) remembers, in this process, at
// most that many keys that Redis said admit nothing, until their
// RetryAfter: a key under attack then costs Redis one call per RetryAfter
// per process.
package redislimit
