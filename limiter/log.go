package limiter

import "time"

// logEntry is hits admitted at one instant.
type logEntry struct {
	at   int64 // Unix ns
	hits int64
}

// windowLog is the sliding window log of one key, kept beside its state in
// the shard (only this algorithm needs one): entries in time order,
// live from head. Hits admitted at the same instant share an entry, and every
// entry holds at least one hit, so there are never more entries than Limit.
type windowLog struct {
	entries []logEntry
	head    int
	total   int64 // hits in entries[head:]
}

func (l *windowLog) clear() {
	l.entries = l.entries[:0]
	l.head = 0
	l.total = 0
}

// expire drops the entries admitted at or before cutoff.
func (l *windowLog) expire(cutoff int64) {
	for l.head < len(l.entries) && l.entries[l.head].at <= cutoff {
		l.total -= l.entries[l.head].hits
		l.head++
	}
	switch {
	case l.head == len(l.entries):
		l.clear()
	case l.head > 32 && l.head*2 >= len(l.entries):
		n := copy(l.entries, l.entries[l.head:])
		l.entries = l.entries[:n]
		l.head = 0
	}
}

func (l *windowLog) add(at, hits int64) {
	if n := len(l.entries); n > l.head {
		last := &l.entries[n-1]
		if at <= last.at { // same instant, or the clock stepped back
			last.hits += hits
			l.total += hits
			return
		}
	}
	l.entries = append(l.entries, logEntry{at, hits})
	l.total += hits
}

// decideSlidingLog admits at most Limit hits in any (now-Period, now].
func decideSlidingLog(st *state, l *windowLog, req *Request, now int64) Decision {
	p := int64(req.Period)
	l.expire(now - p)
	probe := max(req.Hits, 1)
	d := Decision{Limit: req.Limit}
	if l.total+probe <= req.Limit {
		d.Allowed = true
		if req.Hits > 0 {
			l.add(now, req.Hits)
		}
	} else {
		if req.Behavior&DrainOverLimit != 0 && req.Hits > 0 && l.total < req.Limit {
			l.add(now, req.Limit-l.total)
		}
		// Wait until enough of the oldest entries expire.
		need := l.total + probe - req.Limit
		for _, e := range l.entries[l.head:] {
			need -= e.hits
			if need <= 0 {
				d.RetryAfter = time.Duration(e.at + p - now)
				break
			}
		}
	}
	d.Remaining = max(req.Limit-l.total, 0)
	st.expireAt = now
	if n := len(l.entries); n > l.head {
		st.expireAt = addSat(l.entries[n-1].at, p)
	}
	d.ResetAt = nsTime(st.expireAt)
	return d
}
