package limiter

import (
	"math"
	"time"
)

// windowBounds returns the start and end (Unix ns) of the window containing
// now: a calendar unit in the request's location, or a multiple of Period
// since the Unix epoch.
func windowBounds(req *Request, now int64) (start, end int64) {
	if req.Calendar != NoCalendar {
		return calendarBounds(req.Calendar, req.Location, now)
	}
	p := int64(req.Period)
	start = floorDiv(now, p) * p
	return start, addSat(start, p)
}

// calendarBounds returns the calendar unit containing now in loc (nil: UTC).
// It always has start <= now < end, also where a zone transition repeats or
// skips local times.
func calendarBounds(c Calendar, loc *time.Location, now int64) (start, end int64) {
	if loc == nil {
		loc = time.UTC
	}
	t := time.Unix(0, now).In(loc)
	switch c {
	case Minute, Hour:
		// Truncate the wall clock in the offset in effect at now: a
		// repeated hour after a DST change is a window of its own, and
		// half-hour offsets keep windows on local hours.
		since := time.Duration(t.Second())*time.Second + time.Duration(t.Nanosecond())
		unit := time.Minute
		if c == Hour {
			since += time.Duration(t.Minute()) * time.Minute
			unit = time.Hour
		}
		start = now - int64(since)
		return start, start + int64(unit)
	}
	y, mo, d := t.Date()
	var s, e time.Time
	switch c {
	case Day:
		s, e = dayStart(y, mo, d, loc), dayStart(y, mo, d+1, loc)
	case Week:
		back := (int(t.Weekday()) + 6) % 7 // days since Monday
		s, e = dayStart(y, mo, d-back, loc), dayStart(y, mo, d-back+7, loc)
	case Month:
		s, e = dayStart(y, mo, 1, loc), dayStart(y, mo+1, 1, loc)
	default: // Year
		s, e = dayStart(y, 1, 1, loc), dayStart(y+1, 1, 1, loc)
	}
	return s.UnixNano(), e.UnixNano()
}

// dayStart returns the first instant of the local date (y, m, d) in loc,
// normalizing m and d as time.Date does. Where a zone transition skips
// midnight (or the whole day), time.Date returns an instant of an earlier
// day or one after the gap; the day then begins at the transition.
func dayStart(y int, m time.Month, d int, loc *time.Location) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	wy, wm, wd := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Date() // normalized
	ty, tm, td := t.Date()
	switch {
	case ty != wy || tm != wm || td != wd: // before the gap
		if _, end := t.ZoneBounds(); !end.IsZero() {
			return end
		}
	case t.Hour() != 0 || t.Minute() != 0 || t.Second() != 0: // after it
		if start, _ := t.ZoneBounds(); !start.IsZero() {
			return start
		}
	}
	return t
}

// decideFixedWindow admits at most Limit hits per window.
func decideFixedWindow(st *state, req *Request, now int64) Decision {
	start, end := windowBounds(req, now)
	// The stored count is that of the window containing now: decide has
	// reset the state if its window ended, and boundTimes has moved a
	// window after now's (the clock stepped back) to now's. (With the
	// same Period or Calendar a stored window that is not over is this
	// one; after a change its hits count in the current window, as doc.go
	// says.)
	count := st.windowHits()
	probe := max(req.Hits, 1)
	d := Decision{Limit: req.Limit}
	if count+probe <= req.Limit {
		d.Allowed = true
		count += req.Hits
		if req.Hits > 0 {
			d.Window = Window{start, end}
		}
	} else {
		if req.Behavior&DrainOverLimit != 0 && req.Hits > 0 && count < req.Limit {
			count = req.Limit
		}
		d.RetryAfter = time.Duration(end - now)
	}
	d.Remaining = max(req.Limit-count, 0)
	if count > st.windowHits() {
		st.setLastCharge(now)
	}
	st.setWindow(start, count)
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
	ws, cur, prev := st.windowStart(), st.windowHits(), st.prevWindowHits()
	if cur > 0 || prev > 0 {
		switch q := counterPeriod(st, p); {
		case q != p:
			cur, prev = regroupCounts(ws, q, cur, prev, start, p)
		case ws == start:
		case ws == start-p:
			prev, cur = cur, 0
		default:
			// Both windows are over; decide resets such a state, but a
			// merged one may get here. (boundTimes has moved a window
			// after now's to now's.)
			cur, prev = 0, 0
		}
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
		if req.Hits > 0 {
			d.Window = Window{start, addSat(start, p)}
		}
	} else {
		if req.Behavior&DrainOverLimit != 0 && req.Hits > 0 {
			cur += remaining
			remaining = 0
		}
		d.RetryAfter = slidingCounterRetry(req.Limit, p, cur, prev, probe, elapsed)
	}
	d.Remaining = remaining
	st.setWindow(start, cur)
	st.setPrevWindowHits(prev)
	st.expireAt = counterExpiry(start, cur, prev, p, now)
	d.ResetAt = nsTime(st.expireAt)
	return d
}

// counterExpiry is when a sliding window counter is fresh again: two periods
// after the start of its current window while that window has hits, one
// while only the previous window has, now when neither has.
func counterExpiry(start, cur, prev, p, now int64) int64 {
	switch {
	case cur > 0:
		return addSat(start, 2*p)
	case prev > 0:
		return addSat(start, p)
	}
	return now
}

// counterPeriod is the Period the counts of st were written with, which its
// expiry tells (see counterExpiry); st holds hits. An expiry saturated at
// the latest representable instant tells nothing, and p is assumed.
func counterPeriod(st *state, p int64) int64 {
	if st.expireAt == math.MaxInt64 {
		return p
	}
	q := st.expireAt - st.windowStart()
	if st.windowHits() > 0 {
		q /= 2
	}
	return q
}

// regroupCounts places the counts of the windows [ws, ws+q) (cur) and
// [ws-q, ws) (prev), written with Period q, in the windows of Period p, the
// current one beginning at start: each count in the window that holds the
// last nanosecond of its own, or in the current one if that nanosecond is
// later; a count whose last nanosecond is before the previous window is
// over. A count saturates at MaxLimit.
func regroupCounts(ws, q, cur, prev, start, p int64) (newCur, newPrev int64) {
	for _, c := range [2]struct{ end, hits int64 }{{ws + q, cur}, {ws, prev}} {
		switch {
		case c.end > start:
			newCur += c.hits
		case c.end > start-p:
			newPrev += c.hits
		}
	}
	return min(newCur, MaxLimit), min(newPrev, MaxLimit)
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
