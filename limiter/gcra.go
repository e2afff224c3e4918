package limiter

import "time"

// decideGCRA is the generic cell rate algorithm (virtual scheduling form).
// It works on behind, how far the TAT is ahead of now, which is at most the
// horizon's distance, so that no sum overflows.
func decideGCRA(st *state, req *Request, now int64) Decision {
	t := gcraInterval(req)
	ahead := horizon(now) - now
	behind := gcraBehind(st, t, now)
	tolerance := req.burst() * t
	probe := max(req.Hits, 1)
	// Hits never exceed the burst, so room >= 0: a request is admitted
	// when behind + probe*t <= tolerance.
	room := tolerance - probe*t
	d := Decision{Limit: req.Limit}
	if behind <= room || req.Behavior&Charge != 0 {
		d.Allowed = true
		behind = min(behind+req.Hits*t, ahead)
		if req.Hits > 0 {
			d.Window = Window{now, now}
		}
	} else {
		if req.Behavior&DrainOverLimit != 0 && req.Hits > 0 && behind < tolerance {
			behind = min(tolerance, ahead)
		}
		d.RetryAfter = time.Duration(behind - room)
	}
	d.Remaining = max((tolerance-behind)/t, 0)
	tat := now + behind
	st.setTAT(tat, t)
	st.setTATLead(behind)
	st.expireAt = tat
	d.ResetAt = nsTime(tat)
	return d
}

// gcraInterval is the emission interval of req: Period/Limit rounded up.
func gcraInterval(req *Request) int64 {
	return (int64(req.Period) + req.Limit - 1) / req.Limit
}

// gcraBehind is how far (ns) st's TAT is ahead of now at the interval t:
// the outstanding hits of the interval st was written with are rescheduled
// at t (rounded up), up to the horizon. A stored TAT is at most the horizon
// of the decision that wrote it, which is not after now's.
func gcraBehind(st *state, t, now int64) int64 {
	old := st.interval()
	if old == 0 || st.tat() <= now {
		return 0
	}
	behind := st.tat() - now
	if old != t {
		behind = min(mul(behind, t).divCeil(old), horizon(now)-now)
	}
	return behind
}
