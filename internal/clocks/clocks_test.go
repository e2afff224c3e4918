package clocks_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/clocks"
	"github.com/sluicehq/sluice/internal/fakeclock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ticked reports whether c holds a tick, waiting up to a second for one
// that a fake clock's AfterFunc goroutine is delivering.
func ticked(c <-chan struct{}, wait bool) bool {
	if !wait {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	select {
	case <-c:
		return true
	case <-time.After(10 * time.Second):
		return false
	}
}

// A ticker on a fake clock ticks only when the clock passes a period, and
// never after Stop.
func TestTickerOnFakeClock(t *testing.T) {
	clk := fakeclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	tk := clocks.NewTicker(clk, time.Second)
	for range 3 {
		if ticked(tk.C, false) {
			t.Fatal("ticked before the clock moved a period")
		}
		clk.Advance(time.Second)
		if !ticked(tk.C, true) {
			t.Fatal("no tick once the clock moved a period")
		}
	}
	tk.Stop()
	clk.Advance(time.Hour)
	if ticked(tk.C, false) {
		t.Fatal("ticked after Stop")
	}
}

// A timeout on a fake clock ends the context only when the clock passes
// it, with DeadlineExceeded as its cause.
func TestWithTimeoutOnFakeClock(t *testing.T) {
	clk := fakeclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx, cancel := clocks.WithTimeout(context.Background(), clk, time.Minute)
	defer cancel()
	clk.Advance(59 * time.Second)
	if ctx.Err() != nil {
		t.Fatalf("ended before its timeout: %v", ctx.Err())
	}
	clk.Advance(time.Second)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("not ended once the clock passed its timeout")
	}
	if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		t.Fatalf("cause %v, want DeadlineExceeded", context.Cause(ctx))
	}
	tm := clocks.NewTimer(clk, time.Second)
	defer tm.Stop()
	if ticked(tm.C, false) {
		t.Fatal("timer fired before the clock moved")
	}
	clk.Advance(time.Second)
	if !ticked(tm.C, true) {
		t.Fatal("timer did not fire once the clock moved")
	}
}

// stillClock reads a time that never moves; its waits are handed to the
// test, which ends them (as a ClockFunc's system timer would) by calling
// them.
type stillClock struct {
	now   time.Time
	waits chan time.Duration
	fire  chan func()
}

func (c stillClock) Now() time.Time { return c.now }

func (c stillClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.waits <- d
	c.fire <- f
	return func() bool { return false }
}

// A ticker on a clock that stands still while its waits run on another
// timer waits one period for each tick, not a period longer each time.
func TestTickerOnClockThatStandsStill(t *testing.T) {
	c := stillClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), waits: make(chan time.Duration, 16), fire: make(chan func(), 16)}
	tk := clocks.NewTicker(c, time.Second)
	defer tk.Stop()
	for i := range 5 {
		if d := <-c.waits; d != time.Second {
			t.Fatalf("wait %d for the next tick is %v, want one period (1s)", i, d)
		}
		(<-c.fire)()
		if !ticked(tk.C, false) {
			t.Fatalf("no tick when wait %d ended", i)
		}
	}
}
