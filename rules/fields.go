package rules

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Fields are a verdict's rate-limit response fields, ready to write as
// HTTP headers or gRPC metadata.
type Fields struct {
	// Limit, Remaining and Reset are the X-RateLimit-Limit, -Remaining and
	// -Reset values of the most restrictive limit: one that rejected the
	// request (the longest to wait), else the one with the least
	// remaining (the latest reset among equals). Reset is in whole
	// seconds, rounded up.
	Limit, Remaining, Reset int64
	// Policy and RateLimit are the RateLimit-Policy and RateLimit fields
	// of draft-ietf-httpapi-ratelimit-headers (revisions 09 to 11), which
	// list every limit, most restrictive first:
	//
	//	RateLimit-Policy: "api_per_user";q=100;w=60
	//	RateLimit: "api_per_user";r=42;t=17
	//
	// q is the limit and w the period in seconds (absent for calendar
	// months and years, whose length varies); r is what remains and t the
	// seconds until the limit is fully reset, or, for a limit that
	// rejected the request, until it admits it again, so that Retry-After
	// never precedes the end of the effective window as the draft asks.
	Policy, RateLimit string
	// RetryAfter is the Retry-After value of a rejected request in whole
	// seconds, rounded up and at least 1; 0 when the request was admitted.
	RetryAfter int64
	// Violated names the enforced limits that rejected the request.
	Violated []string
}

// Fields returns the response fields of v at now, and false when no limit
// was decided (no rule applied, or the limiter failed for all of them).
func (v *Verdict) Fields(now time.Time) (Fields, bool) {
	var ls []*Limit
	for i := range v.Limits {
		if v.Limits[i].Err == nil {
			ls = append(ls, &v.Limits[i])
		}
	}
	if len(ls) == 0 {
		return Fields{}, false
	}
	reset := func(l *Limit) int64 {
		if l.Rejected {
			return max(ceilSeconds(l.RetryAfter), 1)
		}
		return ceilSeconds(l.Decision.ResetAt.Sub(now))
	}
	slices.SortStableFunc(ls, func(a, b *Limit) int {
		ra, rb := a.Rejected && a.Enforced, b.Rejected && b.Enforced
		switch {
		case ra != rb:
			if ra {
				return -1
			}
			return 1
		case ra && a.RetryAfter != b.RetryAfter:
			return -cmpInt(int64(a.RetryAfter), int64(b.RetryAfter))
		case a.Decision.Remaining != b.Decision.Remaining:
			return cmpInt(a.Decision.Remaining, b.Decision.Remaining)
		}
		return -cmpInt(reset(a), reset(b))
	})
	top := ls[0]
	f := Fields{Limit: top.Decision.Limit, Remaining: top.Decision.Remaining, Reset: reset(top)}
	if f.Limit == 0 {
		f.Limit = top.Request.Limit
	}
	var pol, rl strings.Builder
	for i, l := range ls {
		if i > 0 {
			pol.WriteString(", ")
			rl.WriteString(", ")
		}
		name := sfString(l.Rule.Name)
		pol.WriteString(name)
		pol.WriteString(";q=")
		pol.WriteString(strconv.FormatInt(l.Request.Limit, 10))
		if w := windowSeconds(&l.Request); w > 0 {
			pol.WriteString(";w=")
			pol.WriteString(strconv.FormatInt(w, 10))
		}
		rl.WriteString(name)
		rl.WriteString(";r=")
		rl.WriteString(strconv.FormatInt(l.Decision.Remaining, 10))
		rl.WriteString(";t=")
		rl.WriteString(strconv.FormatInt(reset(l), 10))
		if l.Rejected && l.Enforced {
			f.Violated = append(f.Violated, l.Rule.Name)
		}
	}
	f.Policy, f.RateLimit = pol.String(), rl.String()
	if !v.Allowed && v.Err == nil {
		f.RetryAfter = max(ceilSeconds(v.RetryAfter), 1)
	}
	return f, true
}

// windowSeconds is the w parameter: the period in whole seconds, at least
// 1; 0 (absent) for calendar units of varying length.
func windowSeconds(r *limiter.Request) int64 {
	switch r.Calendar {
	case limiter.NoCalendar:
		return max(ceilSeconds(r.Period), 1)
	case limiter.Minute:
		return 60
	case limiter.Hour:
		return 3600
	case limiter.Day:
		return 86400
	case limiter.Week:
		return 7 * 86400
	}
	return 0
}

// ceilSeconds is d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// sfString encodes s as a structured-field String (RFC 9651 section
// 3.3.3). Valid rule names need no escaping; this is defence in depth.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
