package limiter

// refund returns req.Hits to st, which decide has already reset if its
// state was stale, for a refund without Charged (see refundWindow). Only
// what is still counted can be given back: a bucket level, the count of
// the window the hits went into, the TAT, the newest log entries; nothing
// goes below fresh.
func refund(st *state, lg *windowLog, req *Request, now int64) {
	h := req.Hits
	switch req.Algorithm {
	case TokenBucket, LeakyBucket:
		last := st.levelTime()
		level := bucketLevelAt(st.level(), last, now, float64(req.Limit), float64(req.Period))
		st.setLevel(max(level-float64(h), 0), max(last, now))
	case FixedWindow:
		if start, _ := windowBounds(req, now); st.windowStart() >= start {
			st.setWindow(st.windowStart(), max(st.windowHits()-h, 0))
		}
	case SlidingWindowCounter:
		// The stored current window is the one the hits went into, even
		// if it has since become the previous one. The expiry tells the
		// Period of the counts (see counterPeriod), so it follows them.
		if st.windowHits() > 0 {
			q := counterPeriod(st, int64(req.Period))
			st.setWindow(st.windowStart(), max(st.windowHits()-h, 0))
			st.expireAt = counterExpiry(st.windowStart(), st.windowHits(), st.prevWindowHits(), q, st.expireAt)
		}
	case GCRA:
		if t := st.interval(); t != 0 && st.tat() > now {
			st.setTAT(max(st.tat()-h*t, now), t)
		}
	case SlidingWindowLog:
		if lg != nil {
			lg.removeNewest(h)
		}
	}
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

// windowRefund reports whether r is a refund to the window it names
// (Request.Charged), which Reset does not clear first.
func (r *Request) windowRefund() bool {
	return r.Behavior&(Refund|Reset) == Refund && !r.Charged.IsZero()
}

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
