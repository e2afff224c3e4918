package limiter

import "math"

// A clock that steps back finds states written after its now. Every
// decision bounds the state it reads by now first (boundTimes), whoever
// wrote the state: no time of the state lies further ahead of now than the
// request's own limit puts it, so a step back never holds a key longer than
// consuming its whole capacity at now would, and RetryAfter stays exact.

// boundTimes bounds the times of st, a live state of req's algorithm, and of
// its log lg (nil for the other algorithms) by now, in place, and reports
// whether anything was later than now. A state written at or before now is
// left as it is. What a later state holds is read as written at now:
//   - the buckets: the level as it stood at its time, which becomes now;
//   - GCRA: the TAT at most tatLead after now, as far ahead as the
//     decision that wrote it put it;
//   - the fixed window: the count of a window that began after now counts
//     in now's window;
//   - the sliding window counter: the counts of a current window that
//     began after now count in now's window, up to Limit (or the current
//     count, if more);
//   - the sliding window log: hits logged after now are logged at now.
//
// No count is lowered but the sliding window counter's previous one, which
// the window after now's would weigh at most as much at the time it was
// written. See the package comment for what this admits.
func boundTimes(st *state, lg *windowLog, req *Request, now int64) bool {
	switch req.Algorithm {
	case TokenBucket, LeakyBucket:
		if st.levelTime() > now {
			st.setLevel(st.level(), now)
			return true
		}
	case GCRA:
		// tatLead is below 2^56, so now+lead never overflows when now
		// is negative. A received state carries none: clampReceived
		// bounds its TAT by the request's tolerance.
		if lead := st.tatLead(); !st.isReceived() && lead < maxTATLead && st.tat() > addSat(now, lead) {
			st.setTAT(now+lead, st.interval())
			return true
		}
	case FixedWindow:
		// A window that began after now, not one that began after now's
		// began: that is a longer Period's, which decideFixedWindow
		// counts in now's.
		if st.windowStart() > now && st.windowHits() > 0 {
			start, _ := windowBounds(req, now)
			st.setWindow(start, st.windowHits())
			return true
		}
	case SlidingWindowCounter:
		// As for the fixed window: regroupCounts places the counts of a
		// longer Period's window that began after now's began. One of
		// req's Period that began after now's is not aligned to it
		// unless it began after now (a received state may be neither).
		p := int64(req.Period)
		start := floorDiv(now, p) * p
		ws, cur, prev := st.windowStart(), st.windowHits(), st.prevWindowHits()
		if (cur > 0 || prev > 0) && ws > start && (ws > now || counterPeriod(st, p) == p) {
			cur = max(cur, min(cur+prev, req.Limit))
			st.setWindow(start, cur)
			st.setPrevWindowHits(0)
			st.expireAt = counterExpiry(start, cur, 0, p, now)
			return true
		}
	case SlidingWindowLog:
		return lg != nil && lg.boundTimes(now)
	}
	return false
}

// timesAfter reports whether decide of req at now bounds times of st, a
// live state as stored, that lie after now (boundTimes, which
// clampReceived applies to a received state first), for every algorithm
// but the sliding window log, whose entries keep their instants (a refund
// finds its charge's entry by it, and one bounded to now holds no earlier
// instant's hits). A received GCRA state carries no tatLead, and tells
// no time it was written at.
func timesAfter(st state, req *Request, now int64) bool {
	if st.algo() == SlidingWindowLog {
		return false
	}
	return boundTimes(&st, nil, ownRequest(&st, req, now), now)
}

// boundTimes moves the entries after now to now, merged into one entry,
// and reports whether there were any.
func (l *windowLog) boundTimes(now int64) bool {
	n := len(l.entries)
	i := n
	for i > l.head && l.entries[i-1].at > now {
		i--
	}
	if i == n {
		return false
	}
	last := l.entries[n-1].cum
	l.entries = l.entries[:i]
	if l.joinsLast(now) {
		l.entries[i-1] = logEntry{now, last}
	} else {
		l.entries = append(l.entries, logEntry{now, last})
	}
	return true
}

// newest is the time of the newest entry, or the least instant for an
// empty log.
func (l *windowLog) newest() int64 {
	if n := len(l.entries); n > l.head {
		return l.entries[n-1].at
	}
	return math.MinInt64
}
