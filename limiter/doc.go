// Package limiter makes the rate-limit decision for a key this process owns.
//
// It is a leaf package: it knows nothing of clusters, peers or transports. A
// [Request] names a limit (Name), a client key (Key), a cost (Hits), a rate
// (Limit per Period, with a Burst where the algorithm has one) and an
// [Algorithm]; a [Decision] says whether the request is admitted and what the
// client may do next (Remaining, ResetAt, RetryAfter, and Delay for the leaky
// bucket).
//
// [Store] keeps the per-key state in memory, sharded with one lock per shard.
// The state of every algorithm but the sliding window log fits in three
// machine words, so a key costs well under 128 bytes beyond its own bytes.
// An entry is dropped by [Store.Sweep] only once its state has returned to
// fresh, so dropping it changes no future decision; a maximum entry count
// and a memory budget in bytes ([StoreConfig].MaxBytes, which counts every
// key and every log entry) evict the least recently used entries, and
// evictions of live state are counted.
//
// Time is always an argument: [Store.CheckAt] takes now, [Store.Check] calls
// time.Now once. Rejected requests consume nothing, unless the request asks
// for [DrainOverLimit]; a [Charge] consumes its hits whatever the state
// (hits admitted elsewhere, for the buckets and GCRA); peeks (Hits 0 without [Reset]) never write: whatever
// their algorithm, Limit, Period or Burst, they decide on a copy of the
// key's state and keep nothing, so the state, its expiry and its place in
// [Store.Changed] are what they were (a peek with other parameters answers
// as a check with them would find the key now). [Store.TakeAt] that takes
// nothing keeps nothing either. RetryAfter is exact for every algorithm:
// the same request is admitted at now+RetryAfter and not a nanosecond
// earlier, if nothing else is consumed meanwhile.
//
// The algorithms and their exact semantics:
//
//   - [TokenBucket]: a bucket of capacity Burst refilled continuously at
//     Limit/Period. A request of h hits is admitted when h tokens are present.
//   - [LeakyBucket]: a queue of capacity Burst that drains at Limit/Period. An
//     admitted request gets a Delay, the time until everything queued ahead of
//     it has drained, so outflow is smooth; a full queue rejects. [Wait]
//     sleeps for the delay under a context.
//   - [FixedWindow]: at most Limit hits per window. Windows are aligned to
//     multiples of Period since the Unix epoch, or with a [Calendar] unit to
//     calendar minutes, hours, days, ISO weeks (starting Monday), months or
//     years in the request's time zone. Across a DST change a day (week,
//     month, year) is as long as the clocks make it, and it begins at the
//     transition if that skips midnight; a local hour that the change
//     repeats is two windows, one per offset.
//   - [SlidingWindowLog]: at most Limit hits admitted in any interval
//     (now-Period, now]; the log stores (time, hits) pairs, merging hits
//     admitted at the same instant, so it never holds more entries than
//     Limit. Nor more than [MaxLogEntries]: a log that would pass it keeps
//     one entry per multiple of a quantum, a power of two nanoseconds, each
//     at the latest instant of the hits it holds. Those hits then count
//     until at most a quantum later than exactly, never earlier, so the log
//     admits no more than an exact one would. The quantum is the least
//     power of two that leaves at most MaxLogEntries/2 entries, or twice the
//     previous quantum: less than Period/1023 of the request that filled
//     the log. A log that empties is exact again. Decisions stay exact for
//     the log as it is: RetryAfter is found by binary search over its
//     cumulative counts, so a denial costs no scan of the log.
//   - [SlidingWindowCounter]: windows aligned like the fixed window; a request
//     is admitted when cur + hits + prev*(Period-elapsed)/Period <= Limit,
//     computed exactly in integers, where cur and prev are the admitted hits
//     of the current and previous windows and elapsed is the time since the
//     current window began.
//   - [GCRA]: the generic cell rate algorithm, one theoretical arrival time
//     (TAT) per key. The emission interval T is Period/Limit rounded up to a
//     whole nanosecond (never faster than Limit per Period); a request of h
//     hits is admitted when max(TAT, now) + h*T - now <= Burst*T, all in
//     integer nanoseconds, so decisions are exact.
//
// A request whose Limit, Period or Burst differ from the previous request for
// the same key takes effect at once and keeps what was consumed: the bucket
// level as it stood at the previous request, draining at the new rate from
// then on; the TAT, its outstanding time converted to the new emission
// interval (rounded up); the window counts and the log. A cut never resets a
// key: after it the key stays limited until what it carries has drained at
// the new rate (or until the horizon below). State that had returned to fresh
// under the parameters of the request that wrote it is fresh.
//
// A request with another Algorithm for a key with live state never discards
// it: it converts the state conservatively. The hits the state still counts
// at now, c, are read with the request's parameters as a change of Limit or
// Period reads them (a bucket level drained at the request's rate, rounded
// up; a fixed window's count; the sliding window counter's estimate over the
// request's Period, rounded up; a log's hits within the request's Period;
// GCRA's outstanding time at its own interval, in hits rounded up), and the
// key becomes the state that the request's algorithm has after taking min(c,
// capacity) hits from fresh at now. With the same capacity (the same Limit,
// and a Burst of 0 or Limit where the other algorithm has none), Remaining
// after the conversion is exactly what the old algorithm had left at now, so
// a spent key stays spent, and from then on the key admits no more than a
// fresh key of the new algorithm that took those hits at the conversion (a
// test asserts both for every pair of algorithms). The hits are released as
// the new algorithm releases hits it admitted at that instant, which may be
// sooner than the old one would have (a window that ends, a bucket that
// drains): carrying the old release time would need state dated after now,
// which no algorithm keeps. Before the conversion counts c, the state's
// times are bounded by now as its own algorithm reads them (see below), so
// a clock set back or a peer's clock ahead never makes a switch read a
// spent key as fresh. A peek does not convert; the first check that can
// write does. Refusing such a request instead would make middleware,
// which fails open on errors, unlimit a key whose rule changed its
// algorithm.
//
// Both kinds of change release hits sooner when the new rate is laxer: a
// far shorter Period or higher Limit drains a bucket or ends a window
// early, and a round trip through another algorithm (A->B->A) counts only
// what the intermediate state still holds. [StoreConfig].KeepStrictest
// closes that for callers who may not reset a key: the store keeps,
// beside each live key, the rate its state was last charged under (Limit,
// Burst, Period or Calendar and Location, and the state's Algorithm), and
// a request at another rate is decided with the state's Algorithm and the
// strictest of both rates: for the buckets, GCRA and the log the longer
// period; for a fixed window or sliding window counter, whose count
// moves to the window of the rate it is decided at, the rate whose window
// holding now ends later (on a tie, the longer; with a fixed window's
// Calendar), so that hits counted in a window are never released before
// the end of every window they were charged under (a 3-hour window beside
// a 2-hour one, a month beside a week or 24 hours beside a 23-hour day
// may end first, or last); over that period the least Limit either rate
// allows (rounded down), and the least capacity. Where that Limit is
// below one hit, a request that charges is denied until the key is
// fresh. The state is never
// converted to another algorithm and never read at a laxer rate, so no
// request without Reset lowers what the key counts: a cut of Limit or
// Burst takes effect at once and keeps what was consumed, while a raise,
// a shorter Period or another Algorithm takes effect once the key's state
// is fresh (or after a Reset). A request for more Hits than the
// strictest capacity is denied, consuming nothing, with RetryAfter until
// the key is fresh, when its own rate takes effect. The decision's Limit
// is the strictest rate's. A [Snapshot] carries the key's rate
// (RateLimit, RateBurst, and RatePeriod or a calendar window's
// RateCalendar and RateLocation), and [Store.Merge] keeps the strictest
// of it and the receiving key's (for the window algorithms too the
// window of the two that ends later, which the joined count lasts until); a
// state received without one is charged at the rate of the first
// decision after it, bounded as received states are.
//
// After a Period or Calendar change, the count of a fixed window that is not
// over counts in the current window. The sliding window counter places each
// of its two counts, those of its current and previous windows under the old
// Period, in the window of the new alignment that holds the last nanosecond
// of the count's own window, or in the current window if that nanosecond is
// later (no hit was admitted after now): the count of a window that is not
// over, or that ended during the current window, counts in the current
// window; one that ended during the previous window counts in the previous
// window; an earlier one is over. A count so placed saturates at MaxLimit.
// From then on they are the counts of those windows, and the decision,
// Remaining, ResetAt and RetryAfter follow from them by the formula above.
//
// Merge never lowers what a live key counts. A received state of another
// algorithm than the key's live one is dropped: neither can be read in
// the other's terms without the rate of the request that will read it.
// Of the same algorithm, the two are joined: the later fixed window's
// start with the larger of both counts (two live windows start together
// unless another Period or a skewed clock charged one); each sliding
// window counter's counts aligned to the later window, the larger of
// each, a count whose window is not over at the later start staying in
// the current window (another Period's); the log that counts, after
// each instant, the larger of what the two count after it (a window
// ending at any later time holds the larger of both windows' hits, at
// any Period); GCRA's later TAT at the shorter interval; and for
// the buckets, the level that lasts longer when both drain at one rate
// (as their levels and expiries tell it), else the larger level at the
// later time, which is at least what either holds at any rate.
//
// A state received from another node ([Store.Merge]) is untrusted. Merge
// refuses one whose expiry or GCRA arrival time is more than MaxStateLife
// (the longest one valid request makes a state last: MaxDrain and an hour
// of rounding) plus MaxClockSkew (5 minutes) after now, or whose bucket
// level time, window start or newest log entry is more than MaxClockSkew
// after now. A state it does merge is marked received, and the first
// decision on its key bounds it by that decision's request before deciding:
// no time after now, a bucket level of at most Burst (within the buckets'
// tolerance of 1e-9 hits), a TAT at most Burst*T after now, window counts
// of at most Limit, and the newest Limit hits of the log's window. A
// received key therefore stays limited at most as long as a fresh key that
// the request fully consumed at now. A state that a peer wrote under the
// same parameters on a clock not ahead of this node's is within these
// bounds and decides exactly as it would have on the peer. A state carried
// past a cut of Limit, Period or Burst (a cut racing a hand-off, or a cut
// before the key moved) is bounded by the new parameters, as if the cut had
// come before the hits it carries beyond them; one that would last longer
// than MaxStateLife is refused, and its key starts fresh on the receiving
// node. Times of a peer whose clock runs ahead by up to MaxClockSkew are
// read as now, so its state counts up to that much less.
//
// A clock that steps back finds states written after its now. Each
// decision first bounds the state it reads by now, whoever wrote it, and
// reads what a later state holds as written at now: a bucket level as it
// stood, at now; a GCRA arrival time at most as far ahead of now as the
// decision that wrote it put it ahead of its own clock; the count of a
// fixed window that began after now in now's window; the two counts of a
// sliding window counter whose current window began after now together in
// now's window, up to Limit (or the current count, if more); log entries
// after now at now. A step back therefore never holds a key longer than
// spending what it carries at now would: a key spent to its limit is
// released within a burst's drain, by the end of now's window, or (the
// sliding window counter) a hit's share of a period after it. RetryAfter
// stays exact. A peek (Hits 0) that the bound would change
// decides on a copy and writes nothing.
//
// To a key, time is what its clock reads. A step forward of s is s that
// passed: the key refills, at most to its capacity, as if s had elapsed,
// so a step forward admits at most one capacity more than real time
// allows. A step back is time that stood still: over any interval of real
// time, the buckets, GCRA and the sliding window log admit no more than
// they would on a clock that stood still from the step until the key's
// next decision; the fixed window and the sliding window counter admit at
// most one Limit more per step back, as the window that holds the moved
// count may end sooner than the window it left would have.
//
// Concurrent callers read the clock before they take the store's lock, so
// a reading may arrive after a later one. A reading at most 100 ms behind
// the latest that its key's shard of the store has decided at is read as
// that latest reading, so that a late caller at a window's boundary finds
// the next window's count where it is, and the limit stays exact; its
// RetryAfter and Delay count from its own reading. A step back of at most
// 100 ms is therefore read as time that stood still until the clock is back
// where it was (a key held up to 100 ms longer); a larger one is bounded as
// above.
//
// Time saturates at the horizon: the latest instant Unix nanoseconds
// represent, 2262-04-11 23:47:16.854775807 UTC (or, for a now before 1970,
// now plus the longest Duration if that is earlier). A key whose consumption
// would take longer to drain, as after a drastic cut, stays limited until the
// horizon and is fresh from then on: ResetAt is the horizon and RetryAfter
// the time until it, so that now+RetryAfter never overflows and RetryAfter
// stays exact. GCRA keeps time rather than hits, so what it carries past a
// change is at most the time until the horizon.
package limiter
