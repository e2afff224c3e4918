package cluster

import (
	"context"
	"time"
)

// Clock is the one time a Node reads and waits on: the time its
// decisions are made at, and every deadline of its own (a hand-over's
// timeout, the wait of a check for a key's owner, the outbox's retries and
// give-up time, the peer clients' check deadlines, the proofs' retries).
// A deadline is the clock's Now plus a duration, waited for with the
// clock's AfterFunc and compared with the clock's Now, so no deadline is
// started on one clock and ended on another. Implementations are safe for
// concurrent use.
//
// [SystemClock] is the system's; [ClockFunc] adapts a function that reads
// the time (a test's fake or offset clock) whose waits run on the
// system's timer; a fake clock that also implements AfterFunc (as
// internal/fakeclock's does) moves every deadline only when the test
// moves it.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed on the
	// clock, unless stop is called first; stop reports whether it
	// stopped the call, as time.Timer's Stop does.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// SystemClock returns the system's clock.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// ClockFunc is a Clock that reads the time from the function and waits
// on the system's timer: AfterFunc(d, f) calls f once d has passed on the
// system's clock, and the deadlines the node compares with Now are
// Now's. A function that stands still thus keeps a deadline from passing
// until the function moves past it (the node's timers fire and look
// again); one that runs at the system's pace with an offset moves every
// deadline with it.
type ClockFunc func() time.Time

func (c ClockFunc) Now() time.Time { return c() }

func (c ClockFunc) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

var (
	_ Clock = systemClock{}
	_ Clock = ClockFunc(nil)
)

// clockTimer is a one-shot timer on a Clock, for selects: C receives once
// the duration has passed.
type clockTimer struct {
	C    chan struct{}
	stop func() bool
}

// newTimer starts a timer of d on c.
func newTimer(c Clock, d time.Duration) *clockTimer {
	t := &clockTimer{C: make(chan struct{}, 1)}
	t.stop = c.AfterFunc(d, t.fire)
	return t
}

func (t *clockTimer) fire() {
	select {
	case t.C <- struct{}{}:
	default:
	}
}

// Stop stops the timer; it is safe on a nil timer.
func (t *clockTimer) Stop() {
	if t != nil {
		t.stop()
	}
}

// withTimeout is context.WithTimeout with d measured on c: ctx ends, with
// context.DeadlineExceeded as its cause, once d has passed on c.
func withTimeout(ctx context.Context, c Clock, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := c.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}
