package limiter

import "time"

// windowBounds returns the start and end (Unix ns) of the window containing
// now: a calendar unit in the request's location, or a multiple of Period
// since the Unix epoch.
func windowBounds(req *Request, now int64) (start, end int64) {
	if req.Calendar != NoCalendar {
		return calendarBounds(req.Calendar, req.Location, now)
	}
	p := int64(req.Period)
	start = floorDiv(now, p) * p
	return start, start + p
}

// calendarBounds returns the calendar unit containing now in loc (nil: UTC).
func calendarBounds(c Calendar, loc *time.Location, now int64) (start, end int64) {
	if loc == nil {
		loc = time.UTC
	}
	t := time.Unix(0, now).In(loc)
	y, mo, d := t.Date()
	h, mi := t.Hour(), t.Minute()
	var s, e time.Time
	switch c {
	case Minute:
		s = time.Date(y, mo, d, h, mi, 0, 0, loc)
		e = s.Add(time.Minute)
	case Hour:
		// Truncating in absolute time keeps hours right across DST changes
		// and in zones with half-hour offsets alike.
		s = time.Date(y, mo, d, h, 0, 0, 0, loc)
		e = s.Add(time.Hour)
	case Day:
		s = time.Date(y, mo, d, 0, 0, 0, 0, loc)
		e = time.Date(y, mo, d+1, 0, 0, 0, 0, loc)
	case Week:
		back := (int(t.Weekday()) + 6) % 7 // days since Monday
		s = time.Date(y, mo, d-back, 0, 0, 0, 0, loc)
		e = time.Date(y, mo, d-back+7, 0, 0, 0, 0, loc)
	case Month:
		s = time.Date(y, mo, 1, 0, 0, 0, 0, loc)
		e = time.Date(y, mo+1, 1, 0, 0, 0, 0, loc)
	default: // Year
		s = time.Date(y, 1, 1, 0, 0, 0, 0, loc)
		e = time.Date(y+1, 1, 1, 0, 0, 0, 0, loc)
	}
	if s.UnixNano() > now { // a local midnight skipped by DST: the unit began earlier
		s = time.Unix(0, now)
	}
	return s.UnixNano(), e.UnixNano()
}

// decideFixedWindow admits at most Limit hits per window.
func decideFixedWindow(st *state, req *Request, now int64) Decision {
	start, end := windowBounds(req, now)
	count := st.w[1]
	if st.w[0] < start {
		// The stored window is over. (A stored start at or after start is
		// the same window, or one that began inside it before a Period
		// change: its hits count in this window.)
		count = 0
	}
	probe := max(req.Hits, 1)
	d := Decision{Limit: req.Limit}
	if count+probe <= req.Limit {
		d.Allowed = true
		count += req.Hits
	} else {
		d.RetryAfter = time.Duration(end - now)
		if req.Behavior&DrainOverLimit != 0 && count < req.Limit {
			count = req.Limit
		}
	}
	d.Remaining = max(req.Limit-count, 0)
	st.w[0], st.w[1] = start, count
	st.expireAt = now
	if count > 0 {
		st.expireAt = end
	}
	d.ResetAt = nsTime(st.expireAt)
	return d
}

// decideSlidingCounter admits when
// cur + hits + prev*(Period-elapsed)/Period <= Limit, exactly.
func decideSlidingCounter(st *state, req *Request, now int64) Decision {
	p := int64(req.Period)
	start := floorDiv(now, p) * p
	cur, prev := st.w[1], st.third()
	switch ws := st.w[0]; {
	case ws == start:
	case ws == start-p:
		prev, cur = cur, 0
	case ws < start-p:
		prev, cur = 0, 0
	default:
		// ws > start: the window began later than the current aligned
		// one (Period grew, or the clock stepped back): keep its counts.
	}
	elapsed := now - start
	limitP := mul(req.Limit, p)
	// used is cur*P + prev*(P-elapsed): the estimate, scaled by P.
	used := mul(cur, p).add(mul(prev, p-elapsed))
	remaining := int64(0)
	if used.less(limitP) {
		remaining = limitP.sub(used).div(p)
	}
	probe := max(req.Hits, 1)
	d := Decision{Limit: req.Limit}
	if probe <= remaining {
		d.Allowed = true
		cur += req.Hits
		remaining -= req.Hits
	} else {
		d.RetryAfter = slidingCounterRetry(req.Limit, p, cur, prev, probe, elapsed)
		if req.Behavior&DrainOverLimit != 0 {
			cur += remaining
			remaining = 0
		}
	}
	d.Remaining = remaining
	st.w[0], st.w[1] = start, cur
	st.setThird(prev)
	switch {
	case cur > 0:
		st.expireAt = start + 2*p
	case prev > 0:
		st.expireAt = start + p
	default:
		st.expireAt = now
	}
	d.ResetAt = nsTime(st.expireAt)
	return d
}

// slidingCounterRetry is how long until hits are admitted, given the counts
// of the current window (begun elapsed ago) and the previous one.
func slidingCounterRetry(limit, p, cur, prev, hits, elapsed int64) time.Duration {
	if cur+hits <= limit {
		// Wait in this window until prev*(P-e) <= (limit-cur-hits)*P.
		return time.Duration(weightedWait(limit-cur-hits, p, prev) - elapsed)
	}
	// Wait for the next window, where cur becomes the previous count.
	return time.Duration(p - elapsed + weightedWait(limit-hits, p, cur))
}

// weightedWait returns the least e in [0, P] with count*(P-e) <= room*P.
func weightedWait(room, p, count int64) int64 {
	if count == 0 {
		return 0
	}
	allowance := mul(room, p).div(count) // floor(room*P/count)
	if allowance >= p {
		return 0
	}
	return p - allowance
}
