// Package fakeclock is the time of a test: a clock that moves only when
// the test moves it, whose Now method is what sluice's Clock fields and
// options take.
//
// It imports only the standard library, so that any package's tests can
// use it, the cluster's own internal tests included.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a time that stands still until Advance or Set moves it. It is
// safe for concurrent use. The zero Clock reads the zero time.
type Clock struct {
	mu     sync.Mutex
	now    time.Time // guarded by mu
	timers []*timer  // guarded by mu: those not fired nor stopped
}

// timer is a call AfterFunc waits to make.
type timer struct {
	at time.Time
	f  func()
}

// New returns a clock that reads start, without its monotonic clock
// reading: like a time from time.Unix, it compares as the wall time it
// says.
func New(start time.Time) *Clock {
	return &Clock{now: start.Round(0)}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc calls f in its own goroutine once the clock has been moved d
// past its time now (at once when d <= 0), unless stop is called first;
// stop reports whether it stopped the call.
func (c *Clock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{at: c.now.Add(d), f: f}
	if d <= 0 {
		go f()
		return func() bool { return false }
	}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, u := range c.timers {
			if u == t {
				c.timers = append(c.timers[:i], c.timers[i+1:]...)
				return true
			}
		}
		return false
	}
}

// Advance moves the clock d forward (backward if d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(c.now.Add(d))
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(t.Round(0))
}

// setLocked moves the clock to t and makes the calls of the timers it
// passed. c.mu must be held.
func (c *Clock) setLocked(t time.Time) {
	c.now = t
	kept := c.timers[:0]
	for _, u := range c.timers {
		if u.at.After(t) {
			kept = append(kept, u)
			continue
		}
		go u.f()
	}
	clear(c.timers[len(kept):])
	c.timers = kept
}
