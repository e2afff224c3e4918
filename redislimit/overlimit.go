package redislimit

import (
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// overLimit remembers keys that Redis said admit nothing, until when, so
// that checks of them until then are denied here without a call to
// Redis. It holds at most max keys: a key that finds it full takes the
// place of an expired one among the first few it looks at, or else of
// the first, so an insert costs a bounded time.
type overLimit struct {
	max int
	mu  sync.Mutex // guards denied
	// denied maps a key and its parameters to its remembered denial.
	denied map[overLimitKey]denial
}

// denial is a key's remembered denial: it admits nothing before until,
// and its state is fresh at resetAt.
type denial struct{ until, resetAt time.Time }

// evictScan is how many entries a key that finds the cache full looks at
// for an expired one.
const evictScan = 8

func newOverLimit(max int) *overLimit {
	return &overLimit{max: max, denied: make(map[overLimitKey]denial, min(max, 1024))}
}

// overLimitKey is a request's key and every parameter a decision depends
// on, so that a changed limit is asked of Redis at once.
type overLimitKey struct {
	name, key    string
	limit, burst int64
	period       time.Duration
	algorithm    limiter.Algorithm
	calendar     limiter.Calendar
	location     string
}

func keyOf(req *limiter.Request) overLimitKey {
	k := overLimitKey{name: req.Name, key: req.Key, limit: req.Limit, burst: req.Burst, period: req.Period,
		algorithm: req.Algorithm, calendar: req.Calendar}
	if req.Location != nil {
		k.location = req.Location.String()
	}
	return k
}

// cacheable reports whether req's denial may be remembered or answered
// from memory: it asks for at most one hit (so its RetryAfter holds for
// every request of one hit or more) and changes nothing but its count.
func cacheable(req *limiter.Request) bool { return req.Hits <= 1 && req.Behavior == 0 }

// lookup returns the remembered denial of req at now, if any.
func (o *overLimit) lookup(req *limiter.Request, now time.Time) (limiter.Decision, bool) {
	if req.Behavior != 0 {
		return limiter.Decision{}, false
	}
	o.mu.Lock()
	d, ok := o.denied[keyOf(req)]
	o.mu.Unlock()
	if !ok || !now.Before(d.until) {
		return limiter.Decision{}, false
	}
	return limiter.Decision{Limit: req.Limit, ResetAt: d.resetAt, RetryAfter: d.until.Sub(now)}, true
}

// remember records Redis's decision d of req, made at now, when it says
// the key admits nothing for a while.
func (o *overLimit) remember(req *limiter.Request, d limiter.Decision, now time.Time) {
	if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || !cacheable(req) {
		return
	}
	k := keyOf(req)
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.denied[k]; !ok && len(o.denied) >= o.max {
		var victim overLimitKey
		seen := 0
		for other, od := range o.denied {
			if seen == 0 || !now.Before(od.until) {
				victim = other
			}
			if seen++; seen == evictScan || !now.Before(od.until) {
				break
			}
		}
		delete(o.denied, victim)
	}
	o.denied[k] = denial{until: now.Add(d.RetryAfter), resetAt: d.ResetAt}
}

// forget drops the remembered denial of req's key and parameters: req
// gave the key hits back (Reset or Refund), so that the next check of
// them asks Redis again. A denial remembered under other parameters
// stays until its RetryAfter.
func (o *overLimit) forget(req *limiter.Request) {
	k := keyOf(req)
	o.mu.Lock()
	delete(o.denied, k)
	o.mu.Unlock()
}
