package peer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// clockStart is where the tests' clocks start; their steps say how far
// after it they are.
var clockStart = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// counts are the counters of Stats that say where the checks are.
type counts struct {
	calls, failedCalls, expired uint64
	pending, inFlight           int
}

func countsOf(s Stats) counts {
	return counts{s.Calls, s.FailedCalls, s.ExpiredItems, s.Pending, s.InFlight}
}

// timedOut reports whether err is the error of a check that waited
// Timeout: ErrUnavailable, with the gRPC status DeadlineExceeded.
func timedOut(err error) bool {
	return errors.Is(err, ErrUnavailable) && errors.Is(err, transport.ErrUnavailable) && status.Code(err) == codes.DeadlineExceeded
}

// receiveTimedOut receives what from ch, the outcome of a check, and fails
// the test unless the check timed out.
func receiveTimedOut(t *testing.T, what string, ch <-chan outcome) {
	t.Helper()
	if out := receive(t, what, ch); !timedOut(out.err) {
		t.Fatalf("%s: %v, want ErrUnavailable with DeadlineExceeded", what, out.err)
	}
}

// expireAt sets clk to at after clockStart and has c's watchdog look at once.
func expireAt(c *Client, clk *fakeclock.Clock, at time.Duration) {
	clk.Set(clockStart.Add(at))
	c.expire(clk.Now())
}

// A forwarded check waits at most Timeout from when it was queued. The
// owner holds every batch it gets; with MaxInFlight 1, the checks queued
// behind the held batch fail at their own deadline, not that of the batch
// ahead of them plus their own: those queued with the held batch's
// deadline fail with it, without being sent, and those queued later go out
// on a new stream and fail at theirs. Nothing fails earlier. Steps on an
// injected clock: each sets the clock, then queues a group of concurrent
// checks or has the watchdog look, and says where the checks are then and
// which groups have failed by now. The counters change synchronously with
// expire, so that what has not failed yet is known, not guessed.
func TestCheckWaitsAtMostTimeoutFromQueued(t *testing.T) {
	const timeout = time.Second
	o := newOwner("node-b")
	srv := startServer(t, o)
	clk := fakeclock.New(clockStart)
	cfg := testConfig()
	cfg.Timeout, cfg.MaxInFlight, cfg.Clock = timeout, 1, ClockFunc(clk.Now)
	c := newTestClient(t, srv.addr, cfg)

	const n = 40 // checks in each group but the first
	groups := map[string][]<-chan outcome{}
	failed := map[string]bool{}
	for i, s := range []struct {
		at         time.Duration
		queue      string // a group of checks to queue; "" has the watchdog look
		checks     int
		many       bool // the group is one CheckMany rather than concurrent Checks
		want       counts
		got        int      // batches the owner has got
		wantFailed []string // the groups failed by now, all of their checks
	}{
		{at: 0, queue: "held", checks: 1, want: counts{calls: 1, inFlight: 1}, got: 1},
		{at: 0, queue: "with the held batch", checks: n, want: counts{calls: 1, inFlight: 1, pending: n}, got: 1},
		{at: timeout / 2, queue: "half a timeout later", checks: n, many: true, want: counts{calls: 1, inFlight: 1, pending: 2 * n}, got: 1},
		{at: timeout - 1, want: counts{calls: 1, inFlight: 1, pending: 2 * n}, got: 1},
		{
			at:         timeout,
			want:       counts{calls: 2, failedCalls: 1, expired: n, inFlight: 1},
			got:        2, // on a new stream
			wantFailed: []string{"held", "with the held batch"},
		},
		{at: 3*timeout/2 - 1, want: counts{calls: 2, failedCalls: 1, expired: n, inFlight: 1}, got: 2},
		{
			at:         3 * timeout / 2,
			want:       counts{calls: 2, failedCalls: 2, expired: n},
			got:        2,
			wantFailed: []string{"half a timeout later"},
		},
	} {
		clk.Set(clockStart.Add(s.at))
		switch {
		case s.queue == "":
			c.expire(clk.Now())
		case s.many:
			reqs := make([]limiter.Request, s.checks)
			for j := range reqs {
				reqs[j] = req("hold")
			}
			ch := make(chan outcome, s.checks)
			go func() {
				for _, r := range c.CheckMany(context.Background(), reqs) {
					ch <- outcome{r.Decision.Decision, r.Err}
				}
			}()
			for range s.checks {
				groups[s.queue] = append(groups[s.queue], ch)
			}
		default:
			for range s.checks {
				groups[s.queue] = append(groups[s.queue], goCheck(context.Background(), c, req("hold")))
			}
		}
		// The checks just queued, or those the watchdog let go, reach
		// their place, and the batches sent reach the owner.
		testwait.For(t, fmt.Sprintf("step %d: %+v, %d batches got", i, s.want, s.got), func() bool {
			return countsOf(c.Stats()) == s.want && len(o.batchSizes()) == s.got
		})
		for _, g := range s.wantFailed {
			for _, ch := range groups[g] {
				receiveTimedOut(t, fmt.Sprintf("step %d: a check %s", i, g), ch)
			}
			failed[g] = true
		}
	}
	for g := range groups {
		if !failed[g] {
			t.Errorf("the checks %s did not fail", g)
		}
	}
	// The checks queued with the held batch never reached the owner.
	if got := o.batchSizes(); !slices.Equal(got, []int{1, n}) {
		t.Fatalf("the owner got batches of %v, want [1 %d]", got, n)
	}
	// The client recovers as soon as the owner answers.
	o.release()
	if d, err := c.Check(context.Background(), req("x")); err != nil || !d.Allowed {
		t.Fatalf("check after the owner answers again: %+v, %v", d, err)
	}
}

// The checks of a CheckMany larger than MaxBatch share one deadline: those
// that wait behind its first batch, which the owner holds, fail with it,
// without being sent.
func TestCheckManyRestFailsWithItsFirstBatch(t *testing.T) {
	o := newOwner("node-b")
	srv := startServer(t, o)
	clk := fakeclock.New(clockStart)
	cfg := testConfig()
	cfg.Timeout, cfg.MaxInFlight, cfg.MaxBatch, cfg.Clock = time.Second, 1, 2, ClockFunc(clk.Now)
	c := newTestClient(t, srv.addr, cfg)

	// Three checks in one CheckMany, MaxBatch 2: a batch of two is held,
	// the third waits behind it with the same deadline.
	res := make(chan []transport.Result, 1)
	go func() {
		res <- c.CheckMany(context.Background(), []limiter.Request{req("hold"), req("hold"), req("hold")})
	}()
	testwait.For(t, "a batch in flight and one check queued", func() bool {
		return countsOf(c.Stats()) == counts{calls: 1, inFlight: 1, pending: 1}
	})
	expireAt(c, clk, time.Second)
	for i, r := range receive(t, "CheckMany", res) {
		if !timedOut(r.Err) {
			t.Fatalf("check %d: %v, want ErrUnavailable with DeadlineExceeded", i, r.Err)
		}
	}
	if got, want := countsOf(c.Stats()), (counts{calls: 1, failedCalls: 1, expired: 1}); got != want {
		t.Fatalf("counters %+v, want %+v", got, want)
	}
}
