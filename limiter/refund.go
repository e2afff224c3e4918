package limiter

import (
	"cmp"
	"math"
	"slices"
)

// refund returns req.Hits to st, which decide has already reset if its
// state was stale, for a refund without Charged (see refundWindow). Only
// what is still counted can be given back: a bucket level, the count of
// the window the hits went into, the TAT, the newest log entries; nothing
// goes below fresh. It returns the whole hits given back: a bucket's or
// GCRA's fraction of a hit is not counted, so that what it returns is
// never more than the state counts fewer.
func refund(st *state, lg *windowLog, req *Request, now int64) (gave int64) {
	h := req.Hits
	switch req.Algorithm {
	case TokenBucket, LeakyBucket:
		last := st.levelTime()
		level := bucketLevelAt(st.level(), last, now, float64(req.Limit), float64(req.Period))
		st.setLevel(max(level-float64(h), 0), max(last, now))
		gave = int64(math.Floor(min(max(level, 0), float64(h))))
	case FixedWindow:
		if start, _ := windowBounds(req, now); st.windowStart() >= start {
			gave = min(st.windowHits(), h)
			st.setWindow(st.windowStart(), max(st.windowHits()-h, 0))
		}
	case SlidingWindowCounter:
		// The stored current window is the one the hits went into, even
		// if it has since become the previous one. The expiry tells the
		// Period of the counts (see counterPeriod), so it follows them.
		if st.windowHits() > 0 {
			q := counterPeriod(st, int64(req.Period))
			gave = min(st.windowHits(), h)
			st.setWindow(st.windowStart(), max(st.windowHits()-h, 0))
			st.expireAt = counterExpiry(st.windowStart(), st.windowHits(), st.prevWindowHits(), q, st.expireAt)
		}
	case GCRA:
		if t := st.interval(); t != 0 && st.tat() > now {
			tat := st.tat()
			st.setTAT(max(tat-h*t, now), t)
			gave = (tat - st.tat()) / t
		}
	case SlidingWindowLog:
		if lg != nil {
			before := lg.total()
			lg.removeNewest(h)
			gave = before - lg.total()
		}
	}
	return max(gave, 0)
}

// removeNewest takes up to h hits off the newest entries.
func (l *windowLog) removeNewest(h int64) {
	for h > 0 && len(l.entries) > l.head {
		n := len(l.entries)
		take := min(h, l.hits(n-1))
		h -= take
		if take == l.hits(n-1) {
			l.entries = l.entries[:n-1]
		} else {
			l.entries[n-1].cum -= take
		}
	}
	if len(l.entries) == l.head {
		l.clear()
	}
}

// chargedRefund reports whether r is a refund to the charge it names
// (Request.Charged), which Reset does not clear first.
func (r *Request) chargedRefund() bool {
	return r.Behavior&(Refund|Reset) == Refund && !r.Charged.IsZero()
}

// chargedAt reports whether r's Charged is an instant (Start == End), the
// Decision.Window of a charge of a token or leaky bucket, GCRA or sliding
// window log, which have no windows.
func (r *Request) chargedAt() bool { return r.Charged.Start == r.Charged.End }

// instantAlgorithm reports whether a's charges name the instant they were
// charged at rather than a window (Decision.Window).
func (a Algorithm) instantAlgorithm() bool { return a.HasBurst() || a == SlidingWindowLog }

// Which count of a window state holds a refund's window (windowCount).
const (
	noWindow   = iota
	curWindow  // the stored current window: a fixed window's, or a counter's
	prevWindow // the counter's previous window
)

// windowCount returns which count of st, a live state, holds req's
// Charged window: the fixed window or sliding window counter that st is, of
// req's algorithm, whose stored current window (or the counter's previous
// one) is exactly that window and counts hits. A state that has gone
// fresh since, or been charged under another algorithm or Period, holds
// another window or none, and the hits it counts are not the refund's.
func (st *state) windowCount(req *Request) int {
	w, ws := req.Charged, st.windowStart()
	if st.algo() != req.Algorithm {
		return noWindow
	}
	switch req.Algorithm {
	case FixedWindow:
		// A fixed window that counts hits expires when its window ends.
		if st.windowHits() > 0 && ws == w.Start && st.expireAt == w.End {
			return curWindow
		}
	case SlidingWindowCounter:
		if st.windowHits() == 0 && st.prevWindowHits() == 0 {
			return noWindow
		}
		q := counterPeriod(st, int64(req.Period))
		switch {
		case st.windowHits() > 0 && ws == w.Start && addSat(ws, q) == w.End:
			return curWindow
		case st.prevWindowHits() > 0 && ws-q == w.Start && ws == w.End:
			return prevWindow
		}
	}
	return noWindow
}

// refundWindow takes req.Hits off the count of st, a live state, that
// holds req.Charged, and reports whether one does (see windowCount);
// nothing goes below zero.
func refundWindow(st *state, req *Request) bool {
	which := st.windowCount(req)
	if which == noWindow {
		return false
	}
	q := counterPeriod(st, int64(req.Period)) // a counter's, before its counts change
	if which == prevWindow {
		st.setPrevWindowHits(max(st.prevWindowHits()-req.Hits, 0))
	} else {
		st.setWindow(st.windowStart(), max(st.windowHits()-req.Hits, 0))
	}
	if req.Algorithm == SlidingWindowCounter {
		st.expireAt = counterExpiry(st.windowStart(), st.windowHits(), st.prevWindowHits(), q, st.expireAt)
	}
	return true
}

// refundCharged gives req.Hits back to st (and lg), a live state as
// stored, to the charge req.Charged names, and reports whether it gave
// any back: to the window of a fixed window or sliding window counter
// (refundWindow), or what has not drained of a charge at an instant
// (refundInstant). With apply false it only reports.
func refundCharged(st *state, lg *windowLog, req *Request, now int64, apply bool) bool {
	switch {
	case st.algo() != req.Algorithm:
		return false // another algorithm's hits are other requests'
	case !req.Algorithm.instantAlgorithm():
		if !apply {
			return st.windowCount(req) != noWindow
		}
		return refundWindow(st, req)
	case !req.chargedAt():
		return false // a window: no charge of this algorithm names one
	}
	return refundInstant(st, lg, req, now, apply)
}

// refundInstant gives back what is still counted of req.Hits charged at
// the instant req.Charged.Start on st, a live token bucket, leaky bucket,
// GCRA or sliding window log state of req's algorithm and rate, as stored
// (before boundTimes), and reports whether it gave any back.
//
// The buckets and GCRA give back at most hits - rate×(now - at), floor 0
// (rate is Limit/Period for the buckets, one hit per emission interval for
// GCRA), and never more than the level or the TAT's lead over now. This is
// never more than what of the charge still counts, whatever order the
// hits drain in: compare the key's level (or TAT's lead) with the level it
// would have without the charge. At the charge they differ by hits. Both
// drain at rate while above zero and grow alike by every later charge, so
// the difference only shrinks, and only while the level without the
// charge is zero, then at rate at most. So at now the charge still adds at
// least hits - rate×(now - at) to the level, and giving that back leaves
// the key at least as spent as if the charge had never been made: another
// request's hits are never taken off. (A state of another rate drained at
// its own, so it gives nothing back.)
//
// The sliding window log gives back up to the hits of its entry at that
// instant, while the entry is in the window: hits of one instant expire
// together, so which of them are the refund's does not matter. An entry
// that has left the window, or has been merged into a later instant
// (coarsened, or joined by hits of a later instant), gives nothing back.
func refundInstant(st *state, lg *windowLog, req *Request, now int64, apply bool) bool {
	at := req.Charged.Start
	switch req.Algorithm {
	case TokenBucket, LeakyBucket:
		limit, period := float64(req.Limit), float64(req.Period)
		last, stored := st.levelTime(), st.level()
		// The expiry the last decision wrote tells the rate it drained at.
		if stored <= 0 || st.expireAt != min(addSat(last, drainTime(stored, limit, period)), horizon(last)) {
			return false
		}
		level := bucketLevelAt(stored, last, now, limit, period)
		back := float64(req.Hits)
		if at < now {
			if now-at < 0 { // a difference past int64: long drained
				return false
			}
			back -= float64(now-at) * limit / period
		}
		back = min(back, level)
		if back <= 0 {
			return false
		}
		if apply {
			level -= back
			if level < bucketEpsilon {
				level = 0
			}
			st.setLevel(level, max(last, now))
		}
		return true
	case GCRA:
		t, tat := st.interval(), st.tat()
		// The TAT as boundTimes reads it: a clock that stepped back
		// leaves it further ahead than any hits are.
		if lead := st.tatLead(); !st.isReceived() && lead < maxTATLead && tat > addSat(now, lead) {
			tat = now + lead
		}
		if t == 0 || t != gcraInterval(req) || tat <= now {
			return false
		}
		// hits*t is at most the burst's drain time (Validate), so
		// neither it nor its difference with an elapsed time below it
		// overflows.
		back := req.Hits * t
		if at < now {
			if now-at >= back || now-at < 0 { // drained, or a difference past int64
				return false
			}
			back -= now - at
		}
		back = min(back, tat-now)
		if apply {
			st.setTAT(tat-back, t)
		}
		return true
	default: // SlidingWindowLog
		if lg == nil || len(lg.entries) == lg.head || st.expireAt != addSat(lg.newest(), int64(req.Period)) {
			return false
		}
		if at <= now-int64(req.Period) {
			return false // out of the window, whether or not expired yet
		}
		live := lg.entries[lg.head:]
		i, found := slices.BinarySearchFunc(live, at, func(e logEntry, at int64) int { return cmp.Compare(e.at, at) })
		if !found {
			return false
		}
		if apply {
			lg.removeAt(lg.head+i, req.Hits)
		}
		return true
	}
}

// holds reports whether the log has a live entry at the instant at.
func (l *windowLog) holds(at int64) bool {
	live := l.entries[l.head:]
	_, found := slices.BinarySearchFunc(live, at, func(e logEntry, at int64) int { return cmp.Compare(e.at, at) })
	return found
}

// removeAt takes up to h hits off entry i, a live one, and drops it if
// none are left.
func (l *windowLog) removeAt(i int, h int64) {
	take := min(h, l.hits(i))
	for j := i; j < len(l.entries); j++ {
		l.entries[j].cum -= take
	}
	if l.hits(i) == 0 {
		l.entries = slices.Delete(l.entries, i, i+1)
	}
	if len(l.entries) == l.head {
		l.clear()
	}
}
