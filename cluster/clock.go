package cluster

import (
	"time"

	"github.com/sluicehq/sluice/internal/clocks"
)

// Clock is the one time a Node reads and waits on: the time its
// decisions are made at, and every deadline, timer and ticker of its own
// (a hand-over's timeout, the wait of a check for a key's owner, the
// outbox's give-up time, the peer clients' call deadlines, the proofs'
// retries, the periodic sweeps, copies, clock probes and join retries,
// the lease loop, a Leave's time limit). Resending messages that may have
// been lost (the outbox's backoff, the requests for hand-over
// confirmations) runs on the system's timer instead, so that a clock
// that stands still stalls no exchange between nodes.
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
func SystemClock() Clock { return clocks.System{} }

// ClockFunc is a Clock that reads the time from the function and waits
// on the system's timer: AfterFunc(d, f) calls f once d has passed on the
// system's clock, and the deadlines the node compares with Now are
// Now's. A function that stands still thus keeps a deadline from passing
// until the function moves past it (the node's timers fire and look
// again), and its tickers tick once per period of the system's timer;
// one that runs at the system's pace with an offset moves every deadline
// with it.
type ClockFunc func() time.Time

func (c ClockFunc) Now() time.Time { return c() }

func (c ClockFunc) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

var (
	_ Clock        = ClockFunc(nil)
	_ clocks.Clock = Clock(nil)
	_ Clock        = clocks.Clock(nil)
)
