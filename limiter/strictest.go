package limiter

import "time"

// charged is the rate a key's live state was last charged under, kept
// beside the state so that StoreConfig.KeepStrictest can tell a request
// that would read the state at a laxer rate. The Algorithm is the state's
// own (its tag). The zero value is unknown: a fresh key, or a state that
// Store.Merge received, which the next decision charges under its own
// request's rate.
type charged struct {
	limit, burst int64 // Limit and the effective burst (Request.Capacity)
	// period is the Period, or -Calendar for calendar windows.
	period int64
	loc    *time.Location // the calendar's Location; nil with none
}

// chargedOf is the rate req charges under.
func chargedOf(req *Request) charged {
	c := charged{limit: req.Limit, burst: req.burst(), period: int64(req.Period)}
	if req.Calendar != NoCalendar {
		c.period, c.loc = -int64(req.Calendar), req.Location
	}
	return c
}

func (c *charged) known() bool { return c.limit != 0 }

// request is req with c's rate and the algorithm a.
func (c *charged) request(req Request, a Algorithm) Request {
	req.Algorithm, req.Limit, req.Burst = a, c.limit, c.burst
	req.Period, req.Calendar, req.Location = time.Duration(c.period), NoCalendar, nil
	if c.period < 0 {
		req.Period, req.Calendar, req.Location = 0, Calendar(-c.period), c.loc
	}
	if !a.HasBurst() {
		req.Burst = 0
	}
	return req
}

// sameRate reports whether a and b charge alike: one algorithm, Limit,
// capacity, Period or Calendar unit and zone.
func sameRate(a, b *Request) bool {
	ca, cb := chargedOf(a), chargedOf(b)
	return a.Algorithm == b.Algorithm && ca.limit == cb.limit && ca.burst == cb.burst &&
		ca.period == cb.period && zoneName(ca.loc) == zoneName(cb.loc)
}

func zoneName(l *time.Location) string {
	if l == nil {
		return "UTC"
	}
	return l.String()
}

// strictest returns the request that decides req on a live state of
// algorithm a last charged under c (known), under KeepStrictest: req
// itself when it charges as c does; otherwise req with a's algorithm and
// the strictest of both rates, which never reads the state as counting
// less than either would. The buckets, GCRA and the log keep the longer
// Period. A fixed window or sliding window counter keeps the rate whose
// window holding now ends later (on a tie, the longer; with its Calendar,
// a fixed window's): hits counted in a window are never released before
// the end of every window they were charged under, so a count that moves
// to the other rate's window moves to one that ends no earlier (a 3-hour
// window beside a 2-hour one, a month beside a week or 24 hours beside a
// 23-hour DST day may end first, or last). Over the kept Period the
// Limit is the least that either rate allows (rounded down), and the
// capacity the least of both. A meet that Validate would refuse (a drain
// past MaxDrain, or for the windows a Limit below one, after rounding)
// falls back to c's rate; for the windows, none reports that the meet
// admits nothing over the window kept, and the caller denies req; moved
// reports that the meet moves a fixed window's or counter's count to
// req's window (a fixed window's count whose last charge came before
// that window stays where it is when the decision charges nothing: see
// decideKeyLocked).
func strictest(c charged, a Algorithm, req *Request, now int64) (m Request, none, moved bool) {
	old := c.request(*req, a)
	if sameRate(&old, req) {
		return *req, false, false
	}
	ts, tr := periodOf(&old, now), periodOf(req, now)
	m = old
	tm := ts
	theirs := old
	theirs.Period, theirs.Calendar, theirs.Location = time.Duration(tr), NoCalendar, nil
	if req.Calendar != NoCalendar && a == FixedWindow {
		theirs.Period, theirs.Calendar, theirs.Location = 0, req.Calendar, req.Location
	}
	take := tr > ts
	if a == FixedWindow || a == SlidingWindowCounter {
		// The count moves to the window of the rate decided with: only
		// one that ends no earlier keeps it counted as long as both
		// rates would.
		er, eo := windowEnd(&theirs, now), windowEnd(&old, now)
		take = er > eo || er == eo && tr > ts
	}
	if take {
		m, tm = theirs, tr
	}
	limit := min(mul(old.Limit, tm).div(ts), mul(req.Limit, tm).div(tr))
	capacity := min(old.Capacity(), req.Capacity())
	if a.HasBurst() {
		m.Limit, m.Burst = limit, capacity
	} else {
		m.Limit, m.Burst = min(limit, capacity), 0
	}
	m.Hits = req.Hits
	if m.Hits > m.Capacity() {
		m.Hits = 0 // validated below as a peek; the caller denies it
	}
	windows := a == FixedWindow || a == SlidingWindowCounter
	moved = take && windows
	if m.Validate() != nil {
		none = take && m.Limit < 1 && windows
		m, moved = old, false
	}
	m.Hits = req.Hits
	return m, none, moved
}

func windowStart(r *Request, now int64) int64 {
	start, _ := windowBounds(r, now)
	return start
}

func windowEnd(r *Request, now int64) int64 {
	_, end := windowBounds(r, now)
	return end
}

// overCapacity is the decision on req, whose Hits are more than its
// capacity (a request narrowed by strictest): denied, with what a peek
// finds, and RetryAfter until the key is fresh, when req's own rate takes
// effect and admits it if nothing else is consumed meanwhile.
func overCapacity(st state, lg *windowLog, req *Request, now int64) Decision {
	p := *req
	p.Hits = 0
	d := peek(st, lg, &p, now)
	d.Allowed = false
	d.RetryAfter = max(time.Duration(st.expireAt-now), 1)
	return d
}
