package limiter

// refund returns req.Hits to st, which decide has already reset if its
// state was stale. Only what is still counted can be given back: a bucket
// level, the count of the window the hits went into, the TAT, the newest
// log entries; nothing goes below fresh.
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
