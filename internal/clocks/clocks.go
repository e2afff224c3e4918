// Package clocks waits on a clock that may be the system's or a test's:
// the one-shot timers, tickers and context deadlines of cluster and peer
// are built here on a Clock's AfterFunc, so that every deadline a node
// starts is measured, and ended, on the clock it was started on.
package clocks

import (
	"context"
	"sync"
	"time"
)

// Clock is the time a component reads and waits on; cluster.Clock and
// peer.Clock have its method set. Implementations are safe for concurrent
// use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed on the
	// clock, unless stop is called first; stop reports whether it stopped
	// the call, as time.Timer's Stop does.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// System is the system's clock.
type System struct{}

func (System) Now() time.Time { return time.Now() }

func (System) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

var _ Clock = System{}

// Timer is a one-shot timer on a Clock, for selects: C receives once the
// duration has passed.
type Timer struct {
	C    chan struct{}
	stop func() bool
}

// NewTimer starts a timer of d on c.
func NewTimer(c Clock, d time.Duration) *Timer {
	t := &Timer{C: make(chan struct{}, 1)}
	t.stop = c.AfterFunc(d, func() { signal(t.C) })
	return t
}

// Stop stops the timer; it is safe on a nil timer.
func (t *Timer) Stop() {
	if t != nil {
		t.stop()
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Ticker ticks on a Clock every period: C receives a tick at each
// multiple of the period from the ticker's start, as the clock reads
// them, and holds at most one (a slow receiver drops ticks, as
// time.Ticker's does). On a clock whose waits run on another timer (a
// ClockFunc), a clock that stands still or steps back has it wait one
// period of that timer, never longer, for the next tick.
type Ticker struct {
	C      chan struct{}
	c      Clock
	period time.Duration

	mu      sync.Mutex  // guards next, stop and stopped
	next    time.Time   // when the pending tick is due
	stop    func() bool // the pending tick's
	stopped bool
}

// NewTicker starts a ticker of period d, which must be positive, on c.
func NewTicker(c Clock, d time.Duration) *Ticker {
	if d <= 0 {
		panic("clocks: NewTicker with a period that is not positive")
	}
	t := &Ticker{C: make(chan struct{}, 1), c: c, period: d}
	t.mu.Lock()
	t.next = c.Now().Add(d)
	t.stop = c.AfterFunc(d, t.tick)
	t.mu.Unlock()
	return t
}

// tick sends a tick and arms the next one, due a period after this one
// was: a clock moved past it meanwhile has it fire at once.
func (t *Ticker) tick() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	now := t.c.Now()
	t.next = t.next.Add(t.period)
	if !t.next.After(now) || t.next.Sub(now) > t.period {
		// Ticks that fell behind are dropped, as time.Ticker's are; a
		// clock that stood still, or stepped back, while the wait ran
		// on another timer waits a period again, not the growing time
		// to a tick it has not reached (the wait would lengthen by a
		// period at each tick).
		t.next = now.Add(t.period)
	}
	t.stop = t.c.AfterFunc(t.next.Sub(now), t.tick)
	signal(t.C)
}

// Stop stops the ticker: no tick is sent after it returns.
func (t *Ticker) Stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	t.stop()
}

// WithTimeout is context.WithTimeout with d measured on c: ctx ends, with
// context.DeadlineExceeded as its cause, once d has passed on c. On the
// system's clock it is context.WithTimeout itself, whose deadline gRPC
// sends along with a call.
func WithTimeout(ctx context.Context, c Clock, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := c.(System); ok {
		return context.WithTimeout(ctx, d)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := c.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}
