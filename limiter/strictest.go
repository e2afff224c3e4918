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
// less than either would. The longer Period is kept (with its Calendar, a
// fixed window's), so that no window shortens under a count, unless its
// window holding now ends before c's does (windows aligned elsewhere: a
// fixed window's or counter's Period is then c's): over it, the
// Limit is the least that either rate allows (rounded down), and the
// capacity the least of both. A meet that Validate would refuse (a drain
// past MaxDrain after rounding) falls back to c's rate.
func strictest(c charged, a Algorithm, req *Request, now int64) Request {
	return meet(c, a, req, now, false)
}

// strictestMerged is strictest for a state that Merge has joined with
// one charged under req's rate: the merged counts last until the later
// of both windows ends, so the window algorithms keep the rate whose
// window holding now ends later (on a tie, the longer), its Limit cut to
// what either rate allows over it. (A fixed window decided at the other
// rate would end the joined count with that rate's window.)
func strictestMerged(c charged, a Algorithm, req *Request, now int64) Request {
	return meet(c, a, req, now, true)
}

func meet(c charged, a Algorithm, req *Request, now int64, merged bool) Request {
	old := c.request(*req, a)
	if sameRate(&old, req) {
		return *req
	}
	ts, tr := periodOf(&old, now), periodOf(req, now)
	m := old
	tm := ts
	theirs := old
	theirs.Period, theirs.Calendar, theirs.Location = time.Duration(tr), NoCalendar, nil
	if req.Calendar != NoCalendar && a == FixedWindow {
		theirs.Period, theirs.Calendar, theirs.Location = 0, req.Calendar, req.Location
	}
	take := tr > ts
	if a == FixedWindow || a == SlidingWindowCounter {
		// A longer window aligned elsewhere may end first (3h windows
		// against 2h ones, a month against a week, 24h against a 23-hour
		// DST day): a fixed window's count would go fresh, a counter's
		// start to fade, before c's window ends. Only a window that ends
		// no earlier is kept.
		er, eo := windowEnd(&theirs, now), windowEnd(&old, now)
		if merged {
			take = er > eo || er == eo && tr > ts
		} else {
			take = take && er >= eo
		}
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
	if m.Validate() != nil {
		m = old
	}
	m.Hits = req.Hits
	return m
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
