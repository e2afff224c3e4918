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
	mu  sync.Mutex
	now time.Time // guarded by mu
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

// Advance moves the clock d forward (backward if d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t.Round(0)
}
