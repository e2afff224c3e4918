package limiter

import "time"

// decideGCRA is the generic cell rate algorithm (virtual scheduling form).
func decideGCRA(st *state, req *Request, now int64) Decision {
	t := (int64(req.Period) + req.Limit - 1) / req.Limit // ceil(Period/Limit)
	tat := st.tat()
	switch old := st.interval(); {
	case old == 0:
		// Fresh (no interval yet): TAT 0 would be a backlog before 1970.
		tat = now
	case old != t && tat > now:
		// Keep what was consumed: the outstanding hits (tat-now)/old
		// are rescheduled at the new interval.
		tat = now + mul(tat-now, t).divCeil(old)
	}
	if tat < now {
		tat = now
	}
	tolerance := req.burst() * t
	probe := max(req.Hits, 1)
	d := Decision{Limit: req.Limit}
	if next := tat + probe*t; next-now <= tolerance {
		d.Allowed = true
		tat += req.Hits * t
	} else {
		if req.Behavior&DrainOverLimit != 0 && req.Hits > 0 && tat-now < tolerance {
			tat = now + tolerance
		}
		d.RetryAfter = time.Duration(tat + probe*t - now - tolerance)
	}
	d.Remaining = max((tolerance-(tat-now))/t, 0)
	st.setTAT(tat, t)
	st.expireAt = tat
	d.ResetAt = nsTime(tat)
	return d
}
